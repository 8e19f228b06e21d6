"""Pipelines of micro-batches: GPipe and 1F1B (PipeDream-Flush, as Megatron, Alpa, JaxPP run
them), an eager schedule of the same stages, and interleaved layouts with their eager schedule.

GPipe and 1F1B are what the benchmark compares the searched plans against, so they do what those
systems do and nothing cleverer: the model is cut into S contiguous stages in forward order, one
per device of the pipeline (`stages.py`), and every stage runs its micro-batches in a fixed order
(`priorities.py`). The eager schedule keeps their stages and lets each device start, whenever it is
idle, the ready op of the oldest micro-batch (then of the longest path to the step's end): where a
graph's edges run against the fixed orders it does not wait for slots the dependencies do not need.

Interleaved layouts (`interleaved.py`) deal chunks of consecutive forward units round the devices,
which puts work on every device early and late in the step and balances at a finer grain; the best
balanced are simulated with the eager schedule, the fastest improved by moving units across chunk
edges (`_moved_units`), and the eager schedules are justified (`passes/placement/justify.py`, as the
eager schedule of contiguous stages is). On the MSR training layer graphs over 6 devices at 32
micro-batches this takes the best plan from 1.14-1.33 to 1.07-1.15 times max(total work / k,
critical path / m) (`bench/bench_pipeline.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.justify import RoundClock, justified
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.pipeline.interleaved import interleaved_layouts
from pesto_ir.passes.placement.pipeline.priorities import eager_priorities, priorities, slot_ticks
from pesto_ir.passes.placement.pipeline.stages import (
    FORWARD,
    Stages,
    Units,
    balanced_cut,
    pipeline_units,
    split_stages,
)
from pesto_ir.schedule.memory import fits_memory
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.simulate import PlanError, Prepared, order_from_priority, simulate, simulate_eager
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError
from pesto_ir.util.units import human_time

SCHEDULES = ("gpipe", "1f1b")  # the fixed schedules (`slot_ticks`)
EAGER = "eager"
INTERLEAVED = "interleaved"
PIPELINE_SCHEDULES = (*SCHEDULES, EAGER, INTERLEAVED)
# what the eager schedules' parts cost in simulations of a fixed schedule (`schedule_worth`)
LAYOUT_WORTH = 0.4  # one layout's eager simulation
JUSTIFY_WORTH = 2.0  # justifying and checking one eager schedule cut short by a deadline (one round; its set-up and memory checks weigh on large graphs)
JUSTIFY_SIMULATIONS = 6  # a justification, in simulations of a layout (kept for after the unit moves)
SIMULATED_LAYOUTS = 4  # interleaved layouts, best balanced first, whose eager schedules are simulated
JUSTIFIED_LAYOUTS = 2  # interleaved layouts, fastest first, whose eager schedules are justified
MAX_MOVES = 32  # simulations of the local search on the fastest interleaved layout (`_moved_units`) ...
MOVE_SIMULATED_OPS = 200_000  # ... and the ops they may simulate in all (about 4 s here)


class PipelineGraph:
    """`graph` over `cluster` as the pipeline schedules see it, worked out once for all the
    schedules tried on it: its placement units, the contiguous stages, and the simulator's
    preparation (on a 64,000-op pipeline each took about a second per schedule)."""

    def __init__(self, graph: Graph, cluster: Cluster) -> None:
        self.graph, self.cluster = graph, cluster

    @functools.cached_property
    def units(self) -> Units:
        return pipeline_units(self.graph, self.cluster)

    @functools.cached_property
    def stages(self) -> Stages:
        return split_stages(self.graph, self.cluster, self.units)

    @functools.cached_property
    def prepared(self) -> Prepared:
        return Prepared(self.graph, self.cluster)

    def of(self, graph: Graph, cluster: Cluster) -> PipelineGraph:
        """Itself, if worked out for `graph` and `cluster`."""
        if graph is not self.graph or cluster is not self.cluster:
            raise ValueError(f"pipeline units worked out for another graph or cluster than graph '{graph.name}'")
        return self


def pipeline_plan(graph: Graph, cluster: Cluster, schedule: str, options: PlaceOptions,
                  until: float | None = None, pipeline: PipelineGraph | None = None) -> Plan:
    """The `schedule` ("gpipe", "1f1b", "eager" or "interleaved") pipeline of `graph` over the
    devices of `cluster`, timed by the simulator and checked (memory too): contiguous stages, stage
    s on `cluster.names[s]`, or for "interleaved" the layouts of `_interleaved_plan`. Each is
    deterministic and bounded by counts, not by time, so `options` (time limits, seeds) changes
    nothing, unless `until` (a `work.now()` reading) stops the eager schedules' searches
    before their counts: the interleaved layouts' unit moves, their justifications after the
    first, and the justification rounds that would end past it (`justify.RoundClock`); a plan that
    does not fit in memory raises the validator's
    PlanError, as the real systems would run out of memory. `pipeline`: `PipelineGraph(graph,
    cluster)`, where the caller tries several schedules."""
    if schedule not in PIPELINE_SCHEDULES:
        raise PestoError(f"unknown pipeline schedule '{schedule}' (schedules: {', '.join(PIPELINE_SCHEDULES)})")
    m = microbatch_count(graph)
    pipeline = pipeline.of(graph, cluster) if pipeline else PipelineGraph(graph, cluster)
    if schedule == INTERLEAVED:
        return _interleaved_plan(pipeline, m, until)
    stages, prepared = pipeline.stages, pipeline.prepared
    where = stages.stage_of()
    placement = {name: cluster.names[s] for name, s in where.items()}
    if schedule == EAGER:
        plan = justified(graph, cluster, placement, _eager_schedule(graph, cluster, placement, schedule, prepared),
                         until, prepared)
    else:
        ticks = slot_ticks(schedule, len(cluster), m)
        order = order_from_priority(graph, placement, priorities(graph, where, ticks))
        plan = simulate(graph, cluster, placement, order, schedule, prepared)
    plan.notes.append(_note(schedule, stages, m))
    return check_plan(graph, cluster, plan)


def _eager_schedule(graph: Graph, cluster: Cluster, placement: Mapping[str, str], algorithm: str,
                    prepared: Prepared | None = None) -> Plan:
    """The eager schedule of `placement` by `eager_priorities`."""
    prepared = prepared or Prepared(graph, cluster)
    return simulate_eager(graph, cluster, placement, eager_priorities(graph, cluster, placement, prepared),
                          algorithm, prepared)


@dataclass
class Layout:
    """An interleaved layout and its eager schedule."""

    label: str
    forward_stage: list[int]  # per forward unit, in order: its device's index
    stages: Stages
    placement: dict[str, str]
    plan: Plan


def _layout(graph: Graph, cluster: Cluster, units: Units, label: str, forward_stage: list[int],
            prepared: Prepared) -> Layout:
    stages = units.stages(graph, forward_stage, len(cluster))
    placement = {name: cluster.names[s] for name, s in stages.stage_of().items()}
    return Layout(label, forward_stage, stages, placement,
                  _eager_schedule(graph, cluster, placement, INTERLEAVED, prepared))


def _interleaved_plan(pipeline: PipelineGraph, m: int, until: float | None = None) -> Plan:
    """The fastest eager schedule of the interleaved layouts: the `SIMULATED_LAYOUTS` best
    balanced are simulated (on the MSR training graphs over 6 devices the fastest was always among
    the three best balanced), the fastest improved by moving units between neighbouring chunks
    (`_moved_units`, leaving time before `until` for the justifications), and the `JUSTIFIED_LAYOUTS` fastest that fit in memory
    justified, and the improved one too (bert24_training_layer over 3 devices at m = 4: it was
    faster simulated, slower justified); after the first, none whose justification and check
    would end past `until` by the longest so far."""
    graph, cluster, units = pipeline.graph, pipeline.cluster, pipeline.units
    weights = units.weights()
    found = interleaved_layouts(weights, len(cluster), cluster.is_homogeneous())
    if not found:  # a unit too large for any slack: the contiguous stages
        found = [("contiguous stages", balanced_cut(weights, len(cluster)))]
    balanced = sorted(found, key=lambda layout: max(units.stages(graph, layout[1], len(cluster)).costs))  # stable
    prepared = pipeline.prepared  # for every layout's simulations
    started = work.now()
    layouts = [_layout(graph, cluster, units, label, stage, prepared) for label, stage in balanced[:SIMULATED_LAYOUTS]]
    each = (work.now() - started) / len(layouts)
    layouts.sort(key=lambda lay: lay.plan.makespan)
    moved = layouts[0]
    moves_until = None if until is None else until - (JUSTIFIED_LAYOUTS + 1) * JUSTIFY_SIMULATIONS * each
    if moves_until is None or work.now() + each <= moves_until:
        moved = _moved_units(graph, cluster, units, layouts[0], prepared, moves_until)
    improved = moved is not layouts[0]
    if improved:  # justified too, before the layouts it came from (it may lose to them)
        layouts.insert(0, moved)
    best: Plan | None = None
    failed: PlanError | None = None
    kept = 0
    clock, checking = RoundClock(), 0.0  # the longest justification's first round and check, for `until`
    for lay in layouts:
        if best is not None and until is not None and work.now() + clock.first + checking > until:
            break
        plan = justified(graph, cluster, lay.placement, lay.plan, until, prepared, clock)
        plan.notes.append(_note(INTERLEAVED, lay.stages, m, lay.label))
        started = work.now()
        try:
            plan = check_plan(graph, cluster, plan)
        except PlanError as e:
            failed = failed or e
            continue
        finally:
            checking = max(checking, work.now() - started)
        if best is None or plan.makespan < best.makespan:
            best = plan
        kept += 1
        if kept == JUSTIFIED_LAYOUTS + improved:
            break
    if best is None:
        assert failed is not None
        raise failed
    return best


def _moved_units(graph: Graph, cluster: Cluster, units: Units, start: Layout, prepared: Prepared,
                 until: float | None = None) -> Layout:
    """First-improvement local search from `start`: a forward unit next to one on another device
    moves there while that makes the eager schedule faster (and it fits in memory), for at most
    `MOVE_SIMULATED_OPS` ops simulated (`MAX_MOVES` simulations), none that would end after
    `until` by the longest so far: where chunks of whole units cannot balance the devices, the
    units at their edges can (GNMT-8 over 6 devices: 1.160 to 1.147 times the bound)."""
    budget = min(MAX_MOVES, MOVE_SIMULATED_OPS // max(len(graph.ops), 1))
    capacity = {d.name: d.memory for d in cluster.devices}
    best, tried, longest = start, 0, 0.0
    while tried < budget:
        for moved in _edge_moves(best.forward_stage):
            if tried == budget or (until is not None and work.now() + longest > until):
                budget = tried  # the count or the time is spent: no more moves
                break
            tried += 1
            started = work.now()
            found = _layout(graph, cluster, units, f"{start.label}, units moved", moved, prepared)
            better = found.plan.makespan < best.plan.makespan * (1 - 1e-9) and fits_memory(graph, found.plan, capacity, prepared.memory)
            longest = max(longest, work.now() - started)
            if better:
                best = found
                break
        else:
            break  # no move helps
    return best


def schedule_worth(schedule: str) -> float:
    """What `pipeline_plan` of `schedule` takes at least, in runs of a fixed schedule (the first on
    the graph, which also cuts its stages), when `until` cuts its search short: the interleaved
    layouts' simulations and one justification round for each layout kept; the eager schedule's
    simulation and one round. Uncut, on the MSR training layer graphs at m = 32 over 4 and 6
    devices, a layout's eager simulation took 0.2-0.5, justifying and checking one 0.6-5, the
    whole interleaved search 3.7 (GNMT over 4 devices, 6 moves) to 26 (BERT-24, 32 moves)."""
    if schedule == INTERLEAVED:
        return SIMULATED_LAYOUTS * LAYOUT_WORTH + JUSTIFIED_LAYOUTS * JUSTIFY_WORTH
    if schedule == EAGER:
        return LAYOUT_WORTH + JUSTIFY_WORTH
    if schedule in SCHEDULES:
        return 1.0
    raise PestoError(f"unknown pipeline schedule '{schedule}' (schedules: {', '.join(PIPELINE_SCHEDULES)})")


def _edge_moves(stage: list[int]) -> Iterator[list[int]]:
    """`stage` with one forward unit moved to the device of a neighbour in forward order that is on
    another device: first the first unit's moves, then the next's."""
    for i, here in enumerate(stage):
        for j in (i - 1, i + 1):
            if 0 <= j < len(stage) and stage[j] != here:
                yield [*stage[:i], stage[j], *stage[i + 1:]]


def _note(schedule: str, stages: Stages, m: int, layout: str = "") -> str:
    """The stage boundaries (each stage's first forward op; none where an interleaved layout left a
    device without a forward unit) and costs, for the report."""
    forward = [(ops[0].name, st) for ops, k, st in zip(stages.units, stages.kinds, stages.stage) if k == FORWARD]
    firsts = [next((repr(name) for name, st in forward if st == s), "none") for s in range(len(stages.costs))]
    costs = ", ".join(human_time(c) for c in stages.costs)
    return (f"{schedule}: {len(stages.costs)} stages, {m} micro-batch{'es' if m != 1 else ''}, "
            f"{layout + ', ' if layout else ''}stage costs {costs}; "
            f"stages start at ops {', '.join(firsts)}")


def microbatch_count(graph: Graph) -> int:
    """m from the rewrite's `microbatched` attribute, else from the ops' `microbatch` attributes (1
    for a graph that was not rewritten)."""
    attr = graph.attrs.get("microbatched")
    if attr is not None and isinstance(attr.value, dict) and "microbatches" in attr.value:
        return int(attr.value["microbatches"])
    return 1 + max((int(i) for op in graph.ops if (i := op.get("microbatch")) is not None), default=0)
