"""Pipelines of micro-batches: GPipe and 1F1B (PipeDream-Flush, as Megatron, Alpa, JaxPP run
them), an eager schedule of the same stages, and interleaved layouts with their eager schedule.

GPipe and 1F1B are what the benchmark compares the searched plans against, so they do what those
systems do and nothing cleverer: the model is cut into S contiguous stages in forward order, one
per device of the pipeline, and every stage runs its micro-batches in a fixed order. The eager
schedule keeps their stages and lets each device start, whenever it is idle, the ready op of the
oldest micro-batch (then of the longest path to the step's end): where a graph's edges run
against the fixed orders (below) it does not wait for slots the dependencies do not need.

Stages. Placement units are colocate groups (an op without `colocate` is its own unit), taken in
forward order: by the first of their forward ops in `graph.ops` that reads another op (a weight
node, which a cost graph's topological order puts first, does not say where its group computes).
Each op is

- backward: `backward = true` (cost graphs) or "transpose(" in its `scope` (JAX);
- other: not backward, and either downstream of a backward op (the optimizer update, gradient
  sums) or read only by other ops (the update's constants and its reads of optimizer state);
- forward: the rest (the model's forward pass, the loss);
- and, whatever the above, constant when it is computed from literals alone (a mask, a zero
  buffer, the loss' cotangent seed; tensor graphs only).

A unit of constants is a constant unit; else a unit is a forward unit if it holds a forward op,
else a backward unit if it holds a backward op (a weight gradient's copies and their sums), else
an other unit. Every unit takes the stage of an owning forward unit (`unit_owners`): a backward
unit the latest forward unit it reads directly, else the earliest owner among its producers; an
other unit the latest owner among its producers; a constant unit, or one with no owned producer,
the earliest owner among its consumers (else the first forward unit). The forward units are cut
into S non-empty contiguous runs minimising the largest stage's cost, a forward unit weighing the
cost of every unit it owns on the stage's device: bisection on the bottleneck with a greedy fill,
which is exact for contiguous cuts. So the stage costs are the real per-device totals.

Schedule. Every op with a `microbatch` attribute belongs to a slot (phase F or B, micro-batch i)
of its stage. On each stage GPipe runs F0 .. F(m-1), then B0 .. B(m-1); 1F1B runs w = min(S-s-1, m)
warm-up forwards, then m-w pairs (next forward, oldest backward), then drains the w backwards left.
The slots are timed once on an abstract pipeline (forward 1, backward 2 time units) and an op's
priority is its slot's start there. Along the edges of a training step (micro-batch i's forward
from stage s to s+1, its backward back down) priorities never decrease, and `order_from_priority`
pops ops in priority order, so each stage runs exactly its slot order (ties inside a slot by graph
order). Where a graph's edges run against the schedule (the MSR cost graphs' backward chains run
from the first layer to the last) the order is still valid, as close to the schedule as the
dependencies allow. An op without a micro-batch runs with its latest producer's slot (after it, by
graph order), or, with no producer in a slot, just before its first consumer. The simulator
times the orders; `check_plan` checks the plan, memory included.

Interleaved layouts. Contiguous stages balance the devices only as finely as k runs of whole units
can, and each device waits for the pipeline to fill before its first work and to drain after its
last. `interleaved_layouts` deals chunks of consecutive forward units round the devices (v chunks
per device for several v, round robin or snake, filled from either end), which puts work on every
device early and late in the step and balances at a finer grain; the best balanced are simulated
with the eager schedule, the fastest improved by moving units across chunk edges
(`_moved_units`), and the eager schedules are justified (`passes/placement/justify.py`, as the eager
schedule of contiguous stages is). On the MSR training layer graphs over 6 devices at 32
micro-batches this takes the best plan from 1.14-1.33 to 1.07-1.15 times max(total work / k,
critical path / m) (`bench/bench_pipeline.py`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import summed_costs
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.ir.types import TensorType
from pesto_ir.passes.placement.common import colocation_units
from pesto_ir.passes.placement.justify import RoundClock, justified
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.memory import fits_memory
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.simulate import PlanError, Prepared, order_from_priority, simulate, simulate_eager
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util.errors import PestoError
from pesto_ir.util.units import human_time

SCHEDULES = ("gpipe", "1f1b")  # the fixed schedules (`slot_ticks`)
EAGER = "eager"
INTERLEAVED = "interleaved"
PIPELINE_SCHEDULES = (*SCHEDULES, EAGER, INTERLEAVED)
CHUNKS_PER_DEVICE = (1, 2, 3, 4, 6, 8)  # interleaved layouts: chunks per device ...
SLACKS = (1.1, 1.25)  # ... and how far past total / k a device's chunks may take it (the second if the first fails)
# what the eager schedules' parts cost in simulations of a fixed schedule (`schedule_worth`)
LAYOUT_WORTH = 0.4  # one layout's eager simulation
JUSTIFY_WORTH = 2.0  # justifying and checking one eager schedule cut short by a deadline (one round; its set-up and memory checks weigh on large graphs)
JUSTIFY_SIMULATIONS = 6  # a justification, in simulations of a layout (kept for after the unit moves)
SIMULATED_LAYOUTS = 4  # interleaved layouts, best balanced first, whose eager schedules are simulated
JUSTIFIED_LAYOUTS = 2  # interleaved layouts, fastest first, whose eager schedules are justified
MAX_MOVES = 32  # simulations of the local search on the fastest interleaved layout (`_moved_units`) ...
MOVE_SIMULATED_OPS = 200_000  # ... and the ops they may simulate in all (about 4 s here)
FORWARD, BACKWARD, OTHER, CONSTANT = "forward", "backward", "other", "constant"
PHASE_TIME = {"F": 1.0, "B": 2.0}  # the abstract pipeline's slot lengths (backward ~ twice forward)
BISECTIONS = 60

Slot = tuple[str, int]  # (phase "F" or "B", micro-batch)


@dataclass
class Stages:
    """Where the pipeline cut the graph: each unit's ops, kind and stage; each stage's cost."""

    units: list[list[Op]]
    kinds: list[str]
    stage: list[int]  # per unit
    costs: list[float]  # per stage: seconds of every op placed there, on its device

    def stage_of(self) -> dict[str, int]:
        return {op.name: s for ops, s in zip(self.units, self.stage) for op in ops}


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
    nothing, unless `until` (a `time.perf_counter()` reading) stops the eager schedules' searches
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
    started = time.perf_counter()
    layouts = [_layout(graph, cluster, units, label, stage, prepared) for label, stage in balanced[:SIMULATED_LAYOUTS]]
    each = (time.perf_counter() - started) / len(layouts)
    layouts.sort(key=lambda lay: lay.plan.makespan)
    moved = layouts[0]
    moves_until = None if until is None else until - (JUSTIFIED_LAYOUTS + 1) * JUSTIFY_SIMULATIONS * each
    if moves_until is None or time.perf_counter() + each <= moves_until:
        moved = _moved_units(graph, cluster, units, layouts[0], prepared, moves_until)
    improved = moved is not layouts[0]
    if improved:  # justified too, before the layouts it came from (it may lose to them)
        layouts.insert(0, moved)
    best: Plan | None = None
    failed: PlanError | None = None
    kept = 0
    clock, checking = RoundClock(), 0.0  # the longest justification's first round and check, for `until`
    for lay in layouts:
        if best is not None and until is not None and time.perf_counter() + clock.first + checking > until:
            break
        plan = justified(graph, cluster, lay.placement, lay.plan, until, prepared, clock)
        plan.notes.append(_note(INTERLEAVED, lay.stages, m, lay.label))
        started = time.perf_counter()
        try:
            plan = check_plan(graph, cluster, plan)
        except PlanError as e:
            failed = failed or e
            continue
        finally:
            checking = max(checking, time.perf_counter() - started)
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
            if tried == budget or (until is not None and time.perf_counter() + longest > until):
                budget = tried  # the count or the time is spent: no more moves
                break
            tried += 1
            started = time.perf_counter()
            found = _layout(graph, cluster, units, f"{start.label}, units moved", moved, prepared)
            better = found.plan.makespan < best.plan.makespan * (1 - 1e-9) and fits_memory(graph, found.plan, capacity, prepared.memory)
            longest = max(longest, time.perf_counter() - started)
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


def interleaved_layouts(weights: list[list[float]], k: int, alike: bool = False) -> list[tuple[str, list[int]]]:
    """Distinct layouts of the forward units (their owned units' `weights` per device, in forward
    order) over k devices: `interleaved_cut` for each count of chunks per device and device order
    (round robin: 0, 1, .., k-1, 0, ..; snake: 0, .., k-1, k-1, .., 0, ..), with the first slack
    that gives one, filled from the first unit and from the last (a large last layer gets its
    device first, the units before it fill what is left). With `alike` devices (and links) a layout
    that only renames the devices of another is left out."""
    orders = {"round-robin": list(range(k)), "snake": [*range(k), *reversed(range(k))]}
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[str, list[int]]] = []
    for start in ("", " from the end"):
        for per_device in CHUNKS_PER_DEVICE:
            for name, order in orders.items():
                found = _first_cut(weights[::-1] if start else weights, order, per_device)
                if found is None:
                    continue
                found = found[::-1] if start else found
                key = _renamed(found) if alike else tuple(found)
                if key in seen:
                    continue
                seen.add(key)
                chunks = 1 + sum(1 for a, b in zip(found, found[1:]) if a != b)
                out.append((f"{chunks} chunks in {name} order{start}", found))
    return out


def _first_cut(weights: list[list[float]], order: Sequence[int], per_device: int) -> list[int] | None:
    """`interleaved_cut` with the first of `SLACKS` that gives one."""
    for slack in SLACKS:
        found = interleaved_cut(weights, order, per_device, slack)
        if found is not None:
            return found
    return None


def _renamed(devices: list[int]) -> tuple[int, ...]:
    """`devices` with the devices numbered in the order they first appear."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(d, len(first)) for d in devices)


