"""`ilp`: Pesto's joint placement-and-scheduling MILP, for k devices of any speeds, in python-mip.

The model (Pesto, Middleware 2021, §4, generalised from 2 GPUs to k heterogeneous devices):

- `x[u,d]` (binary): placement unit `u` runs on device `d`. A unit is one op, or a whole
  colocation group (ops sharing a `colocate` attribute share their variables, so they share a device).
- `S[i]`: op start; its end is `C[i] = S[i] + sum_d cost(i,d) x[u(i),d]`. `T`: the makespan.
- Transfer nodes, one per (producer p, destination device d): `a[p,d]` >= x[c,d] - x[p,d] for each
  consumer c (p's results are needed on d and p is elsewhere: the XOR/AND products linearised),
  start `R[p,d]` >= C[p], duration `D[p,d]` that of the link from p's device (heterogeneous links;
  with results read by different consumers, only the results needed there).
  A consumer on d starts after R[p,d] + D[p,d]; on p's own device D is 0, so it waits for C[p] only.
- Big-M disjunctions with an ordering binary for op pairs with no path between them that may share
  a device, and for transfer pairs that may share a directed link (one transfer at a time).
- Memory capacity per device, and symmetry breaking between interchangeable devices (same costs,
  memory and links): units are taken in topological order and may only open the next device of
  their class once the previous one is used.

What keeps it small and tight is the upper bound `UB` from the warm start: every op gets a time
window [earliest start, latest finish] from critical paths and from the work of its ancestors
(descendants) over the cluster's capacity; pairs whose windows cannot overlap need no ordering
binary at all, and every big-M is the width of the two windows involved. Valid inequalities
(T >= C[i] + tail[i], T >= the load of each device, T >= the lower bound) lift the LP bound.

The solve: the plain MILP first (a quarter of the time limit, at least 5 s); it proves small graphs
(about 15 ops) optimal. Past that its bound rarely leaves the critical path, so the rest of the time
goes to a large-neighbourhood search on the same model: all but a window of ops near one point in
time keep the incumbent's devices and orders, and CBC re-optimizes the window in a second or two.
Each solution is turned into a real schedule twice, by `simulate` (first-come-first-served links)
and by `replay` with the solver's own link order; the best of those and the warm start is
returned, after `check_plan`. Times are scaled so UB is 1000 units, which keeps CBC's absolute
tolerances far below the costs. CBC's preprocessing is off: it crashed the bundled CBC
(CglPreProcess::postProcess) on a 1M-nonzero model, and bought nothing measurable here.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pesto_ir.bounds import lower_bound
from pesto_ir.cluster import Cluster
from pesto_ir.costs import op_cost, value_bytes
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph, Op
from pesto_ir.memory import footprints
from pesto_ir.passes.algo_common import NO_START_HINT, interchangeable_devices, longest_paths, unplaceable_reason
from pesto_ir.placement import PlaceOptions
from pesto_ir.plan import OpSlot, Plan, Transfer
from pesto_ir.simulate import PlanError, order_from_priority, simulate, transfer_bytes
from pesto_ir.validate import check_plan, validate_plan

ALGORITHM = "ilp"
SOLVERS = ("cbc", "highs")

# Size limits (measured with bench/bench_ilp.py; above either, the warm start comes back as it
# is, with a note and status "skipped"; the place pass coarsens before `ilp` in the default
# pipeline). Past ~25k binaries CBC overruns its time limit: a 30 s solve of a 326-op graph on
# 2 devices (55k binaries, 1M nonzeros) took 239 s, most of it inside CBC after it had stopped;
# 33-40k binaries overran by 3-11 s. Graphs over MAX_OPS are not even modelled (they exceed the
# binary limit anyway, and the pair analysis is quadratic). In 30 s the search improved warm
# starts by 1-7% on 20-80-op graphs (under ~5k binaries); on the 177- and 192-op MSR layer
# graphs it found 0-0.2%, on a 200-group coarsening of BERT-3 training (4 devices) still 1.4%.
MAX_OPS = 300
MAX_INTEGERS = 25_000

SCALE_UB = 1000.0  # the warm-start makespan in model time units
REL_GAP = 1e-6  # "optimal" means within this fraction of the bound
EPS = 1e-7  # model time units of slack in window tests (UB is 1000)
HEARTBEAT = 10.0  # seconds between progress lines when nothing changes
EXACT_SHARE = 0.25  # of the time limit for the plain MILP solve before neighbourhood search
EXACT_MIN = 5.0  # seconds the plain solve gets at least (within the limit)
LNS_START_OPS = 12  # ops freed in the first neighbourhood (adapted as the search goes)
LNS_MIN_OPS = 6
LNS_SLICES = 16  # neighbourhoods per remaining time, at first
LNS_MIN_SLICE = 1.0  # seconds: the shortest neighbourhood solve worth starting
LNS_MAX_SLICE = 5.0


class IlpError(PestoError):
    """The ILP cannot run: an unknown or missing solver, nothing fits, or no plan in time."""


# ---------------------------------------------------------------------------- entry point

def place_ilp(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Solve Pesto's MILP from `options.warm_start`; return the best real schedule found."""
    started = time.perf_counter()
    solver = _solver_name(options.solver)
    if not graph.ops:
        return Plan(graph.name, ALGORITHM, list(cluster.names), {}, [], 0.0,
                    _solver_info(solver, "optimal", 0.0, 0.0, 0.0, 0.0))
    warm, notes = _warm_start(graph, cluster, options)
    lb = lower_bound(graph, cluster)
    early = _early_answer(graph, cluster, warm, lb, solver, started)
    if early is None:  # (early answers cover graphs over MAX_OPS)
        inst = _Instance.build(graph, cluster, warm.makespan if warm is not None else None, lb)
        if inst.integers() > MAX_INTEGERS:
            early = _too_many_binaries(inst, warm, solver, lb, started)
    if early is not None:
        early.notes[:0] = notes
        if early.solver and early.solver.get("status") == "skipped":
            options.progress(f"ilp: MILP skipped: {early.notes[-1]}")
        return check_plan(graph, cluster, early)
    milp = _Milp(inst, solver, options)
    options.progress(f"ilp: {graph.name}: {len(graph.ops)} ops on {len(cluster)} devices, "
                     f"{milp.size()}; warm start {_fmt(warm.makespan) if warm else 'none'}, "
                     f"lower bound {_fmt(lb)}")
    search = _Search(milp, warm, options, started + options.time_limit)
    search.run()
    return search.finish(notes, started)


def _solver_name(name: str) -> str:
    """The MILP backend, checked before any work: HiGHS only where python-mip can load it."""
    solver = (name or "cbc").lower()
    if solver not in SOLVERS:
        raise IlpError(f"unknown MILP solver '{name}' for algo=ilp (choose one of: {', '.join(SOLVERS)})")
    if solver == "highs" and not _highs_available():
        raise IlpError("solver=highs: python-mip cannot load the HiGHS library; install it with "
                       "`pip install highsbox` (or set PMIP_HIGHS_LIBRARY), or use solver=cbc")
    return solver


