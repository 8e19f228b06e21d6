"""Discrete-event simulation of a placed, ordered graph (the semantics of `pesto-plan/1`).

Each device runs its ops one at a time in the given order. An op starts once its device is free
and every input is on that device: a producer on the same device has ended, or the transfer of a
producer's results from another device has arrived. A producer's results are sent once per
destination device (all the results ops there read, as one message); transfers on one directed
link run one at a time, first come first served (ops that end at the same time send in graph
order). Graph inputs are available everywhere at time 0.

`simulate` runs given per-device orders; `simulate_eager` chooses the order as it goes (each idle
device starts its ready op of least priority), with the same timing of ops and transfers.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, value_bytes
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.schedule.memory import GraphBytes, reader_names
from pesto_ir.schedule.plan import OpSlot, Plan, Transfer, tie_ranks
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError


class PlanError(PestoError):
    """A plan breaks a rule (or cannot be executed at all); lists every problem found."""

    def __init__(self, problems: list[str], context: str = "invalid plan") -> None:
        self.problems = problems
        self.context = context
        shown = problems[:20]
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{context}:\n  " + "\n  ".join(shown) + more)

    def format(self) -> str:
        return f"error: {self}"


def transfer_bytes(op: Op, placement: Mapping[str, str]) -> dict[str, int]:
    """Bytes `op` must send to each other device: its results read by ops placed there."""
    return sends(_results(op), placement[op.name], placement)


def _results(op: Op) -> list[tuple[int, Sequence[str]]]:
    """Each result's bytes and the names of the ops that read it."""
    return [(value_bytes(r), reader_names(r)) for r in op.results]


def sends(results: Sequence[tuple[int, Sequence[str]]], src: str, placement: Mapping[str, str]) -> dict[str, int]:
    """Bytes an op on `src` must send to each other device, from its results' (bytes, readers)."""
    out: dict[str, int] = {}
    for nbytes, users in results:
        if not users:
            continue
        for d in {placement[u] for u in users} - {src}:
            out[d] = out.get(d, 0) + nbytes
    return out


class Prepared:
    """What simulating `graph` on `cluster` needs that no placement changes: each op's producers,
    its results' bytes and readers, its cost on each device (looked up once). A search that times
    many placements of one graph prepares it once and hands it to `simulate` (critical-path moves
    on the JAX LSTM's 4,441 ops: 2/5 of each simulation was this)."""

    def __init__(self, graph: Graph, cluster: Cluster) -> None:
        self.graph, self.cluster = graph, cluster
        self.ops = {op.name: op for op in graph.ops}
        self.index = {name: i for i, name in enumerate(self.ops)}
        self.producers = {op.name: [p.name for p in op.producers()] for op in graph.ops}
        self.results = {op.name: _results(op) for op in graph.ops}
        self._cost: dict[tuple[str, str], float] = {}
        self._placed: tuple[tuple[str, ...], Placed] | None = None

    @functools.cached_property
    def consumers(self) -> dict[str, list[str]]:
        """Each op's consumers (for searches that walk the graph backward)."""
        return {op.name: [c.name for c in op.consumers()] for op in self.graph.ops}

    @functools.cached_property
    def memory(self) -> GraphBytes:
        """The graph's bytes, for checking the memory of the plans simulated (`memory.fits_memory`)."""
        return GraphBytes(self.graph)

    def cost(self, name: str, device: str) -> float:
        key = (name, device)
        seconds = self._cost.get(key)
        if seconds is None:
            seconds = self._cost[key] = op_cost(self.ops[name], self.cluster.device(device))
        return seconds

    def costs(self, placement: Mapping[str, str]) -> dict[str, float]:
        """`cost` of each op of `placement` on its device, in its order (one call for them all)."""
        known, ops, device = self._cost, self.ops, self.cluster.device
        out: dict[str, float] = {}
        for name, d in placement.items():
            seconds = known.get((name, d))
            if seconds is None:
                seconds = known[(name, d)] = op_cost(ops[name], device(d))
            out[name] = seconds
        return out

    def placed(self, placement: Mapping[str, str]) -> Placed:
        """`Placed` for `placement` (every op placed), kept for the last placement asked: the
        rounds of a justification simulate one placement again and again (on a 64,000-op
        pipeline, its messages took a third of each simulation)."""
        key = tuple(placement[name] for name in self.ops)
        if self._placed is None or self._placed[0] != key:
            self._placed = (key, Placed(self, placement))
        return self._placed[1]

    def of(self, graph: Graph, cluster: Cluster) -> Prepared:
        """Itself, if prepared for `graph` and `cluster`."""
        if graph is not self.graph or cluster is not self.cluster:
            raise ValueError(f"a simulation prepared for another graph or cluster than graph '{graph.name}'")
        return self


