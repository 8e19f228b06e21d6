"""`ilp`: Pesto's joint placement-and-scheduling MILP (`ilp_model`, over the instance of
`ilp_instance`), solved in python-mip from a warm start, for k devices of any speeds.

The solve: the plain MILP first (a quarter of the time limit, at least 5 s); it proves small graphs
(about 15 ops) optimal. Past that its bound rarely leaves the critical path, so the rest of the time
goes to a large-neighbourhood search on the same model: all but a window of ops near one point in
time keep the incumbent's devices and orders, and CBC re-optimizes the window in a second or two.
Each solution is turned into a real schedule twice, by `simulate` (first-come-first-served links)
and by `exact_common.earliest_schedule` with the solver's own link order; the best of those and the
warm start is returned, after `check_plan`. CBC's log is followed live by `cbc_log`.
"""

from __future__ import annotations

import random
import time
from functools import partial
from typing import Any

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import NO_START_HINT
from pesto_ir.passes.placement.exact.common import as_algorithm, early_answer, fallback_plan, fmt, gap, given_warm_start
from pesto_ir.passes.placement.exact.ilp_instance import IlpError, Instance, relabel_for_symmetry
from pesto_ir.passes.placement.exact.ilp_model import ALGORITHM, Milp, MilpResult, solver_name
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import Plan, faster
from pesto_ir.schedule.simulate import simulate
from pesto_ir.schedule.validate import check_plan, validate_plan

# Size limits (measured with bench/bench_ilp.py; above either, the warm start comes back as it
# is, with a note and status "skipped"; the place pass coarsens before `ilp` in the default
# pipeline). Past ~25k binaries CBC overruns its time limit: a 30 s solve of a 326-op graph on
# 2 devices (55k binaries, 1M nonzeros) took 239 s, most of it inside CBC after it had stopped;
# 33-40k binaries overran by 3-11 s. Graphs over MILP_MAX_OPS are not even modelled (they exceed the
# binary limit anyway, and the pair analysis is quadratic). In 30 s the search improved warm
# starts by 1-7% on 20-80-op graphs (under ~5k binaries); on the 177- and 192-op MSR layer
# graphs it found 0-0.2%, on a 200-group coarsening of BERT-3 training (4 devices) still 1.4%.
MILP_MAX_OPS = 300
MAX_INTEGERS = 25_000

WHOLE_MILP_SHARE = 0.25  # of the time limit for the plain MILP solve before neighbourhood search
EXACT_MIN = 5.0  # seconds the plain solve gets at least (within the limit)
LNS_START_OPS = 12  # ops freed in the first neighbourhood (adapted as the search goes)
LNS_MIN_OPS = 6
LNS_SLICES = 16  # neighbourhoods per remaining time, at first
LNS_MIN_SLICE = 1.0  # seconds: the shortest neighbourhood solve worth starting
LNS_MAX_SLICE = 5.0


# ---------------------------------------------------------------------------- entry point

