"""What the hybrid search's screening measures and works to (`screening.py`): the rates of its
rewrites and heuristics so far (`Rates`), its clock readings (`ScreeningTimes`), what building a
pipelined replica graph and its schedules costs (`BuildCost`), which strategies the memory
floor rules out (`cannot_fit`) or a rank graph's walk predicts over memory (`first_predicted_to_fit`),
and whether one batch's lower bound rules it out (`one_batch_ruled_out`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.pipeline.schedules import schedule_worth
from pesto_ir.passes.placement.search.replica_memory import ReplicaMemory, variant_to_screen
from pesto_ir.passes.placement.search.strategies import Candidate
from pesto_ir.passes.rewrite.replicas import Strategy, replica_graph
from pesto_ir.passes.rewrite.tensor_shard import TensorLayout, tensor_shard
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import Plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError
from pesto_ir.util.units import human_bytes, human_time

REWRITE_SECONDS_PER_OP = 2.5e-4  # a rewrite's guessed time per op it builds, until one is timed (2e-4 here)


@dataclass
class Rates:
    """What the search has measured so far, to tell whether the next step fits in the time left:
    seconds per op of a rewrite (with its cost annotation), and seconds per op and device of the
    heuristics on one batch (list scheduling tries every device for every op); and the fastest
    plan screened so far with its graph, which Ctrl-C keeps."""

    rewrite_seconds: float = 0.0
    rewrite_ops: int = 0
    heuristic: float | None = None
    fastest: tuple[Graph, Plan] | None = None
    one_batch_bound: float | None = None  # the one-batch step's lower bound, once needed (`one_batch_ruled_out`)
    shard: bool = False  # the search may shard optimizer state (`optimizer-state=auto`, a step with state)
    fsdp: bool = False  # and then the parameters too (`parameters=auto`)
    prebuilt: dict[Strategy, Graph] = field(default_factory=dict)  # replica graphs built before: the start plan's
    halved: bool = False  # a start plan uses at most half of each replica's devices (`_on_fewer_devices` need not)
    memory: ReplicaMemory | None = None  # the one-batch graph's walk (`replica_memory.py`), made once per search
    rank_memory: dict[TensorLayout, ReplicaMemory | None] = field(default_factory=dict)  # its ranks' walks
    # per tensor-parallel layout, why its step cannot be split by samples (a rewrite's MicrobatchError):
    # no strategy of that layout with several replicas or micro-batches can be built
    unsplittable: dict[TensorLayout, str] = field(default_factory=dict)

    def screened(self, c: Candidate) -> None:
        if c.plan is not None and c.graph is not None and (self.fastest is None
                                                           or c.plan.makespan < self.fastest[1].makespan):
            self.fastest = (c.graph, c.plan)

    def rewrote(self, seconds: float, ops: int) -> None:
        self.rewrite_seconds += seconds
        self.rewrite_ops += ops

    def rewrite(self, ops: float) -> float | None:
        """Seconds to rewrite into a graph of `ops` ops, or None before any rewrite was timed."""
        return self.rewrite_seconds / self.rewrite_ops * ops if self.rewrite_ops else None

    def rewrite_or_guess(self, ops: float) -> float:
        """`rewrite`, or before any rewrite was timed, `REWRITE_SECONDS_PER_OP`'s guess."""
        measured = self.rewrite(ops)
        return REWRITE_SECONDS_PER_OP * ops if measured is None else measured

    def screening(self, ops: float, devices: int) -> float | None:
        """Seconds to rewrite into `ops` ops and run the heuristics on them over `devices` devices,
        or None before the heuristics were timed."""
        if self.heuristic is None:
            return None
        return self.rewrite_or_guess(ops) + self.heuristic * ops * devices


@dataclass(frozen=True)
class ScreeningTimes:
    """The clock readings (`work.now()`) the screening of strategies works to, taken from
    the search's `Budget`: `screened_by` ends the screening's share of the time limit (the one-batch
    heuristics' time, and the degrees' equal shares of it); `finish_by` is the last a screening step
    may end, so that bucketing, checking and refining the best plan keep the rest of the limit."""

    screened_by: float
    finish_by: float
    # work the one-batch search would get after the screening: where one batch is ruled out by its
    # lower bound (`one_batch_ruled_out`), each tensor-parallel degree not screened yet may still
    # have its first strategy screened until `finish_by + spare` (`_screen_ranks`)
    spare: float = 0.0

    def degree_end(self, stop: float, last: bool) -> float:
        """Where a degree's first schedules may go on to: the end of screening for the last degree
        screened, else the end of its share (`stop`)."""
        return self.finish_by if last else stop

