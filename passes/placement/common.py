"""What the placement heuristics share: an indexed view of the graph, memory bookkeeping, timing.

Algorithms work on integer op indices (graph order, which the verifier keeps topological) with
costs per device read once through `pesto_ir.cost.lookup`, so their inner loops touch no attributes.
Ops of one `colocate` group form a unit that is placed as a whole. `Memory` follows the bytes each
device holds as ops are committed in the order a device runs them (tensor lifetimes, as
`pesto_ir.schedule.memory` counts them for a timed plan). Every algorithm ends in `timed_plan`: the
simulator times the placement and per-device order, and `check_plan` re-checks the exact peak.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, op_memory, value_bytes
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.schedule.bounds import memory_shortfall
from pesto_ir.schedule.memory import footprints, output_bytes, peak_bytes, peak_memory, workspace_bytes
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.simulate import simulate
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError


class PlacementError(PestoError):
    """An algorithm could not produce a placement (memory it cannot fit, a bad option)."""


@dataclass
class PlaceGraph:
    """A graph seen by index: op i is `graph.ops[i]`; device j is `cluster.devices[j]`."""

    graph: Graph
    cluster: Cluster
    names: list[str]
    cost: list[list[float]]  # cost[i][j]: seconds of op i on device j
    mem: list[int]  # footprint: every byte op i holds, as if all lived for the whole step
    resident: list[int]  # bytes op i holds for the whole step (its `memory`)
    out: list[int]  # bytes of op i's output, held until its readers are done
    work: list[int]  # scratch bytes op i holds while it runs
    inputs: list[list[tuple[int, int]]]  # (graph input, bytes) op i reads
    keep: list[bool]  # whether op i's output is a graph output (held to the end of the step)
    preds: list[list[tuple[int, int]]]  # (producer, bytes op i reads from it)
    succs: list[list[int]]
    unit: list[int]  # colocation unit of each op
    unit_ops: list[list[int]]
    unit_mem: list[int]
    unit_resident: list[int]
    capacity: list[float]
    latency: list[list[float]]  # latency[a][b] of link a -> b (0 on the diagonal)
    inv_bw: list[list[float]]  # seconds per byte of link a -> b (0 on the diagonal)

    @staticmethod
    def build(graph: Graph, cluster: Cluster) -> PlaceGraph:
        index = {op.name: i for i, op in enumerate(graph.ops)}
        devices = cluster.devices
        cost = [[op_cost(op, d) for d in devices] for op in graph.ops]
        footprint = footprints(graph)
        mem = [footprint[op.name] for op in graph.ops]
        resident = [op_memory(op) for op in graph.ops]
        input_index = {id(v): x for x, v in enumerate(graph.inputs)}
        inputs = [[(input_index[id(v)], v.type.nbytes) for v in dict.fromkeys(op.operands) if id(v) in input_index]
                  for op in graph.ops]
        outputs = {id(v) for v in graph.outputs}
        keep = [any(id(r) in outputs for r in op.results) for op in graph.ops]
        reads: list[dict[int, int]] = [{} for _ in graph.ops]
        for p, c, v in graph.edges():
            r = reads[index[c.name]]
            r[index[p.name]] = r.get(index[p.name], 0) + value_bytes(v)
        preds = [list(r.items()) for r in reads]
        succs: list[list[int]] = [[] for _ in graph.ops]
        for i, r in enumerate(reads):
            for q in r:
                succs[q].append(i)
        unit, unit_ops = unit_indices(graph.ops)
        unit_mem = [sum(mem[i] for i in ops) for ops in unit_ops]
        unit_resident = [sum(resident[i] for i in ops) for ops in unit_ops]
        names = cluster.names
        latency = [[0.0 if a == b else cluster.link(a, b).latency for b in names] for a in names]
        inv_bw = [[0.0 if a == b else 1.0 / cluster.link(a, b).bandwidth for b in names] for a in names]
        return PlaceGraph(graph, cluster, [op.name for op in graph.ops], cost, mem, resident,
                          [output_bytes(op) for op in graph.ops], [workspace_bytes(op) for op in graph.ops],
                          inputs, keep, preds, succs, unit, unit_ops, unit_mem, unit_resident,
                          [d.memory for d in devices], latency, inv_bw)

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def k(self) -> int:
        return len(self.capacity)

    def transfer_time(self, a: int, b: int, nbytes: int) -> float:
        return 0.0 if a == b else self.latency[a][b] + nbytes * self.inv_bw[a][b]

    def mean_transfer_time(self, nbytes: int) -> float:
        """Seconds to send `nbytes` over an average link (0 with one device): the mean latency plus
        `nbytes` over the links' harmonic mean bandwidth, the mean of every link's time."""
        latency, inv_bw = self._mean_link
        return latency + nbytes * inv_bw

    @functools.cached_property
    def _mean_link(self) -> tuple[float, float]:
        """The mean latency and inverse bandwidth over the ordered pairs of distinct devices, summed
        once: m-SCT asks for every edge (on 64 devices, 4,032 links for each of 32,537 edges: 178 s)."""
        k = self.k
        if k < 2:
            return 0.0, 0.0
        pairs = k * (k - 1)
        return (sum(sum(row) for row in self.latency) / pairs, sum(sum(row) for row in self.inv_bw) / pairs)


def is_backward(op: Op) -> bool:
    """A backward op: cost graphs mark it, JAX's transposition names it in the scope."""
    return op.get("backward") is True or "transpose(" in str(op.get("scope", "") or "")