def interleaved_cut(weights: list[list[float]], order: Sequence[int], per_device: int, slack: float
                    ) -> list[int] | None:
    """The device of each item (`weights[i][d]`, in order): items fill chunks of about the mean
    total / (k x `per_device`) each, chunk c going to the next device of the cycle `order` that
    stays within `slack` x the mean total / k; None when no device can take an item. A layout that
    puts every device's work early and late in the step: it fills and drains a pipeline sooner
    than k contiguous stages (Megatron-LM's interleaved stages), and balances it at a finer grain."""
    k = len(weights[0]) if weights else 1
    total = sum(sum(w) / k for w in weights)
    target, cap = total / (k * per_device), slack * total / k
    load = [0.0] * k
    out: list[int] = []
    c, chunk = 0, 0.0
    for w in weights:
        mean = sum(w) / k
        if chunk > 0 and chunk + mean / 2 > target:  # this chunk is full: the next device
            c, chunk = c + 1, 0.0
        for _ in range(len(order)):  # past devices without room for the item
            if load[order[c % len(order)]] + w[order[c % len(order)]] <= cap * (1 + 1e-12):
                break
            c, chunk = c + 1, 0.0
        else:
            return None
        d = order[c % len(order)]
        out.append(d)
        load[d] += w[d]
        chunk += mean
    return out


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


