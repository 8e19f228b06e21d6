"""Replicas: one data-parallel replica's graph and its plan as the plan of the whole step.

A strategy (d, m) splits the k devices into d replicas of k/d devices (contiguous in the
cluster's order; mirrored devices must be alike) and rewrites the step into one replica's graph of
m micro-batches (`passes/rewrite/rebatch.py`), its all-reduces costed by the ring over the mirrored
devices. Every replica runs the same schedule, so a plan of replica 0 on its devices is the plan
of the step. The `microbatch` pass and the hybrid search (`passes/placement/search/hybrid.py`) both build on this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster, ring_time
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.types import BlobType
from pesto_ir.ir.verifier import verify
from pesto_ir.passes.annotate_costs import AnnotateCostsPass
from pesto_ir.passes.placement.options import PlaceOptions, inner, kept_on_interrupt
from pesto_ir.passes.rewrite.collective_buckets import bucket_all_reduces
from pesto_ir.passes.rewrite.rebatch import rebatch
from pesto_ir.passes.rewrite.shard_params import shard_parameters
from pesto_ir.passes.rewrite.shard_state import shard_optimizer_state
from pesto_ir.passes.rewrite.tensor_rank import interleaved, partition_specs, sequence_parallel
from pesto_ir.passes.rewrite.tensor_shard import TensorLayout, tensor_shard
from pesto_ir.passmanager import PassContext
from pesto_ir.schedule.plan import RING_PHASES, Parallelism, Plan, write_plan_attrs
from pesto_ir.schedule.validate import check_plan, collectives_for
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError

Solve = Callable[[Graph, Cluster, PlaceOptions], Plan]  # an engine: a plan of the graph on the cluster


@dataclass(frozen=True, order=True)
class Strategy:
    data_parallel: int
    microbatches: int
    optimizer_state: str = "replicated"  # or "sharded" (`passes/rewrite/shard_state.py`), with d > 1
    tensor: TensorLayout = TensorLayout(1)  # t ranks and the inputs split across them (`tensor_shard.py`)
    parameters: str = "replicated"  # or "sharded" (FSDP, `passes/rewrite/shard_params.py`), with the state sharded

    @property
    def tensor_parallel(self) -> int:
        return self.tensor.size

    def __str__(self) -> str:
        sharded = " params sharded" if self.parameters == "sharded" else \
            " state sharded" if self.optimizer_state == "sharded" else ""
        ranks = f" t={self.tensor_parallel}" if self.tensor_parallel > 1 else ""
        return f"d={self.data_parallel} m={self.microbatches}{ranks}{sharded}"

    def sharded(self) -> Strategy:
        return dataclasses.replace(self, optimizer_state="sharded")

    def fully_sharded(self) -> Strategy:
        return dataclasses.replace(self, optimizer_state="sharded", parameters="sharded")


ONE_BATCH = Strategy(1, 1)


def replica_groups(cluster: Cluster, d: int) -> tuple[tuple[str, ...], ...]:
    """d groups of k/d devices, contiguous in the cluster's order; mirrored devices must be alike."""
    k = len(cluster)
    if d < 1 or k % d:
        raise PestoError(f"data-parallel {d} does not divide the {k} devices into equal replicas")
    per = k // d
    names = cluster.names
    groups = tuple(tuple(names[r * per:(r + 1) * per]) for r in range(d))
    _check_alike(cluster, groups, lambda a, b, kinds: f"data-parallel {d}: device {b} would mirror {a}, but they "
                 f"differ ({kinds}); replicas need alike devices")
    return groups


def _check_alike(cluster: Cluster, groups: tuple[tuple[str, ...], ...],
                 why: Callable[[str, str, str], str]) -> None:
    """Every device of `groups[r]` is alike (kind, memory, speed) the device of `groups[0]` it
    mirrors: they run one schedule. `why(a, b, "kind_b vs kind_a")` says it where one is not."""
    for group in groups[1:]:
        for a, b in zip(groups[0], group):
            da, db = cluster.device(a), cluster.device(b)
            if (da.kind, da.memory, da.peak_flops) != (db.kind, db.memory, db.peak_flops):
                raise PestoError(why(a, b, f"{db.kind} vs {da.kind}"))


