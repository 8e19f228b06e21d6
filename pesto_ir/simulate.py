"""Discrete-event simulation of a placed, ordered graph (the semantics of `pesto-plan/1`).

Each device runs its ops one at a time in the given order. An op starts once its device is free
and every input is on that device: a producer on the same device has ended, or the transfer of a
producer's results from another device has arrived. A producer's results are sent once per
destination device (all the results ops there read, as one message); transfers on one directed
link run one at a time, first come first served (ops that end at the same time send in graph
order). Graph inputs are available everywhere at time 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from pesto_ir.cluster import Cluster
from pesto_ir.costs import op_cost, value_bytes
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph, Op
from pesto_ir.plan import OpSlot, Plan, Transfer


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
    src = placement[op.name]
    out: dict[str, int] = {}
    for r in op.results:
        devices = {placement[user.name] for user in r.users()} - {src}
        for d in devices:
            out[d] = out.get(d, 0) + value_bytes(r)
    return out


def simulate(graph: Graph, cluster: Cluster, placement: Mapping[str, str],
             order: Mapping[str, Sequence[str]], algorithm: str = "") -> Plan:
    """Times for every op and transfer when each device runs `order[device]` in sequence."""
    _check_inputs(graph, cluster, placement, order)
    ops = {op.name: op for op in graph.ops}
    cost = {name: op_cost(op, cluster.device(placement[name])) for name, op in ops.items()}
    producers = {op.name: [p.name for p in op.producers()] for op in graph.ops}
    pos = {d: 0 for d in cluster.names}
    device_free = {d: 0.0 for d in cluster.names}
    link_free: dict[tuple[str, str], float] = {}
    finished: dict[str, float] = {}
    arrived: dict[tuple[str, str], float] = {}  # (producer, device) -> time its data is there
    slots: dict[str, OpSlot] = {}
    transfers: list[Transfer] = []
    # (time, rank, seq, kind, op, device): ops that end together send in graph order, so the order of
    # transfers on a link does not depend on which device's order listed its op first
    index = {op.name: i for i, op in enumerate(graph.ops)}
    events: list[tuple[float, int, int, str, str, str]] = []
    seq = 0

    def ready_time(name: str, device: str) -> float | None:
        t = 0.0
        for p in producers[name]:
            at = finished.get(p) if placement[p] == device else arrived.get((p, device))
            if at is None:
                return None
            t = max(t, at)
        return t

    def try_start(device: str) -> None:
        nonlocal seq
        queue = order.get(device, ())
        while pos[device] < len(queue):
            name = queue[pos[device]]
            ready = ready_time(name, device)
            if ready is None:
                return
            start = max(device_free[device], ready)
            end = start + cost[name]
            slots[name] = OpSlot(device, start, end)
            device_free[device] = end
            pos[device] += 1
            heapq.heappush(events, (end, index[name], seq, "op", name, device))
            seq += 1

    for d in cluster.names:
        try_start(d)
    while events:
        t, _, _, kind, name, device = heapq.heappop(events)
        if kind == "op":
            finished[name] = t
            for dst, nbytes in sorted(transfer_bytes(ops[name], placement).items()):
                link = (device, dst)
                start = max(t, link_free.get(link, 0.0))
                end = start + cluster.transfer_time(device, dst, nbytes)
                link_free[link] = end
                transfers.append(Transfer(name, device, dst, start, end, nbytes))
                heapq.heappush(events, (end, len(index), seq, "xfer", name, dst))
                seq += 1
            try_start(device)
        else:
            arrived[(name, device)] = t
            try_start(device)

    if len(slots) != len(ops):
        stuck = {d: order[d][pos[d]] for d in cluster.names if pos[d] < len(order.get(d, ()))}
        waits = ", ".join(f"{d} waits at op '{n}'" for d, n in sorted(stuck.items()))
        raise PlanError([f"the device orders deadlock: {waits} (an op is ordered before one it depends on)"],
                        context="cannot simulate the plan")
    return Plan(graph.name, algorithm, list(cluster.names), {n: slots[n] for n in ops}, transfers)


def _check_inputs(graph: Graph, cluster: Cluster, placement: Mapping[str, str],
                  order: Mapping[str, Sequence[str]]) -> None:
    problems: list[str] = []
    names = set(cluster.names)
    for op in graph.ops:
        d = placement.get(op.name)
        if d is None:
            problems.append(f"op '{op.name}' is not placed")
        elif d not in names:
            problems.append(f"op '{op.name}' is placed on unknown device '{d}'")
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


def order_from_priority(graph: Graph, placement: Mapping[str, str],
                        priority: Mapping[str, float] | Mapping[str, tuple[float, ...]] | None = None
                        ) -> dict[str, list[str]]:
    """Per-device orders that respect dependencies: a topological order, ties by `priority` (a
    number or a tuple of numbers per op), then graph position."""
    index = {op.name: i for i, op in enumerate(graph.ops)}
    key = (lambda n: (priority[n], index[n])) if priority is not None else (lambda n: (index[n],))
    indeg = {op.name: len(op.producers()) for op in graph.ops}
    ready = [(key(op.name), op.name) for op in graph.ops if indeg[op.name] == 0]
    heapq.heapify(ready)
    out: dict[str, list[str]] = {}
    while ready:
        _, name = heapq.heappop(ready)
        out.setdefault(placement[name], []).append(name)
        for c in graph.op(name).consumers():
            indeg[c.name] -= 1
            if indeg[c.name] == 0:
                heapq.heappush(ready, (key(c.name), c.name))
    return out