# ---------------------------------------------------------------- stages

def is_backward(op: Op) -> bool:
    """A backward op: cost graphs mark it, JAX's transposition names it in the scope."""
    return op.get("backward") is True or "transpose(" in str(op.get("scope", "") or "")


def op_kinds(graph: Graph) -> dict[str, str]:
    """Each op's kind (module docstring): the optimizer side is what the backward pass feeds and
    what only feeds it, so that the update of a layer's weights stays out of the forward order."""
    kind: dict[str, str] = {}
    tainted: set[str] = set()
    for op in graph.ops:
        if any(p.name in tainted for p in op.producers()) or is_backward(op):
            tainted.add(op.name)
        kind[op.name] = BACKWARD if is_backward(op) else OTHER if op.name in tainted else FORWARD
    outputs = {id(v) for v in graph.outputs}
    for op in reversed(graph.ops):
        users = op.consumers()
        if kind[op.name] == FORWARD and users and not any(id(r) in outputs for r in op.results) \
                and all(kind[u.name] == OTHER for u in users):
            kind[op.name] = OTHER
    return kind


def constant_ops(graph: Graph) -> set[str]:
    """Ops computed from literals alone (no graph input upstream, tensor results): a mask, a
    zero-filled buffer, the loss' cotangent seed. Each belongs next to its readers, not at its
    place in graph order. Cost graphs (blob values) have none: their sources are layers."""
    const: set[str] = set()
    for op in graph.ops:
        if all(isinstance(r.type, TensorType) for r in op.results) and \
                all(v.owner is not None and v.owner.name in const for v in op.operands):
            const.add(op.name)
    return const