def mirror_groups(cluster: Cluster, d: int, t: int = 1) -> tuple[tuple[str, ...], ...]:
    """The devices that run replica 0's schedule: with t tensor-parallel ranks, each replica's
    devices are cut into runs of t contiguous devices (one rank group, inside a host where hosts
    hold whole groups), rank 0 of each run is placed, and list r*t + j holds replica r's rank j."""
    groups = replica_groups(cluster, d)
    per = len(groups[0])
    if t < 1 or per % t:
        raise PestoError(f"tensor-parallel {t} does not divide the {per} device(s) of a replica into equal groups")
    if t == 1:
        return groups
    out = tuple(tuple(g[s * t + j] for s in range(per // t)) for g in groups for j in range(t))
    _check_alike(cluster, out, lambda a, b, kinds: f"tensor-parallel {t}: device {b} would run {a}'s schedule on "
                 f"its own blocks, but they differ ({kinds}); a tensor-parallel group needs alike devices")
    return out


def placed_devices(cluster: Cluster, strategy: Strategy) -> tuple[str, ...]:
    """The devices a strategy's plan places its replica graph on: replica 0's (its rank 0's)."""
    return mirror_groups(cluster, strategy.data_parallel, strategy.tensor_parallel)[0]


def sub_cluster(cluster: Cluster, names: Sequence[str]) -> Cluster:
    """The devices `names` of `cluster` and the links between them."""
    keep = set(names)
    return Cluster([cluster.device(n) for n in names],
                   {pair: link for pair, link in cluster.links.items() if pair[0] in keep and pair[1] in keep},
                   calibrated_on=cluster.calibrated_on)


def all_reduce_cost(cluster: Cluster, groups: tuple[tuple[str, ...], ...]) -> Callable[[int], float]:
    """An all-reduce's duration before placement: the slowest ring over mirrored devices (the
    validator checks the ring of the device it lands on)."""
    ring = collective_cost(cluster, groups)
    return lambda nbytes: ring("all_reduce", nbytes)


def collective_cost(cluster: Cluster, groups: tuple[tuple[str, ...], ...]) -> Callable[[str, int], float]:
    """A collective's duration before placement, by its opcode: the slowest ring over mirrored devices."""
    rings = [[g[i] for g in groups] for i in range(len(groups[0]))]

    def cost(opcode: str, nbytes: int) -> float:
        return max(ring_time(cluster, ring, nbytes, RING_PHASES[opcode]) for ring in rings)

    return cost


def replica_graph(graph: Graph, cluster: Cluster, strategy: Strategy) -> Graph:
    """One replica's graph for `strategy`, costed: copies re-costed by roofline where the graph
    was costed that way, else their costs scale with the batch."""
    if strategy != ONE_BATCH:
        typed = any(not isinstance(r.type, BlobType) for op in graph.ops for r in op.results)
        # about the ops it builds, and on a graph of arrays the source's ops too, whose shapes and
        # costs it reads again (on the 7.1B and 39B GPTs: 240-280 us per op at m = 1, 180 at m = 2)
        work.charge(work.rewrite_kind(typed), len(graph.ops) * (strategy.microbatches + typed))
    groups = replica_groups(cluster, strategy.data_parallel)
    out = rebatch(graph, strategy.microbatches, strategy.data_parallel, all_reduce_cost(cluster, groups))
    mirrors = groups
    if strategy.tensor.size > 1:
        mirrors = mirror_groups(cluster, strategy.data_parallel, strategy.tensor.size)
        out = tensor_shard(out, strategy.tensor, collective_cost(cluster, mirrors[:strategy.tensor.size]),
                           collective_cost(cluster, mirrors[::strategy.tensor.size]))
    across = collective_cost(cluster, mirrors[::strategy.tensor.size])
    if strategy.optimizer_state == "sharded":
        shard_state(out, strategy, across)
    if strategy.parameters == "sharded":
        shard_params(out, strategy, across)
    if out is not graph and any("flops" in op.attrs for op in graph.ops):
        AnnotateCostsPass(model="roofline").run(out, PassContext(cluster=sub_cluster(cluster, mirrors[0]), quiet=True))
    return out


def shard_state(graph: Graph, strategy: Strategy, cost: Callable[[str, int], float] | None) -> None:
    """Shard the optimizer state of a replica graph (`passes/rewrite/shard_state.py`), or say why not."""
    if strategy.data_parallel < 2:
        raise PestoError("optimizer state is sharded across data-parallel replicas; with one replica there is "
                         "nothing to shard it across")
    done = shard_optimizer_state(graph, strategy.data_parallel, cost)
    if not done.changed:
        why = "; ".join(f"%{n}: {w}" for n, w in list(done.kept.items())[:3])
        raise PestoError(f"{strategy}: graph '{graph.name}' has no optimizer state to shard (state is a param "
                         "input that only elementwise update ops of its own shape read)" + (f"; {why}" if why else ""))
    verify(graph)


def shard_params(graph: Graph, strategy: Strategy, cost: Callable[[str, int], float] | None) -> None:
    """Shard the parameters of a replica graph whose state is sharded (`passes/rewrite/shard_params.py`),
    or say why not."""
    if strategy.optimizer_state != "sharded":
        raise PestoError("parameters are sharded with the optimizer state (FSDP shards both)")
    done = shard_parameters(graph, strategy.data_parallel, cost)
    if not done.inputs:
        why = "; ".join(f"%{n}: {w}" for n, w in list(done.kept.items())[:3])
        raise PestoError(f"{strategy}: graph '{graph.name}' has no parameter to shard" + (f" ({why})" if why else ""))
    verify(graph)


def parameters_of(graph: Graph) -> str:
    """How a replica graph holds its parameters: "sharded" after `passes/rewrite/shard_params.py`."""
    return "sharded" if "sharded_parameters" in graph.attrs else "replicated"


def state_of(graph: Graph) -> str:
    """How a replica graph holds its optimizer state: "sharded" after `passes/rewrite/shard_state.py`."""
    return "sharded" if "sharded_inputs" in graph.attrs else "replicated"


def as_hybrid(graph: Graph, cluster: Cluster, plan: Plan, strategy: Strategy) -> Plan:
    """`plan` (replica 0's, on its devices) as the plan of the whole step on `cluster`, validated.

    With one replica on all of `cluster` the plan is the same plan, and one that has passed the
    validator (it has its peaks) is not checked again: on a 25,000-op pipeline a check is 0.7 s."""
    groups = mirror_groups(cluster, strategy.data_parallel, strategy.tensor_parallel)
    same = len(groups) == 1 and list(plan.devices) == list(cluster.names) and plan.peak_memory is not None
    plan = dataclasses.replace(plan, devices=list(cluster.names),
                               parallelism=Parallelism(strategy.data_parallel, strategy.microbatches, groups,
                                                       state_of(graph), strategy.tensor_parallel,
                                                       partition_specs(graph), interleaved(graph),
                                                       parameters_of(graph), sequence_parallel(graph)))
    plan.collectives = collectives_for(graph, plan)
    return plan if same else check_plan(graph, cluster, plan)


def bucketed(graph: Graph, cluster: Cluster, plan: Plan, strategy: Strategy) -> tuple[Graph, Plan]:
    """`plan` of replica 0 as a hybrid plan, its gradient all-reduces merged into buckets
    (`passes/rewrite/collective_buckets.py`, on a copy of `graph`) where that makes the step faster; the
    graph the plan is of, and the plan."""
    plain = as_hybrid(graph, cluster, plan, strategy)
    if strategy.data_parallel == 1:
        return graph, plain
    groups = replica_groups(cluster, strategy.data_parallel)
    sub = sub_cluster(cluster, groups[0])
    merged = bucket_all_reduces(graph.clone(), sub, on_replica(plan, sub), collective_cost(cluster, groups))
    if merged is None:
        return graph, plain
    hybrid = as_hybrid(merged[0], cluster, merged[1], strategy)
    return (merged[0], hybrid) if hybrid.makespan <= plain.makespan else (graph, plain)


def on_replica(plan: Plan, sub: Cluster) -> Plan:
    """A hybrid plan as a plain plan of replica 0 on its devices (a warm start for the engines)."""
    return dataclasses.replace(plan, devices=list(sub.names), parallelism=None, collectives=[], peak_memory=None)


def place_rewritten(graph: Graph, cluster: Cluster, options: PlaceOptions, place: Solve) -> Plan:
    """Place a graph the `microbatch` pass already rewrote (its `microbatched` attribute gives d and
    m) on replica 0's devices, as the plan of the whole step."""
    degrees = graph.attrs["microbatched"].value
    strategy = Strategy(int(degrees["data_parallel"]), int(degrees["microbatches"]), state_of(graph))
    sub = sub_cluster(cluster, replica_groups(cluster, strategy.data_parallel)[0])
    replica = inner(options)  # its plan becomes the whole step's on Ctrl-C
    try:
        plan = as_hybrid(graph, cluster, place(graph, sub, replica), strategy)
    except KeyboardInterrupt:
        carried = replica.incumbent.plan_of(graph)
        raise kept_on_interrupt(options, graph, None if carried is None else as_hybrid(graph, cluster, carried, strategy)) from None
    write_plan_attrs(graph, plan)
    return plan
