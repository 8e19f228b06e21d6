"""`ilp`'s MILP in python-mip (`Milp`), for k devices of any speeds, over an `ilp_instance.Instance`.

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

Valid inequalities (T >= C[i] + tail[i], T >= the load of each device, T >= the lower bound) lift
the LP bound. Besides a whole solve, the model offers what a neighbourhood search needs
(`start_values`, `fix_outside`, `unfix`, `drop_symmetry`) and turns a solution into real schedules
(`realize`). CBC's preprocessing is off: it crashed the bundled CBC (CglPreProcess::postProcess) on
a 1M-nonzero model, and bought nothing measurable here.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from pesto_ir.passes.placement.exact.cbc_log import CbcLog, status_name
from pesto_ir.passes.placement.exact.common import REL_GAP, timed_both_ways
from pesto_ir.passes.placement.exact.ilp_instance import EPS, IlpError, Instance, Xfer, relabel_for_symmetry
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.simulate import order_from_priority, transfer_bytes
from pesto_ir.util import work
from pesto_ir.util.native_stdout import native_stdout_silenced

ALGORITHM = "ilp"
SOLVERS = ("cbc", "highs")
MIN_CBC_SECONDS = 0.5  # the least a solve is given, whatever is left


def solver_name(name: str) -> str:
    """The MILP backend, checked before any work: HiGHS only where python-mip can load it."""
    solver = (name or "cbc").lower()
    if solver not in SOLVERS:
        raise IlpError(f"unknown MILP solver '{name}' for algo=ilp (choose one of: {', '.join(SOLVERS)})")
    if solver == "highs" and not highs_available():
        raise IlpError("solver=highs: python-mip cannot load the HiGHS library; install it with "
                       "`pip install highsbox` (or set PMIP_HIGHS_LIBRARY), or use solver=cbc")
    return solver


def highs_available() -> bool:
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


@dataclass
class MilpResult:
    status: str
    objective: float | None  # seconds
    bound: float | None  # seconds
    seconds: float
    has_solution: bool


class Milp:
    """The python-mip model of one instance, with its variables by role."""

    def __init__(self, inst: Instance, solver: str, options: PlaceOptions) -> None:
        import mip

        self.mip = mip
        self.solver = solver
        self.inst = inst
        self.options = options
        with native_stdout_silenced():  # HiGHS prints a banner unless told to be quiet at once
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

    def _duration(self, t: Xfer) -> Any:
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
            plan = relabel_for_symmetry(inst, plan)
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
    def solve(self, seconds: float, live: bool = True) -> MilpResult:
        """Optimize for at most `seconds`; `live` reports CBC's incumbent and bound as it goes."""
        mip, m = self.mip, self.model
        started = time.perf_counter()
        log = CbcLog(self.options.progress, self.inst.unit)
        live = live and not self.options.quiet and self.solver == "cbc" and log.start()
        m.verbose = 1 if live else 0
        try:
            status = m.optimize(max_seconds=max(seconds, MIN_CBC_SECONDS))
        finally:
            if live:
                log.stop()
        elapsed = time.perf_counter() - started
        work.charge("wall", elapsed)
        has = status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE)
        objective = m.objective_value / self.inst.unit if has else None
        bound = m.objective_bound
        bound_s = bound / self.inst.unit if bound is not None and math.isfinite(bound) and abs(bound) < 1e30 else None
        if status == mip.OptimizationStatus.OPTIMAL and objective is not None:
            bound_s = objective if bound_s is None else min(max(bound_s, 0.0), objective)
        return MilpResult(status_name(status), objective, bound_s, elapsed, has)

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
        return timed_both_ways(graph, cluster, placement, order, link_order, ALGORITHM, ("milp", "replay"))
