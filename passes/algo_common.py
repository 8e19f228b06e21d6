"""What the placement heuristics share: an indexed view of the graph, memory bookkeeping, timing.

Algorithms work on integer op indices (graph order, which the verifier keeps topological) with
costs per device read once through `pesto_ir.costs`, so their inner loops touch no attributes.
Ops of one `colocate` group form a unit that is placed as a whole; memory is reserved per unit.
Every algorithm ends in `timed_plan`: the simulator times the placement and per-device order.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pesto_ir.bounds import memory_shortfall
from pesto_ir.cluster import Cluster
from pesto_ir.costs import op_cost, op_memory, value_bytes
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph
from pesto_ir.plan import Plan
from pesto_ir.simulate import simulate


class PlacementError(PestoError):
    """An algorithm could not produce a placement (memory it cannot fit, a bad option)."""


@dataclass
class PlaceGraph:
    """A graph seen by index: op i is `graph.ops[i]`; device j is `cluster.devices[j]`."""

    graph: Graph
    cluster: Cluster
    names: list[str]
    cost: list[list[float]]  # cost[i][j]: seconds of op i on device j
    mem: list[int]
    preds: list[list[tuple[int, int]]]  # (producer, bytes op i reads from it)
    succs: list[list[int]]
    unit: list[int]  # colocation unit of each op
    unit_ops: list[list[int]]
    unit_mem: list[int]
    capacity: list[float]
    latency: list[list[float]]  # latency[a][b] of link a -> b (0 on the diagonal)
    inv_bw: list[list[float]]  # seconds per byte of link a -> b (0 on the diagonal)

    @staticmethod
    def build(graph: Graph, cluster: Cluster) -> PlaceGraph:
        index = {op.name: i for i, op in enumerate(graph.ops)}
        devices = cluster.devices
        cost = [[op_cost(op, d) for d in devices] for op in graph.ops]
        mem = [op_memory(op) for op in graph.ops]
        reads: list[dict[int, int]] = [{} for _ in graph.ops]
        for p, c, v in graph.edges():
            r = reads[index[c.name]]
            r[index[p.name]] = r.get(index[p.name], 0) + value_bytes(v)
        preds = [list(r.items()) for r in reads]
        succs: list[list[int]] = [[] for _ in graph.ops]
        for i, r in enumerate(reads):
            for p in r:
                succs[p].append(i)
        unit, unit_ops = _units(graph)
        unit_mem = [sum(mem[i] for i in ops) for ops in unit_ops]
        names = cluster.names
        latency = [[0.0 if a == b else cluster.link(a, b).latency for b in names] for a in names]
        inv_bw = [[0.0 if a == b else 1.0 / cluster.link(a, b).bandwidth for b in names] for a in names]
        return PlaceGraph(graph, cluster, [op.name for op in graph.ops], cost, mem, preds, succs, unit,
                          unit_ops, unit_mem, [d.memory for d in devices], latency, inv_bw)

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def k(self) -> int:
        return len(self.capacity)

    def transfer_time(self, a: int, b: int, nbytes: int) -> float:
        return 0.0 if a == b else self.latency[a][b] + nbytes * self.inv_bw[a][b]

    def mean_transfer_time(self, nbytes: int) -> float:
        """Seconds to send `nbytes` over an average link (0 with one device)."""
        k = self.k
        if k < 2:
            return 0.0
        total = sum(self.transfer_time(a, b, nbytes) for a in range(k) for b in range(k) if a != b)
        return total / (k * (k - 1))


def _units(graph: Graph) -> tuple[list[int], list[list[int]]]:
    """Colocation unit of every op (ops of one `colocate` group share one), units in first-op order."""
    unit: list[int] = []
    unit_ops: list[list[int]] = []
    by_group: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        g = op.get("colocate")
        if g is None:
            u = len(unit_ops)
            unit_ops.append([])
        else:
            u = by_group.setdefault(str(g), len(unit_ops))
            if u == len(unit_ops):
                unit_ops.append([])
        unit.append(u)
        unit_ops[u].append(i)
    return unit, unit_ops


class Memory:
    """Bytes reserved per device; a unit's whole memory is reserved when its first op is placed."""

    def __init__(self, pg: PlaceGraph) -> None:
        self.pg = pg
        self.used = [0] * pg.k
        self.unit_device = [-1] * len(pg.unit_ops)

    def fits(self, unit: int, device: int) -> bool:
        d = self.unit_device[unit]
        if d >= 0:
            return d == device
        return self.used[device] + self.pg.unit_mem[unit] <= self.pg.capacity[device]

    def place(self, unit: int, device: int) -> None:
        if self.unit_device[unit] < 0:
            self.unit_device[unit] = device
            self.used[device] += self.pg.unit_mem[unit]

    def roomiest(self, unit: int) -> int:
        """The device with the most memory left that fits `unit`, or -1."""
        best, room = -1, -1.0
        for d in range(self.pg.k):
            left = self.pg.capacity[d] - self.used[d]
            if self.fits(unit, d) and left > room:
                best, room = d, left
        return best

    def no_room(self, unit: int, algorithm: str) -> PlacementError:
        pg = self.pg
        ops = pg.unit_ops[unit]
        what = f"op '{pg.names[ops[0]]}'" if len(ops) == 1 else \
            f"colocation group '{pg.graph.ops[ops[0]].get('colocate')}' ({len(ops)} ops)"
        free = ", ".join(f"{pg.cluster.devices[d].name} {int(pg.capacity[d] - self.used[d])}" for d in range(pg.k))
        return PlacementError(f"{algorithm}: {what} needs {pg.unit_mem[unit]} bytes but no device has that "
                              f"much left (bytes free: {free}); try another algorithm or more devices")