def placement_units(graph: Graph, op_kind: dict[str, str]) -> list[list[Op]]:
    """Colocate groups (an op without one alone), in forward order: by the first of their forward
    ops (else of their ops) that reads another op. Ops that read none (weights, in cost graphs
    whose topological order puts every source first) say nothing about where a unit computes."""
    index = {op.name: i for i, op in enumerate(graph.ops)}

    def position(ops: list[Op]) -> tuple[int, int]:
        forward = [op for op in ops if op_kind[op.name] == FORWARD] or ops
        reading = [op for op in forward if op.producers()]
        return (index[(reading or forward)[0].name], index[ops[0].name])

    return sorted(colocation_units(graph.ops), key=position)


@dataclass
class Units:
    """A graph's placement units as the pipelines see them: each unit's ops and kind, the forward
    unit that owns it (`unit_owners`), the forward units in order, and each unit's cost per device."""

    units: list[list[Op]]
    kinds: list[str]
    owner: list[int]
    forward: list[int]
    cost: list[list[float]]  # per unit, per device of the cluster

    def weights(self) -> list[list[float]]:
        """Per forward unit, in order, the cost of every unit it owns on each device."""
        out = {u: [0.0] * len(self.cost[u]) for u in self.forward}
        for u, f in enumerate(self.owner):
            out[f] = [a + b for a, b in zip(out[f], self.cost[u])]
        return [out[u] for u in self.forward]

    def stages(self, graph: Graph, forward_stage: list[int], n_stages: int) -> Stages:
        """The stages when forward unit i (in order) goes to `forward_stage[i]`: every unit takes
        its owner's run of consecutive forward units on one stage, `backward_flows_back` moves
        backward units to later runs, and each run is on its stage. For contiguous stages the
        runs are the stages; for interleaved ones, where the stages go round, a later run may be
        on an earlier device, and the backward units follow the runs, not the device numbers."""
        run = [0] * len(forward_stage)
        for i in range(1, len(forward_stage)):
            run[i] = run[i - 1] + (forward_stage[i] != forward_stage[i - 1])
        device_of_run = {r: d for r, d in zip(run, forward_stage)}
        of = dict(zip(self.forward, run))
        runs = backward_flows_back(graph, self.units, self.kinds, [of[f] for f in self.owner])
        stage = [device_of_run[r] for r in runs]
        costs = [0.0] * n_stages
        for u, s in enumerate(stage):
            costs[s] += self.cost[u][s]
        return Stages(self.units, self.kinds, stage, costs)


def pipeline_units(graph: Graph, cluster: Cluster) -> Units:
    """The units, their kinds, owners and costs; refuses a graph with fewer forward units than
    devices (a stage would be empty)."""
    op_kind = op_kinds(graph)
    units = placement_units(graph, op_kind)
    const = constant_ops(graph)
    kinds = [CONSTANT if all(op.name in const for op in ops) else _unit_kind(ops, op_kind) for ops in units]
    forward = [u for u, k in enumerate(kinds) if k == FORWARD]
    if len(forward) < len(cluster):
        raise PestoError(f"graph '{graph.name}' has {len(forward)} forward placement unit(s), fewer than the "
                         f"{len(cluster)} pipeline stages: a stage would be empty")
    devices = [cluster.device(n) for n in cluster.names]
    cost = [summed_costs(ops, devices) for ops in units]
    return Units(units, kinds, unit_owners(units, kinds), forward, cost)


def split_stages(graph: Graph, cluster: Cluster, units: Units | None = None) -> Stages:
    """Units, their kinds and stages, and the stage costs, cut into contiguous stages (`units`:
    `pipeline_units(graph, cluster)`, where the caller has them)."""
    units = units or pipeline_units(graph, cluster)
    return units.stages(graph, balanced_cut(units.weights(), len(cluster)), len(cluster))


def backward_flows_back(graph: Graph, units: list[list[Op]], kinds: list[str], stage: list[int]) -> list[int]:
    """Stages where no backward unit feeds a backward unit of a later stage: gradients flow from
    the last stage to the first, and a schedule runs a stage's backward work of a micro-batch in
    one go. A backward unit whose owner rule put it before one of its backward readers (it read no
    forward value of its own layer) moves to that reader's stage."""
    unit_of = {op.name: u for u, ops in enumerate(units) for op in ops}
    stage = list(stage)
    for op in reversed(graph.ops):  # readers before what they read
        u = unit_of[op.name]
        if kinds[u] != BACKWARD:
            continue
        later = [stage[unit_of[c.name]] for c in op.consumers() if kinds[unit_of[c.name]] == BACKWARD]
        if later and max(later) > stage[u]:
            stage[u] = max(later)
    return stage


