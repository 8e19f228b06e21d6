"""`auto`: a portfolio that spends the time limit where it pays, by graph size.

1. Heuristics first (the warm start the place pass hands over, or the best of the place pass's
   heuristics, or m-ETF): they take milliseconds and are sometimes already optimal (at the lower
   bound), in which case nothing else runs.
2. Small graphs (at most `EXACT_UNITS` placement units) go to the whole CP-SAT model for the rest
   of the time: it can prove optimality there.
3. Larger graphs go to large-neighbourhood search with CP-SAT sub-models: the whole model stalls
   above about a hundred units (one worker found nothing better than m-ETF in 10 s on the coarse
   200-node ResNet-50 training graph; LNS took it from 1.58 to 1.20 times the lower bound in 20 s).

The plan says which engine won and its gap to the lower bound, in `plan.solver` (`winner`,
`portfolio`) and in a note. The CP-SAT worker process is started before the heuristics run, so
importing OR-tools overlaps them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from pesto_ir.bounds import lower_bound
from pesto_ir.cluster import Cluster
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph
from pesto_ir.passes.algo_cpsat import as_algorithm, fmt, gap, place_cpsat, starting_plan
from pesto_ir.passes.cpsat_worker import shared_solver
from pesto_ir.passes.lns import improve_with_lns
from pesto_ir.placement import PlaceOptions
from pesto_ir.plan import Plan
from pesto_ir.validate import check_plan, validate_plan

ALGORITHM = "auto"
EXACT_UNITS = 60  # up to this many placement units the whole CP-SAT model gets the time
MIN_EXACT_SECONDS = 0.5  # below this much time left after the heuristics, the heuristic plan stands
REL_GAP = 1e-6
MARGIN = 0.03  # of the time left, kept for timing and checking the solver's plan


class AutoError(PestoError):
    pass


def place_auto(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Heuristics, then CP-SAT (small graphs) or CP-SAT LNS (larger ones) within the time limit."""
    started = time.perf_counter()
    if not graph.ops:
        return Plan(graph.name, ALGORITHM, list(cluster.names), {}, [], 0.0,
                    {"name": "none", "status": "optimal", "gap": 0.0, "bound": 0.0, "seconds": 0.0, "winner": "none"})
    if len(cluster) > 1:
        shared_solver().start()
    heuristic, notes = _heuristic(graph, cluster, options)
    lb = lower_bound(graph, cluster)
    stages: list[tuple[str, float]] = [(heuristic.algorithm or "heuristic", heuristic.makespan)]
    left = options.time_limit - (time.perf_counter() - started)
    at_bound = len(cluster) == 1 or heuristic.makespan <= lb * (1 + REL_GAP) + 1e-15
    if at_bound or left < MIN_EXACT_SECONDS:
        why = ("one device" if len(cluster) == 1 else "it meets the lower bound" if at_bound
               else f"only {max(left, 0.0):.1f}s were left")
        plan = _relabelled(heuristic)
        plan.solver = {"name": heuristic.algorithm or "heuristic", "status": "optimal" if at_bound else "heuristic"}
        return _summary(graph, cluster, plan, heuristic.algorithm or "heuristic", stages, lb, notes, started,
                        f"kept the heuristic plan ({why})")
    exact_options = dataclasses.replace(options, time_limit=left * (1 - MARGIN), warm_start=heuristic)
    units = len({str(op.get("colocate")) if op.get("colocate") is not None else "\0" + op.name for op in graph.ops})
    if units <= EXACT_UNITS:
        plan = place_cpsat(graph, cluster, exact_options)
        engine = "cpsat"
    else:
        plan = improve_with_lns(graph, cluster, exact_options, engine="cpsat", start=heuristic)
        engine = "cpsat-lns"
    stages.append((engine, plan.makespan))
    won = engine if plan.makespan < heuristic.makespan * (1 - 1e-12) else (heuristic.algorithm or "heuristic")
    return _summary(graph, cluster, _relabelled(plan), won, stages, lb, notes, started,
                    f"{engine} on {units} placement units")


def _relabelled(plan: Plan) -> Plan:
    """A copy of `plan` that says it is auto's (the engine that made it is named in the summary)."""
    out = as_algorithm(plan, ALGORITHM)
    out.notes = list(plan.notes)
    return out


def _heuristic(graph: Graph, cluster: Cluster, options: PlaceOptions) -> tuple[Plan, list[str]]:
    """The warm start when valid, else the place pass's best heuristic plan, else m-ETF or the
    fastest device."""
    given = options.warm_start
    notes: list[str] = []
    if given is not None:
        problems = validate_plan(graph, cluster, given)
        if not problems:
            return given, notes
        notes.append(f"the warm start was not a valid plan of this graph ({problems[0]}); ignored it")
    quiet = dataclasses.replace(options, quiet=True, warm_start=None)
    best = _place_pass_heuristics(graph, cluster, quiet)
    if best is None:
        best, more = starting_plan(graph, cluster, quiet)
        notes.extend(more)
    if best is None:
        raise AutoError(f"no heuristic found a plan of '{graph.name}' that fits in memory, so there is nothing "
                        "to start from; check the memory figures or coarsen less")
    return best, notes


def _place_pass_heuristics(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan | None:
    try:
        from pesto_ir.passes.place import best_heuristic_plan
    except ImportError:
        return None
    return best_heuristic_plan(graph, cluster, options)


def _summary(graph: Graph, cluster: Cluster, plan: Plan, winner: str, stages: list[tuple[str, float]], lb: float,
             notes: list[str], started: float, how: str) -> Plan:
    """Record which engine won, the portfolio's results and the gap to the lower bound."""
    bound = min(max(lb, (plan.solver or {}).get("bound") or 0.0), plan.makespan)
    solver: dict[str, Any] = dict(plan.solver or {})
    solver.update({"bound": bound, "gap": gap(plan.makespan, bound),
                   "seconds": round(time.perf_counter() - started, 3), "winner": winner,
                   "portfolio": ", ".join(f"{name} {fmt(t)}" for name, t in stages)})
    solver.setdefault("status", "feasible")
    plan.solver = solver
    plan.lower_bound = bound
    plan.notes = notes + [n for n in plan.notes if n not in notes]
    plan.notes.append(f"auto: {how}; {winner} won with {fmt(plan.makespan)}, "
                      f"{solver['gap']:.2%} above the lower bound {fmt(bound)}")
    return check_plan(graph, cluster, plan)