def colocation_units(ops: Sequence[Op]) -> list[list[Op]]:
    """Ops grouped by `colocate` attribute (an op without one alone), each group's ops in the order
    of `ops`, the groups in the order of their first op: the units every algorithm places whole."""
    units: list[list[Op]] = []
    where: dict[str, int] = {}
    for op in ops:
        g = op.get("colocate")
        if g is None:
            units.append([op])
            continue
        key = str(g)
        if key not in where:
            where[key] = len(units)
            units.append([])
        units[where[key]].append(op)
    return units


def unit_indices(ops: Sequence[Op]) -> tuple[list[int], list[list[int]]]:
    """`colocation_units(ops)` by position in `ops`: (the unit of each op, the ops of each unit)."""
    index = {op.name: i for i, op in enumerate(ops)}
    unit_ops = [[index[op.name] for op in members] for members in colocation_units(ops)]
    unit = [0] * len(ops)
    for u, members in enumerate(unit_ops):
        for i in members:
            unit[i] = u
    return unit, unit_ops


# Failed `Memory.fits` checks per op and device before a schedule gives up (where memory barely holds
# the step, pairs are re-checked after every commit: docs/hybrid.md, the work clock), never fewer than
# `MIN_FAILED_CHECKS` (about a second: a small graph's retries cost nothing), charged in batches
MAX_FAILED_CHECKS_PER_PAIR, MIN_FAILED_CHECKS, FAILED_CHECKS_CHARGED = 2, 100_000, 1024