def _highs_available() -> bool:
    """Import mip.highs with its load-failure log silenced; it records whether the library loaded."""
    log = logging.getLogger("mip.highs")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        import mip.highs
    except Exception:  # a broken optional backend must not break the CBC path
        return False
    finally:
        log.setLevel(level)
    return bool(getattr(mip.highs, "has_highs", False))


def _solver_info(solver: str, status: str, seconds: float, bound: float | None, gap: float | None,
                 objective: float | None) -> dict[str, Any]:
    return {"name": solver, "status": status, "gap": gap, "seconds": round(seconds, 3),
            "bound": bound, "objective": objective}


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


# ---------------------------------------------------------------------------- warm start

def _warm_start(graph: Graph, cluster: Cluster, options: PlaceOptions) -> tuple[Plan | None, list[str]]:
    """The given warm start when it is a valid plan of this graph, else one built here."""
    notes: list[str] = []
    given = options.warm_start
    if given is not None:
        problems = validate_plan(graph, cluster, given)
        if not problems:
            return given, notes
        notes.append(f"the warm start was not a valid plan of this graph ({problems[0]}); ignored it")
    fallback = _fallback_plan(graph, cluster)
    if fallback is not None and validate_plan(graph, cluster, fallback):
        return None, notes  # its memory count leaves out copies and lifetimes; the exact peak says no
    return fallback, notes


def _fallback_plan(graph: Graph, cluster: Cluster) -> Plan | None:
    """Everything on the fastest device that holds it all; else colocation units first-fit in
    topological order onto the fastest device with room (None if that fails too)."""
    by_speed = sorted(cluster.devices, key=lambda d: (sum(op_cost(op, d) for op in graph.ops),
                                                      cluster.names.index(d.name)))
    footprint = footprints(graph)
    total = sum(footprint.values())
    whole = next((d for d in by_speed if total <= d.memory), None)
    if whole is not None:
        placement = {op.name: whole.name for op in graph.ops}
        label = f"everything on {whole.name}"
    else:
        free = {d.name: d.memory for d in cluster.devices}
        placement = {}
        for members in _colocation_units(graph.topo_order()):
            need = sum(footprint[op.name] for op in members)
            dev = next((d.name for d in by_speed if free[d.name] >= need), None)
            if dev is None:
                return None
            free[dev] -= need
            placement.update({op.name: dev for op in members})
        label = "first-fit by memory, fastest device first"
    return simulate(graph, cluster, placement, _topological_orders(graph, placement), label)


def _topological_orders(graph: Graph, placement: Mapping[str, str]) -> dict[str, list[str]]:
    order: dict[str, list[str]] = {}
    for op in graph.topo_order():
        order.setdefault(placement[op.name], []).append(op.name)
    return order


def _colocation_units(ops: Sequence[Op]) -> list[list[Op]]:
    """Ops grouped by `colocate` attribute (others alone), in order of each group's first op."""
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


def _early_answer(graph: Graph, cluster: Cluster, warm: Plan | None, lb: float, solver: str,
                  started: float) -> Plan | None:
    """Answers that need no MILP: one device, a warm start at the lower bound, a graph too big."""
    if warm is None:
        reason = unplaceable_reason(graph, cluster)
        if reason is not None:
            raise IlpError(reason)
        if len(graph.ops) > MAX_OPS:
            raise IlpError(f"the graph has {len(graph.ops)} ops, more than the exact model's limit of "
                           f"{MAX_OPS}, and no warm start fits in memory; coarsen it first")
        return None
    elapsed = time.perf_counter() - started
    if len(cluster) == 1:  # every topological order runs back to back: the total work
        device = cluster.names[0]
        warm = simulate(graph, cluster, {op.name: device for op in graph.ops},
                        {device: [op.name for op in graph.topo_order()]}, ALGORITHM)
    plan = _as_ilp(warm)
    if len(cluster) == 1 or warm.makespan <= lb * (1 + REL_GAP) + 1e-15:
        plan.solver = _solver_info(solver, "optimal", elapsed, warm.makespan, 0.0, warm.makespan)
        plan.lower_bound = warm.makespan
        why = "one device" if len(cluster) == 1 else "the warm start meets the lower bound"
        plan.notes.append(f"no MILP needed: {why}, so it is optimal")
        return plan
    if len(graph.ops) > MAX_OPS:
        return _skipped(plan, solver, lb, elapsed, f"the graph has {len(graph.ops)} ops, more than the "
                        f"exact model's limit of {MAX_OPS}")
    return None


def _too_many_binaries(inst: _Instance, warm: Plan | None, solver: str, lb: float, started: float) -> Plan:
    why = (f"the model would have {inst.integers()} binary variables, more than the limit of "
           f"{MAX_INTEGERS} (CBC overruns its time limit on larger ones)")
    if warm is None:
        raise IlpError(f"{why}, and no warm start fits in memory; coarsen the graph first")
    return _skipped(_as_ilp(warm), solver, lb, time.perf_counter() - started, why)


def _skipped(plan: Plan, solver: str, lb: float, elapsed: float, why: str) -> Plan:
    """The warm start, returned because the model would be too big to solve in time."""
    plan.solver = _solver_info(solver, "skipped", elapsed, lb, _gap(plan.makespan, lb), None)
    plan.lower_bound = lb
    plan.notes.append(f"{why}; returned the warm start unchanged (coarsen the graph further to let "
                      "the ILP improve it)")
    return plan


def _as_ilp(plan: Plan) -> Plan:
    """A copy of `plan` that says it came out of the ilp algorithm (and from which heuristic)."""
    notes = list(plan.notes)
    if plan.algorithm and plan.algorithm != ALGORITHM:
        notes.append(f"warm start from {plan.algorithm}")
    return Plan(plan.graph, ALGORITHM, list(plan.devices),
                {n: OpSlot(s.device, s.start, s.end) for n, s in plan.ops.items()},
                [Transfer(t.src, t.src_device, t.to, t.start, t.end, t.nbytes) for t in plan.transfers],
                plan.lower_bound, None, notes)


def _gap(makespan: float, bound: float) -> float:
    return max(0.0, (makespan - bound) / makespan) if makespan > 0 else 0.0


# ---------------------------------------------------------------------------- the instance

@dataclass
class _Xfer:
    """A possible transfer of producer p's results to device d."""

    p: int
    d: int
    consumers: list[int]  # ops of other units that read p and may run on d
    sources: list[int]  # devices p may run on, other than d
    duration: dict[int, float]  # by source device, all results that may be sent (model units)
    results: list[tuple[float, list[int]]]  # (bytes, consumers that read it) when results differ
    release: float = 0.0  # earliest start
    deadline: float = 0.0  # latest end
    latest: float = 0.0  # latest start (or, when not sent, its producer's latest end)
    dmin: float = 0.0
    dmax: float = 0.0


@dataclass(frozen=True)
class _Pair:
    """Two ops, or two transfers to device `d`, that may need ordering: whether `a` may go first,
    whether `b` may, and the big-M of each order (the width of the windows involved). Neither
    order possible means they may never share a device (a link)."""

    a: int
    b: int
    first: bool
    second: bool
    big_ab: float
    big_ba: float
    d: int = -1
    shared: tuple[int, ...] = ()  # source devices both transfers may come from


