"""`cpsat`: Pesto's joint placement-and-scheduling problem in OR-tools CP-SAT.

The same problem as the MILP of `ilp_model`, stated with CP-SAT's scheduling constraints instead of
big-M pairs, in integer ticks (the formulation is in `cpsat_problem`). The solve starts from the
given warm start, else the best heuristic plan (`heuristic_portfolio`) or the fallback plan
(`exact_common`). The solved placement and per-device orders are timed exactly by `simulate` and by
replaying the solver's own link order (`exact_common.earliest_schedule`); the best of those and the
warm start is returned, after `check_plan`.

The problem, as plain data in ticks, and the messages of a solve are in `cpsat_problem`; the model
is built and solved in a worker process (`cpsat_worker`, `cpsat_model`): OR-tools and python-mip's CBC
cannot share one. One CP-SAT worker thread (`options.threads`, default 1) is deterministic when the
solve ends by optimality; a second thread sometimes helps the whole model (coarse ResNet-50
training at 4 devices: 1.38 -> 1.26 times the lower bound in 10 s) but not LNS, on this 2-core
machine shared with other jobs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import NO_START_HINT
from pesto_ir.passes.placement.exact.common import (
    as_algorithm,
    early_answer,
    fallback_plan,
    fmt,
    gap,
    given_warm_start,
    timed_both_ways,
)
from pesto_ir.passes.placement.exact.cpsat_problem import (
    CpSatError,
    Hint,
    Problem,
    Request,
    Result,
    Solution,
    SolveInterrupted,
)
from pesto_ir.passes.placement.exact.cpsat_worker import SolverProcess, shared_solver
from pesto_ir.passes.placement.heuristics.portfolio import best_heuristic_plan
from pesto_ir.passes.placement.options import PlaceOptions, kept_on_interrupt
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util import work

ALGORITHM = "cpsat"
SOLVER_NAME = "cp-sat"
# Without the LP relaxation CP-SAT's single worker finds better plans on the MSR graphs in the
# same time (coarse resnet50/bert24/gnmt training graphs at 4 devices); the bound comes from
# `lower_bound` and propagation either way. Without probing, presolve takes 1.8 s instead of 10 s
# on the coarse BERT-12 training graph at 8 devices, where probing then left no time to search
# (status UNKNOWN despite a complete, feasible hint).
SEARCH_PARAMS = {"linearization_level": 0, "cp_model_probing_level": 0}
# Of the time limit, what the heuristics of a start without a warm start may take: on 8,000 ops at
# 8 devices the seven take 30 s together, and the solver needs the rest.
HEURISTIC_SHARE = 0.3
MIN_WORK_SECONDS = 0.05  # the least work a solve is given (CP-SAT needs a moment to read its hint)
WALL_SLACK = 4.0  # outside a time limit, a solve's wall clock is capped at this many times its work ...
WALL_STOPPED = 0.05  # ... and one that used less than this much less of its deterministic time was stopped by it


# ---------------------------------------------------------------------------- entry point

def place_cpsat(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Solve the CP-SAT model from the warm start; return the best real schedule found. On Ctrl-C,
    the best of the solver's last incumbent and the warm start is offered to `options.incumbent`."""
    started = work.now()
    if not graph.ops:
        return Plan(graph.name, ALGORITHM, list(cluster.names), {}, [], 0.0,
                    solver_info("optimal", 0.0, 0.0, 0.0, 0.0, None, options))
    try:
        warm, notes = starting_plan(graph, cluster, options)
    except KeyboardInterrupt:
        raise kept_on_interrupt(options, graph, options.warm_start) from None
    lb = lower_bound(graph, cluster)
    early = _early_answer(graph, cluster, warm, lb, started, options)
    if early is not None:
        early.notes[:0] = notes
        return check_plan(graph, cluster, early)
    proc = shared_solver()
    proc.start()
    prob = Problem.build(graph, cluster, warm.makespan if warm is not None else None, lb)
    hint = Hint.of(prob, cluster, warm) if warm is not None else None
    options.progress(f"cpsat: {graph.name}: {len(graph.ops)} ops on {len(cluster)} devices; warm start "
                     f"{fmt(warm.makespan) if warm else 'none'}, lower bound {fmt(lb)}, 1 tick = {prob.tick:.0e} s")
    remaining = options.time_limit - (work.now() - started)
    try:
        result = solve(proc, prob, hint, options, remaining, "cpsat", params=dict(SEARCH_PARAMS), incumbents=True)
    except KeyboardInterrupt as e:
        raise _interrupted(graph, cluster, prob, e, warm, notes, lb, started, options) from None
    if result.note:
        notes.append(result.note)
    plan = realise(graph, cluster, prob, result, warm, notes)
    if plan is None and result.status == "infeasible" and warm is None:
        # Without a warm start the horizon is loose, so only memory (with colocation) can be unmet.
        raise CpSatError(f"no placement of '{graph.name}' fits the devices' memory: CP-SAT proved it "
                         f"(the heuristics found none either); add devices or memory")
    if plan is None:
        raise CpSatError(f"CP-SAT found no plan for '{graph.name}' within {options.time_limit:g}s "
                         f"(status {result.status}) and no heuristic found a plan to start from: "
                         f"{NO_START_HINT}")
    return finish(graph, cluster, plan, result, prob, lb, started, options)