class Memory:
    """Bytes each device holds as ops are committed, each device's ops in the order it runs them.

    A colocation unit's resident bytes are reserved when its first op is placed, a graph input when
    a device first reads it; an op's output is held from its commit, and so is each copy of an input
    it reads from another device, until every reader of that producer has been committed (graph
    outputs are kept); scratch counts only while the op itself is checked.

    Placers that walk ops without times free at the last reader's commit. List schedulers pass the
    ops' end times (`ends`): a tensor is then freed at its last reader's end, and a check at time
    `at` (when the op can start) still counts what is freed after it. Either way this is an estimate
    of the exact peak (`pesto_ir.schedule.memory`): a copy can arrive while earlier ops still hold theirs.
    `reserve` holds bytes back per device (`schedule_within_memory` sets it from a timed overshoot);
    `timed_plan` and `check_plan` check the exact peak.
    """

    def __init__(self, pg: PlaceGraph, ends: list[float] | None = None,
                 reserve: Sequence[int] | None = None, *, algorithm: str) -> None:
        self.pg = pg
        self.algorithm = algorithm  # the placer's name, for its errors
        self.ends = ends
        self.capacity = [c - (reserve[d] if reserve else 0) for d, c in enumerate(pg.capacity)]
        self.resident = [0] * pg.k  # held the whole step: it adds to every moment, past ones too
        self.used = [0] * pg.k  # outputs and copies alive now
        self.peak = [0] * pg.k  # the most outputs and copies held at once so far
        self.unit_device = [-1] * len(pg.unit_ops)
        self.device_of = [-1] * pg.n
        self.inputs_on: set[tuple[int, int]] = set()
        self.copies: list[dict[int, int]] = [{} for _ in range(pg.n)]  # producer -> device -> bytes
        self.readers_left = [len(s) for s in pg.succs]
        self.pending: list[list[tuple[float, int]]] = [[] for _ in range(pg.k)]  # (freed at, bytes)
        self.failed = 0  # checks that found no room (`fits`)
        self.max_failed = max(MAX_FAILED_CHECKS_PER_PAIR * pg.n * pg.k, MIN_FAILED_CHECKS)

    def need(self, v: int, device: int) -> tuple[int, int]:
        """Bytes committing op v on `device` would add there: held the whole step, and while it
        runs (its output, scratch and copies of its inputs)."""
        pg = self.pg
        resident = pg.unit_resident[pg.unit[v]] if self.unit_device[pg.unit[v]] < 0 else 0
        resident += sum(b for x, b in pg.inputs[v] if (x, device) not in self.inputs_on)
        copies = sum(max(0, nbytes - self.copies[p].get(device, 0))
                     for p, nbytes in pg.preds[v] if self.device_of[p] != device)
        return resident, copies + pg.out[v] + pg.work[v]

    def held(self, device: int, at: float | None = None) -> int:
        """Outputs and copies held on `device` from time `at` on (now, without times)."""
        if at is None:
            return self.used[device]
        return self.used[device] + sum(b for t, b in self.pending[device] if t > at)

    def free_bytes(self, device: int) -> int:
        return int(self.capacity[device] - self.resident[device] - max(self.peak[device], self.used[device]))

    def may_run(self, v: int, device: int) -> bool:
        """Whether colocation lets op v run on `device`."""
        d = self.unit_device[self.pg.unit[v]]
        return d < 0 or d == device

    def fits(self, v: int, device: int, at: float | None = None) -> bool:
        if not self.may_run(v, device):
            return False
        resident, transient = self.need(v, device)
        busiest = max(self.peak[device], self.held(device, at) + transient)
        if self.resident[device] + resident + busiest <= self.capacity[device]:
            return True
        self.failed += 1
        if self.failed % FAILED_CHECKS_CHARGED == 0:
            work.charge("memory-check", FAILED_CHECKS_CHARGED)
        if self.failed > self.max_failed:
            raise PlacementError(f"{self.algorithm}: gave up after {self.failed} checks found no room for an op "
                                 f"(the last: op '{self.pg.names[v]}' needs {resident + transient} bytes on "
                                 f"{self.pg.cluster.devices[device].name} with {self.free_bytes(device)} free): ops "
                                 "wait for memory to free again and again, so the step barely fits on these devices, "
                                 "if at all")
        return False

    def place(self, v: int, device: int, free_from: list[float] | None = None, at: float | None = None) -> None:
        """Commit op v on `device` (its end already in `ends`, when given). `free_from[d]`: when
        device d can next run an op; `at`: as for `fits`."""
        pg = self.pg
        u = pg.unit[v]
        resident, transient = self.need(v, device)
        self.peak[device] = max(self.peak[device], self.held(device, at) + transient)
        if self.unit_device[u] < 0:
            self.unit_device[u] = device
        self.inputs_on.update((x, device) for x, _ in pg.inputs[v])
        for p, nbytes in pg.preds[v]:
            if self.device_of[p] != device:
                self.copies[p][device] = max(nbytes, self.copies[p].get(device, 0))
        self.resident[device] += resident
        self.used[device] += transient - pg.work[v] - pg.out[v]
        self.device_of[v] = device
        if self.readers_left[v] > 0 or pg.keep[v]:
            self.used[device] += pg.out[v]
        for p, _ in pg.preds[v]:
            self.readers_left[p] -= 1
            if self.readers_left[p] == 0 and not pg.keep[p]:
                self._free(p, self.device_of[p], pg.out[p])
                for d, nbytes in self.copies[p].items():
                    self._free(p, d, nbytes)
        if self.ends is not None and free_from is not None:
            self._settle(free_from)

    def _free(self, p: int, device: int, nbytes: int) -> None:
        self.used[device] -= nbytes
        if self.ends is not None and nbytes:
            at = max(self.ends[c] for c in self.pg.succs[p])
            self.pending[device].append((at, nbytes))

    def _settle(self, free_from: list[float]) -> None:
        """Forget the frees before each device can next run an op: no later check looks before."""
        for d, frees in enumerate(self.pending):
            if frees:
                self.pending[d] = [(t, b) for t, b in frees if t > free_from[d]]

    def roomiest(self, v: int) -> int:
        """The device with the most memory left that fits op v, or -1."""
        best, room = -1, -1.0
        for d in range(self.pg.k):
            left = self.free_bytes(d)
            if self.fits(v, d) and left > room:
                best, room = d, left
        return best

    def no_room(self, v: int, algorithm: str) -> PlacementError:
        pg = self.pg
        unit = pg.unit_ops[pg.unit[v]]
        what = f"op '{pg.names[v]}'" if len(unit) == 1 else \
            f"op '{pg.names[v]}' of colocation group '{pg.graph.ops[v].get('colocate')}' ({len(unit)} ops)"
        short = ", ".join(f"{pg.cluster.devices[d].name} needs {sum(self.need(v, d))} with "
                          f"{self.free_bytes(d)} free" for d in range(pg.k) if self.may_run(v, d))
        return PlacementError(f"{algorithm}: {what} fits on no device with what is alive when it would run "
                              f"(bytes: {short}); try another algorithm or more devices")


