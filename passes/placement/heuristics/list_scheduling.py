"""Classic list schedulers: ETF (Hwang et al., 1989) and HEFT (Topcuoglu et al., 2002).

- `etf`: repeatedly run the (ready op, device) pair that can start earliest, ties by earliest
  finish, then by topological position, then by device; the op is appended at the device's end.
- `heft`: ops in decreasing upward rank (mean cost over the devices plus the largest, over its
  successors, of the edge's mean transfer time plus the successor's rank), ties by topological
  position, each appended on the device where it finishes earliest (no insertion into gaps).

Both share what Baechi's m-ETF uses (`algo_common`): a tensor is sent once per destination on a
FIFO link (`LinkQueues`), memory follows tensor lifetimes (`Memory`: a pair is taken only when what
the op adds fits beside what is alive when it can start) and colocation units stay on one device.
Unlike m-ETF, ETF's start is not charged a slow device's extra time (it breaks ties by finish
instead). Plans are timed by the simulator (`timed_plan`) and rebuilt with bytes held back when the
exact peak overshoots (`schedule_within_memory`). Ties are broken by index: same input, same plan.
"""

from __future__ import annotations

import heapq

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import (
    Memory,
    PairQueue,
    PlaceGraph,
    PlacementError,
    schedule_within_memory,
    timed_plan,
)
from pesto_ir.passes.placement.links import LinkQueues, checkpoint
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.plan import Plan


class _Appender:
    """The state both schedulers keep: ops appended at their device's end, transfers on FIFO links."""

    def __init__(self, pg: PlaceGraph, algorithm: str, reserve: list[int] | None) -> None:
        self.pg = pg
        self.algorithm = algorithm
        self.end = [0.0] * pg.n
        self.device_of = [-1] * pg.n
        self.mem = Memory(pg, ends=self.end, reserve=reserve, algorithm=algorithm)
        self.links = LinkQueues(pg, self.device_of, self.end)
        self.device_free = [0.0] * pg.k
        self.order: list[list[int]] = [[] for _ in range(pg.k)]
        self.placed = 0

    def start(self, v: int, d: int) -> float:
        return max(self.device_free[d], self.links.data_ready(v, d))

    def fits(self, v: int, d: int) -> bool:
        """Colocation lets v run on d, and its output and copies fit beside what is alive then."""
        return self.mem.fits(v, d, self.device_free[d])

    def commit(self, v: int, d: int) -> None:
        at = self.device_free[d]
        start = max(at, self.links.data_ready(v, d, commit=True))
        self.device_of[v] = d
        self.end[v] = start + self.pg.cost[v][d]
        self.device_free[d] = self.end[v]
        self.mem.place(v, d, free_from=self.device_free, at=at)
        self.order[d].append(v)
        self.placed += 1
        checkpoint(self.algorithm, self.placed, links=self.links)

    def plan(self) -> Plan:
        self.links.charge()  # the inputs looked up since the last checkpoint
        if min(self.device_of, default=0) < 0:
            raise PlacementError(f"{self.algorithm}: some ops were left unscheduled (a bug)")
        return timed_plan(self.pg, self.device_of, self.order, self.algorithm)