@dataclass
class _Instance:
    """Everything the model needs, precomputed in model time units."""

    graph: Graph
    cluster: Cluster
    ops: list[Op]  # topological order
    index: dict[str, int]
    unit_of: list[int]
    units: list[list[int]]
    allowed: list[list[int]]  # per unit
    cost: list[list[float]]  # per op, per device
    fast: list[float]  # per op, fastest allowed cost
    producers: list[list[int]]
    consumers: list[list[int]]
    desc: list[int]  # bitset of descendants per op
    est: list[float]
    lst: list[float]
    tail: list[float]
    ub: float
    lb: float
    unit: float  # model units per second
    xfers: dict[tuple[int, int], _Xfer] = field(default_factory=dict)
    op_pairs: list[_Pair] = field(default_factory=list)
    link_pairs: list[_Pair] = field(default_factory=list)
    classes: list[list[int]] = field(default_factory=list)
    unit_bytes: list[int] = field(default_factory=list)  # footprint of each unit (every byte held all step)

    def integers(self) -> int:
        """Binary variables the model will have: placements and the pairs of either order."""
        pairs = sum(1 for q in self.op_pairs + self.link_pairs if q.first and q.second)
        return sum(len(a) for a in self.allowed) + pairs

    @property
    def k(self) -> int:
        return len(self.cluster.devices)

    def lft(self, i: int) -> float:
        return self.ub - self.tail[i]

    @staticmethod
    def build(graph: Graph, cluster: Cluster, ub_seconds: float | None, lb_seconds: float) -> _Instance:
        ops = graph.topo_order()
        index = {op.name: i for i, op in enumerate(ops)}
        devices = cluster.devices
        raw_cost = [[op_cost(op, d) for d in devices] for op in ops]
        if ub_seconds is None:
            ub_seconds = _loose_upper_bound(ops, cluster, raw_cost)
        unit = SCALE_UB / ub_seconds if ub_seconds > 0 else 1.0
        units_ops = _colocation_units(ops)
        units = [[index[op.name] for op in members] for members in units_ops]
        unit_of = [0] * len(ops)
        for u, members in enumerate(units):
            for i in members:
                unit_of[i] = u
        footprint = footprints(graph)
        unit_bytes = [sum(footprint[ops[i].name] for i in members) for members in units]
        allowed = [_allowed_devices(cluster, [ops[i] for i in members], unit_bytes[u]) for u, members in enumerate(units)]
        cost = [[c * unit for c in row] for row in raw_cost]
        fast = [min(cost[i][d] for d in allowed[unit_of[i]]) for i in range(len(ops))]
        producers = [sorted(index[p.name] for p in op.producers()) for op in ops]
        consumers = [sorted(index[c.name] for c in op.consumers()) for op in ops]
        inst = _Instance(graph, cluster, ops, index, unit_of, units, allowed, cost, fast, producers, consumers,
                         _descendants(consumers), [], [], [], ub_seconds * unit * (1 + 1e-9) + EPS,
                         lb_seconds * unit, unit)
        inst.unit_bytes = unit_bytes
        best = [min(row) for row in cost]
        inst.est, inst.tail = _windows(producers, consumers, fast, inst.desc, best, _capacity(cluster, ops))
        inst.lst = [inst.lft(i) - fast[i] for i in range(len(ops))]
        inst.xfers = _transfers(inst)
        inst.op_pairs = _op_pairs(inst)
        inst.link_pairs = _link_pairs(inst)
        inst.classes = _device_classes(inst)
        return inst


def _loose_upper_bound(ops: Sequence[Op], cluster: Cluster, cost: list[list[float]]) -> float:
    """Without a warm start: every op at its worst cost, then every result sent to every other
    device over the slowest link, one thing at a time (any placement that fits does no worse)."""
    worst_link = max((lk.latency + 1.0 / lk.bandwidth for lk in cluster.links.values()), default=0.0)
    slowest_bw = min((lk.bandwidth for lk in cluster.links.values()), default=1.0)
    worst_lat = max((lk.latency for lk in cluster.links.values()), default=0.0)
    sends = sum(worst_lat + sum(value_bytes(r) for r in op.results) / slowest_bw for op in ops if op.consumers())
    return sum(max(row) for row in cost) + sends * (len(cluster) - 1) + worst_link


def _allowed_devices(cluster: Cluster, members: list[Op], need: int) -> list[int]:
    allowed = [d for d, dev in enumerate(cluster.devices) if need <= dev.memory]
    if not allowed:
        what = f"op '{members[0].name}'" if len(members) == 1 else \
            f"colocation group '{members[0].get('colocate')}' ({len(members)} ops)"
        biggest = max(dev.memory for dev in cluster.devices)
        raise IlpError(f"{what} needs {need} bytes but the largest device holds {int(biggest)}")
    return allowed


def _descendants(consumers: list[list[int]]) -> list[int]:
    """Reachability as Python-int bitsets, built in reverse topological order."""
    desc = [0] * len(consumers)
    for i in range(len(consumers) - 1, -1, -1):
        bits = 0
        for c in consumers[i]:
            bits |= desc[c] | (1 << c)
        desc[i] = bits
    return desc


def _windows(producers: list[list[int]], consumers: list[list[int]], fast: list[float], desc: list[int],
             best: list[float], capacity: float) -> tuple[list[float], list[float]]:
    """Earliest starts and tails (time any schedule needs after an op ends), each the larger of
    a longest path (fastest allowed costs, free links) and the work of all ancestors (descendants,
    at their fastest on any device) spread over the cluster's capacity: everything before an op
    must have run somewhere first."""
    n = len(fast)
    anc = [0] * n
    for i in range(n):
        for p in producers[i]:
            anc[i] |= anc[p] | (1 << p)
    est = [0.0] * n
    for i in range(n):
        path = max((est[p] + fast[p] for p in producers[i]), default=0.0)
        est[i] = max(path, _work(anc[i], best) / capacity)
    tail = [0.0] * n
    for i in range(n - 1, -1, -1):
        path = max((fast[c] + tail[c] for c in consumers[i]), default=0.0)
        tail[i] = max(path, _work(desc[i], best) / capacity)
    return est, tail


def _work(bits: int, fast: list[float]) -> float:
    total = 0.0
    while bits:
        low = bits & -bits
        total += fast[low.bit_length() - 1]
        bits ^= low
    return total


def _capacity(cluster: Cluster, ops: Sequence[Op]) -> float:
    """How many fastest-device seconds of work the cluster does per second (as `lower_bound`):
    device d runs any op at best 1/r_d as fast as its fastest device, r_d the smallest ratio."""
    capacity = 0.0
    for d in cluster.devices:
        ratios = []
        for op in ops:
            best = min(op_cost(op, e) for e in cluster.devices)
            if best > 0:
                ratios.append(op_cost(op, d) / best)
        capacity += 1.0 / min(ratios) if ratios else 1.0
    return capacity