PairKey = tuple[Any, ...]


class PairQueue:
    """The (ready op, device) pairs of a list scheduler, least key first, where a pair's key is
    `key(start, x, v, d)` for its start = max(when device d is free, `ready`: when v's inputs can
    be there) and a per-pair number `x` (the extra time on d, or the cost); a key ends in (v, d),
    grows with start and, for one start, with x.

    Every commit makes its device free later, so under a plain heap every pair of that device went
    stale and was popped, re-timed and pushed again: a node read by N others cost N^2. Here the
    pairs whose inputs are there before their device is free (start = the device's free time) are
    kept apart, by x then op, and re-timed only when asked for the least: a commit costs one look
    at its device. The others keep their key fixed until their device's free time passes `ready`
    (they move over when they reach the front). Each device's least pair sits in one heap across
    devices (stale entries skipped by a version per device), so a pop looks at no other device.

    `ready` is what the scheduler knew when it pushed the pair; the scheduler re-times the pair it
    pops, as before, and pushes it again when its key has moved. `free` is the scheduler's own
    list of device free times, read live: `touch(d)` after changing `free[d]`. `placed`, where
    given, is the scheduler's list of each op's device (-1 while unplaced), read live: a pair whose
    op was placed is dropped when it reaches the front of its device's pairs, never popped (a node
    read by N others leaves N pairs on every other device, each a pop, a re-timing and a heap push
    of its device's least key)."""

    def __init__(self, free: Sequence[float], key: Callable[[float, float, int, int], PairKey],
                 placed: Sequence[int] | None = None) -> None:
        self.free = free
        self.key = key
        self.placed = placed
        k = len(free)
        self.later: list[list[tuple[PairKey, float, float, int]]] = [[] for _ in range(k)]  # (key, ready, x, v)
        self.xs: list[list[float]] = [[] for _ in range(k)]  # the x of each group of `now`, once each
        self.now: list[dict[float, list[int]]] = [{} for _ in range(k)]  # x -> ops, of pairs ready by `free`
        # each device's least key, and where that pair is: its x in `now`, or None at the front of `later`
        self.least: list[tuple[PairKey, float | None] | None] = [None] * k
        self.version = [0] * k
        self.heads: list[tuple[PairKey, int]] = []  # (device's least key, version)
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def push(self, v: int, d: int, ready: float, x: float) -> None:
        if ready <= self.free[d]:
            self._add_now(d, x, v)
            key = self.key(self.free[d], x, v, d)
        else:
            key = self.key(ready, x, v, d)
            heapq.heappush(self.later[d], (key, ready, x, v))
        self.size += 1
        least = self.least[d]
        if least is None or key < least[0]:  # else device d's least pair stays what it was
            self.touch(d)

    def pop(self) -> tuple[PairKey, int, int, float] | None:
        """The least pair, removed: (its key, v, d, a `ready` to push it again with); None if empty."""
        while self.heads:
            key, version = heapq.heappop(self.heads)
            d = key[-1]
            least = self.least[d]
            if version != self.version[d] or least is None:
                continue
            x = least[1]
            if x is None:
                _, ready, _, v = heapq.heappop(self.later[d])
            else:
                v = heapq.heappop(self.now[d][x])
                ready = self.free[d]
            self.size -= 1
            self.touch(d)
            return key, v, d, ready
        return None

    def touch(self, d: int) -> None:
        """Device d's pairs or free time changed: find its least pair again."""
        self.version[d] += 1
        least = self._least(d)
        self.least[d] = least
        if least is not None:
            heapq.heappush(self.heads, (least[0], self.version[d]))

    def _add_now(self, d: int, x: float, v: int) -> None:
        group = self.now[d].get(x)
        if group is None:
            group = self.now[d][x] = []
            heapq.heappush(self.xs[d], x)
        heapq.heappush(group, v)

    def _least(self, d: int) -> tuple[PairKey, float | None] | None:
        free, later, xs, now, placed = self.free[d], self.later[d], self.xs[d], self.now[d], self.placed
        while later and (later[0][1] <= free or (placed is not None and placed[later[0][3]] >= 0)):
            _, _, x, v = heapq.heappop(later)
            if placed is not None and placed[v] >= 0:
                self.size -= 1
            else:  # its device is free after its inputs are there now
                self._add_now(d, x, v)
        best: tuple[PairKey, float | None] | None = (later[0][0], None) if later else None
        if len(xs) == 1 and now[xs[0]] and (placed is None or placed[now[xs[0]][0]] < 0):
            x = xs[0]  # one group, its least op unplaced (the common case): no heap moves
            key = self.key(free, x, now[x][0], d)
            return (key, x) if best is None or key < best[0] else best
        taken: list[float] = []
        first: PairKey | None = None
        while xs:  # groups by x: the least key is the least op of the least x, or of an x whose
            x = xs[0]  # start + x rounds to the same time (then the op decides)
            group = now[x]
            while group and placed is not None and placed[group[0]] >= 0:
                heapq.heappop(group)
                self.size -= 1
            if not group:
                heapq.heappop(xs)
                del now[x]
                continue
            key = self.key(free, x, group[0], d)
            if first is None:
                first = key
            elif key[:-2] != first[:-2]:
                break
            if best is None or key < best[0]:
                best = (key, x)
            taken.append(heapq.heappop(xs))
        for x in taken:
            heapq.heappush(xs, x)
        return best


