"""A start plan: a plan made before, which `place` starts from and must beat.

`place{start=FILE}` (`pesto-compile --start FILE`) reads a `pesto-plan/1` file, applies it to the
graph on this cluster and times it here. The search takes it as its strategy's plan so far (the
plan to refine), and the pass returns the faster of the start and what the search found.

A plan on fewer devices is a plan on more: the other devices idle. So planning for k devices from
the plan for k/2 never gives a slower step, whatever the time limit cuts. Without it, a search
given the same time on more devices, with more to explore, sometimes ended slower (auto on BERT-3
training: 40.887 ms at k = 4, 40.889 at k = 8). The suite (`bench/suite.py`) plans each k from
the plan for the k before it. Re-running with the previous result as the start also lets a longer
search continue where a shorter one stopped.

Its ops, devices and strategy are checked when it is read. It is compared by its own times, and
checked as given on this graph and cluster only when it would be used; where its times are not
valid here (the cluster's figures differ), it is re-timed by the simulator with the start's devices
and per-device orders. A hybrid plan's
replica graph is rebuilt for its data-parallel degree and micro-batches on this cluster, with its
collectives merged into the buckets the file names (`buckets`), so its ops must be on devices of
this cluster's replica 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.expansion import expand_plan
from pesto_ir.passes.placement.options import PlaceError
from pesto_ir.passes.rewrite.collective_buckets import feeds_all_reduce, merge_bucket, mergeable
from pesto_ir.passes.rewrite.replicas import (
    ONE_BATCH,
    Strategy,
    as_hybrid,
    collective_cost,
    mirror_groups,
    placed_devices,
    replica_graph,
    replica_groups,
    sub_cluster,
)
from pesto_ir.passes.rewrite.tensor_rank import interleaved, partition_specs, sequence_parallel
from pesto_ir.passes.rewrite.tensor_shard import TensorLayout
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import RING_PHASES, Parallelism, Plan, faster
from pesto_ir.schedule.validate import check_plan, collectives_for
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError, first_reason
from pesto_ir.util.loader import decode_json, read_source_text

START = "start plan"  # the engine and winner a start plan is labelled with
BUCKET_HINT = ".bucket"  # what a merged all-reduce's name holds (`passes/rewrite/collective_buckets.py`)


@dataclass
class StartPlan:
    """A start plan applied here: its strategy, the graph it is a plan of (the graph placed, or a
    replica graph rebuilt for its strategy) and the plan as given. It is compared by its own times
    (`claimed`) and checked, or re-timed where they are not valid here, only when it would be used
    (`checked`): on a 64,000-op pipeline a check takes 1.5 s of the search's time."""

    source: str
    strategy: Strategy
    graph: Graph
    given: Plan
    cluster: Cluster
    rewritten: Graph | None = None  # the replica graph as the search builds it (before buckets), for it to reuse
    rewrite_seconds: float = 0.0  # what building it took (the search's rates count it)
    _checked: Plan | None = None

    @property
    def claimed(self) -> float:
        """The step time the plan gives itself."""
        return self.given.makespan

    def beats(self, makespan: float) -> bool:
        """Whether the start is faster than `makespan`: by its own times, then checked here."""
        return faster(self.claimed, makespan) and faster(self.checked().makespan, makespan)

    def checked(self) -> Plan:
        """The plan, valid here: as given, or re-timed by the simulator with its devices and orders."""
        if self._checked is None:
            self._checked = _timed_here(self)
        return self._checked


def read_start_plan(path: str) -> Plan:
    """The plan in a `pesto-plan/1` file; what is wrong with the file is an error naming it."""
    data = decode_json(read_source_text(path), path)
    try:
        return Plan.from_json(data)
    except PestoError as e:
        raise PlaceError(f"{path}: start plan: {e}") from None


def strategy_of(plan: Plan) -> Strategy:
    """The data-parallel degree, micro-batches, optimizer state, tensor-parallel layout and
    parameters `plan` was made for."""
    par = plan.parallelism
    if par is None:
        return ONE_BATCH
    splits = tuple((n, next(i for i, a in enumerate(spec) if a is not None)) for n, spec in par.layouts
                   if any(a is not None for a in spec))
    return Strategy(par.data_parallel, par.microbatches, par.optimizer_state,
                    TensorLayout(par.tensor_parallel, splits, par.interleave, par.sequence_parallel), par.parameters)


def apply_start(graph: Graph, cluster: Cluster, plan: Plan, source: str) -> StartPlan:
    """`plan` as a plan of `graph` on `cluster` (a replica graph of it for a hybrid plan), timed here."""
    strategy = strategy_of(plan)
    started = work.now()
    try:
        target = graph if strategy == ONE_BATCH else replica_graph(graph, cluster, strategy)
    except PestoError as e:
        raise PlaceError(f"{source}: the start plan's strategy ({strategy}) gives no replica graph here: "
                         f"{first_reason(e)}") from None
    rewrite_seconds = work.now() - started
    rewritten = None if strategy == ONE_BATCH else target
    if plan.buckets:
        rewritten, target = target, target.clone()
        _merge_buckets(target, cluster, strategy, plan.buckets, source)
    _check_ops(target, plan, source, strategy)
    _check_devices(cluster, plan, _replica0(cluster, strategy), source)
    return StartPlan(source, strategy, target, plan, cluster, rewritten, rewrite_seconds)