class Placed:
    """What simulating `graph` with one placement needs that no order changes: each op's cost on
    its device, its messages (destination, bytes, seconds on the link, by destination) and, for
    the eager schedule, each producer's readers per device."""

    def __init__(self, prepared: Prepared, placement: Mapping[str, str]) -> None:
        self.placement = {name: placement[name] for name in prepared.ops}  # a copy: the caller's may change
        self.producers = prepared.producers
        self.cost = prepared.costs(self.placement)
        link = prepared.cluster.transfer_time
        self.sends: dict[str, list[tuple[str, int, float]]] = {}
        for name, src in self.placement.items():
            out = sends(prepared.results[name], src, self.placement)
            self.sends[name] = [(dst, nbytes, link(src, dst, nbytes)) for dst, nbytes in sorted(out.items())] if out else []

    @functools.cached_property
    def readers(self) -> dict[tuple[str, str], list[str]]:
        """(producer, device) -> the ops there that read it, in graph order."""
        out: dict[tuple[str, str], list[str]] = {}
        for name, producers in self.producers.items():
            for p in producers:
                out.setdefault((p, self.placement[name]), []).append(name)
        return out


class _Timeline:
    """What a simulation has timed so far: op slots, transfers, when each op's results are on each
    device, and the pending events (an op ending, a transfer arriving)."""

    def __init__(self, prepared: Prepared, placement: Mapping[str, str]) -> None:
        self.cluster, self.placed = prepared.cluster, prepared.placed(placement)
        self.ops = prepared.ops
        self.cost = self.placed.cost
        self.producers = prepared.producers
        self.device_free = {d: 0.0 for d in self.cluster.names}
        self.link_free: dict[tuple[str, str], float] = {}
        self.slots: dict[str, OpSlot] = {}
        self.transfers: list[Transfer] = []
        # (time, rank, seq, kind, op, device): ops that end together send in graph order, so the order of
        # transfers on a link does not depend on which device's order listed its op first
        self.index = prepared.index
        self.events: list[tuple[float, int, int, str, str, str]] = []
        self.seq = 0

    def start(self, name: str, device: str, ready: float) -> None:
        """Runs `name` on `device` once the device is free and `ready` (its inputs there) has come."""
        start = max(self.device_free[device], ready)
        end = start + self.cost[name]
        self.slots[name] = OpSlot(device, start, end)
        self.device_free[device] = end
        heapq.heappush(self.events, (end, self.index[name], self.seq, "op", name, device))
        self.seq += 1

    def next_event(self) -> tuple[float, str, str, str]:
        """Pops the next event: an op's end (its results are on its device, and sent to the devices
        that read them) or a transfer's arrival (its data is on its device); the caller counts down
        the readers there (`Placed.readers`)."""
        t, _, _, kind, name, device = heapq.heappop(self.events)
        if kind == "op":
            for dst, nbytes, seconds in self.placed.sends[name]:
                link = (device, dst)
                start = max(t, self.link_free.get(link, 0.0))
                end = start + seconds
                self.link_free[link] = end
                self.transfers.append(Transfer(name, device, dst, start, end, nbytes))
                heapq.heappush(self.events, (end, len(self.index), self.seq, "xfer", name, dst))
                self.seq += 1
        return t, kind, name, device

    def peek(self) -> float:
        """The time of the next event."""
        return self.events[0][0]

    def plan(self, name: str, algorithm: str) -> Plan:
        """The plan of graph `name` once every op has run (ops in graph order), with the order of the
        ops its times leave open (`slots` holds them in the order they started)."""
        return Plan(name, algorithm, list(self.cluster.names), {n: self.slots[n] for n in self.ops}, self.transfers,
                    ties=tie_ranks(self.slots))