def simulated_plan(pg: PlaceGraph, device_of: Sequence[int], order: Sequence[Sequence[int]], algorithm: str) -> Plan:
    """The simulator's times for ops placed by `device_of`, run on each device in `order`."""
    names = pg.cluster.names
    placement = {pg.names[i]: names[device_of[i]] for i in range(pg.n)}
    per_device = {names[d]: [pg.names[i] for i in ops] for d, ops in enumerate(order)}
    return simulate(pg.graph, pg.cluster, placement, per_device, algorithm=algorithm)


class MemoryOvershoot(PlacementError):
    """A schedule's exact peak exceeds some device's capacity; `over[d]`: by how many bytes."""

    def __init__(self, message: str, over: list[int]) -> None:
        super().__init__(message)
        self.over = over


def timed_plan(pg: PlaceGraph, device_of: Sequence[int], order: Sequence[Sequence[int]], algorithm: str) -> Plan:
    """`simulated_plan`, or an error naming the device, its peak, the moment and what is alive then
    when the plan does not fit."""
    plan = simulated_plan(pg, device_of, order, algorithm)
    peaks = peak_bytes(pg.graph, plan)
    devices = pg.cluster.devices
    over = [math.ceil(peaks[d.name][0] - d.memory) if peaks[d.name][0] > d.memory else 0
            for d in devices]  # infinite memory: never over
    if any(over):  # what is alive at the peaks, named only where a device is over
        named = peak_memory(pg.graph, plan)
        described = [named[d.name].describe(d.memory) for d, o in zip(devices, over) if o]
        raise MemoryOvershoot(f"{algorithm}: its plan does not fit in memory once timed:\n  " + "\n  ".join(described),
                              over)
    return plan