def timed_plan(pg: PlaceGraph, device_of: Sequence[int], order: Sequence[Sequence[int]], algorithm: str) -> Plan:
    """The simulator's times for ops placed by `device_of`, run on each device in `order`."""
    names = pg.cluster.names
    placement = {pg.names[i]: names[device_of[i]] for i in range(pg.n)}
    per_device = {names[d]: [pg.names[i] for i in ops] for d, ops in enumerate(order)}
    return simulate(pg.graph, pg.cluster, placement, per_device, algorithm=algorithm)


def topological_orders(pg: PlaceGraph, device_of: Sequence[int]) -> list[list[int]]:
    """Per-device orders following the graph's (topological) op order."""
    order: list[list[int]] = [[] for _ in range(pg.k)]
    for i in range(pg.n):
        order[device_of[i]].append(i)
    return order


@contextlib.contextmanager
def native_stdout_silenced() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null: CBC's simplex prints there even at log level 0."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no usable descriptor 1 (embedded interpreters): nothing to silence
        yield
        return
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def longest_paths(preds: dict[Any, list[Any]], length: dict[Any, float]) -> dict[Any, float] | None:
    """Finish time of every node of a DAG given as predecessor lists (Kahn); None on a cycle."""
    succs: dict[Any, list[Any]] = {n: [] for n in preds}
    indeg = {n: len(ps) for n, ps in preds.items()}
    for n, ps in preds.items():
        for p in ps:
            if p not in succs:
                return None
            succs[p].append(n)
    ready = [n for n, k in indeg.items() if k == 0]
    start = {n: 0.0 for n in preds}
    finish: dict[Any, float] = {}
    while ready:
        n = ready.pop()
        finish[n] = start[n] + length[n]
        for s in succs[n]:
            start[s] = max(start[s], finish[n])
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return finish if len(finish) == len(preds) else None


def unplaceable_reason(graph: Graph, cluster: Cluster) -> str | None:
    """Why no placement exists when no heuristic found one (an exact solver has no warm start)."""
    problems = memory_shortfall(graph, cluster)
    if problems:
        return "no placement fits in memory: " + "; ".join(problems)
    if len(cluster) == 1:
        return f"the graph does not fit on {cluster.names[0]}"
    return None


def interchangeable_devices(first: dict[int, tuple[Any, ...]],
                            towards: Callable[[int, int], tuple[Any, ...]]) -> list[list[int]]:
    """Devices grouped by signature `first[d]`, then split until every device of a group sees each
    device outside it the same way (`towards(d, f)`: its links to and from f); groups in order."""
    sig: dict[tuple[Any, ...], list[int]] = {}
    for d, key in first.items():
        sig.setdefault(key, []).append(d)
    groups = list(sig.values())
    changed = True
    while changed:
        changed = False
        refined: list[list[int]] = []
        for g in groups:
            parts: dict[tuple[Any, ...], list[int]] = {}
            for d in g:
                outside = tuple((f, *towards(d, f)) for f in first if f not in g)
                parts.setdefault(outside, []).append(d)
            changed |= len(parts) > 1
            refined.extend(parts.values())
        groups = refined
    return groups