def simulate(graph: Graph, cluster: Cluster, placement: Mapping[str, str],
             order: Mapping[str, Sequence[str]], algorithm: str = "", prepared: Prepared | None = None) -> Plan:
    """Times for every op and transfer when each device runs `order[device]` in sequence (`prepared`:
    `Prepared(graph, cluster)`, for a caller that simulates the graph many times)."""
    _check_inputs(graph, cluster, placement, order)
    work.charge("simulate", len(graph.ops))
    run = _Timeline(prepared.of(graph, cluster) if prepared else Prepared(graph, cluster), placement)
    pos = {d: 0 for d in cluster.names}
    # Per op, its inputs not yet on its device and when the last of those came: each event counts
    # down its readers there, so an op read from N producers costs N in all, where asking all N
    # again at every arrival cost N^2 (a 20,000 -> 1 reverse star took 70 s to simulate).
    waiting = {name: len(ps) for name, ps in run.producers.items()}
    inputs_at = dict.fromkeys(run.producers, 0.0)
    readers = run.placed.readers

    def try_start(device: str) -> None:
        queue = order.get(device, ())
        i = pos[device]
        while i < len(queue) and not waiting[queue[i]]:
            run.start(queue[i], device, inputs_at[queue[i]])
            i += 1
        pos[device] = i

    for d in cluster.names:
        try_start(d)
    while run.events:
        t, _, name, device = run.next_event()
        for reader in readers.get((name, device), ()):
            waiting[reader] -= 1
            inputs_at[reader] = max(inputs_at[reader], t)
        try_start(device)

    if len(run.slots) != len(run.ops):
        stuck = {d: order[d][pos[d]] for d in cluster.names if pos[d] < len(order.get(d, ()))}
        waits = ", ".join(f"{d} waits at op '{n}'" for d, n in sorted(stuck.items()))
        raise PlanError([f"the device orders deadlock: {waits} (an op is ordered before one it depends on)"],
                        context="cannot simulate the plan")
    return run.plan(graph.name, algorithm)


def simulate_eager(graph: Graph, cluster: Cluster, placement: Mapping[str, str],
                   priority: Mapping[str, tuple[float, ...]], algorithm: str = "",
                   prepared: Prepared | None = None) -> Plan:
    """Times for every op and transfer when each device, whenever it is idle, starts the op of
    least `priority` (then graph order) among its ops whose inputs are there: a list schedule of a
    fixed placement, timed as `simulate` times an order (the plan's orders are its start times).

    Devices choose once the events pending at that time (ops that end, transfers that arrive, at
    exactly the same time) have all been seen, so the choice does not depend on the order of
    those events; an op of no duration started then ends after the choice. `prepared`: as for
    `simulate`."""
    problems = _placement_problems(graph, cluster, placement)
    unranked = [op.name for op in graph.ops if op.name not in priority]
    if unranked:
        problems.append(f"{len(unranked)} op(s) have no priority, e.g. '{unranked[0]}'")
    if problems:
        raise PlanError(problems, context="cannot simulate the plan")
    work.charge("simulate", 2 * len(graph.ops))  # a heap of ready ops per device: about twice `simulate`'s work
    run = _Timeline(prepared.of(graph, cluster) if prepared else Prepared(graph, cluster), placement)
    waiting = {name: len(ps) for name, ps in run.producers.items()}  # inputs not yet on the op's device
    readers = run.placed.readers
    ready: dict[str, list[tuple[tuple[float, ...], int, str]]] = {d: [] for d in cluster.names}
    busy: set[str] = set()

    def now_ready(names: Iterable[str]) -> None:
        for name in names:
            heapq.heappush(ready[placement[name]], (priority[name], run.index[name], name))

    now_ready(name for name, n in waiting.items() if n == 0)
    now = 0.0
    devices = cluster.names
    while True:
        for d in devices:
            if d not in busy and ready[d]:
                run.start(heapq.heappop(ready[d])[2], d, now)
                busy.add(d)
        if not run.events:
            break
        now = run.peek()
        while run.events and run.peek() == now:
            _, kind, name, device = run.next_event()
            if kind == "op":
                busy.discard(device)
            arrived = readers.get((name, device), [])
            for reader in arrived:
                waiting[reader] -= 1
            now_ready(r for r in arrived if waiting[r] == 0)
    if len(run.slots) != len(run.ops):  # not a DAG in graph order: an op waits for one after it
        never = next(op.name for op in graph.ops if op.name not in run.slots)
        raise PlanError([f"{len(run.ops) - len(run.slots)} op(s) never had their inputs, e.g. '{never}'"],
                        context="cannot simulate the plan")
    return run.plan(graph.name, algorithm)