def _unit_kind(ops: list[Op], op_kind: dict[str, str]) -> str:
    found = {op_kind[op.name] for op in ops}
    return FORWARD if FORWARD in found else BACKWARD if BACKWARD in found else OTHER


def unit_owners(units: list[list[Op]], kinds: list[str]) -> list[int]:
    """The forward unit whose stage each unit takes (a forward unit owns itself). Stages grow with
    the forward order, so owners say the stage rule before the cut is known:

    - a backward unit: the latest forward unit it reads directly or that reads what it reads (the
      op it differentiates), else the earliest owner among its producers (the layer whose gradient
      it continues);
    - an other unit: the latest owner among its producers (the update runs where its gradient is);
    - with neither, and constant units: the earliest owner among its consumers (a constant joins
      its first reader; an update term that reads optimizer state only, its update), else the
      first forward unit.
    """
    unit_of = {op.name: u for u, ops in enumerate(units) for op in ops}
    producers = [{unit_of[p.name] for op in ops for p in op.producers()} - {u} for u, ops in enumerate(units)]
    # the forward units that read what a unit reads: a weight gradient (x^T dy) reads the x its
    # forward matmul (x W) read, so it belongs with that matmul even where x was made a stage earlier;
    # not through constants (a literal 0.5 that every layer reads says nothing of where a unit belongs)
    siblings = [{unit_of[c.name] for op in ops for v in op.operands
                 if v.owner is not None and kinds[unit_of[v.owner.name]] != CONSTANT
                 for c in v.users() if kinds[unit_of[c.name]] == FORWARD} - {u} for u, ops in enumerate(units)]
    consumers = [{unit_of[c.name] for op in ops for c in op.consumers()} - {u} for u, ops in enumerate(units)]
    owner = [u if k == FORWARD else -1 for u, k in enumerate(kinds)]
    for _ in range(len(units)):  # a unit may read units that first appear after it: settle to a fixed point
        changed = False
        for u, k in enumerate(kinds):
            if k in (FORWARD, CONSTANT):
                continue
            direct = [v for v in producers[u] | siblings[u] if kinds[v] == FORWARD] if k == BACKWARD else []
            known = [owner[v] for v in producers[u] if owner[v] >= 0]
            found = max(direct) if direct else (min(known) if k == BACKWARD else max(known)) if known else -1
            if found != owner[u]:
                owner[u], changed = found, True
        if not changed:
            break
    first = next(u for u, k in enumerate(kinds) if k == FORWARD)
    for u in reversed(range(len(units))):
        if owner[u] < 0:
            owner[u] = min((owner[v] for v in consumers[u] if owner[v] >= 0), default=first)
    return owner


def balanced_cut(weights: list[list[float]], n_stages: int) -> list[int]:
    """The stage of each item: S non-empty contiguous runs (needs len(weights) >= S) whose largest
    load is smallest. Bisection on the bottleneck T; `_fill(T)` is the greedy that fills each stage
    as far as T allows, which fits whenever any cut does."""
    lo, hi = 0.0, max(sum(w[s] for w in weights) for s in range(n_stages))
    best = _fill(weights, n_stages, hi)
    assert best is not None
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        found = _fill(weights, n_stages, mid)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
        if hi - lo <= 1e-12 * max(hi, 1e-30):
            break
    return best


def _fill(weights: list[list[float]], n_stages: int, limit: float) -> list[int] | None:
    """Each stage takes items while its load stays within `limit`, leaving one item per later stage;
    None when the loads do not fit."""
    n = len(weights)
    out: list[int] = []
    stage, load = 0, 0.0
    for i, w in enumerate(weights):
        if out and stage < n_stages - 1 and (load + w[stage] > limit or n - i == n_stages - 1 - stage):
            stage, load = stage + 1, 0.0
        if load + w[stage] > limit * (1 + 1e-12):
            return None
        out.append(stage)
        load += w[stage]
    return out if stage == n_stages - 1 else None


