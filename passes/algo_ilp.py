"""`ilp`: Pesto's joint placement-and-scheduling MILP, for k devices of any speeds, in python-mip.

The model (Pesto, Middleware 2021, §4, generalised from 2 GPUs to k heterogeneous devices):

- `x[u,d]` (binary): placement unit `u` runs on device `d`. A unit is one op, or a whole
  colocation group (ops sharing a `colocate` attribute share their variables, so they share a device).
- `S[i]`: op start; its end is `C[i] = S[i] + sum_d cost(i,d) x[u(i),d]`. `T`: the makespan.
- Transfer nodes, one per (producer p, destination device d): `a[p,d]` >= x[c,d] - x[p,d] for each
  consumer c (p's results are needed on d and p is elsewhere: the XOR/AND products linearised),
  start `R[p,d]` >= C[p], duration `D[p,d]` that of the link from p's device (heterogeneous links).
  A consumer on d starts after R[p,d] + D[p,d]; on p's own device D is 0, so it waits for C[p] only.
- Big-M disjunctions with an ordering binary for op pairs with no path between them that may share
  a device, and for transfer pairs that may share a directed link (one transfer at a time).
- Memory capacity per device, and symmetry breaking between interchangeable devices (same costs,
  memory and links): units are taken in topological order and may only open the next device of
  their class once the previous one is used.

What keeps it small and tight is the upper bound `UB` from the warm start: every op gets a time
window [earliest start, latest finish] from critical paths, pairs whose windows cannot overlap need
no ordering binary at all, and every big-M is the width of the two windows involved. Valid
inequalities (T >= C[i] + tail[i], T >= load of each device, T >= the lower bound) lift the LP bound.

The solved placement and per-device orders are turned into a real schedule twice, by `simulate`
(first-come-first-served links) and by replaying the solver's own link orders; the better of those
and the warm start is returned, after `check_plan`. Times are scaled so UB is 1000 units, which
keeps CBC's absolute tolerances far below the costs (microseconds against seconds).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pesto_ir.bounds import lower_bound, memory_shortfall
from pesto_ir.cluster import Cluster
from pesto_ir.costs import op_cost, op_memory, value_bytes
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph, Op
from pesto_ir.placement import PlaceOptions
from pesto_ir.plan import OpSlot, Plan, Transfer
from pesto_ir.simulate import PlanError, order_from_priority, simulate, transfer_bytes
from pesto_ir.validate import check_plan, validate_plan

ALGORITHM = "ilp"
SOLVERS = ("cbc", "highs")

# Above this many ops (after coarsening) the exact model is too big to help within minutes:
# bench/bench_ilp.py measured a 354-op graph at 4 devices spend most of a 60 s budget just
# building and presolving, without improving on the warm start. The place pass coarsens to
# fewer nodes before `ilp` in the default pipeline.
MAX_OPS = 300

SCALE_UB = 1000.0  # the warm-start makespan in model time units
REL_GAP = 1e-6  # "optimal" means within this fraction of the bound
EPS = 1e-7  # model time units of slack in window tests (UB is 1000)


class IlpError(PestoError):
    pass


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
    if early is not None:
        early.notes[:0] = notes
        return check_plan(graph, cluster, early)
    inst = _Instance.build(graph, cluster, warm.makespan if warm is not None else None, lb)
    milp = _Milp(inst, solver, options)
    if warm is not None:
        milp.set_start(_relabel_for_symmetry(inst, warm))
    options.progress(f"ilp: {graph.name}: {len(graph.ops)} ops on {len(cluster)} devices, "
                     f"{milp.model.num_cols} variables ({milp.model.num_int} integer), "
                     f"{milp.model.num_rows} constraints; warm start {_fmt(warm.makespan) if warm else 'none'}, "
                     f"lower bound {_fmt(lb)}")
    result = milp.solve(max(0.0, options.time_limit - (time.perf_counter() - started)))
    return _finish(graph, cluster, inst, milp, result, warm, notes, started, options)


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
    return _fallback_plan(graph, cluster), notes


def _fallback_plan(graph: Graph, cluster: Cluster) -> Plan | None:
    """Everything on the fastest device that holds it all; else units first-fit, fastest first."""
    units = _colocation_units(graph.topo_order())
    by_speed = sorted(cluster.devices, key=lambda d: (sum(op_cost(op, d) for op in graph.ops), cluster.names.index(d.name)))
    total = sum(op_memory(op) for op in graph.ops)
    placement: dict[str, str] = {}
    label = ""
    for d in by_speed:
        if total <= d.memory:
            placement = {op.name: d.name for op in graph.ops}
            label = f"everything on {d.name}"
            break
    else:
        free = {d.name: d.memory for d in cluster.devices}
        for members in units:
            need = sum(op_memory(op) for op in members)
            dev = next((d.name for d in by_speed if free[d.name] >= need), None)
            if dev is None:
                return None
            free[dev] -= need
            placement.update({op.name: dev for op in members})
        label = "first-fit by memory, fastest device first"
    order: dict[str, list[str]] = {}
    for op in graph.topo_order():
        order.setdefault(placement[op.name], []).append(op.name)
    return simulate(graph, cluster, placement, order, algorithm=label)


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
        problems = memory_shortfall(graph, cluster)
        if problems:
            raise IlpError("no placement fits in memory: " + "; ".join(problems))
        if len(cluster) == 1:
            raise IlpError(f"the graph does not fit on {cluster.names[0]}")
        if len(graph.ops) > MAX_OPS:
            raise IlpError(f"the graph has {len(graph.ops)} ops, more than the exact model's limit of "
                           f"{MAX_OPS}, and no warm start fits in memory; coarsen it first")
        return None
    elapsed = time.perf_counter() - started
    plan = _as_ilp(warm)
    if len(cluster) == 1 or warm.makespan <= lb * (1 + REL_GAP) + 1e-15:
        plan.solver = _solver_info(solver, "optimal", elapsed, warm.makespan, 0.0, warm.makespan)
        plan.lower_bound = warm.makespan
        why = "one device" if len(cluster) == 1 else "the warm start meets the lower bound"
        plan.notes.append(f"no MILP needed: {why}, so it is optimal")
        return plan
    if len(graph.ops) > MAX_OPS:
        plan.solver = _solver_info(solver, "skipped", elapsed, lb, _gap(warm.makespan, lb), None)
        plan.lower_bound = lb
        plan.notes.append(f"the graph has {len(graph.ops)} ops, more than the exact model's limit of {MAX_OPS}; "
                          "returned the warm start unchanged (coarsen the graph to let the ILP improve it)")
        return plan
    return None


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
    dmin: float = 0.0
    dmax: float = 0.0


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
    classes: list[list[int]] = field(default_factory=list)

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
        allowed = [_allowed_devices(graph, cluster, [ops[i] for i in members]) for members in units]
        cost = [[c * unit for c in row] for row in raw_cost]
        fast = [min(cost[i][d] for d in allowed[unit_of[i]]) for i in range(len(ops))]
        producers = [sorted(index[p.name] for p in op.producers()) for op in ops]
        consumers = [sorted(index[c.name] for c in op.consumers()) for op in ops]
        inst = _Instance(graph, cluster, ops, index, unit_of, units, allowed, cost, fast, producers, consumers,
                         _descendants(consumers), [], [], [], ub_seconds * unit * (1 + 1e-9) + EPS,
                         lb_seconds * unit, unit)
        inst.est, inst.tail = _windows(producers, consumers, fast)
        inst.lst = [inst.lft(i) - fast[i] for i in range(len(ops))]
        inst.xfers = _transfers(inst)
        inst.classes = _device_classes(inst)
        return inst


def _loose_upper_bound(ops: Sequence[Op], cluster: Cluster, cost: list[list[float]]) -> float:
    """Without a warm start: every op at its worst cost plus every edge at its slowest link."""
    worst_link = max((lk.latency + 1.0 / lk.bandwidth for lk in cluster.links.values()), default=0.0)
    slowest_bw = min((lk.bandwidth for lk in cluster.links.values()), default=1.0)
    worst_lat = max((lk.latency for lk in cluster.links.values()), default=0.0)
    sends = sum(worst_lat + sum(value_bytes(r) for r in op.results) / slowest_bw for op in ops if op.consumers())
    return sum(max(row) for row in cost) + sends + worst_link


def _allowed_devices(graph: Graph, cluster: Cluster, members: list[Op]) -> list[int]:
    need = sum(op_memory(op) for op in members)
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


def _windows(producers: list[list[int]], consumers: list[list[int]], fast: list[float]) -> tuple[list[float], list[float]]:
    """Earliest starts and tails (longest path after each op), with fastest costs and free links."""
    n = len(fast)
    est = [0.0] * n
    for i in range(n):
        est[i] = max((est[p] + fast[p] for p in producers[i]), default=0.0)
    tail = [0.0] * n
    for i in range(n - 1, -1, -1):
        tail[i] = max((fast[c] + tail[c] for c in consumers[i]), default=0.0)
    return est, tail


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
            x.dmin = dmin
            x.dmax = max(duration.values())
            out[(p, d)] = x
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
    devices = inst.cluster.devices
    sig: dict[tuple[Any, ...], list[int]] = {}
    for d, dev in enumerate(devices):
        key = (tuple(row[d] for row in inst.cost), dev.memory, tuple(d in a for a in inst.allowed))
        sig.setdefault(key, []).append(d)
    groups = list(sig.values())
    changed = True
    while changed:
        changed = False
        refined: list[list[int]] = []
        for g in groups:
            parts: dict[tuple[Any, ...], list[int]] = {}
            for d in g:
                parts.setdefault(_link_signature(inst.cluster, d, g), []).append(d)
            changed |= len(parts) > 1
            refined.extend(parts.values())
        groups = refined
    return [g for g in groups if len(g) > 1 and _uniform_inside(inst.cluster, g)]


def _link_signature(cluster: Cluster, d: int, group: list[int]) -> tuple[Any, ...]:
    names = cluster.names
    out = []
    for f in range(len(names)):
        if f not in group:
            a, b = cluster.link(names[d], names[f]), cluster.link(names[f], names[d])
            out.append((f, a.latency, a.bandwidth, b.latency, b.bandwidth))
    return tuple(out)


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
        self.model = mip.Model(name=f"pesto-{inst.graph.name}", sense=mip.MINIMIZE,
                               solver_name=mip.CBC if solver == "cbc" else mip.HIGHS)
        m = self.model
        m.seed = options.seed
        m.threads = max(1, options.threads)
        m.max_mip_gap = REL_GAP
        m.max_mip_gap_abs = EPS
        self.x: dict[tuple[int, int], Any] = {}
        self.S: list[Any] = []
        self.T: Any = None
        self.a: dict[tuple[int, int], Any] = {}
        self.R: dict[tuple[int, int], Any] = {}
        self.D: dict[tuple[int, int], Any] = {}
        self.order: dict[tuple[int, int], Any] = {}  # op pairs i < j: 1 when i runs first
        self.link_order: dict[tuple[int, int, int], Any] = {}  # (p, q, d), p < q: 1 when p's goes first
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
        mem = [sum(op_memory(inst.ops[i]) for i in members) for members in inst.units]
        for d, dev in enumerate(inst.cluster.devices):
            on_d = [u for u in range(len(inst.units)) if d in inst.allowed[u] and mem[u] > 0]
            if sum(mem[u] for u in on_d) > dev.memory:
                m += xsum(mem[u] * self.x[(u, d)] for u in on_d) <= dev.memory

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
            r_ub = max(inst.lft(p), t.deadline - t.dmin, t.release)
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
        inst = self.inst
        n = len(inst.ops)
        for i in range(n):
            ui = inst.unit_of[i]
            for j in range(i + 1, n):
                if inst.desc[i] >> j & 1:
                    continue
                uj = inst.unit_of[j]
                if ui != uj and not set(inst.allowed[ui]) & set(inst.allowed[uj]):
                    continue
                if inst.cost[i] == [0.0] * inst.k or inst.cost[j] == [0.0] * inst.k:
                    continue  # a zero-length op never blocks a device
                ij = inst.est[i] + inst.fast[i] <= inst.lst[j] + EPS
                ji = inst.est[j] + inst.fast[j] <= inst.lst[i] + EPS
                self._disjunction(i, j, ij, ji)

    def _disjunction(self, i: int, j: int, ij: bool, ji: bool) -> None:
        inst, m = self.inst, self.model
        if not ij and not ji and inst.unit_of[i] == inst.unit_of[j]:
            ij = ji = True  # cannot happen below a true UB; stay exact rather than clever
        if not ij and not ji:
            for d in set(inst.allowed[inst.unit_of[i]]) & set(inst.allowed[inst.unit_of[j]]):
                m += self.xv(i, d) + self.xv(j, d) <= 1
            return
        m_ij = inst.lft(i) - inst.est[j]
        m_ji = inst.lft(j) - inst.est[i]
        if (ij and m_ij <= 0) or (ji and m_ji <= 0):
            return  # the windows alone put one op after the other
        same = self._same_device(i, j)
        if ij and ji:
            o = m.add_var(f"o_{i}_{j}", var_type=self.mip.BINARY)
            self.order[(i, j)] = o
            m += self.S[j] >= self.end(i) - m_ij * (1 - o) - m_ij * (1 - same)
            m += self.S[i] >= self.end(j) - m_ji * o - m_ji * (1 - same)
        elif ij:
            m += self.S[j] >= self.end(i) - m_ij * (1 - same)
        else:
            m += self.S[i] >= self.end(j) - m_ji * (1 - same)

    def _link_disjunctions(self) -> None:
        inst = self.inst
        by_dest: dict[int, list[_Xfer]] = {}
        for t in inst.xfers.values():
            by_dest.setdefault(t.d, []).append(t)
        for d, ts in by_dest.items():
            for a_i, tp in enumerate(ts):
                for tq in ts[a_i + 1:]:
                    shared = set(tp.sources) & set(tq.sources)
                    if shared:
                        self._link_pair(tp, tq, d, sorted(shared))

    def _link_pair(self, tp: _Xfer, tq: _Xfer, d: int, shared: list[int]) -> None:
        inst, m = self.inst, self.model
        rp, rq = self.R[(tp.p, d)], self.R[(tq.p, d)]
        m_pq = rp.ub + tp.dmax - tq.release
        m_qp = rq.ub + tq.dmax - tp.release
        pq = tp.release + tp.dmin + tq.dmin <= tq.deadline + EPS
        qp = tq.release + tq.dmin + tp.dmin <= tp.deadline + EPS
        if (pq and m_pq <= 0) or (qp and m_qp <= 0):
            return  # the windows alone put one transfer after the other
        up, uq = inst.unit_of[tp.p], inst.unit_of[tq.p]
        if up == uq:
            same: Any = 1
        else:
            same = m.add_var(f"ss_{tp.p}_{tq.p}_{d}", lb=0.0, ub=1.0)
            for s in shared:
                m += same >= self.x[(up, s)] + self.x[(uq, s)] - 1
        both = same + self.a[(tp.p, d)] + self.a[(tq.p, d)] - 2  # 1 when both use one link
        if not pq and not qp:
            m += both <= 0
        elif pq and qp:
            w = m.add_var(f"w_{tp.p}_{tq.p}_{d}", var_type=self.mip.BINARY)
            self.link_order[(tp.p, tq.p, d)] = w
            m += rq >= rp + self.D[(tp.p, d)] - m_pq * (1 - w) - m_pq * (1 - both)
            m += rp >= rq + self.D[(tq.p, d)] - m_qp * w - m_qp * (1 - both)
        elif pq:
            m += rq >= rp + self.D[(tp.p, d)] - m_pq * (1 - both)
        else:
            m += rp >= rq + self.D[(tq.p, d)] - m_qp * (1 - both)

    def _symmetry(self) -> None:
        """Within a class of interchangeable devices, unit u may use the class's device j only
        if an earlier unit uses device j-1 (`h[u,j]`: some unit up to u uses device j)."""
        inst, m = self.inst, self.model
        for cls in self.inst.classes:
            prev: list[Any] = [0] * len(cls)
            for u in range(len(inst.units)):
                if not all(d in inst.allowed[u] for d in cls):
                    continue
                for j in range(1, len(cls)):
                    m += self.x[(u, cls[j])] <= prev[j - 1]
                cur = []
                for j in range(len(cls) - 1):
                    h = m.add_var(f"h_{u}_{cls[j]}", lb=0.0, ub=1.0)
                    m += h >= self.x[(u, cls[j])]
                    m += h >= prev[j]
                    m += h <= prev[j] + self.x[(u, cls[j])]
                    cur.append(h)
                prev = cur + [0]

    # ------------------------------------------------------------------ warm start
    def set_start(self, plan: Plan) -> None:
        """Hand the solver the warm start's integer choices; it computes the continuous values."""
        inst, names = self.inst, self.inst.cluster.names
        dev = [names.index(plan.ops[op.name].device) for op in inst.ops]
        start: list[tuple[Any, float]] = []
        for (u, d), var in self.x.items():
            start.append((var, 1.0 if dev[inst.units[u][0]] == d else 0.0))
        key = [(plan.ops[op.name].start, plan.ops[op.name].end, i) for i, op in enumerate(inst.ops)]
        for (i, j), var in self.order.items():
            start.append((var, 1.0 if key[i] <= key[j] else 0.0))
        sent = {(t.src, names.index(t.to)): t.start for t in plan.transfers}
        for (p, q, d), var in self.link_order.items():
            tp = sent.get((inst.ops[p].name, d), math.inf)
            tq = sent.get((inst.ops[q].name, d), math.inf)
            start.append((var, 1.0 if (tp, p) <= (tq, q) else 0.0))
        self.model.start = start

    # ------------------------------------------------------------------ solving
    def solve(self, seconds: float) -> _Result:
        mip, m = self.mip, self.model
        started = time.perf_counter()
        live = not self.options.quiet and self.solver == "cbc"
        m.verbose = 1 if live else 0
        with _CbcLog(self.options.progress, self.inst.unit) if live else contextlib.nullcontext():
            status = m.optimize(max_seconds=max(seconds, 0.5))
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