def cannot_fit(strategy: Strategy, cluster: Cluster, rates: Rates) -> str:
    """Why `strategy` fits no plan, sharded as far as the search may shard it, by the memory floor
    (`ReplicaMemory.floor`: a bound, not a guess), or "" where it may fit."""
    if rates.memory is None:
        return ""
    widest = strategy
    if strategy.data_parallel > 1 and strategy.parameters != "sharded":
        widest = strategy.fully_sharded() if rates.fsdp else strategy.sharded() if rates.shard else strategy
    floor = rates.memory.floor(widest, len(cluster) // strategy.data_parallel)
    capacity = max(d.memory for d in cluster.devices)
    if floor <= capacity:
        return ""
    return (f"not screened: it cannot fit: under any plan{' of ' + str(widest) if widest != strategy else ''} "
            f"a device holds at least {human_bytes(floor)} at once, over the {human_bytes(capacity)} it has")


def one_batch_ruled_out(graph: Graph, cluster: Cluster, rates: Rates) -> str:
    """Why no one-batch plan can beat the fastest plan screened so far: the one-batch step's lower
    bound (`schedule/bounds.py`: every one-batch plan is at least as slow) is not below it; or "".
    Screening one batch then only costs time (on megatron-gpt-7.1B the heuristics took 38 s for
    1.977 s a step, its bound 1.128 s, against a tensor-parallel plan of 565.5 ms), and searching
    over strategies stays at least as fast as one batch alone."""
    if rates.fastest is None:
        return ""
    if rates.one_batch_bound is None:
        rates.one_batch_bound = lower_bound(graph, cluster)
    fastest = rates.fastest[1].makespan
    if rates.one_batch_bound < fastest:
        return ""
    return (f"not screened: one batch's lower bound, {human_time(rates.one_batch_bound, 4)}, is over the "
            f"{human_time(fastest, 4)} plan screened, so no one-batch plan can beat it")


@dataclass
class BuildCost:
    """Seconds per op of the rewrite and of a schedule's simulation and check, as measured so far
    (a schedule's first guessed at twice the rewrite's, the heuristics at three schedules'), and
    the size of a rewrite: ops per micro-batch and ops that run once."""

    rewrite: float
    ops_per_microbatch: float = 0.0
    once_ops: float = 0.0
    schedule: float | None = None

    def estimate(self, c: Candidate, engines: Sequence[str]) -> float:
        """Seconds to build `c`'s graph (unless built) and run `engines` on it (the heuristics as
        three schedules; the eager schedules cut short by a deadline, as `schedule_worth` counts
        them)."""
        built = c.source or c.graph
        ops = len(built.ops) if built is not None else self.once_ops + self.ops_per_microbatch * c.strategy.microbatches
        rate = self.schedule if self.schedule is not None else 2 * self.rewrite
        build = 0.0 if built is not None else self.rewrite * ops
        return build + rate * ops * schedules_worth(engines)

    def learn(self, c: Candidate, seconds: float, built: bool, engines: Sequence[str]) -> None:
        """`engines` on `c` took `seconds` (with the rewrite, unless `built` before)."""
        if c.source is None:
            return
        ops = len(c.source.ops)
        worth = schedules_worth(engines)
        self.schedule = max(seconds - (0.0 if built else self.rewrite * ops), 0.0) / max(ops * worth, 1)


def schedules_worth(engines: Sequence[str]) -> float:
    """What `engines` cost in simulations of a fixed schedule: the heuristics three, a pipeline
    schedule its `schedule_worth`."""
    return sum(3.0 if engine == "heuristics" else schedule_worth(engine) for engine in engines)


def ranks_predicted_to_fit(graph: Graph, cluster: Cluster, ranks: list[Strategy], rates: Rates) -> bool:
    """Whether a strategy of the largest tensor-parallel degree, one device per rank, is predicted
    to fit by its rank graph's walk (`first_predicted_to_fit`), or else a pipeline of ranks is (a
    model whose ranks outgrow one device each, alpa-gpt-39B on 64 V100s: 16 stages of 4 ranks is
    how Alpa runs it)."""
    k = len(cluster)
    capacity = min(d.memory for d in cluster.devices)
    alike = [s for s in ranks if s.data_parallel * s.tensor_parallel == k]
    if alike:
        t = max(s.tensor_parallel for s in alike)
        if first_predicted_to_fit(graph, cluster, [s for s in alike if s.tensor_parallel == t], capacity,
                                  rates) is not None:
            return True
    for d, t in sorted({(s.data_parallel, s.tensor_parallel) for s in ranks if s.data_parallel * s.tensor_parallel < k}):
        if first_predicted_to_fit(graph, cluster, [s for s in ranks if (s.data_parallel, s.tensor_parallel) == (d, t)],
                                  capacity, rates) is not None:
            return True
    return False


def first_predicted_to_fit(graph: Graph, cluster: Cluster, alike: list[Strategy], capacity: float, rates: Rates
                            ) -> Strategy | None:
    """Of strategies `alike` but for their micro-batches, the variant with the fewest
    micro-batches that the rank's walk predicts to fit in `capacity` (the least sharded that does;
    over the stages of a pipeline where a rank has several devices), or None: fewer micro-batches
    predicted over it need not be screened, as more micro-batches only hold less."""
    for s in sorted(alike, key=lambda s: s.microbatches):
        memory = rank_memory_of(graph, cluster, s, rates)
        if memory is None:
            return None
        stages = len(cluster) // (s.data_parallel * s.tensor_parallel)
        variant, _ = variant_to_screen(memory, s, capacity, rates.shard, rates.fsdp, stages)
        if variant is not None and memory.predicted_peak(variant, stages) <= capacity:
            return variant
    return None


def rank_memory_of(graph: Graph, cluster: Cluster, strategy: Strategy, rates: Rates) -> ReplicaMemory | None:
    """The walk of one rank's graph of the one-batch step, split by `strategy`'s layout (made once
    per layout; None where it has no batch to predict by): its replicas' peaks follow from it as
    one-device replicas' follow from the one-batch graph's (`ReplicaMemory.predicted_peak`). Where
    the group spans every device, that rank graph is the strategy d = 1 m = 1's replica graph,
    the first the screening tries: it is built as that (with its costs) and kept for it."""
    layout = strategy.tensor
    if layout not in rates.rank_memory:
        one_batch = Strategy(1, 1, tensor=layout)
        try:
            if layout.size == len(cluster):
                rank = rates.prebuilt[one_batch] = replica_graph(graph, cluster, one_batch)
            else:
                rank = tensor_shard(graph, layout)
            rates.rank_memory[layout] = ReplicaMemory.of(rank, graph)
        except PestoError:
            rates.rank_memory[layout] = None
    return rates.rank_memory[layout]


def rank_screening_order(graph: Graph, cluster: Cluster, todo: list[Strategy], capacity: float, rates: Rates
                         ) -> list[Strategy]:
    """Tensor-parallel strategies in the order `_screen_ranks` takes them: those the rank graph's
    walk predicts to fit first, then the largest degree; one device per rank before pipelines, and
    pipelines of fewer replicas (more stages) first: replicas all-reduce every gradient, pipeline
    stages send only activations, and across hosts the gradients cost more (alpa-gpt-39B on 64
    V100s, 25 Gb/s between hosts: d = 1 t = 8 over 8 stages gives 2.673 s, d = 2 t = 8 over 4
    stages 4.711 s); a pipeline's micro-batches from its stage count up (fewer leave stages idle,
    and one batch over several stages is list-scheduled near memory), then fewer first."""
    k = len(cluster)

    def key(s: Strategy) -> tuple[bool, int, bool, int, bool, int, Strategy]:
        stages = k // (s.data_parallel * s.tensor_parallel)
        return (not rank_predicted_to_fit(graph, cluster, s, capacity, rates), -s.tensor_parallel, stages > 1,
                s.data_parallel, s.microbatches < stages, s.microbatches, s)

    return sorted(todo, key=key)


def rank_predicted_to_fit(graph: Graph, cluster: Cluster, strategy: Strategy, capacity: float, rates: Rates) -> bool:
    """Whether the rank graph's walk predicts `strategy` (its least sharded variant that does) to
    fit in `capacity` over its stages (`first_predicted_to_fit`); True where it predicts nothing."""
    if rank_memory_of(graph, cluster, strategy, rates) is None:
        return True  # no prediction: nothing to rank it below
    return first_predicted_to_fit(graph, cluster, [strategy], capacity, rates) is not None


def first_end(graph: Graph, cluster: Cluster, times: ScreeningTimes, rates: Rates, one_batch_next: bool) -> float:
    """Until when a tensor-parallel degree's first strategy may start: the end of the screening,
    and past it by `times.spare` where one batch, still to come, is ruled out by its bound."""
    if times.finish_by < work.now() <= times.finish_by + times.spare and one_batch_next \
            and not work.was_cut() and one_batch_ruled_out(graph, cluster, rates):
        return times.finish_by + times.spare
    return times.finish_by