def _interrupted(graph: Graph, cluster: Cluster, prob: Problem, caught: KeyboardInterrupt, warm: Plan | None,
                 notes: list[str], lb: float, started: float, options: PlaceOptions) -> KeyboardInterrupt:
    """Ctrl-C during the solve: the best of its last incumbent (timed exactly) and the warm start."""
    result = caught.result if isinstance(caught, SolveInterrupted) else Result("interrupted", None, None, 0.0)
    seconds = work.now() - started
    plan = realise(graph, cluster, prob, result, warm,
                   [*notes, f"interrupted (Ctrl-C) after {seconds:.1f}s: the best plan CP-SAT had found"])
    if plan is None:
        return KeyboardInterrupt()
    return kept_on_interrupt(options, graph, finish(graph, cluster, plan, result, prob, lb, started, options))


def solver_info(status: str, seconds: float, bound: float | None, gap: float | None, objective: float | None,
                tick: float | None, options: PlaceOptions) -> dict[str, Any]:
    """What `plan.solver` records for a CP-SAT solve."""
    info: dict[str, Any] = {"name": SOLVER_NAME, "status": status, "gap": gap, "bound": bound,
                            "seconds": round(seconds, 3), "objective": objective,
                            "workers": max(1, options.threads)}
    if tick is not None:
        info["resolution"] = tick
    return info


def finish(graph: Graph, cluster: Cluster, plan: Plan, result: Result, prob: Problem, lb: float,
           started: float, options: PlaceOptions) -> Plan:
    """Record the solve in `plan.solver` (bound: the best of CP-SAT's and the lower bound)."""
    bound = min(max(b for b in (result.bound, lb) if b is not None), plan.makespan)
    plan.lower_bound = bound
    plan.solver = solver_info(result.status, work.now() - started, bound, gap(plan.makespan, bound),
                              result.objective, prob.tick, options)
    options.progress(f"cpsat: {result.status} after {result.seconds:.1f}s: makespan {fmt(plan.makespan)}, "
                     f"bound {fmt(bound)}, gap {plan.solver['gap']:.2%}")
    return check_plan(graph, cluster, plan)


# ---------------------------------------------------------------------------- warm start

def starting_plan(graph: Graph, cluster: Cluster, options: PlaceOptions) -> tuple[Plan | None, list[str]]:
    """The given warm start when it is a valid plan of this graph, else the best of the place pass's
    heuristics (as many as fit in `HEURISTIC_SHARE` of the time limit, at least until one gives a plan) and
    everything on the fastest device that holds it; None if none fits in memory."""
    given, notes = given_warm_start(graph, cluster, options)
    if given is not None:
        return given, notes
    until = work.now() + options.time_limit * HEURISTIC_SHARE
    quiet = dataclasses.replace(options, quiet=True, warm_start=None)
    fallback = fallback_plan(graph, cluster, "fastest-device")
    candidates = [p for p in (best_heuristic_plan(graph, cluster, quiet, until=until), fallback) if p is not None]
    return (min(candidates, key=lambda p: p.makespan) if candidates else None), notes