class _CbcLog:
    """While CBC solves, route its log (written to file descriptor 1) through a pipe and report
    each new incumbent, and the bound at most once a second. python-mip's own progress callback
    crashes the bundled CBC (CbcBnBOutput::onStrongStats) and its incumbent callback is a no-op,
    so the log is the one live view of the search."""

    def __init__(self, report: Callable[[str], None], unit: float) -> None:
        self.report = report
        self.unit = unit
        self.best = math.inf
        self.bound = -math.inf
        self.last = -math.inf
        self.started = time.perf_counter()

    def __enter__(self) -> _CbcLog:
        sys.stdout.flush()
        read, write = os.pipe()
        self.saved = os.dup(1)
        os.dup2(write, 1)
        os.close(write)
        self.thread = threading.Thread(target=self._read, args=(read,), daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
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
        if improved or (bound is not None and now - self.last >= 1.0):
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
        busy: str | None = None  # the last op on d that takes time (zero-length ops block nothing)
        for name in names:
            op = graph.op(name)
            preds = [busy] if busy is not None else []
            for p in op.producers():
                preds.append(p.name if placement[p.name] == d else (p.name, d))
            nodes[name] = preds
            length[name] = op_cost(op, cluster.device(d))
            if length[name] > 0:
                busy = name
    for op in graph.ops:
        for dst, nbytes in transfer_bytes(op, placement).items():
            nodes[(op.name, dst)] = [op.name]
            length[(op.name, dst)] = cluster.transfer_time(placement[op.name], dst, nbytes)
    for (_, dst), names in link_order.items():
        for k in range(1, len(names)):
            nodes[(names[k], dst)].append((names[k - 1], dst))
    finish = _longest_paths(nodes, length)
    if finish is None:
        return None
    slots = {op.name: OpSlot(placement[op.name], finish[op.name] - length[op.name], finish[op.name])
             for op in graph.ops}
    transfers = [Transfer(op.name, placement[op.name], dst, finish[(op.name, dst)] - length[(op.name, dst)],
                          finish[(op.name, dst)], nbytes)
                 for op in graph.ops for dst, nbytes in sorted(transfer_bytes(op, placement).items())]
    return Plan(graph.name, algorithm, list(cluster.names), slots, transfers)


def _longest_paths(preds: dict[Any, list[Any]], length: dict[Any, float]) -> dict[Any, float] | None:
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


def _finish(graph: Graph, cluster: Cluster, inst: _Instance, milp: _Milp, result: _Result, warm: Plan | None,
            notes: list[str], started: float, options: PlaceOptions) -> Plan:
    """Pick the best of the simulated MILP plan, its replay and the warm start; record the solve."""
    candidates: list[tuple[Plan, str]] = []
    if result.has_solution:
        placement, order, link_order, _ = milp.solution()
        try:
            candidates.append((simulate(graph, cluster, placement, order, ALGORITHM), "milp"))
        except PlanError:
            pass
        replayed = replay(graph, cluster, placement, order, link_order)
        if replayed is not None:
            candidates.append((replayed, "replay"))
    if warm is not None:
        candidates.append((_as_ilp(warm), "warm"))
    if not candidates:
        raise IlpError(f"the MILP found no plan for '{graph.name}' within {options.time_limit:g}s "
                       f"(status {result.status}) and there is no warm start; raise --time-limit or coarsen more")
    plan, source = min(candidates, key=lambda c: c[0].makespan * (1 + 1e-12) if c[1] == "warm" else c[0].makespan)
    plan = _note_outcome(plan, source, candidates, result, warm, notes)
    elapsed = time.perf_counter() - started
    bound = max(b for b in (result.bound, inst.lb / inst.unit) if b is not None)
    bound = min(bound, plan.makespan)
    plan.lower_bound = bound
    plan.solver = _solver_info(milp.solver, result.status, elapsed, bound,
                               _gap(plan.makespan, bound), result.objective)
    options.progress(f"ilp: {result.status} after {result.seconds:.1f}s: makespan {_fmt(plan.makespan)} "
                     f"({source}), bound {_fmt(bound)}, gap {plan.solver['gap']:.2%}")
    return check_plan(graph, cluster, plan)


def _note_outcome(plan: Plan, source: str, candidates: list[tuple[Plan, str]], result: _Result,
                  warm: Plan | None, notes: list[str]) -> Plan:
    plan.notes = notes + [n for n in plan.notes if n not in notes]
    by = {s: p.makespan for p, s in candidates}
    if source == "warm":
        plan.notes.append(f"the MILP found nothing better than the warm start (status {result.status}); "
                          "returned the warm start")
    elif warm is not None and plan.makespan >= warm.makespan * (1 - 1e-9):
        plan.notes.append(f"the MILP found nothing better than the warm start (status {result.status})")
    if source == "replay" and "milp" in by:
        plan.notes.append(f"kept the MILP's link order: first-come-first-served links would give "
                          f"{_fmt(by['milp'])} instead of {_fmt(plan.makespan)}")
    if result.objective is not None and plan.makespan > result.objective * (1 + 1e-6) + 1e-12 and source != "warm":
        plan.notes.append(f"the simulated schedule ({_fmt(plan.makespan)}) is longer than the MILP's "
                          f"({_fmt(result.objective)})")
    return plan