def _etf(pg: PlaceGraph, reserve: list[int]) -> Plan:
    """Pairs lazily re-timed (`PairQueue`), keyed (start, finish, op, device): a pair's start and
    finish only grow as devices and links fill up, so a popped pair whose key is unchanged is the
    least of all pairs that fit; one that does not fit waits until the next commit may have freed
    memory."""
    s = _Appender(pg, "etf", reserve)
    missing = [len(p) for p in pg.preds]
    queue = PairQueue(s.device_free, _etf_key, placed=s.device_of)
    blocked: list[tuple[int, int, float]] = []  # (op, device, when its inputs can be there)

    def make_ready(v: int) -> None:
        for d in range(pg.k):
            if s.mem.may_run(v, d):
                queue.push(v, d, s.links.data_ready(v, d), pg.cost[v][d])

    for v in range(pg.n):
        if missing[v] == 0:
            make_ready(v)
    while (popped := queue.pop()) is not None:
        stored, v, d, ready = popped
        if s.device_of[v] >= 0 or not s.mem.may_run(v, d):
            continue
        if not s.fits(v, d):
            blocked.append((v, d, ready))
            continue
        ready = s.links.data_ready(v, d)
        if _etf_key(max(s.device_free[d], ready), pg.cost[v][d], v, d) != stored:
            queue.push(v, d, ready, pg.cost[v][d])
            continue
        s.commit(v, d)
        queue.touch(d)
        for w, e, at in blocked:  # memory may have freed: waiting pairs try again
            queue.push(w, e, at, pg.cost[w][e])
        blocked.clear()
        for c in pg.succs[v]:
            missing[c] -= 1
            if missing[c] == 0:
                make_ready(c)
    left = [v for v, d, _ in blocked if s.device_of[v] < 0 and s.mem.may_run(v, d)]
    if left:  # nothing fits anywhere, and no commit is left to free memory
        raise s.mem.no_room(min(left), "etf")
    return s.plan()


def _etf_key(start: float, cost: float, v: int, d: int) -> tuple[float, float, int, int]:
    """ETF's order of pairs: start, then finish, then op, then device."""
    return (start, start + cost, v, d)


def upward_ranks(pg: PlaceGraph) -> list[float]:
    """HEFT's upward rank of every op: its mean cost plus the largest (mean transfer time of the
    edge + successor's rank) over its successors."""
    rank = [0.0] * pg.n
    mean_cost = [sum(c) / len(c) if c else 0.0 for c in pg.cost]
    out: list[list[tuple[int, float]]] = [[] for _ in range(pg.n)]
    for v in range(pg.n):
        for p, nbytes in pg.preds[v]:
            out[p].append((v, pg.mean_transfer_time(nbytes)))
    for v in reversed(range(pg.n)):  # graph order is topological
        rank[v] = mean_cost[v] + max((c + rank[s] for s, c in out[v]), default=0.0)
    return rank


def _heft(pg: PlaceGraph, rank: list[float], reserve: list[int]) -> Plan:
    s = _Appender(pg, "heft", reserve)
    missing = [len(p) for p in pg.preds]
    ready = [(-rank[v], v) for v in range(pg.n) if missing[v] == 0]
    heapq.heapify(ready)
    while ready:
        skipped: list[tuple[float, int]] = []
        chosen: tuple[int, int] | None = None
        while ready:  # the highest-ranked ready op that fits somewhere (the next, if memory refuses)
            item = heapq.heappop(ready)
            v = item[1]
            best: tuple[float, float, int] | None = None
            for d in range(pg.k):
                if s.fits(v, d):
                    t = s.start(v, d)
                    key = (t + pg.cost[v][d], t, d)
                    if best is None or key < best:
                        best = key
            if best is not None:
                chosen = (v, best[2])
                break
            skipped.append(item)
        if chosen is None:
            raise s.mem.no_room(min(v for _, v in skipped), "heft")
        for item in skipped:
            heapq.heappush(ready, item)
        v, d = chosen
        s.commit(v, d)
        for c in pg.succs[v]:
            missing[c] -= 1
            if missing[c] == 0:
                heapq.heappush(ready, (-rank[c], c))
    return s.plan()


def etf(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Earliest start time first: the (ready op, device) pair that starts earliest, appended."""
    pg = PlaceGraph.build(graph, cluster)
    return schedule_within_memory(pg, lambda reserve: _etf(pg, reserve))


def heft(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Heterogeneous earliest finish time: ops by upward rank, each on its earliest-finish device."""
    pg = PlaceGraph.build(graph, cluster)
    rank = upward_ranks(pg)
    return schedule_within_memory(pg, lambda reserve: _heft(pg, rank, reserve))
