"""`auto`: a portfolio that spends the time limit where it pays, by graph size.

1. Heuristics first (the warm start the place pass hands over, or the best of the place pass's
   heuristics and the fastest single device): they take milliseconds to a second and are
   sometimes already optimal (at the lower bound), in which case nothing else runs. On 4 devices
   or more, `auto` itself then places the graph on the first half of the devices with
   `SEED_SHARE` of the time left: a plan on fewer devices is a plan on all of them, and the search
   on more devices, which has more to explore in the same time, starts from it. On the MSR graphs
   the refined plan at k = 8 had been slower than at k = 4 on 8 of 16 rows (by up to 3.4%).
2. Small graphs (at most `EXACT_UNITS` placement units) go to the whole CP-SAT model first, for
   `WHOLE_MODEL_SHARE` of the time left: it can prove optimality there, and its bound is kept.
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
from typing import Any

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.budget import Budget
from pesto_ir.passes.placement.common import colocation_units
from pesto_ir.passes.placement.exact.common import REL_GAP, as_algorithm, fmt, gap
from pesto_ir.passes.placement.exact.cpsat import place_cpsat, starting_plan
from pesto_ir.passes.placement.exact.cpsat_worker import shared_solver
from pesto_ir.passes.placement.options import PlaceOptions, inner, kept_on_interrupt
from pesto_ir.passes.placement.search.lns import LNS_MAX_OPS, improve_with_lns
from pesto_ir.passes.placement.search.local_search import improve_by_moves
from pesto_ir.passes.rewrite.replicas import sub_cluster
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import Plan, faster
from pesto_ir.schedule.validate import check_plan, validate_plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError, first_reason

ALGORITHM = "auto"
EXACT_UNITS = 60  # up to this many placement units the whole CP-SAT model is tried first ...
WHOLE_MODEL_SHARE = 0.4  # ... for this share of the time left, then LNS improves its plan
PROVE_UNITS = 12  # up to this many units the whole model gets all the time: it proves optimality fast
# ... and the whole model only up to this many ops x devices: its size follows the ops, not the units
# (a 32-micro-batch pipeline of 2048 ops in a few colocated stages, on 8 devices, took 10 s to build
# and send to the solver, for a 1.7 s solve), so past it LNS's sub-models alone
EXACT_MAX_OP_DEVICES = 2_000
MIN_EXACT_SECONDS = 0.5  # below this much time left after the heuristics, the heuristic plan stands
SEED_SHARE = 0.35  # of the time left, for auto on the first half of the devices (a starting plan) ...
MIN_SEED_DEVICES = 4  # ... on clusters of this many devices or more
MARGIN = 0.03  # of the time left, kept for timing and checking the solver's plan


def place_auto(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Heuristics, then CP-SAT (small graphs) or CP-SAT LNS (larger ones) within the time limit.
    On Ctrl-C, the best plan of the stages run so far is offered to `options.incumbent`."""
    if not graph.ops:
        return Plan(graph.name, ALGORITHM, list(cluster.names), {}, [], 0.0,
                    {"name": "none", "status": "optimal", "gap": 0.0, "bound": 0.0, "seconds": 0.0, "winner": "none"})
    if len(cluster) > 1:
        shared_solver().start()
    run = _Portfolio(graph, cluster, inner(options))  # its stages' plans become its summary on Ctrl-C
    try:
        return run.run()
    except KeyboardInterrupt:
        raise kept_on_interrupt(options, graph, run.interrupted()) from None