def _early_answer(graph: Graph, cluster: Cluster, warm: Plan | None, lb: float, started: float,
                  options: PlaceOptions) -> Plan | None:
    """Answers that need no solve: one device, or a warm start at the lower bound."""
    def info(status: str, seconds: float, bound: float | None, gap: float | None, objective: float | None) -> dict[str, Any]:
        return solver_info(status, seconds, bound, gap, objective, None, options)

    return early_answer(graph, cluster, warm, lb, ALGORITHM, "CP-SAT solve", info, started, CpSatError)


def solve(proc: SolverProcess, prob: Problem, hint: Hint | None, options: PlaceOptions, seconds: float,
          label: str, deterministic: float | None = None, **kwargs: Any) -> Result:
    """Solve `prob` in the solver process within `seconds` of work (and `deterministic` seconds of
    CP-SAT's own, where given: the less of the two), reporting progress unless quiet.

    CP-SAT is stopped by its deterministic time, which counts its work, so the same request gives
    the same answer on a quiet or a busy machine; the wall clock only caps it, at what the place
    pass's time limit leaves (`util/work.py`) or, outside one, `WALL_SLACK` times the work. A solve
    the wall clock stopped first marks the search as cut by the time limit."""
    seconds = max(seconds, MIN_WORK_SECONDS)
    allowed = seconds / work.RATES["cpsat"]
    if deterministic is not None:
        allowed = min(allowed, deterministic)
    wall = min(work.wall_left(), seconds * WALL_SLACK + 1.0)
    request = Request(prob, hint, wall, time.monotonic() + wall, workers=max(1, options.threads),
                      seed=options.seed, deterministic=allowed, **kwargs)
    work.charge("cpsat-model", sum(len(prob.allowed[u]) for u in prob.unit_of))
    started = time.perf_counter()

    def report(objective: float, bound: float) -> None:
        inc = fmt(objective * prob.tick) if math.isfinite(objective) else "none"
        low = fmt(bound * prob.tick) if math.isfinite(bound) else "none"
        options.progress(f"{label}: {time.perf_counter() - started:6.1f}s  incumbent {inc}  bound {low}")

    result = proc.solve(request, None if options.quiet else report)
    work.charge("cpsat", min(result.deterministic, allowed))
    if result.status not in ("optimal", "infeasible") and result.deterministic < allowed * (1 - WALL_STOPPED):
        work.mark_cut()  # the wall clock stopped it before its work was done
    return result


# ---------------------------------------------------------------------------- a real schedule

def schedules(graph: Graph, cluster: Cluster, prob: Problem, sol: Solution, algorithm: str) -> list[tuple[Plan, str]]:
    """The solution timed exactly: by `simulate` (links first come, first served) and by replaying
    the solver's link order; (plan, how) for each that does not deadlock."""
    names = cluster.names
    placement = {n: names[sol.device[i]] for i, n in enumerate(prob.names)}
    order: dict[str, list[str]] = {}
    for i in sorted(range(prob.n), key=lambda i: (sol.start[i], sol.end[i], i)):
        order.setdefault(placement[prob.names[i]], []).append(prob.names[i])
    links: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for (p, d), r in sol.sends.items():
        links.setdefault((placement[prob.names[p]], names[d]), []).append((r, p))
    link_order = {k: [prob.names[p] for _, p in sorted(v)] for k, v in links.items()}
    return timed_both_ways(graph, cluster, placement, order, link_order, algorithm, ("simulated", "replayed"))


def realise(graph: Graph, cluster: Cluster, prob: Problem, result: Result, warm: Plan | None,
            notes: list[str], algorithm: str = ALGORITHM) -> Plan | None:
    """The best of the solver's schedules and the warm start, with notes saying which won."""
    candidates = schedules(graph, cluster, prob, result.solution, algorithm) if result.solution else []
    if warm is not None:
        candidates.append((as_algorithm(warm, algorithm), "warm"))
    if not candidates:
        return None
    plan, how = min(candidates, key=lambda c: (c[0].makespan, c[1] == "warm"))
    by = {h: p.makespan for p, h in candidates}
    plan.notes = notes + [n for n in plan.notes if n not in notes]
    if how == "warm" or (warm is not None and plan.makespan >= warm.makespan * (1 - 1e-9)):
        plan.notes.append(f"CP-SAT found nothing better than the warm start (status {result.status})")
    else:
        others = ", ".join(f"{h} {fmt(t)}" for h, t in by.items() if h != how)
        plan.notes.append(f"kept the {how} CP-SAT schedule ({fmt(plan.makespan)}; {others})")
    return plan