MEMORY_RETRIES = 3  # schedules rebuilt with the overshoot held back, before giving up


def schedule_within_memory(pg: PlaceGraph, schedule: Callable[[list[int]], Plan]) -> Plan:
    """`schedule(reserve)` with no bytes held back, then, while its exact peak overshoots, again with
    twice the overshoot and 1/256 of the capacity more held back on those devices: the estimate
    that the placers keep is corrected by the exact peak."""
    reserve = [0] * pg.k
    for attempt in range(MEMORY_RETRIES + 1):
        if attempt and work.was_cut():
            raise PlacementError("a plan that fits in memory: stopped by the time limit before its next try")
        try:
            return schedule(reserve)
        except MemoryOvershoot as e:
            if attempt == MEMORY_RETRIES:
                raise
            reserve = [r + 2 * o + (int(c) // 256 if o else 0) for r, o, c in zip(reserve, e.over, pg.capacity)]
    raise AssertionError("unreachable")


def topological_orders(pg: PlaceGraph, device_of: Sequence[int]) -> list[list[int]]:
    """Per-device orders following the graph's (topological) op order."""
    order: list[list[int]] = [[] for _ in range(pg.k)]
    for i in range(pg.n):
        order[device_of[i]].append(i)
    return order


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


# What an exact engine says when neither it nor any heuristic found a plan: the heuristics give up only
# when memory runs out, so memory is the likely cause.
NO_START_HINT = ("the heuristics fail only when memory runs out, so the devices are likely too small for this graph "
                 "(copies between devices count too); add devices or memory, or raise --time-limit")


def unplaceable_reason(graph: Graph, cluster: Cluster) -> str | None:
    """Why no placement exists when no heuristic found one (an exact solver has no warm start)."""
    problems = memory_shortfall(graph, cluster)
    if problems:
        return "no placement fits in memory: " + "; ".join(problems)
    if len(cluster) == 1:
        device = cluster.devices[0]
        everything = {op.name: device.name for op in graph.ops}
        plan = simulate(graph, cluster, everything, {device.name: [op.name for op in graph.ops]})
        return "the graph does not fit on its one device in topological order: " + \
            peak_memory(graph, plan)[device.name].describe(device.memory)
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