class _Portfolio:
    """One `auto` run: its best plan so far, the engine that made it and every stage's result."""

    def __init__(self, graph: Graph, cluster: Cluster, options: PlaceOptions, as_seed: bool = False) -> None:
        self.graph, self.cluster, self.options = graph, cluster, options
        self.as_seed = as_seed  # a starting plan for more devices: give up where no heuristic fits
        self.budget = Budget.start(options.time_limit)
        self.plan: Plan | None = None
        self.engine = ""
        self.stages: list[tuple[str, float]] = []
        self.bound = 0.0
        self.notes: list[str] = []

    def left(self) -> float:
        return self.budget.left()

    def offer(self, engine: str, plan: Plan, always: bool = False) -> None:
        """Record a stage's result; keep its plan if it is faster than the best (or `always`)."""
        self.stages.append((engine, plan.makespan))
        if self.plan is None or always or faster(plan.makespan, self.plan.makespan):
            self.plan, self.engine = plan, engine

    def summary(self, how: str) -> Plan:
        assert self.plan is not None
        return _summary(self.graph, self.cluster, _relabelled(self.plan), self.engine, self.stages, self.bound,
                        self.notes, self.budget, how)

    def interrupted(self) -> Plan | None:
        """Ctrl-C: the faster of the plan the interrupted stage kept and the best before it, as the
        run's summary (None when it had none)."""
        carried = self.options.incumbent.plan_of(self.graph)
        if carried is not None:
            self.offer(carried.algorithm or "interrupted stage", carried)
        given = self.options.warm_start
        if self.plan is None and given is not None and not validate_plan(self.graph, self.cluster, given):
            self.offer(given.algorithm or "warm start", given)  # interrupted while the heuristics ran
        if self.plan is None:
            return None
        seconds = self.budget.spent()
        self.options.progress(f"auto: interrupted after {seconds:.1f}s; keeping the best plan found so far")
        plan = self.summary(f"interrupted (Ctrl-C) after {seconds:.1f}s")
        assert plan.solver is not None  # _summary sets it
        plan.solver["status"] = "interrupted"
        return plan

    def run(self) -> Plan:
        graph, cluster, options = self.graph, self.cluster, self.options
        heuristic, self.notes = starting_plan(graph, cluster, options)
        self.bound = lower_bound(graph, cluster)
        left = self.left()
        if heuristic is None and self.as_seed:
            raise PestoError("no heuristic plan fits in memory")
        if heuristic is None and left < MIN_EXACT_SECONDS:  # no engine starts without time to run
            raise PestoError(f"no heuristic plan fits in memory, and the {self.budget.spent():.1f}s the heuristics "
                             f"took leave {max(left, 0.0):.1f}s of the {self.budget.seconds:g}s limit, too little for "
                             "CP-SAT to search from scratch; add devices or memory, or raise --time-limit")
        model = work.RATES["cpsat-model"] * len(graph.ops) * len(cluster)
        if heuristic is None and model > left:  # CP-SAT would spend the time building its model
            raise PestoError(f"no heuristic plan fits in memory, and CP-SAT's model of {len(graph.ops)} ops on "
                             f"{len(cluster)} devices takes about {model:.3g}s of work to build, more than the "
                             f"{max(left, 0.0):.3g}s left to search from scratch; add devices or memory, use fewer "
                             "ops (coarsen), or raise --time-limit")
        if heuristic is None:  # memory too tight for every greedy packing: CP-SAT searches from scratch
            plan = place_cpsat(graph, cluster, dataclasses.replace(options, time_limit=left * (1 - MARGIN),
                                                                   warm_start=None))
            self.offer("cpsat", plan)
            return self.summary("no heuristic plan fits in memory, so CP-SAT started from scratch")
        name = heuristic.algorithm or "heuristic"
        self.offer(name, heuristic)
        at_bound = len(cluster) == 1 or heuristic.makespan <= self.bound * (1 + REL_GAP) + 1e-15
        if at_bound or left < MIN_EXACT_SECONDS:
            why = ("one device" if len(cluster) == 1 else "it meets the lower bound" if at_bound
                   else f"only {max(left, 0.0):.1f}s were left")
            self.plan = dataclasses.replace(heuristic, solver={"name": name,
                                                               "status": "optimal" if at_bound else "heuristic"})
            return self.summary(f"kept the heuristic plan ({why})")
        self._seed_from_half(left)
        left = self.left()
        units = len(colocation_units(graph.ops))
        if units <= EXACT_UNITS and len(graph.ops) * len(cluster) <= EXACT_MAX_OP_DEVICES:
            share = left * (WHOLE_MODEL_SHARE if units > PROVE_UNITS else 1.0) * (1 - MARGIN)
            exact = place_cpsat(graph, cluster, dataclasses.replace(options, time_limit=share, warm_start=self.plan))
            assert exact.solver is not None  # place_cpsat reports its solve
            self.bound = max(self.bound, exact.solver.get("bound") or 0.0)
            optimal = exact.solver["status"] == "optimal"
            self.offer("cpsat", exact, always=optimal)
            if optimal:
                return self.summary(f"CP-SAT solved all {units} placement units to optimality")
        left = self.left()
        assert self.plan is not None  # the heuristic plan was offered
        if left >= MIN_EXACT_SECONDS and len(graph.ops) > LNS_MAX_OPS:
            moved = improve_by_moves(graph, cluster, self.plan, left * (1 - MARGIN), options.incumbent)
            self.offer("moves", check_plan(graph, cluster, moved))
            return self.summary(f"critical-path moves ({len(graph.ops)} ops: more than LNS's steps can model "
                                "in time)")
        if left >= MIN_EXACT_SECONDS:
            lns_options = dataclasses.replace(options, time_limit=left * (1 - MARGIN), warm_start=self.plan)
            self.offer("cpsat-lns", improve_with_lns(graph, cluster, lns_options, engine="cpsat", start=self.plan))
        how = ("CP-SAT on the whole model, then LNS" if units <= EXACT_UNITS else "LNS with CP-SAT sub-models")
        return self.summary(f"{how} on {units} placement units")

    def _seed_from_half(self, left: float) -> None:
        """Offer `auto`'s plan on the first half of the devices (with `SEED_SHARE` of `left`, seeded
        the same way in turn), as a plan on all of them. On Ctrl-C, the half's best plan is
        offered and the interrupt goes on."""
        cluster = self.cluster
        if len(cluster) < MIN_SEED_DEVICES or left * SEED_SHARE < MIN_EXACT_SECONDS:
            return
        half = sub_cluster(cluster, cluster.names[:len(cluster) // 2])
        options = inner(dataclasses.replace(self.options, time_limit=left * SEED_SHARE, warm_start=None, quiet=True))
        on_half = _Portfolio(self.graph, half, options, as_seed=True)
        try:
            seed = on_half.run()
        except PestoError as e:  # no heuristic plan fits on half the devices
            self.notes.append(f"auto: no plan on {len(half)} of the {len(cluster)} devices to start from "
                              f"({first_reason(e)})")
            return
        except KeyboardInterrupt:
            best = on_half.interrupted()  # a plan on the half: offered here as a plan on all
            if best is not None:
                self.offer(f"auto on {len(half)} devices", self._on_all(best))
            raise KeyboardInterrupt from None  # carrying no plan of the half: the caller keeps self.plan
        whole = self._on_all(seed)
        self.options.progress(f"auto: {fmt(whole.makespan)} on {len(half)} of the {len(cluster)} devices")
        self.offer(f"auto on {len(half)} devices", whole)

    def _on_all(self, plan: Plan) -> Plan:
        """A plan on some of the devices as a plan on all of them: the same ops, times and
        transfers; its solver's bound (of fewer devices) and notes dropped."""
        return check_plan(self.graph, self.cluster, dataclasses.replace(
            plan, devices=list(self.cluster.names), peak_memory=None, solver=None, lower_bound=None, notes=[]))


def _relabelled(plan: Plan) -> Plan:
    """A copy of `plan` that says it is auto's (the engine that made it is named in the summary)."""
    out = as_algorithm(plan, ALGORITHM)
    out.notes = list(plan.notes)
    return out


def _summary(graph: Graph, cluster: Cluster, plan: Plan, winner: str, stages: list[tuple[str, float]], lb: float,
             notes: list[str], budget: Budget, how: str) -> Plan:
    """Record which engine won, the portfolio's results and the gap to the lower bound."""
    bound = min(max(lb, (plan.solver or {}).get("bound") or 0.0), plan.makespan)
    solver: dict[str, Any] = dict(plan.solver or {})
    solver.update({"bound": bound, "gap": gap(plan.makespan, bound),
                   "seconds": round(budget.spent(), 3), "winner": winner,
                   "portfolio": ", ".join(f"{name} {fmt(t)}" for name, t in stages)})
    solver.setdefault("status", "feasible")
    plan.solver = solver
    plan.lower_bound = bound
    plan.notes = notes + [n for n in plan.notes if n not in notes]
    plan.notes.append(f"auto: {how}; {winner} won with {fmt(plan.makespan)}, "
                      f"{solver['gap']:.2%} above the lower bound {fmt(bound)}")
    return check_plan(graph, cluster, plan)