def _timed_here(start: StartPlan) -> Plan:
    cluster, strategy, target = start.cluster, start.strategy, start.graph
    timed = _as_given(target, cluster, start.given, strategy)  # one check; re-timing is a simulation and a check
    if timed is None:
        devices = _replica0(cluster, strategy)
        sub = sub_cluster(cluster, devices) if len(devices) < len(cluster) else cluster
        try:
            timed = expand_plan(target, sub, _on(start.given, devices))
            if strategy != ONE_BATCH:
                timed = as_hybrid(target, cluster, timed, strategy)
        except PestoError as e:
            raise PlaceError(f"{start.source}: the start plan is not valid here: {first_reason(e)}") from None
    # a replica graph's bound is not computed: on a 64,000-op pipeline it takes seconds
    bound = lower_bound(target, cluster) if strategy == ONE_BATCH else None
    return dataclasses.replace(timed, algorithm=start.given.algorithm, lower_bound=bound,
                               solver={"name": START, "status": START, "winner": START},
                               notes=[f"{START} {start.source} ({strategy}), timed here"])


def _replica0(cluster: Cluster, strategy: Strategy) -> tuple[str, ...]:
    """The devices a plan of `strategy` places its ops on here: replica 0's (all of them for d = 1)."""
    return placed_devices(cluster, strategy)


def _on(plan: Plan, devices: tuple[str, ...]) -> Plan:
    """`plan` as a plain plan over `devices` (its slots kept), for the simulator to re-time."""
    return Plan(plan.graph, plan.algorithm, list(devices), dict(plan.ops), [], None)


def _as_given(target: Graph, cluster: Cluster, plan: Plan, strategy: Strategy) -> Plan | None:
    """`plan` with its own times, if they are valid on this cluster (its figures are the start's)."""
    named = dataclasses.replace(plan, devices=list(cluster.names), peak_memory=None, collectives=[],
                                parallelism=None if strategy == ONE_BATCH else Parallelism(
                                    strategy.data_parallel, strategy.microbatches,
                                    mirror_groups(cluster, strategy.data_parallel, strategy.tensor_parallel),
                                    strategy.optimizer_state, strategy.tensor_parallel, partition_specs(target),
                                    interleaved(target), strategy.parameters, sequence_parallel(target)))
    named.collectives = collectives_for(target, named)
    try:
        return check_plan(target, cluster, named)
    except PestoError:
        return None


def _merge_buckets(target: Graph, cluster: Cluster, strategy: Strategy, buckets: dict[str, list[str]],
                   source: str) -> None:
    """Merge the replica graph's collectives into the start plan's buckets, as its search merged them
    (`passes/rewrite/collective_buckets.py`), after checking that they may be: collectives of one kind that
    sum, none leading to another of its kind (else the merge could make a cycle), each in one bucket."""
    if strategy.data_parallel == 1:
        raise PlaceError(f"{source}: the start plan has buckets of collectives but no data-parallel replicas")
    cost = collective_cost(cluster, replica_groups(cluster, strategy.data_parallel))
    reaches = {kind: feeds_all_reduce(target, kind) for kind in RING_PHASES}
    taken: set[str] = set()
    for name, members in buckets.items():
        ops = []
        for member in members:
            op = target.op(member) if target.has_op(member) else None
            if op is None or op.opcode not in RING_PHASES or member in taken or not mergeable(op, reaches[op.opcode]) \
                    or op.opcode != target.op(members[0]).opcode:
                raise PlaceError(f"{source}: the start plan's bucket '{name}' holds '{member}', which is not a "
                                 f"collective of the replica graph for {strategy} that can be merged with the others "
                                 "(one kind, summed, leading to no other, in one bucket)")
            taken.add(member)
            ops.append(op)
        if target.has_op(name) or name in taken:
            raise PlaceError(f"{source}: the start plan's bucket '{name}' has the name of an op of the graph")
        merge_bucket(target, ops, cost, name)
    target.ops[:] = target.topo_order()


def _check_ops(target: Graph, plan: Plan, source: str, strategy: Strategy) -> None:
    names = {op.name for op in target.ops}
    missing = [op.name for op in target.ops if op.name not in plan.ops]
    extra = [name for name in plan.ops if name not in names]
    if not missing and not extra:
        return
    of = f"graph '{target.name}'" + ("" if strategy == ONE_BATCH else f" for {strategy}")
    bucketed = [name for name in extra if BUCKET_HINT in name]
    if bucketed:
        raise PlaceError(f"{source}: the start plan places '{bucketed[0]}', a bucket of collectives, but its "
                         "\"buckets\" do not say which collectives it holds (files written before they did)")
    what = (f"it places no op '{missing[0]}'" + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
            if missing else
            f"it places op '{extra[0]}', which the graph has not" + (f" (and {len(extra) - 1} more)" if len(extra) > 1
                                                                      else ""))
    made_for = f" (of '{plan.graph}')" if plan.graph else ""
    raise PlaceError(f"{source}: the start plan{made_for} is not a plan of {of}: {what}")


def _check_devices(cluster: Cluster, plan: Plan, devices: tuple[str, ...], source: str) -> None:
    known, allowed = set(cluster.names), set(devices)
    for name in sorted({slot.device for slot in plan.ops.values()}):
        if name not in known:
            raise PlaceError(f"{source}: the start plan puts ops on device '{name}', which this cluster has not "
                             f"(it has {', '.join(cluster.names)})")
        if name not in allowed:
            raise PlaceError(f"{source}: the start plan puts ops on device '{name}', which is not a device of "
                             f"replica 0 here ({', '.join(devices)}); a hybrid start plan's ops must be on them")
