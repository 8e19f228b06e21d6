"""Critical-path moves: improve a plan of a large graph by moving the ops that make it long.

LNS re-solves a neighbourhood exactly, but each of its steps builds a CP-SAT model of the whole
graph, so on graphs of thousands of ops it makes one or two steps in a time limit of seconds (GPT
training, 4255 ops: two steps in 12 s). This search needs only the simulator: about 50 ms a
candidate at that size on 4 devices, with the graph's simulation prepared once
(`simulate.Prepared`) and the incumbent's ops sorted by start time once per move (76 ms before).
It walks the incumbent's critical chain back from the op that ends last; where an op waited for a
transfer, it tries moving the op to its producer's device and the producer to the op's; where it
waited for its device, it tries the op on every other device. The first move whose
simulated plan is faster is kept, and the walk starts again from the new plan. Ops of a
`colocate` group move together, a faster plan whose peak memory (tensor lifetimes) overfills a
device is not taken, and each device keeps its ops in the order of their start times in the
incumbent.

The search is deterministic: candidates come in a fixed order, so the time limit only decides how
many moves are made. It stops early at a plan no single move improves.
"""

from __future__ import annotations

from collections.abc import Iterator

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import colocation_units
from pesto_ir.passes.placement.options import Incumbent
from pesto_ir.schedule.memory import fits_memory
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.simulate import Prepared, order_from_priority, simulate
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util import work

IMPROVEMENT = 1e-9  # relative: a move must shorten the plan by more than this


def improve_by_moves(graph: Graph, cluster: Cluster, start: Plan, seconds: float,
                     incumbent: Incumbent | None = None) -> Plan:
    """The plan after the improving critical-path moves found from `start` within `seconds` (on
    Ctrl-C, the plan after the moves made so far is offered to `incumbent`)."""
    state = _Moves(start)
    try:
        _search(graph, cluster, state, work.now() + seconds)
    except KeyboardInterrupt:
        if incumbent is not None:
            incumbent.offer(check_plan(graph, cluster, state.result()), graph)
        raise
    return state.result()


class _Moves:
    """The search's incumbent and the number of moves that made it."""

    def __init__(self, start: Plan) -> None:
        self.start = start
        self.best = start
        self.moves = 0

    def result(self) -> Plan:
        best, start = self.best, self.start
        if self.moves:
            best.notes = [*start.notes, f"critical-path moves: {self.moves} improving moves, "
                                        f"{start.makespan:.6g}s -> {best.makespan:.6g}s"]
            best.solver = start.solver
            best.lower_bound = start.lower_bound
        return best


def _search(graph: Graph, cluster: Cluster, state: _Moves, deadline: float) -> None:
    """Improving moves into `state` until `deadline`, or until no move helps."""
    unit = _units(graph)
    capacity = {d.name: d.memory for d in cluster.devices}
    prepared = Prepared(graph, cluster)
    failed: set[tuple[str, str]] = set()  # moves that did not help, skipped until a pass finds nothing new
    retried = False
    while work.now() < deadline:
        best = state.best
        placement = {name: slot.device for name, slot in best.ops.items()}
        sequence = _by_start(graph, best)
        improved = None
        for ops, device in _candidates(graph, cluster, best, unit):
            if work.now() >= deadline:
                break
            key = (ops[0], device)
            moving = [n for n in ops if placement[n] != device]
            if key in failed or not moving:
                continue
            trial = dict(placement)
            trial.update(dict.fromkeys(moving, device))
            plan = simulate(graph, cluster, trial, _split(sequence, trial), best.algorithm, prepared)
            if plan.makespan < best.makespan * (1 - IMPROVEMENT) and fits_memory(graph, plan, capacity, prepared.memory):
                improved = plan
                break
            failed.add(key)
        if improved is None:
            if retried or not failed:
                break
            failed.clear()  # the plan has changed since those moves failed: give them one more chance
            retried = True
            continue
        state.best, state.moves, retried = improved, state.moves + 1, False


def _by_start(graph: Graph, plan: Plan) -> list[str]:
    """The ops in the order of their start times in `plan` (then graph order): what
    `order_from_priority` gives with the starts as priorities, whatever the placement, as a plan
    starts no op before its producers (else its topological sort by them)."""
    index = {op.name: i for i, op in enumerate(graph.ops)}
    sequence = sorted(plan.ops, key=lambda n: (plan.ops[n].start, index[n]))
    position = {n: i for i, n in enumerate(sequence)}
    if all(position[p.name] < position[op.name] for op in graph.ops for p in op.producers()):
        return sequence
    priority = {name: slot.start for name, slot in plan.ops.items()}
    return [n for names in order_from_priority(graph, {n: "" for n in plan.ops}, priority).values() for n in names]


def _split(sequence: list[str], placement: dict[str, str]) -> dict[str, list[str]]:
    """`sequence` as per-device orders."""
    out: dict[str, list[str]] = {}
    for name in sequence:
        out.setdefault(placement[name], []).append(name)
    return out


def _units(graph: Graph) -> dict[str, list[str]]:
    """The ops that move with each op: its `colocate` group, or itself."""
    out: dict[str, list[str]] = {}
    for unit in colocation_units(graph.ops):
        names = [op.name for op in unit]
        out.update(dict.fromkeys(names, names))
    return out


def _candidates(graph: Graph, cluster: Cluster, plan: Plan,
                unit: dict[str, list[str]]) -> Iterator[tuple[list[str], str]]:
    """(ops to move, device) pairs along the critical chain, from its end back to its start."""
    tried: set[tuple[str, str]] = set()
    for name, waited_for, producer in _critical_chain(graph, plan):
        here = plan.ops[name].device
        if waited_for == "transfer":
            there = plan.ops[producer].device
            options = [(name, there), (producer, here)]
        elif waited_for == "device":
            options = [(name, d) for d in cluster.names if d != here]
        else:
            continue
        for op, device in options:
            key = (unit[op][0], device)
            if key not in tried:
                tried.add(key)
                yield unit[op], device


def _critical_chain(graph: Graph, plan: Plan) -> list[tuple[str, str, str]]:
    """(op, what it waited for: "transfer", "device", "data" or "start", the op it waited on),
    from the op that ends last back through whatever each op waited for."""
    slots = plan.ops
    arrival = {(t.src, t.to): t.end for t in plan.transfers}
    previous: dict[str, str] = {}
    for d in plan.devices:
        order = plan.device_order(d)
        previous.update(zip(order[1:], order))
    tol = 1e-12 + 1e-9 * plan.makespan
    name: str | None = max(slots, key=lambda n: (slots[n].end, n))
    chain: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    while name is not None and name not in seen:
        seen.add(name)
        slot = slots[name]
        step: tuple[str, str, str] = (name, "start", "")
        for p in graph.op(name).producers():
            remote = slots[p.name].device != slot.device
            ready = arrival.get((p.name, slot.device), slots[p.name].end) if remote else slots[p.name].end
            if abs(ready - slot.start) <= tol:
                step = (name, "transfer" if remote else "data", p.name)
                break
        if step[1] == "start" and name in previous and abs(slots[previous[name]].end - slot.start) <= tol:
            step = (name, "device", previous[name])
        chain.append(step)
        name = step[2] or None
    return chain