def _placement_problems(graph: Graph, cluster: Cluster, placement: Mapping[str, str]) -> list[str]:
    """Ops not placed, or placed on a device the cluster does not have."""
    problems: list[str] = []
    names = set(cluster.names)
    for op in graph.ops:
        d = placement.get(op.name)
        if d is None:
            problems.append(f"op '{op.name}' is not placed")
        elif d not in names:
            problems.append(f"op '{op.name}' is placed on unknown device '{d}'")
    return problems


def _check_inputs(graph: Graph, cluster: Cluster, placement: Mapping[str, str],
                  order: Mapping[str, Sequence[str]]) -> None:
    problems = _placement_problems(graph, cluster, placement)
    seen: set[str] = set()
    for d, names_on in order.items():
        for n in names_on:
            if n in seen:
                problems.append(f"op '{n}' appears twice in the device orders")
            seen.add(n)
            if placement.get(n) != d:
                problems.append(f"op '{n}' is in the order of {d} but placed on {placement.get(n)}")
    missing = [op.name for op in graph.ops if op.name not in seen]
    if missing:
        problems.append(f"{len(missing)} op(s) are in no device order, e.g. '{missing[0]}'")
    if problems:
        raise PlanError(problems, context="cannot simulate the plan")


def recorded_order(graph: Graph, plan: Plan) -> dict[str, list[str]]:
    """Per-device orders that run `plan` as recorded: by start, then end, then `plan.ties`, then
    graph position, but topologically (`order_from_priority`).

    Given a plan the simulator timed, `simulate` with these orders gives it again, every time to
    the bit: on a device, an op ends no later than the next one starts, so starts and ends never
    decrease along its order, and ops with the same start and end (of no duration) are in the
    order their ties say they ran. The end matters: a zero-length op that starts with a longer
    one ran first (after it, it would have started at its end), and run second it would send its
    results that much later. Topologically, because a solver's plan may put a zero-length
    producer's start one rounding error after its consumer's, and sorting alone would deadlock."""
    placement = {name: slot.device for name, slot in plan.ops.items()}
    ties = plan.ties
    return order_from_priority(graph, placement, {name: (slot.start, slot.end, ties.get(name, 0))
                                                  for name, slot in plan.ops.items()})


def order_from_priority(graph: Graph, placement: Mapping[str, str],
                        priority: Mapping[str, float] | Mapping[str, tuple[float, ...]] | None = None
                        ) -> dict[str, list[str]]:
    """Per-device orders that respect dependencies: a topological order, ties by `priority` (a
    number or a tuple of numbers per op), then graph position."""
    ops = graph.ops
    index = {op.name: i for i, op in enumerate(ops)}
    key = _order_key(priority, index)
    indeg = {op.name: len(op.producers()) for op in ops}
    # (key, op): keys differ in the graph position at the latest, so ops are never compared
    ready: list[tuple[Any, Op]] = [(key(op.name), op) for op in ops if indeg[op.name] == 0]
    heapq.heapify(ready)
    out: dict[str, list[str]] = {}
    while ready:
        _, op = heapq.heappop(ready)
        device = placement[op.name]
        names = out.get(device)
        if names is None:
            out[device] = names = []
        names.append(op.name)
        for c in op.consumers():
            left = indeg[c.name] - 1
            indeg[c.name] = left
            if left == 0:
                heapq.heappush(ready, (key(c.name), c))
    return out


def _order_key(priority: Mapping[str, float] | Mapping[str, tuple[float, ...]] | None,
               index: dict[str, int]) -> Callable[[str], tuple[Any, ...]]:
    """`order_from_priority`'s heap key of an op: (its priority, its graph position). Tuples of one
    length are spread into the key, (*priority, position): tuples compare element by element
    either way, so ops come out in the same order, and flat keys compare faster (recorded orders
    of 50,000 ops)."""
    if priority is None:
        return lambda n: (index[n],)
    ranks = iter(priority.values())
    first = next(ranks, None)
    if type(first) is tuple and all(type(p) is tuple and len(p) == len(first) for p in ranks):
        spread = cast("Mapping[str, tuple[float, ...]]", priority)
        return lambda n: (*spread[n], index[n])
    return lambda n: (priority[n], index[n])