# ---------------------------------------------------------------- schedule

def stage_slots(schedule: str, s: int, n_stages: int, m: int) -> list[Slot]:
    """The order in which stage s runs its slots."""
    forwards = [("F", i) for i in range(m)]
    backwards = [("B", i) for i in range(m)]
    if schedule == "gpipe":
        return forwards + backwards
    warm = min(n_stages - s - 1, m)
    steady = [slot for i in range(m - warm) for slot in (forwards[warm + i], backwards[i])]
    return forwards[:warm] + steady + backwards[m - warm:]


def slot_ticks(schedule: str, n_stages: int, m: int) -> dict[tuple[int, str, int], float]:
    """Each (stage, phase, micro-batch) slot's start on the abstract pipeline: stages run their slots
    in `stage_slots` order; F(s, i) waits for F(s-1, i); B(s, i) for B(s+1, i), and on the last
    stage for F(s, i)."""
    seqs = [stage_slots(schedule, s, n_stages, m) for s in range(n_stages)]
    pos, free = [0] * n_stages, [0.0] * n_stages
    end: dict[tuple[int, str, int], float] = {}
    start: dict[tuple[int, str, int], float] = {}
    while any(p < len(seq) for p, seq in zip(pos, seqs)):
        progressed = False
        for s, seq in enumerate(seqs):
            while pos[s] < len(seq):
                phase, i = seq[pos[s]]
                dep = (s - 1, "F", i) if phase == "F" else (s + 1, "B", i) if s < n_stages - 1 else (s, "F", i)
                if dep[0] in (-1, n_stages) or dep in end:
                    t = max(free[s], end.get(dep, 0.0))
                    start[(s, phase, i)] = t
                    end[(s, phase, i)] = free[s] = t + PHASE_TIME[phase]
                    pos[s] += 1
                    progressed = True
                else:
                    break
        if not progressed:
            raise AssertionError(f"the {schedule} slot orders deadlock")  # not for these two schedules
    return start


def priorities(graph: Graph, stage_of: dict[str, int], ticks: dict[tuple[int, str, int], float]) -> dict[str, float]:
    """Each op's priority: its slot's tick; an op outside the slots takes its latest producer's, or
    with no producer in a slot its earliest consumer's (it runs just before that consumer)."""
    prio: dict[str, float] = {}
    for op in graph.ops:
        i = op.get("microbatch")
        if i is not None:
            prio[op.name] = ticks[(stage_of[op.name], "B" if is_backward(op) else "F", int(i))]
        else:
            found = [prio[p.name] for p in op.producers() if p.name in prio]
            if found:
                prio[op.name] = max(found)
    for op in reversed(graph.ops):
        if op.name not in prio:
            prio[op.name] = min((prio[c.name] for c in op.consumers()), default=0.0)
    return prio


def eager_priorities(graph: Graph, cluster: Cluster, placement: Mapping[str, str],
                     prepared: Prepared | None = None) -> dict[str, tuple[float, ...]]:
    """The eager schedule's choice among ready ops: the oldest micro-batch first, then the longest
    path from the op to the step's end (its cost on its device included, transfers not). Oldest
    first keeps micro-batches moving through the stages, as a pipeline must; by longest path alone
    a device would run one op for every micro-batch before the next. An op without a micro-batch
    takes its latest producer's (a gradient sum, the update), else its earliest consumer's (an
    optimizer term that reads only state runs with the first micro-batch that needs it), else 0,
    as `priorities` places such ops in the fixed schedules."""
    prepared = prepared.of(graph, cluster) if prepared else Prepared(graph, cluster)
    consumers = prepared.consumers
    to_end: dict[str, float] = {}
    for op in reversed(graph.ops):
        tail = max((to_end[c] for c in consumers[op.name]), default=0.0)
        to_end[op.name] = prepared.cost(op.name, placement[op.name]) + tail
    batch: dict[str, int] = {}
    for op in graph.ops:
        i = op.get("microbatch")
        found = [batch[p] for p in prepared.producers[op.name] if p in batch]
        if i is not None or found:
            batch[op.name] = int(i) if i is not None else max(found)
    for op in reversed(graph.ops):
        if op.name not in batch:
            batch[op.name] = min((batch[c] for c in consumers[op.name]), default=0)
    return {op.name: (float(batch[op.name]), -to_end[op.name]) for op in graph.ops}