def _transfers(inst: _Instance) -> dict[tuple[int, int], _Xfer]:
    """Every (producer, destination) transfer some placement could need, with its time window."""
    out: dict[tuple[int, int], _Xfer] = {}
    cluster, names = inst.cluster, inst.cluster.names
    for p in range(len(inst.ops)):
        up = inst.unit_of[p]
        results = _foreign_results(inst, p)
        if not results:
            continue
        for d in range(inst.k):
            sources = [s for s in inst.allowed[up] if s != d]
            cons = sorted({c for _, users in results for c in users if d in inst.allowed[inst.unit_of[c]]})
            if not sources or not cons:
                continue
            sent = [(b, users) for b, users in results if any(c in cons for c in users)]
            total = sum(b for b, _ in sent)
            duration = {s: cluster.transfer_time(names[s], names[d], total) * inst.unit for s in sources}
            smallest = min(b for b, _ in sent)
            dmin = min(cluster.transfer_time(names[s], names[d], smallest) * inst.unit for s in sources)
            same_users = all(set(users) == set(sent[0][1]) for _, users in sent)
            x = _Xfer(p, d, cons, sources, duration, [] if same_users else sent)
            x.release = inst.est[p] + inst.fast[p]
            x.deadline = max(inst.lst[c] for c in cons)
            x.latest = max(inst.lft(p), x.deadline - dmin, x.release)
            x.dmin = dmin
            x.dmax = max(duration.values())
            out[(p, d)] = x
    return out


def _op_pairs(inst: _Instance) -> list[_Pair]:
    """Op pairs with no path between them that may share a device and whose windows overlap."""
    out: list[_Pair] = []
    n = len(inst.ops)
    timeless = {i for i in range(n) if not any(inst.cost[i])}  # zero-length ops block no device
    for i in range(n):
        if i in timeless:
            continue
        ui = inst.unit_of[i]
        for j in range(i + 1, n):
            uj = inst.unit_of[j]
            if inst.desc[i] >> j & 1 or j in timeless or (ui != uj and not set(inst.allowed[ui]) & set(inst.allowed[uj])):
                continue
            ij = inst.est[i] + inst.fast[i] <= inst.lst[j] + EPS
            ji = inst.est[j] + inst.fast[j] <= inst.lst[i] + EPS
            if not ij and not ji and ui == uj:
                ij = ji = True  # cannot happen below a true UB; stay exact rather than clever
            big_ij, big_ji = inst.lft(i) - inst.est[j], inst.lft(j) - inst.est[i]
            if (ij and big_ij <= 0) or (ji and big_ji <= 0):
                continue  # the windows alone put one after the other
            out.append(_Pair(i, j, ij, ji, big_ij, big_ji))
    return out


def _link_pairs(inst: _Instance) -> list[_Pair]:
    """Transfer pairs to one device that may come from one device, with overlapping windows."""
    by_dest: dict[int, list[_Xfer]] = {}
    for t in inst.xfers.values():
        by_dest.setdefault(t.d, []).append(t)
    out: list[_Pair] = []
    for d, ts in by_dest.items():
        for k, tp in enumerate(ts):
            for tq in ts[k + 1:]:
                shared = tuple(sorted(set(tp.sources) & set(tq.sources)))
                if not shared:
                    continue
                big_pq = tp.latest + tp.dmax - tq.release
                big_qp = tq.latest + tq.dmax - tp.release
                pq = tp.release + tp.dmin + tq.dmin <= tq.deadline + EPS
                qp = tq.release + tq.dmin + tp.dmin <= tp.deadline + EPS
                if (pq and big_pq <= 0) or (qp and big_qp <= 0):
                    continue  # the windows alone put one after the other
                out.append(_Pair(tp.p, tq.p, pq, qp, big_pq, big_qp, d, shared))
    return out


def _foreign_results(inst: _Instance, p: int) -> list[tuple[float, list[int]]]:
    """(bytes, readers in other units) for each result of op p that some other unit reads."""
    out = []
    for r in inst.ops[p].results:
        users = sorted({inst.index[u.name] for u in r.users()} - set(inst.units[inst.unit_of[p]]))
        if users:
            out.append((float(value_bytes(r)), users))
    return out


def _device_classes(inst: _Instance) -> list[list[int]]:
    """Groups (of 2 or more) of interchangeable devices: same op costs, memory and links."""
    devices, names = inst.cluster.devices, inst.cluster.names
    first = {d: (tuple(row[d] for row in inst.cost), dev.memory, tuple(d in a for a in inst.allowed))
             for d, dev in enumerate(devices)}

    def towards(d: int, f: int) -> tuple[float, ...]:
        a, b = inst.cluster.link(names[d], names[f]), inst.cluster.link(names[f], names[d])
        return a.latency, a.bandwidth, b.latency, b.bandwidth

    groups = interchangeable_devices(first, towards)
    return [g for g in groups if len(g) > 1 and _uniform_inside(inst.cluster, g)]


def _uniform_inside(cluster: Cluster, group: list[int]) -> bool:
    names = cluster.names
    links = {(cluster.link(names[a], names[b]).latency, cluster.link(names[a], names[b]).bandwidth)
             for a in group for b in group if a != b}
    return len(links) <= 1


def _relabel_for_symmetry(inst: _Instance, plan: Plan) -> Plan:
    """`plan` with interchangeable devices renamed in order of first use, as symmetry breaking wants."""
    names = inst.cluster.names
    rename = {n: n for n in names}
    for cls in inst.classes:
        first_use: list[int] = []
        for members in inst.units:
            d = names.index(plan.ops[inst.ops[members[0]].name].device)
            if d in cls and d not in first_use:
                first_use.append(d)
        first_use += [d for d in cls if d not in first_use]
        for new, old in zip(cls, first_use):
            rename[names[old]] = names[new]
    ops = {n: OpSlot(rename[s.device], s.start, s.end) for n, s in plan.ops.items()}
    transfers = [Transfer(t.src, rename[t.src_device], rename[t.to], t.start, t.end, t.nbytes)
                 for t in plan.transfers]
    return Plan(plan.graph, plan.algorithm, list(plan.devices), ops, transfers)


# ---------------------------------------------------------------------------- the model

@dataclass
class _Result:
    status: str
    objective: float | None  # seconds
    bound: float | None  # seconds
    seconds: float
    has_solution: bool


