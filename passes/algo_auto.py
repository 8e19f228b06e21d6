"""`auto`: a portfolio that spends the time limit where it pays, by graph size.

1. Heuristics first (the warm start the place pass hands over, or the best of the place pass's
   heuristics and the fastest single device): they take milliseconds to a second and are
   sometimes already optimal (at the lower bound), in which case nothing else runs.
2. Small graphs (at most `EXACT_UNITS` placement units) go to the whole CP-SAT model first, for
   `EXACT_SHARE` of the time left: it can prove optimality there, and its bound is kept.
3. Then large-neighbourhood search with CP-SAT sub-models improves the best plan for the rest of
   the time. The whole model stalls above a few dozen units: one worker found nothing better than
   m-ETF in 10 s on the coarse 200-node ResNet-50 training graph, where LNS went from 1.58 to 1.20
   times the lower bound in 20 s; on the coarse BERT-12 training graph (54 units) at 8 devices the
   whole model kept m-SCT's 1.287 in 20 s and LNS reached 1.243.

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
from pesto_ir.ir import Graph
from pesto_ir.passes.algo_cpsat import as_algorithm, fmt, gap, place_cpsat, starting_plan
from pesto_ir.passes.cpsat_worker import shared_solver
from pesto_ir.passes.lns import MAX_OPS as LNS_MAX_OPS
from pesto_ir.passes.lns import improve_with_lns
from pesto_ir.passes.local_search import improve_by_moves
from pesto_ir.placement import PlaceOptions
from pesto_ir.plan import Plan
from pesto_ir.validate import check_plan

ALGORITHM = "auto"
EXACT_UNITS = 60  # up to this many placement units the whole CP-SAT model is tried first ...
EXACT_SHARE = 0.4  # ... for this share of the time left, then LNS improves its plan
PROVE_UNITS = 12  # up to this many units the whole model gets all the time: it proves optimality fast
# ... and the whole model only up to this many ops x devices: its size follows the ops, not the units
# (a 32-micro-batch pipeline of 2048 ops in a few colocated stages, on 8 devices, took 10 s to build
# and send to the solver, for a 1.7 s solve), so past it LNS's sub-models alone
EXACT_MAX_OP_DEVICES = 2_000
MIN_EXACT_SECONDS = 0.5  # below this much time left after the heuristics, the heuristic plan stands
REL_GAP = 1e-6
MARGIN = 0.03  # of the time left, kept for timing and checking the solver's plan


def place_auto(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Heuristics, then CP-SAT (small graphs) or CP-SAT LNS (larger ones) within the time limit."""
    started = time.perf_counter()
    if not graph.ops:
        return Plan(graph.name, ALGORITHM, list(cluster.names), {}, [], 0.0,
                    {"name": "none", "status": "optimal", "gap": 0.0, "bound": 0.0, "seconds": 0.0, "winner": "none"})
    if len(cluster) > 1:
        shared_solver().start()
    heuristic, notes = starting_plan(graph, cluster, options)
    lb = lower_bound(graph, cluster)
    left = options.time_limit - (time.perf_counter() - started)
    if heuristic is None:  # memory too tight for every greedy packing: CP-SAT searches from scratch
        plan = place_cpsat(graph, cluster, dataclasses.replace(options, time_limit=left * (1 - MARGIN),
                                                               warm_start=None))
        return _summary(graph, cluster, _relabelled(plan), "cpsat", [("cpsat", plan.makespan)], lb, notes, started,
                        "no heuristic plan fits in memory, so CP-SAT started from scratch")
    name = heuristic.algorithm or "heuristic"
    stages: list[tuple[str, float]] = [(name, heuristic.makespan)]
    at_bound = len(cluster) == 1 or heuristic.makespan <= lb * (1 + REL_GAP) + 1e-15
    if at_bound or left < MIN_EXACT_SECONDS:
        why = ("one device" if len(cluster) == 1 else "it meets the lower bound" if at_bound
               else f"only {max(left, 0.0):.1f}s were left")
        plan = _relabelled(heuristic)
        plan.solver = {"name": name, "status": "optimal" if at_bound else "heuristic"}
        return _summary(graph, cluster, plan, name, stages, lb, notes, started, f"kept the heuristic plan ({why})")
    units = len({str(op.get("colocate")) if op.get("colocate") is not None else "\0" + op.name for op in graph.ops})
    plan, engine, bound = heuristic, name, lb
    if units <= EXACT_UNITS and len(graph.ops) * len(cluster) <= EXACT_MAX_OP_DEVICES:
        share = left * (EXACT_SHARE if units > PROVE_UNITS else 1.0) * (1 - MARGIN)
        exact = place_cpsat(graph, cluster, dataclasses.replace(options, time_limit=share, warm_start=heuristic))
        stages.append(("cpsat", exact.makespan))
        bound = max(bound, exact.solver.get("bound") or 0.0)
        if exact.makespan < plan.makespan * (1 - 1e-12) or exact.solver["status"] == "optimal":
            plan, engine = exact, "cpsat"
        if exact.solver["status"] == "optimal":
            return _summary(graph, cluster, _relabelled(plan), engine, stages, bound, notes, started,
                            f"CP-SAT solved all {units} placement units to optimality")
    left = options.time_limit - (time.perf_counter() - started)
    if left >= MIN_EXACT_SECONDS and len(graph.ops) > LNS_MAX_OPS:
        moved = check_plan(graph, cluster, improve_by_moves(graph, cluster, plan, left * (1 - MARGIN)))
        stages.append(("moves", moved.makespan))
        if moved.makespan < plan.makespan * (1 - 1e-12):
            plan, engine = moved, "moves"
        how = f"critical-path moves ({len(graph.ops)} ops: more than LNS's steps can model in time)"
        return _summary(graph, cluster, _relabelled(plan), engine, stages, bound, notes, started, how)
    if left >= MIN_EXACT_SECONDS:
        lns_options = dataclasses.replace(options, time_limit=left * (1 - MARGIN), warm_start=plan)
        improved = improve_with_lns(graph, cluster, lns_options, engine="cpsat", start=plan)
        stages.append(("cpsat-lns", improved.makespan))
        if improved.makespan < plan.makespan * (1 - 1e-12):
            plan, engine = improved, "cpsat-lns"
    how = ("CP-SAT on the whole model, then LNS" if units <= EXACT_UNITS else "LNS with CP-SAT sub-models")
    return _summary(graph, cluster, _relabelled(plan), engine, stages, bound, notes, started,
                    f"{how} on {units} placement units")


def _relabelled(plan: Plan) -> Plan:
    """A copy of `plan` that says it is auto's (the engine that made it is named in the summary)."""
    out = as_algorithm(plan, ALGORITHM)
    out.notes = list(plan.notes)
    return out


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
