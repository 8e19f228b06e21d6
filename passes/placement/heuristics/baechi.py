"""Baechi's memory-aware placers (Jeon et al., SoCC 2020): m-TOPO, m-ETF and m-SCT.

- m-TOPO walks the topological order and fills devices one after another up to an even share of
  the memory (total / devices + the largest unit, capped by capacity). When the graph declares no
  memory at all, the share is of compute time instead, so it still spreads the work.
- m-ETF is list scheduling by earliest start: among every ready op and every device that can hold
  it, run the pair that can start first. A start accounts for the device being free and for each
  input's transfer queued on its link. On heterogeneous devices the start is charged the extra time
  the op takes there over its fastest device, so a slow device wins only when it is truly earlier.
- m-SCT is m-ETF with favourite children: the LP relaxation of Hanen & Munier's SCT programme
  (python-mip) picks for each op at most one child to run right after it without communication;
  a device that ran an op keeps itself for that child when the child is ready and starts there
  earliest, and meanwhile runs only urgent ops (ops that could not start any earlier elsewhere).

Memory follows tensor lifetimes (`algo_common.Memory`): a device takes an op only while what the op
adds there (its output, copies of its inputs, its unit's resident bytes the first time) fits beside
what is still alive. Where Baechi reserves every byte of a unit for the whole step, outputs here are
freed once their readers are scheduled, so a pair that does not fit now waits until memory frees.
"""

from __future__ import annotations

import heapq

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import (
    LinkQueues,
    Memory,
    PlaceGraph,
    PlacementError,
    native_stdout_silenced,
    schedule_within_memory,
    timed_plan,
    topological_orders,
)
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.plan import Plan

# Keys within this relative distance count as equal when a lazily re-timed candidate is checked.
_EPS = 1e-12


# ---------------------------------------------------------------- m-TOPO