class _Milp:
    """The python-mip model of one instance, with its variables by role."""

    def __init__(self, inst: _Instance, solver: str, options: PlaceOptions) -> None:
        import mip

        self.mip = mip
        self.solver = solver
        self.inst = inst
        self.options = options
        with _stdout_silenced():  # HiGHS prints a banner unless told to be quiet at once
            self.model = mip.Model(name=f"pesto-{inst.graph.name}", sense=mip.MINIMIZE,
                                   solver_name=mip.CBC if solver == "cbc" else mip.HIGHS)
            self.model.verbose = 0
        m = self.model
        m.seed = options.seed
        m.threads = max(1, options.threads)
        m.max_mip_gap = REL_GAP
        m.max_mip_gap_abs = EPS
        m.preprocess = 0
        self.x: dict[tuple[int, int], Any] = {}
        self.S: list[Any] = []
        self.T: Any = None
        self.a: dict[tuple[int, int], Any] = {}
        self.R: dict[tuple[int, int], Any] = {}
        self.D: dict[tuple[int, int], Any] = {}
        self.order: dict[tuple[int, int], Any] = {}  # op pairs i < j: 1 when i runs first
        self.link_order: dict[tuple[int, int, int], Any] = {}  # (p, q, d), p < q: 1 when p's goes first
        self.symmetry_rows: list[Any] = []
        self.fixed: list[Any] = []
        self._build()

    # ------------------------------------------------------------------ building
    def _build(self) -> None:
        self._placement()
        self._times()
        self._transfer_nodes()
        self._op_disjunctions()
        self._link_disjunctions()
        self._symmetry()
        self.model.objective = self.mip.minimize(self.T)

    def xv(self, i: int, d: int) -> Any:
        """x of op i's unit on device d, or 0 where the unit may not go."""
        return self.x.get((self.inst.unit_of[i], d), 0)

    def end(self, i: int) -> Any:
        inst = self.inst
        return self.S[i] + self.mip.xsum(inst.cost[i][d] * self.x[(inst.unit_of[i], d)]
                                         for d in inst.allowed[inst.unit_of[i]])

    def _placement(self) -> None:
        inst, m, xsum = self.inst, self.model, self.mip.xsum
        for u, devices in enumerate(inst.allowed):
            for d in devices:
                self.x[(u, d)] = m.add_var(f"x_{u}_{d}", var_type=self.mip.BINARY)
            m += xsum(self.x[(u, d)] for d in devices) == 1
        # Conservative: every byte an op holds, and a copy of every tensor a device receives, held
        # for the whole step (copy_{p,d} >= x_{reader's unit,d} - x_{p's unit,d}).
        mem = inst.unit_bytes
        sent = [sum(r.type.nbytes for r in op.results
                    if any(inst.unit_of[inst.index[c.name]] != inst.unit_of[i] for c in r.users()))
                for i, op in enumerate(inst.ops)]
        for d, dev in enumerate(inst.cluster.devices):
            on_d = [u for u in range(len(inst.units)) if d in inst.allowed[u] and mem[u] > 0]
            if sum(mem[u] for u in on_d) + sum(sent) <= dev.memory:
                continue
            copies = []
            for p, nbytes in enumerate(sent):
                readers = {inst.unit_of[c] for c in inst.consumers[p]} - {inst.unit_of[p]}
                readers = {u for u in readers if (u, d) in self.x}
                if nbytes and readers:
                    z = m.add_var(f"copy_{p}_{d}", lb=0.0, ub=1.0)
                    for u in sorted(readers):
                        m += z >= self.x[(u, d)] - self.xv(p, d)
                    copies.append(nbytes * z)
            m += xsum(mem[u] * self.x[(u, d)] for u in on_d) + xsum(copies) <= dev.memory

    def _times(self) -> None:
        inst, m, xsum = self.inst, self.model, self.mip.xsum
        self.S = [m.add_var(f"S_{i}", lb=inst.est[i], ub=max(inst.est[i], inst.lst[i]))
                  for i in range(len(inst.ops))]
        self.T = m.add_var("T", lb=inst.lb, ub=inst.ub)
        for i in range(len(inst.ops)):
            end = self.end(i)
            if len({inst.cost[i][d] for d in inst.allowed[inst.unit_of[i]]}) > 1:
                m += end <= inst.lft(i)
            m += self.T >= end + inst.tail[i]
            for p in inst.producers[i]:
                m += self.S[i] >= self.end(p)
        for d in range(inst.k):
            work = [(i, inst.cost[i][d]) for i in range(len(inst.ops))
                    if d in inst.allowed[inst.unit_of[i]] and inst.cost[i][d] > 0]
            m += self.T >= xsum(c * self.xv(i, d) for i, c in work)

    def _transfer_nodes(self) -> None:
        inst, m = self.inst, self.model
        for (p, d), t in inst.xfers.items():
            a = m.add_var(f"a_{p}_{d}", lb=0.0, ub=1.0)
            self.a[(p, d)] = a
            for c in t.consumers:
                m += a >= self.xv(c, d) - self.xv(p, d)
            m += a <= 1 - self.xv(p, d)
            r_ub = t.latest
            r = m.add_var(f"R_{p}_{d}", lb=t.release, ub=r_ub)
            self.R[(p, d)] = r
            m += r >= self.end(p)
            self.D[(p, d)] = self._duration(t)
            for c in t.consumers:
                big = r_ub + t.dmax - inst.est[c]
                if big > 0:  # else the windows already put the arrival before c's start
                    m += self.S[c] >= r + self.D[(p, d)] - big * (1 - self.xv(c, d))

    def _duration(self, t: _Xfer) -> Any:
        """Transfer time by p's device; with results read by different consumers, only those needed."""
        xsum, m, inst = self.mip.xsum, self.model, self.inst
        if not t.results:
            return xsum(t.duration[s] * self.xv(t.p, s) for s in t.sources)
        names = inst.cluster.names
        need = []
        for k, (nbytes, users) in enumerate(t.results):
            y = m.add_var(f"y_{t.p}_{t.d}_{k}", lb=0.0, ub=1.0)
            for c in users:
                if t.d in inst.allowed[inst.unit_of[c]]:
                    m += y >= self.xv(c, t.d) - self.xv(t.p, t.d)
            need.append((nbytes, y))
        dur = m.add_var(f"D_{t.p}_{t.d}", lb=0.0, ub=t.dmax)
        for s in t.sources:
            link = inst.cluster.link(names[s], names[t.d])
            expr = link.latency * inst.unit + xsum(b / link.bandwidth * inst.unit * y for b, y in need)
            m += dur >= expr - t.duration[s] * (1 - self.xv(t.p, s))
        return dur

    def _same_device(self, i: int, j: int) -> Any:
        """1 (or more) when ops i and j share a device; a continuous lower-bounded indicator."""
        inst = self.inst
        ui, uj = inst.unit_of[i], inst.unit_of[j]
        if ui == uj:
            return 1
        common = set(inst.allowed[ui]) & set(inst.allowed[uj])
        s = self.model.add_var(f"same_{i}_{j}", lb=0.0, ub=1.0)
        for d in common:
            self.model += s >= self.x[(ui, d)] + self.x[(uj, d)] - 1
        return s

    def _op_disjunctions(self) -> None:
        m = self.model
        for q in self.inst.op_pairs:
            i, j = q.a, q.b
            if not q.first and not q.second:
                for d in set(self.inst.allowed[self.inst.unit_of[i]]) & set(self.inst.allowed[self.inst.unit_of[j]]):
                    m += self.xv(i, d) + self.xv(j, d) <= 1
                continue
            same = self._same_device(i, j)
            if q.first and q.second:
                o = m.add_var(f"o_{i}_{j}", var_type=self.mip.BINARY)
                self.order[(i, j)] = o
                m += self.S[j] >= self.end(i) - q.big_ab * (1 - o) - q.big_ab * (1 - same)
                m += self.S[i] >= self.end(j) - q.big_ba * o - q.big_ba * (1 - same)
            elif q.first:
                m += self.S[j] >= self.end(i) - q.big_ab * (1 - same)
            else:
                m += self.S[i] >= self.end(j) - q.big_ba * (1 - same)

    def _link_disjunctions(self) -> None:
        inst, m = self.inst, self.model
        for q in inst.link_pairs:
            p, r, d = q.a, q.b, q.d
            up, ur = inst.unit_of[p], inst.unit_of[r]
            if up == ur:
                same: Any = 1
            else:
                same = m.add_var(f"ss_{p}_{r}_{d}", lb=0.0, ub=1.0)
                for s in q.shared:
                    m += same >= self.x[(up, s)] + self.x[(ur, s)] - 1
            both = same + self.a[(p, d)] + self.a[(r, d)] - 2  # 1 when both use one link
            rp, rr = self.R[(p, d)], self.R[(r, d)]
            if not q.first and not q.second:
                m += both <= 0
            elif q.first and q.second:
                w = m.add_var(f"w_{p}_{r}_{d}", var_type=self.mip.BINARY)
                self.link_order[(p, r, d)] = w
                m += rr >= rp + self.D[(p, d)] - q.big_ab * (1 - w) - q.big_ab * (1 - both)
                m += rp >= rr + self.D[(r, d)] - q.big_ba * w - q.big_ba * (1 - both)
            elif q.first:
                m += rr >= rp + self.D[(p, d)] - q.big_ab * (1 - both)
            else:
                m += rp >= rr + self.D[(r, d)] - q.big_ba * (1 - both)

    def _symmetry(self) -> None:
        """Within a class of interchangeable devices, unit u may use the class's device j only
        if an earlier unit uses device j-1 (`h[u,j]`: some unit up to u uses device j)."""
        inst, m = self.inst, self.model
        for cls in self.inst.classes:
            prev: list[Any] = [0] * len(cls)
            for u in range(len(inst.units)):
                if not all(d in inst.allowed[u] for d in cls):
                    continue
                rows = [self.x[(u, cls[j])] <= prev[j - 1] for j in range(1, len(cls))]
                cur = []
                for j in range(len(cls) - 1):
                    h = m.add_var(f"h_{u}_{cls[j]}", lb=0.0, ub=1.0)
                    rows += [h >= self.x[(u, cls[j])], h >= prev[j], h <= prev[j] + self.x[(u, cls[j])]]
                    cur.append(h)
                self.symmetry_rows += [m.add_constr(r) for r in rows]
                prev = cur + [0]

    def size(self) -> str:
        m = self.model
        return f"{m.num_cols} vars ({m.num_int} int), {m.num_rows} rows, {m.num_nz} nz"

    # ------------------------------------------------------------------ warm start
    def start_values(self, plan: Plan) -> dict[Any, float]:
        """The integer choices of a valid plan (the solver derives the continuous values):
        placement, op order by start time, transfer order on each link by start time."""
        inst, names = self.inst, self.inst.cluster.names
        if self.symmetry_rows:
            plan = _relabel_for_symmetry(inst, plan)
        dev = [names.index(plan.ops[op.name].device) for op in inst.ops]
        values: dict[Any, float] = {}
        for (u, d), var in self.x.items():
            values[var] = 1.0 if dev[inst.units[u][0]] == d else 0.0
        key = [(plan.ops[op.name].start, plan.ops[op.name].end, i) for i, op in enumerate(inst.ops)]
        for (i, j), var in self.order.items():
            values[var] = 1.0 if key[i] <= key[j] else 0.0
        sent = {(t.src, names.index(t.to)): t.start for t in plan.transfers}
        for (p, q, d), var in self.link_order.items():  # a transfer not made counts as sent at once
            tp = sent.get((inst.ops[p].name, d), plan.ops[inst.ops[p].name].end)
            tq = sent.get((inst.ops[q].name, d), plan.ops[inst.ops[q].name].end)
            values[var] = 1.0 if (tp, p) <= (tq, q) else 0.0
        return values

    def set_start(self, values: dict[Any, float]) -> None:
        self.model.start = list(values.items())

    def fix_outside(self, values: dict[Any, float], free: set[int]) -> None:
        """Fix every integer choice but those among the ops of the `free` units: other units'
        devices, and the order of every op pair and transfer pair not both free. A freed op that
        moves keeps its place in time among the fixed ones (on any device), which keeps each
        neighbourhood small enough to search in a second or two."""
        inst = self.inst
        loose = {i for u in free for i in inst.units[u]}
        chosen = [var for (u, _), var in self.x.items() if u not in free]
        chosen += [var for (i, j), var in self.order.items() if i not in loose or j not in loose]
        chosen += [var for (p, q, _), var in self.link_order.items() if p not in loose or q not in loose]
        for var in chosen:
            var.lb = var.ub = values[var]
        self.fixed = chosen

    def unfix(self) -> None:
        for var in self.fixed:
            var.lb, var.ub = 0.0, 1.0
        self.fixed = []

    def drop_symmetry(self) -> None:
        """Remove symmetry breaking: with most placements fixed it would forbid moves that are
        only equivalent to relabelling the fixed ops too."""
        if self.symmetry_rows:
            self.model.remove(self.symmetry_rows)
            self.symmetry_rows = []

    # ------------------------------------------------------------------ solving
    def solve(self, seconds: float, live: bool = True) -> _Result:
        """Optimize for at most `seconds`; `live` reports CBC's incumbent and bound as it goes."""
        mip, m = self.mip, self.model
        started = time.perf_counter()
        log = _CbcLog(self.options.progress, self.inst.unit)
        live = live and not self.options.quiet and self.solver == "cbc" and log.start()
        m.verbose = 1 if live else 0
        try:
            status = m.optimize(max_seconds=max(seconds, 0.5))
        finally:
            if live:
                log.stop()
        elapsed = time.perf_counter() - started
        has = status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE)
        objective = m.objective_value / self.inst.unit if has else None
        bound = m.objective_bound
        bound_s = bound / self.inst.unit if bound is not None and math.isfinite(bound) and abs(bound) < 1e30 else None
        if status == mip.OptimizationStatus.OPTIMAL and objective is not None:
            bound_s = objective if bound_s is None else min(max(bound_s, 0.0), objective)
        return _Result(_status_name(status), objective, bound_s, elapsed, has)

    # ------------------------------------------------------------------ reading the solution
    def solution(self) -> tuple[dict[str, str], dict[str, list[str]], dict[tuple[str, str], list[str]], float]:
        """Placement, per-device order by start time, per-link transfer order, solved makespan."""
        inst, names = self.inst, self.inst.cluster.names
        placement: dict[str, str] = {}
        for i, op in enumerate(inst.ops):
            u = inst.unit_of[i]
            d = max(inst.allowed[u], key=lambda d: self.x[(u, d)].x or 0.0)
            placement[op.name] = names[d]
        # Kahn by solved start: near-ties within the solver's tolerance must not put an op
        # before its producer, which a plain sort by start time could.
        starts = {op.name: self.S[i].x or 0.0 for i, op in enumerate(inst.ops)}
        order = order_from_priority(inst.graph, placement, starts)
        links: dict[tuple[str, str], list[tuple[float, int, str]]] = {}
        for (p, d), r in self.R.items():
            src = placement[inst.ops[p].name]
            if src != names[d] and names[d] in transfer_bytes(inst.ops[p], placement):
                links.setdefault((src, names[d]), []).append((r.x or 0.0, p, inst.ops[p].name))
        link_order = {k: [n for _, _, n in sorted(v)] for k, v in links.items()}
        return placement, order, link_order, (self.T.x or 0.0) / inst.unit

    def realize(self) -> list[tuple[Plan, str]]:
        """The solution as real schedules: simulated (links first come, first served), and
        replayed with the solver's own link order."""
        graph, cluster = self.inst.graph, self.inst.cluster
        placement, order, link_order, _ = self.solution()
        out: list[tuple[Plan, str]] = []
        try:
            out.append((simulate(graph, cluster, placement, order, ALGORITHM), "milp"))
        except PlanError:
            pass
        replayed = replay(graph, cluster, placement, order, link_order)
        if replayed is not None:
            out.append((replayed, "replay"))
        return out


