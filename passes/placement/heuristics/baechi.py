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

from collections import defaultdict

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import (
    Memory,
    PairQueue,
    PlaceGraph,
    PlacementError,
    schedule_within_memory,
    timed_plan,
    topological_orders,
)
from pesto_ir.passes.placement.links import LinkQueues, checkpoint
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.plan import Plan
from pesto_ir.util import work
from pesto_ir.util.native_stdout import native_stdout_silenced

# Keys within this relative distance count as equal when a lazily re-timed candidate is checked.
_EPS = 1e-12


# ---------------------------------------------------------------- m-TOPO

def m_topo(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Fill devices in topological order, each up to an even share of the memory (Baechi m-TOPO)."""
    pg = PlaceGraph.build(graph, cluster)
    return schedule_within_memory(pg, lambda reserve: _m_topo(pg, reserve))


def _m_topo(pg: PlaceGraph, reserve: list[int]) -> Plan:
    mem = Memory(pg, reserve=reserve, algorithm="m-topo")
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
        checkpoint("m-topo", i + 1)
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
    """Earliest-start list scheduling over (ready op, device) pairs, lazily re-timed (`PairQueue`).

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
        self.mem = Memory(pg, ends=self.end, reserve=reserve, algorithm=algorithm)
        self.fastest = [min(c) for c in pg.cost]
        self.extra = [[c - f for c in costs] for costs, f in zip(pg.cost, self.fastest)]
        self.device_free = [0.0] * k
        self.device_of = [-1] * n
        self.links = LinkQueues(pg, self.device_of, self.end)
        self.missing = [len(p) for p in pg.preds]  # unscheduled producers per op
        # (op, device, when its inputs can be there) of pairs that wait for memory to free
        self.blocked: list[tuple[int, int, float]] = []
        self.queue = PairQueue(self.device_free, _etf_key, placed=self.device_of)
        self.order: list[list[int]] = [[] for _ in range(k)]
        self.last = [-1] * k  # last op run on each device
        self.deferred: list[list[tuple[int, int, float]]] = [[] for _ in range(k)]
        self.waiting_for = [-1] * k  # the reserved child deferred pairs on each device wait for

    # -- timing
    def data_ready(self, v: int, d: int, commit: bool = False) -> float:
        """When every input of op v can be on device d (transfers queued on their links)."""
        return self.links.data_ready(v, d, commit)

    def start(self, v: int, d: int) -> float:
        return max(self.device_free[d], self.data_ready(v, d))

    def push(self, v: int, d: int, ready: float | None = None) -> None:
        """Queue pair (v, d), its inputs there at `ready` (looked up when not given)."""
        self.queue.push(v, d, self.data_ready(v, d) if ready is None else ready, self.extra[v][d])

    # -- the main loop
    def run(self) -> Plan:
        try:
            return self._run()
        finally:
            self.links.charge()  # the inputs looked up since the last checkpoint

    def _run(self) -> Plan:
        pg = self.pg
        for v in range(pg.n):
            if self.missing[v] == 0:
                self.make_ready(v)
        done = steps = 0
        while self.queue or self.blocked:
            steps += 1  # a pair popped and pushed back, deferred or blocked is a step too: read the cap by them
            checkpoint(self.algorithm, done, steps, self.links)
            popped = self.queue.pop()
            if popped is None:
                self.blocked = [(v, d, t) for v, d, t in self.blocked
                                if self.device_of[v] < 0 and self.mem.may_run(v, d)]
                if not self.blocked:
                    break
                if not any(self.deferred):
                    raise self.mem.no_room(self.blocked[0][0], self.algorithm)
                self.release_all_deferred()  # a reserved child that waits for memory keeps nothing waiting
                continue
            (stored, *_), v, d, ready = popped
            if self.device_of[v] >= 0 or not self.mem.may_run(v, d):
                continue
            if not self.fits(v, d):
                self.blocked.append((v, d, ready))
                continue
            ready = self.data_ready(v, d)
            now = _etf_key(max(self.device_free[d], ready), self.extra[v][d], v, d)[0]
            if now > stored + _EPS * max(1.0, abs(stored)):
                self.push(v, d, ready)
                continue
            if self.favorite is not None:
                f = self.reserved_child(d)
                if f >= 0 and f != v and not self.urgent(v, d):
                    self.deferred[d].append((v, d, ready))
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
                self.push(v, d)

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
        self.queue.touch(d)
        self.mem.place(v, d, free_from=self.device_free, at=at)
        if self.blocked:  # memory may have freed: waiting pairs try again
            for w, e, ready in self.blocked:
                self.push(w, e, ready)
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
            for w, f, ready in self.deferred[e]:
                self.push(w, f, ready)
            self.deferred[e].clear()
            self.waiting_for[e] = -1

    def release_deferred(self, v: int, d: int) -> None:
        """After v ran on d, pairs waiting on d, or waiting anywhere for v, go back in the heap.

        A deferral stays right until then: other pairs' starts only grow and d stays as free.
        """
        for e in range(self.pg.k):
            if e == d or self.waiting_for[e] == v:
                for w, f, ready in self.deferred[e]:
                    self.push(w, f, ready)
                self.deferred[e].clear()
                self.waiting_for[e] = -1


def _etf_key(start: float, extra: float, v: int, d: int) -> tuple[float, int, int]:
    """m-ETF's order of pairs: start plus the extra time the op takes on d over its fastest device,
    then op, then device. The extra time is exactly 0 on v's fastest devices, so equal starts stay
    equal keys (start + cost - fastest rounds by the cost's last bit, and ties went by that noise)."""
    return (start + extra, v, d)


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


# The favourite-children LP keeps at most this many out-edges (and in-edges) of one op free (`_fixed_edges`);
# the MSR graphs' and the bundled examples' ops have at most 24 out-edges and 5 in-edges, so their LP is whole.
LP_MAX_DEGREE = 64


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
    work.charge("lp-edge", len(edges))  # CBC's time, which no clock here counts as it solves
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
    fixed = _fixed_edges(edges, comm, pg.n)
    gone = _eliminated(edges, fixed, pg.n)
    x = [None if e in fixed else model.add_var(lb=0.0, ub=1.0) for e in range(len(edges))]
    s = [None if gone[i] else model.add_var(lb=0.0) for i in range(pg.n)]
    w = model.add_var(lb=0.0)
    # an eliminated op's rows: for each producer p (-1: none, it is a source) and reader q (-1: the
    # end, it is a sink), s_q - s_p >= the path's length through it; only the largest per pair counts
    before: dict[int, list[tuple[int, float]]] = defaultdict(list)
    after: dict[int, list[tuple[int, float]]] = defaultdict(list)
    out_edges: list[list[int]] = [[] for _ in range(pg.n)]
    in_edges: list[list[int]] = [[] for _ in range(pg.n)]
    has_out = [False] * pg.n
    for e, (p, v, _) in enumerate(edges):
        has_out[p] = True
        xe, sp, sv = x[e], s[p], s[v]
        if xe is None:  # x_e = 1: the edge pays its communication
            if gone[v]:
                before[v].append((p, (proc[p] + comm[e]) * scale))
            elif gone[p]:
                after[p].append((v, comm[e] * scale))
            else:
                assert sp is not None and sv is not None
                model.add_constr(sp - sv <= -(proc[p] + comm[e]) * scale)
            continue
        assert sp is not None and sv is not None  # a free edge's ends stay
        model.add_constr(sp - sv + comm[e] * scale * xe <= -proc[p] * scale)
        out_edges[p].append(e)
        in_edges[v].append(e)
    for groups in (out_edges, in_edges):
        for es in groups:
            if len(es) > 1:
                model.add_constr(mip.xsum(x[e] for e in es if x[e] is not None) >= len(es) - 1)
    for i in range(pg.n):
        si = s[i]
        if si is not None and not has_out[i]:
            model.add_constr(si - w <= -proc[i] * scale)
    through: dict[tuple[int, int], float] = {}
    for v in range(pg.n):
        if gone[v]:
            for p, into in before.get(v) or [(-1, 0.0)]:
                for q, out in after.get(v) or [(-1, 0.0)]:
                    length = into + proc[v] * scale + out
                    through[p, q] = max(through.get((p, q), length), length)
    for (p, q), length in through.items():
        sp = s[p] if p >= 0 else None
        sq = s[q] if q >= 0 else w
        assert sq is not None
        model.add_constr((sp - sq if sp is not None else -sq) <= -length)
    model.objective = mip.minimize(w)
    with native_stdout_silenced():
        # a pure LP: straight to the simplex, no MIP preprocessing; stopped where the time limit's wall clock is
        status = model.optimize(relax=True, max_seconds=work.wall_left())
    if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
        return None, status.name.lower()
    return [1.0 if v is None else float(v.x or 0.0) for v in x], status.name.lower()


def _eliminated(edges: list[tuple[int, int, int]], fixed: set[int], n: int) -> list[bool]:
    """The ops the favourite-children LP leaves out: every edge of theirs fixed, at most one on one
    side, no neighbour left out. Their rows become one per (producer, reader) pair through them,
    the longest, so N fixed readers of one op that feed one other op (or the end) add one row, not
    N parallel ones, on which the simplex degenerates (quadratic in N)."""
    ins: list[list[int]] = [[] for _ in range(n)]
    outs: list[list[int]] = [[] for _ in range(n)]
    free = [False] * n
    for e, (p, v, _) in enumerate(edges):
        outs[p].append(v)
        ins[v].append(p)
        if e not in fixed:
            free[p] = free[v] = True
    gone = [False] * n
    for v in range(n):
        if (ins[v] or outs[v]) and not free[v] and min(len(ins[v]), len(outs[v])) <= 1 \
                and not any(gone[u] for u in ins[v]) and not any(gone[u] for u in outs[v]):
            gone[v] = True
    return gone


def _fixed_edges(edges: list[tuple[int, int, int]], comm: list[float], n: int) -> set[int]:
    """The edges the favourite-children LP fixes at x_e = 1 (never favourites): of an op with more
    than `LP_MAX_DEGREE` out-edges (or in-edges), all but the `LP_MAX_DEGREE` heaviest (ties:
    first in `edges`). At most one of them can be a favourite anyway, and the LP's row summing all
    of them made CBC's simplex quadratic or worse in the fan-out (a 1 -> 10,000 star: 160 s)."""
    out_edges: list[list[int]] = [[] for _ in range(n)]
    in_edges: list[list[int]] = [[] for _ in range(n)]
    for e, (p, v, _) in enumerate(edges):
        out_edges[p].append(e)
        in_edges[v].append(e)
    fixed: set[int] = set()
    for groups in (out_edges, in_edges):
        for es in groups:
            if len(es) > LP_MAX_DEGREE:
                fixed.update(sorted(es, key=lambda e: (-comm[e], e))[LP_MAX_DEGREE:])
    return fixed