def m_topo(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Fill devices in topological order, each up to an even share of the memory (Baechi m-TOPO)."""
    pg = PlaceGraph.build(graph, cluster)
    return schedule_within_memory(pg, lambda reserve: _m_topo(pg, reserve))


def _m_topo(pg: PlaceGraph, reserve: list[int]) -> Plan:
    mem = Memory(pg, reserve=reserve)
    weight, share = _topo_shares(pg)
    load = [0.0] * pg.k
    device_of = [-1] * pg.n
    d = 0
    for i in range(pg.n):
        u = pg.unit[i]
        target = mem.unit_device[u]
        if target < 0:
            while d < pg.k - 1 and (not mem.fits(i, d) or (load[d] > 0 and load[d] + weight[u] > share[d])):
                d += 1
            target = d if mem.fits(i, d) else mem.roomiest(i)
            if target >= 0:
                load[target] += weight[u]
        if target < 0 or not mem.fits(i, target):
            raise mem.no_room(i, "m-topo")
        mem.place(i, target)
        device_of[i] = target
    return timed_plan(pg, device_of, topological_orders(pg, device_of), "m-topo")


def _topo_shares(pg: PlaceGraph) -> tuple[list[float], list[float]]:
    """Weight of each unit and the share of it each device takes: memory, or time without memory."""
    if sum(pg.unit_mem) > 0:
        weight = [float(m) for m in pg.unit_mem]
        share = sum(weight) / pg.k + max(weight)
        return weight, [min(share, cap) for cap in pg.capacity]
    weight = [sum(sum(pg.cost[i]) / pg.k for i in ops) for ops in pg.unit_ops]
    share = sum(weight) / pg.k + max(weight, default=0.0)
    return weight, [share] * pg.k


# ---------------------------------------------------------------- m-ETF / m-SCT

class _ListScheduler:
    """Earliest-start list scheduling over (ready op, device) pairs in a lazily re-timed heap.

    A pair's key only grows as devices and links fill up, so a popped pair whose recomputed key
    still equals its stored one is the true minimum; otherwise it goes back with the new key.
    `favorite` (op -> child or -1) turns on SCT's device reservations.
    """

    def __init__(self, pg: PlaceGraph, algorithm: str, favorite: list[int] | None = None,
                 reserve: list[int] | None = None) -> None:
        self.pg = pg
        self.algorithm = algorithm
        self.favorite = favorite
        k, n = pg.k, pg.n
        self.end = [0.0] * n
        self.mem = Memory(pg, ends=self.end, reserve=reserve)
        self.fastest = [min(c) for c in pg.cost]
        self.device_free = [0.0] * k
        self.device_of = [-1] * n
        self.links = LinkQueues(pg, self.device_of, self.end)
        self.missing = [len(p) for p in pg.preds]  # unscheduled producers per op
        self.blocked: list[tuple[float, int, int]] = []  # pairs that wait for memory to free
        self.heap: list[tuple[float, int, int]] = []
        self.order: list[list[int]] = [[] for _ in range(k)]
        self.last = [-1] * k  # last op run on each device
        self.deferred: list[list[tuple[float, int, int]]] = [[] for _ in range(k)]
        self.waiting_for = [-1] * k  # the reserved child deferred pairs on each device wait for

    # -- timing
    def data_ready(self, v: int, d: int, commit: bool = False) -> float:
        """When every input of op v can be on device d (transfers queued on their links)."""
        return self.links.data_ready(v, d, commit)

    def start(self, v: int, d: int) -> float:
        return max(self.device_free[d], self.data_ready(v, d))

    def key(self, v: int, d: int) -> float:
        # the extra time first: it is exactly 0 on v's fastest devices, so equal starts stay equal
        # keys (start + cost - fastest rounds by the cost's last bit, and ties went by that noise)
        return self.start(v, d) + (self.pg.cost[v][d] - self.fastest[v])

    # -- the main loop
    def run(self) -> Plan:
        pg = self.pg
        for v in range(pg.n):
            if self.missing[v] == 0:
                self.make_ready(v)
        done = 0
        while self.heap or self.blocked:
            if not self.heap:
                self.blocked = [(t, v, d) for t, v, d in self.blocked
                                if self.device_of[v] < 0 and self.mem.may_run(v, d)]
                if not self.blocked:
                    break
                if not any(self.deferred):
                    raise self.mem.no_room(self.blocked[0][1], self.algorithm)
                self.release_all_deferred()  # a reserved child that waits for memory keeps nothing waiting
                continue
            stored, v, d = heapq.heappop(self.heap)
            if self.device_of[v] >= 0 or not self.mem.may_run(v, d):
                continue
            if not self.fits(v, d):
                self.blocked.append((stored, v, d))
                continue
            now = self.key(v, d)
            if now > stored + _EPS * max(1.0, abs(stored)):
                heapq.heappush(self.heap, (now, v, d))
                continue
            if self.favorite is not None:
                f = self.reserved_child(d)
                if f >= 0 and f != v and not self.urgent(v, d):
                    self.deferred[d].append((now, v, d))
                    self.waiting_for[d] = f
                    continue
            self.commit(v, d)
            done += 1
        if done != pg.n:
            raise PlacementError(f"{self.algorithm}: scheduled {done} of {pg.n} ops (a bug: ops left waiting)")
        return timed_plan(pg, self.device_of, self.order, self.algorithm)

    def make_ready(self, v: int) -> None:
        for d in range(self.pg.k):
            if self.mem.may_run(v, d):
                heapq.heappush(self.heap, (self.key(v, d), v, d))

    def fits(self, v: int, d: int) -> bool:
        """Whether v's output and copies fit on d beside what is alive when it can start."""
        return self.mem.fits(v, d, self.device_free[d])

    def commit(self, v: int, d: int) -> None:
        pg = self.pg
        start = max(self.device_free[d], self.data_ready(v, d, commit=True))
        at = self.device_free[d]
        self.device_of[v] = d
        self.end[v] = start + pg.cost[v][d]
        self.device_free[d] = self.end[v]
        self.mem.place(v, d, free_from=self.device_free, at=at)
        if self.blocked:  # memory may have freed: waiting pairs try again
            for item in self.blocked:
                heapq.heappush(self.heap, item)
            self.blocked.clear()
        self.order[d].append(v)
        self.last[d] = v
        for s in pg.succs[v]:
            self.missing[s] -= 1
            if self.missing[s] == 0:
                self.make_ready(s)
        if self.favorite is not None:
            self.release_deferred(v, d)

    # -- SCT reservations
    def reserved_child(self, d: int) -> int:
        """The favourite child device d keeps itself for now, or -1.

        The child of the op d ran last, when that child is ready, unscheduled, may run on d, and
        starts on d no later than anywhere else.
        """
        assert self.favorite is not None
        last = self.last[d]
        f = self.favorite[last] if last >= 0 else -1
        if f < 0 or self.device_of[f] >= 0 or self.missing[f] > 0:
            return -1
        if not self.fits(f, d):
            return -1
        here = self.start(f, d)
        others = (self.start(f, e) for e in range(self.pg.k) if e != d and self.fits(f, e))
        return f if all(here <= t for t in others) else -1

    def urgent(self, v: int, d: int) -> bool:
        """Whether v could start by the time device d is free on every device that can hold it."""
        latest = max((self.start(v, e) for e in range(self.pg.k) if self.fits(v, e)), default=0.0)
        return latest <= self.device_free[d]

    def release_all_deferred(self) -> None:
        for e in range(self.pg.k):
            for item in self.deferred[e]:
                heapq.heappush(self.heap, item)
            self.deferred[e].clear()
            self.waiting_for[e] = -1

    def release_deferred(self, v: int, d: int) -> None:
        """After v ran on d, pairs waiting on d, or waiting anywhere for v, go back in the heap.

        A deferral stays right until then: other pairs' starts only grow and d stays as free.
        """
        for e in range(self.pg.k):
            if e == d or self.waiting_for[e] == v:
                for item in self.deferred[e]:
                    heapq.heappush(self.heap, item)
                self.deferred[e].clear()
                self.waiting_for[e] = -1


def m_etf(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Earliest start time first with memory checks (Baechi m-ETF)."""
    pg = PlaceGraph.build(graph, cluster)
    return schedule_within_memory(pg, lambda reserve: _ListScheduler(pg, "m-etf", reserve=reserve).run())


def m_sct(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """m-ETF with SCT's favourite children from the LP relaxation (Baechi m-SCT)."""
    pg = PlaceGraph.build(graph, cluster)
    favorite, how = favorite_children(pg, options)
    plan = schedule_within_memory(pg, lambda reserve: _ListScheduler(pg, "m-sct", favorite, reserve).run())
    plan.notes.append(f"favourite children: {sum(f >= 0 for f in favorite)} ({how})")
    return plan


def favorite_children(pg: PlaceGraph, options: PlaceOptions) -> tuple[list[int], str]:
    """Each op's favourite child (or -1) from SCT's LP relaxation, rounded at 1/2.

    Variables: x_e in [0, 1] per edge (1 = the edge pays its communication), s_i start times, w
    the makespan. Minimise w subject to s_i + p_i + c_e x_e <= s_j for every edge e = i -> j,
    at most one favourite (x_e = 0) among each op's out-edges and among its in-edges, and
    s_i + p_i <= w. Edges with x_e < 1/2 become favourites, lowest x first, one per parent and
    per child. Should the LP not solve, the heaviest tensors are matched instead.
    """
    edges = [(p, v, nbytes) for v in range(pg.n) for p, nbytes in pg.preds[v]]
    if not edges or pg.k < 2:
        return [-1] * pg.n, "no edges to keep local" if not edges else "one device"
    weights, status = _favorite_lp(pg, edges, options)
    how = "LP relaxation"
    if weights is None:
        weights = [-float(nbytes) for _, _, nbytes in edges]
        how = f"heaviest tensors (the LP ended {status})"
    chosen = sorted((w, -nbytes, p, v) for w, (p, v, nbytes) in zip(weights, edges) if w < 0.5)
    favorite = [-1] * pg.n
    has_parent = [False] * pg.n
    for _, _, p, v in chosen:
        if favorite[p] < 0 and not has_parent[v]:
            favorite[p] = v
            has_parent[v] = True
    return favorite, how


def _favorite_lp(pg: PlaceGraph, edges: list[tuple[int, int, int]],
                 options: PlaceOptions) -> tuple[list[float] | None, str]:
    """The LP's x_e values (None when it has no solution) and its status."""
    import mip

    proc = [sum(c) / len(c) for c in pg.cost]
    comm = [pg.mean_transfer_time(nbytes) for _, _, nbytes in edges]
    scale = max(max(proc), max(comm))
    scale = 1.0 / scale if scale > 0 else 1.0  # times of order 1 keep the simplex well conditioned
    model = mip.Model(sense=mip.MINIMIZE, solver_name=mip.CBC)
    model.verbose = 0
    model.threads = options.threads
    x = [model.add_var(lb=0.0, ub=1.0) for _ in edges]
    s = [model.add_var(lb=0.0) for _ in range(pg.n)]
    w = model.add_var(lb=0.0)
    out_edges: list[list[int]] = [[] for _ in range(pg.n)]
    in_edges: list[list[int]] = [[] for _ in range(pg.n)]
    for e, (p, v, _) in enumerate(edges):
        model.add_constr(s[p] - s[v] + comm[e] * scale * x[e] <= -proc[p] * scale)
        out_edges[p].append(e)
        in_edges[v].append(e)
    for groups in (out_edges, in_edges):
        for es in groups:
            if len(es) > 1:
                model.add_constr(mip.xsum(x[e] for e in es) >= len(es) - 1)
    for i in range(pg.n):
        if not out_edges[i]:
            model.add_constr(s[i] - w <= -proc[i] * scale)
    model.objective = mip.minimize(w)
    with native_stdout_silenced():
        status = model.optimize(relax=True)  # a pure LP: straight to the simplex, no MIP preprocessing
    if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
        return None, status.name.lower()
    return [float(v.x or 0.0) for v in x], status.name.lower()