class _CbcLog:
    """While CBC solves, route its log (written to file descriptor 1) through a pipe and report
    each new incumbent, a raised bound at most once a second, and both every HEARTBEAT seconds.
    python-mip's own progress callback crashes the bundled CBC (CbcBnBOutput::onStrongStats) and
    its incumbent callback is a no-op, so the log is the one live view of the search."""

    def __init__(self, report: Callable[[str], None], unit: float) -> None:
        self.report = report
        self.unit = unit
        self.best = math.inf
        self.bound = -math.inf
        self.last = 0.0
        self.shown_bound = -math.inf
        self.started = time.perf_counter()

    def start(self) -> bool:
        """Point fd 1 at the pipe; False (and nothing changed) where fd 1 cannot be redirected."""
        sys.stdout.flush()
        try:
            read, write = os.pipe()
            self.saved = os.dup(1)
        except OSError:
            return False
        os.dup2(write, 1)
        os.close(write)
        self.thread = threading.Thread(target=self._read, args=(read,), daemon=True)
        self.thread.start()
        return True

    def stop(self) -> None:
        _flush_c_stdio()
        os.dup2(self.saved, 1)  # closes the pipe's last write end: the reader sees EOF
        os.close(self.saved)
        self.thread.join(timeout=5)

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                self.see(*_parse_cbc_line(line))

    def see(self, incumbent: float | None, bound: float | None) -> None:
        now = time.perf_counter() - self.started
        improved = incumbent is not None and incumbent < self.best - 1e-9
        if improved:
            self.best = incumbent
        if bound is not None and bound > self.bound:
            self.bound = bound
        raised = bound is not None and bound > self.shown_bound + 1e-6 * abs(bound) and now - self.last >= 1.0
        if improved or raised or now - self.last >= HEARTBEAT:
            self.shown_bound = self.bound
            self.last = now
            inc = f"{self.best / self.unit * 1e3:.4f} ms" if math.isfinite(self.best) else "none"
            low = f"{self.bound / self.unit * 1e3:.4f} ms" if math.isfinite(self.bound) else "none"
            self.report(f"ilp: {now:6.1f}s  incumbent {inc}  bound {low}")