def place_ilp(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Solve Pesto's MILP from `options.warm_start`; return the best real schedule found."""
    started = time.perf_counter()
    solver = solver_name(options.solver)
    if not graph.ops:
        return Plan(graph.name, ALGORITHM, list(cluster.names), {}, [], 0.0,
                    _solver_info(solver, "optimal", 0.0, 0.0, 0.0, 0.0))
    warm, notes = _warm_start(graph, cluster, options)
    lb = lower_bound(graph, cluster)
    early = _early_answer(graph, cluster, warm, lb, solver, started)
    if early is None:  # (early answers cover graphs over MILP_MAX_OPS)
        inst = Instance.build(graph, cluster, warm.makespan if warm is not None else None, lb)
        if inst.integers() > MAX_INTEGERS:
            early = _too_many_binaries(inst, warm, solver, lb, started)
    if early is not None:
        early.notes[:0] = notes
        if early.solver and early.solver.get("status") == "skipped":
            options.progress(f"ilp: MILP skipped: {early.notes[-1]}")
        return check_plan(graph, cluster, early)
    milp = Milp(inst, solver, options)
    options.progress(f"ilp: {graph.name}: {len(graph.ops)} ops on {len(cluster)} devices, "
                     f"{milp.size()}; warm start {fmt(warm.makespan) if warm else 'none'}, "
                     f"lower bound {fmt(lb)}")
    search = _Search(milp, warm, options, started + options.time_limit)
    search.run()
    return search.finish(notes, started)


def warm_name(warm: Plan) -> str:
    """What the warm start is called where it is returned as the plan: "m-etf's warm start"."""
    return f"{warm.algorithm}'s warm start" if warm.algorithm and warm.algorithm != ALGORITHM else "the warm start"


def _solver_info(solver: str, status: str, seconds: float, bound: float | None, gap: float | None,
                 objective: float | None) -> dict[str, Any]:
    return {"name": solver, "status": status, "gap": gap, "seconds": round(seconds, 3),
            "bound": bound, "objective": objective}


def _warm_start(graph: Graph, cluster: Cluster, options: PlaceOptions) -> tuple[Plan | None, list[str]]:
    """The given warm start when it is a valid plan of this graph, else the fallback plan (None if
    it does not fit)."""
    given, notes = given_warm_start(graph, cluster, options)
    return (given if given is not None else fallback_plan(graph, cluster)), notes


def _early_answer(graph: Graph, cluster: Cluster, warm: Plan | None, lb: float, solver: str,
                  started: float) -> Plan | None:
    """Answers that need no MILP: one device, a warm start at the lower bound, a graph too big."""
    if warm is not None and len(cluster) == 1:  # every topological order runs back to back: the total work
        device = cluster.names[0]
        warm = simulate(graph, cluster, {op.name: device for op in graph.ops},
                        {device: [op.name for op in graph.topo_order()]}, ALGORITHM)
    plan = early_answer(graph, cluster, warm, lb, ALGORITHM, "MILP", partial(_solver_info, solver), started, IlpError,
                         time.perf_counter)
    if plan is not None:
        return plan
    if len(graph.ops) > MILP_MAX_OPS:
        if warm is None:
            raise IlpError(f"the graph has {len(graph.ops)} ops, more than the exact model's limit of "
                           f"{MILP_MAX_OPS}, and no warm start fits in memory; coarsen it first")
        return _skipped(warm, solver, lb, time.perf_counter() - started,
                        f"the graph has {len(graph.ops)} ops, more than the exact model's limit of {MILP_MAX_OPS}")
    return None


def _too_many_binaries(inst: Instance, warm: Plan | None, solver: str, lb: float, started: float) -> Plan:
    why = (f"the model would have {inst.integers()} binary variables, more than the limit of "
           f"{MAX_INTEGERS} (CBC overruns its time limit on larger ones)")
    if warm is None:
        raise IlpError(f"{why}, and no warm start fits in memory; coarsen the graph first")
    return _skipped(warm, solver, lb, time.perf_counter() - started, why)


def _skipped(warm: Plan, solver: str, lb: float, elapsed: float, why: str) -> Plan:
    """The warm start, returned because the model would be too big to solve in time: labelled
    `ilp`, its winner the heuristic that made it (the summary and the chart say so)."""
    plan = as_algorithm(warm, ALGORITHM)
    plan.solver = _solver_info(solver, "skipped", elapsed, lb, gap(plan.makespan, lb), None)
    plan.solver["winner"] = f"{warm_name(warm)}, MILP skipped"
    plan.lower_bound = lb
    plan.notes.append(f"{why}; returned the warm start unchanged (coarsen the graph further to let "
                      "the ILP improve it)")
    return plan


# ---------------------------------------------------------------------------- the search

class _Search:
    """The exact solve, then (when it stops short of optimal) a large-neighbourhood search with
    the same model: all but a window of ops keep the incumbent's placement and orders, and the
    MILP re-optimizes the window. CBC's own search rarely improves a good heuristic start past
    ~20 ops (the LP bound stays at the critical path until most placements are branched on);
    small windows it solves to optimality in well under a second each."""

    def __init__(self, milp: Milp, warm: Plan | None, options: PlaceOptions, deadline: float) -> None:
        self.milp = milp
        self.inst = milp.inst
        self.options = options
        self.deadline = deadline
        self.warm = warm
        self.best: Plan | None = as_algorithm(warm, ALGORITHM) if warm is not None else None
        self.source = "warm"
        self.realized: dict[str, float] = {}  # makespans of the exact solve's realisations
        self.exact = MilpResult("not-run", None, None, 0.0, False)
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
        exact_budget = budget if self.best is None else max(WHOLE_MILP_SHARE * budget, min(budget, EXACT_MIN))
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
        `options.incumbent` when valid (the worker's caller keeps it in case the solve is cut short)."""
        if self.best is not None and not faster(plan.makespan, self.best.makespan):
            return False
        self.best, self.source = plan, label
        if not validate_plan(self.inst.graph, self.inst.cluster, plan):
            self.options.incumbent.offer(plan, self.inst.graph)
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
            if result.has_solution and result.objective is not None:  # it has one with a solution
                if self.objective is None or result.objective < self.objective:
                    self.objective = result.objective
                for plan, _ in milp.realize():
                    improved |= self.offer(plan, "lns")
            if improved:
                self.wins += 1
                self.options.progress(f"ilp: {self.elapsed():6.1f}s  incumbent {fmt(self.best.makespan)}  "
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
        # Interchangeable devices renamed in order of first use: the exact solve (with symmetry
        # breaking) and the neighbourhood search (without) then name the same plan the same way.
        plan = relabel_for_symmetry(inst, self.best)
        plan.notes = notes + [n for n in plan.notes if n not in notes] + self.outcome()
        bound = max(b for b in (exact.bound, inst.lb / inst.unit) if b is not None)
        bound = min(bound, plan.makespan)
        plan.lower_bound = bound
        plan.solver = _solver_info(self.milp.solver, self.status, time.perf_counter() - started, bound,
                                   gap(plan.makespan, bound), self.objective)
        plan.solver["model"] = self.milp.size()
        if self.source == "warm" and self.warm is not None:
            plan.solver["winner"] = f"{warm_name(self.warm)}, unchanged by the MILP"
        if self.rounds:
            plan.solver["lns_rounds"] = self.rounds
        self.options.progress(f"ilp: {self.status} after {time.perf_counter() - started:.1f}s: makespan "
                              f"{fmt(plan.makespan)} (from {self.source}), bound {fmt(bound)}, "
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
                       f"{fmt(self.realized['milp'])} instead of {fmt(best.makespan)}")
        if self.rounds:
            out.append(f"large-neighbourhood search after the exact solve: {self.rounds} windows re-optimized, "
                       f"{self.wins} improved the plan")
        return out