_NUMBER = r"([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
_INCUMBENT = re.compile(rf"(?:Integer solution of|MIPStart provided solution with cost|BestSol:)\s*{_NUMBER}")
_CLASSIC_BEST = re.compile(rf"{_NUMBER} best solution")
_BOUND = re.compile(rf"(?:best possible|Bound:)\s*{_NUMBER}")
_NODE_ROW = re.compile(rf"^\s*\d+\s+\d+\s+\d+\s+{_NUMBER}\s.*?\s{_NUMBER}\s+{_NUMBER}%\s+{_NUMBER}\s*$")
_HEURISTIC_ROW = re.compile(rf"^\s*\S+\s+solution\s+{_NUMBER}\s+{_NUMBER}\s*$")


def _parse_cbc_line(line: str) -> tuple[float | None, float | None]:
    """(incumbent, bound) that one line of CBC's log states, in model units; None where silent.
    Knows the classic messages (Cbc0012I, Cbc0010I) and the tables of the newer log format."""
    line = line.replace("\u2605", " ")  # the star marking a heuristic's new best
    row = _NODE_ROW.match(line)
    if row:
        return float(row.group(1)), float(row.group(2))
    row = _HEURISTIC_ROW.match(line)
    if row:
        return float(row.group(1)), None
    inc, low = _INCUMBENT.search(line) or _CLASSIC_BEST.search(line), _BOUND.search(line)
    return (float(inc.group(1)) if inc else None), (float(low.group(1)) if low else None)


@contextlib.contextmanager
def _stdout_silenced() -> Iterator[None]:
    """File descriptor 1 goes to /dev/null for the duration (for what native solvers print)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no fd 1 to protect
        yield
        return
    os.dup2(null, 1)
    os.close(null)
    try:
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)


def _flush_c_stdio() -> None:
    """Flush the C library's stdout buffer so none of CBC's log lands after fd 1 is restored."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C runtime to reach: nothing was buffered through it
        pass


def _status_name(status: Any) -> str:
    names = {"OPTIMAL": "optimal", "FEASIBLE": "feasible", "NO_SOLUTION_FOUND": "no-solution",
             "INFEASIBLE": "infeasible", "INT_INFEASIBLE": "infeasible", "UNBOUNDED": "unbounded"}
    return names.get(status.name, status.name.lower().replace("_", "-"))


# ---------------------------------------------------------------------------- a real schedule

def replay(graph: Graph, cluster: Cluster, placement: Mapping[str, str], order: Mapping[str, Sequence[str]],
           link_order: Mapping[tuple[str, str], Sequence[str]], algorithm: str = ALGORITHM) -> Plan | None:
    """The earliest schedule that keeps the given device orders *and* link orders (None if they
    deadlock). `simulate` sends on each link first come, first served; the MILP may pick another
    link order, and this is how its schedule is realised exactly."""
    nodes: dict[Any, list[Any]] = {}  # node -> predecessors
    length: dict[Any, float] = {}
    for d, names in order.items():
        busy: str | None = None  # the last op on d that takes time: zero-length ops neither
        for name in names:       # wait for the device nor hold it (they cannot overlap anything)
            op = graph.op(name)
            length[name] = op_cost(op, cluster.device(d))
            preds = [p.name if placement[p.name] == d else (p.name, d) for p in op.producers()]
            if length[name] > 0:
                preds += [busy] if busy is not None else []
                busy = name
            nodes[name] = preds
    for op in graph.ops:
        for dst, nbytes in transfer_bytes(op, placement).items():
            nodes[(op.name, dst)] = [op.name]
            length[(op.name, dst)] = cluster.transfer_time(placement[op.name], dst, nbytes)
    for (_, dst), names in link_order.items():
        for k in range(1, len(names)):
            nodes[(names[k], dst)].append((names[k - 1], dst))
    finish = longest_paths(nodes, length)
    if finish is None:
        return None
    slots = {op.name: OpSlot(placement[op.name], finish[op.name] - length[op.name], finish[op.name])
             for op in graph.ops}
    transfers = [Transfer(op.name, placement[op.name], dst, finish[(op.name, dst)] - length[(op.name, dst)],
                          finish[(op.name, dst)], nbytes)
                 for op in graph.ops for dst, nbytes in sorted(transfer_bytes(op, placement).items())]
    return Plan(graph.name, algorithm, list(cluster.names), slots, transfers)


class _Search:
    """The exact solve, then (when it stops short of optimal) a large-neighbourhood search with
    the same model: all but a window of ops keep the incumbent's placement and orders, and the
    MILP re-optimizes the window. CBC's own search rarely improves a good heuristic start past
    ~20 ops (the LP bound stays at the critical path until most placements are branched on);
    small windows it solves to optimality in well under a second each."""

    def __init__(self, milp: _Milp, warm: Plan | None, options: PlaceOptions, deadline: float) -> None:
        self.milp = milp
        self.inst = milp.inst
        self.options = options
        self.deadline = deadline
        self.warm = warm
        self.best: Plan | None = _as_ilp(warm) if warm is not None else None
        self.source = "warm"
        self.realized: dict[str, float] = {}  # makespans of the exact solve's realisations
        self.exact = _Result("not-run", None, None, 0.0, False)
        self.objective: float | None = None
        self.rounds = 0
        self.wins = 0
        self.status = "not-run"

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def run(self) -> None:
        if self.best is not None:
            self.milp.set_start(self.milp.start_values(self.best))
        budget = self.left()
        exact_budget = budget if self.best is None else max(EXACT_SHARE * budget, min(budget, EXACT_MIN))
        self.exact = self.milp.solve(exact_budget)
        self.status = self.exact.status
        if self.exact.has_solution:
            self.objective = self.exact.objective
            for plan, label in self.milp.realize():
                self.realized[label] = plan.makespan
                self.offer(plan, label)
        if self.exact.status != "optimal" and self.best is not None and self.left() > LNS_MIN_SLICE:
            self.neighbourhoods()

    def offer(self, plan: Plan, label: str) -> bool:
        """Keep `plan` when it beats the best so far (ties keep the earlier), and tell
        `options.on_incumbent` (the worker's caller keeps it in case the solve is cut short)."""
        if self.best is not None and plan.makespan >= self.best.makespan * (1 - 1e-12):
            return False
        self.best, self.source = plan, label
        if self.options.on_incumbent is not None and not validate_plan(self.inst.graph, self.inst.cluster, plan):
            self.options.on_incumbent(plan)
        return True

    def neighbourhoods(self) -> None:
        milp, inst = self.milp, self.inst
        milp.drop_symmetry()
        rng = random.Random(self.options.seed)
        units = len(inst.units)
        size = min(len(inst.ops), LNS_START_OPS)
        slice_s = min(LNS_MAX_SLICE, max(LNS_MIN_SLICE, self.left() / LNS_SLICES))
        while self.left() > LNS_MIN_SLICE:
            assert self.best is not None
            free = self.window(rng, size)
            values = milp.start_values(self.best)
            milp.fix_outside(values, free)
            milp.set_start(values)
            result = milp.solve(min(slice_s, self.left()), live=False)
            milp.unfix()
            self.rounds += 1
            improved = False
            if result.has_solution:
                if self.objective is None or result.objective < self.objective:
                    self.objective = result.objective
                for plan, _ in milp.realize():
                    improved |= self.offer(plan, "lns")
            if improved:
                self.wins += 1
                self.options.progress(f"ilp: {self.elapsed():6.1f}s  incumbent {_fmt(self.best.makespan)}  "
                                      f"(re-optimized {len(free)} of {units} units)")
            if result.status == "optimal" and len(free) == units:
                self.status = "optimal"  # the whole model, solved without symmetry breaking
                self.exact = result
                return
            self.status = "feasible"
            size = self.resize(size, result.status == "optimal", improved)

    @staticmethod
    def resize(size: int, exhausted: bool, improved: bool) -> int:
        """Grow a neighbourhood the solver exhausts, shrink one it could neither finish nor improve."""
        if exhausted:
            return size + max(1, size // 4)
        return size if improved else max(LNS_MIN_OPS, (size * 4) // 5)

    def window(self, rng: random.Random, size: int) -> set[int]:
        """Units of the `size` ops running closest in time to a randomly drawn op of the incumbent."""
        assert self.best is not None
        inst, slots = self.inst, self.best.ops
        mid = [(slots[op.name].start + slots[op.name].end) / 2 for op in inst.ops]
        centre = mid[rng.randrange(len(mid))]
        near = sorted(range(len(mid)), key=lambda i: (abs(mid[i] - centre), i))[:size]
        return {inst.unit_of[i] for i in near}

    def elapsed(self) -> float:
        return self.options.time_limit - self.left()

    def finish(self, notes: list[str], started: float) -> Plan:
        """Record status, bound and gap in the best plan, validate it and say where it came from."""
        inst, exact = self.inst, self.exact
        graph, cluster = inst.graph, inst.cluster
        if self.best is None:
            raise IlpError(f"the MILP found no plan for '{graph.name}' within {self.options.time_limit:g}s "
                           f"(status {exact.status}) and no heuristic found a plan to start from: "
                           f"{NO_START_HINT}")
        plan = self.best
        plan.notes = notes + [n for n in plan.notes if n not in notes] + self.outcome()
        bound = max(b for b in (exact.bound, inst.lb / inst.unit) if b is not None)
        bound = min(bound, plan.makespan)
        plan.lower_bound = bound
        plan.solver = _solver_info(self.milp.solver, self.status, time.perf_counter() - started, bound,
                                   _gap(plan.makespan, bound), self.objective)
        plan.solver["model"] = self.milp.size()
        if self.rounds:
            plan.solver["lns_rounds"] = self.rounds
        self.options.progress(f"ilp: {self.status} after {time.perf_counter() - started:.1f}s: makespan "
                              f"{_fmt(plan.makespan)} (from {self.source}), bound {_fmt(bound)}, "
                              f"gap {plan.solver['gap']:.2%}")
        return check_plan(graph, cluster, plan)

    def outcome(self) -> list[str]:
        out: list[str] = []
        warm, best = self.warm, self.best
        assert best is not None
        if self.source == "warm":
            out.append(f"the MILP found nothing better than the warm start (status {self.status}); "
                       "returned the warm start")
        elif warm is not None and best.makespan >= warm.makespan * (1 - 1e-9):
            out.append(f"the MILP found nothing better than the warm start (status {self.status})")
        if self.source == "replay" and "milp" in self.realized:
            out.append(f"kept the MILP's link order: first-come-first-served links would give "
                       f"{_fmt(self.realized['milp'])} instead of {_fmt(best.makespan)}")
        if self.rounds:
            out.append(f"large-neighbourhood search after the exact solve: {self.rounds} windows re-optimized, "
                       f"{self.wins} improved the plan")
        return out
