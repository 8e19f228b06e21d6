"""Hybrid plans: data-parallel replicas x micro-batches x placement, in one search.

Each strategy (d, m) is d replicas of m micro-batches, placed as one replica's graph on replica
0's devices with the same engines as a one-batch plan (`passes/rewrite/replicas.py`: the replica graph,
rewritten by `passes/rewrite/rebatch.py`, and its plan as the plan of the whole step).

`place{algo=auto}` searches (d, m): it screens every strategy that divides the devices and the
batch with the fast heuristics and the pipeline schedules (GPipe, 1F1B, and the eager schedule
of their stages on every replica graph built), then spends the rest of its time limit on the
best strategy with the full engine, warm-started from the screening plan. A strategy that does
not fit in memory is dropped with the reason kept.

The strategies are `strategies.py`'s and their screening is `screening.py`'s; this module runs
the search and refines the best strategy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.budget import Budget
from pesto_ir.passes.placement.expansion import expand_plan
from pesto_ir.passes.placement.heuristics.portfolio import HEURISTICS
from pesto_ir.passes.placement.options import Incumbent, PlaceOptions, inner, kept_on_interrupt
from pesto_ir.passes.placement.search.screening import MIN_REFINE_SECONDS, REPLICA_REFINE_MAX_OPS, screen_all
from pesto_ir.passes.placement.search.screening_rates import Rates, ScreeningTimes
from pesto_ir.passes.placement.search.start_plan import START, StartPlan
from pesto_ir.passes.placement.search.strategies import Candidate, batch_size, strategies
from pesto_ir.passes.rewrite.replicas import (
    ONE_BATCH,
    Solve,
    Strategy,
    as_hybrid,
    bucketed,
    on_replica,
    placed_devices,
    replica_graph,
    sub_cluster,
)
from pesto_ir.passes.rewrite.shard_state import has_optimizer_state
from pesto_ir.schedule.bounds import lower_bound, work_bound
from pesto_ir.schedule.plan import Plan, write_plan_attrs
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError, first_reason
from pesto_ir.util.units import human_time

SCREEN_SHARE = 0.6  # of the time limit, for screening the strategies (the rest refines the best)
# ... and the screening that may go on past its share ends this much of the limit before its end:
# the best plan is bucketed, checked and refined after it
FINISH_SHARE = 0.05
REFINE_SECONDS_PER_OP = 1e-3  # a pipeline is not refined with less time left than this per op (`_refine_floor`)


LAYOUT_SHARE = 0.25  # of the time limit, at most, for choosing tensor-parallel layouts (`passes/sharding/`)
OTHERS_SHARE = 1.0  # of the time limit's work, for screening and refining the best strategy beside one batch's search
REFINE_MARGIN = 0.5  # a screening plan this much slower than the best plan is not refined (refining gains less)
Refine = Callable[[Graph, Cluster, PlaceOptions, Plan | None], Plan]  # the full engine; a heuristic plan it must beat
# An exact engine's search is skipped where a heuristic plan of the fine graph is within this share of
# the lower bound (a star of N readers: every heuristic is; `driver.place_graph`), and the search over
# strategies where it is within it of the work bound, which no strategy beats (`_at_work_bound`).
# The MSR graphs' and the bundled examples' best heuristic plans are at the bound or 1.2% and more above it.
NEAR_BOUND = 0.01


def search(graph: Graph, cluster: Cluster, options: PlaceOptions, data_parallel: int | None,
           microbatches: int | None, heuristic: Solve, refine: Refine,
           optimizer_state: str = "auto", start: StartPlan | None = None,
           tensor_parallel: int | None = 1, parameters: str = "auto") -> tuple[Graph, Plan]:
    """The fastest plan over the strategies within the time limit: screening, then `refine` (the
    full engine, warm-started) on the best strategy's replica graph; its graph and plan. A `start`
    plan is its strategy's plan so far where it is faster than that strategy's screening plan."""
    if start is None and data_parallel in (None, 1) and microbatches in (None, 1) and tensor_parallel in (None, 1):
        near = _at_work_bound(graph, cluster, options)
        if near is not None:
            return graph, near
    started = work.now()
    todo = strategies(graph, cluster, data_parallel, microbatches, optimizer_state, tensor_parallel, options.progress,
                      parameters, until=started + options.time_limit * LAYOUT_SHARE)
    if not todo:
        raise PestoError(f"no strategy divides the batch of {batch_size(graph)} and the {len(cluster)} devices "
                         f"(data-parallel {data_parallel or 'auto'}, microbatches {microbatches or 'auto'})")
    # one batch among others: its own search (the plan a one-batch place gives) runs after the
    # screening with the whole limit's work, and the screening and the best other strategy's
    # refinement get `OTHERS_SHARE` of it
    one_batch_searched = len(todo) > 1 and ONE_BATCH in todo
    budget = Budget(options.time_limit * (OTHERS_SHARE if one_batch_searched else 1.0), started)
    deadline = budget.deadline
    quiet = inner(dataclasses.replace(options, quiet=True, warm_start=None))  # screening: its fastest plan is kept
    rates = Rates(shard=optimizer_state == "auto" and has_optimizer_state(graph))
    rates.fsdp = rates.shard and parameters == "auto"
    if start is not None:
        if start.rewritten is not None:
            rates.prebuilt[start.strategy] = start.rewritten
            rates.rewrote(start.rewrite_seconds, len(start.rewritten.ops))
        used = {slot.device for slot in start.given.ops.values()}
        rates.halved = 2 * len(used) <= len(cluster) // start.strategy.data_parallel
    try:
        # one batch's own search, where it does not run, leaves the screening its share of that work
        spare = options.time_limit * SCREEN_SHARE if one_batch_searched else 0.0
        times = ScreeningTimes(budget.at(SCREEN_SHARE), deadline - budget.share(FINISH_SHARE), spare)
        tried = screen_all(graph, cluster, todo, quiet, heuristic, times, options, rates) \
            if len(todo) > 1 else [Candidate(todo[0])]
    except KeyboardInterrupt:
        options.progress("place: hybrid search interrupted while screening; keeping the fastest plan screened")
        fastest_graph, fastest = rates.fastest or (graph, None)
        raise kept_on_interrupt(options, fastest_graph, fastest) from None
    if start is not None:
        _offer_start(tried, start)
    screened = [c for c in tried if c.plan is not None]
    one_batch = next((c for c in screened if c.strategy == ONE_BATCH), None) if one_batch_searched else None
    others = [c for c in screened if c is not one_batch] if one_batch_searched else screened
    if others:
        best = min(others, key=lambda c: c.plan.makespan if c.plan is not None else math.inf)
    else:  # no quick plan: the full engine on the one-batch step (it can search from scratch)
        if all(c.unfit for c in tried):
            raise PestoError("no strategy gave a plan: none can fit in memory; "
                             + "; ".join(f"{c.strategy}: {c.why_not}" for c in tried))
        may_fit = [c for c in tried if not c.unfit]
        if all(c.over for c in may_fit):  # refining one from scratch would build what is predicted not to fit
            raise PestoError("no strategy gave a plan: none can fit in memory by the memory floor, or is predicted "
                             "to (add devices or memory, or recompute activations); "
                             + "; ".join(f"{c.strategy}: {c.why_not}" for c in tried))
        best = next((c for c in may_fit if c.strategy == ONE_BATCH), may_fit[0])
    if one_batch is not None and (best is one_batch or not _worth_refining(best, one_batch)):
        best = one_batch  # its own search below is the refinement
    plan = best.plan
    refining = inner(options)  # the engine's plan becomes the whole step's on Ctrl-C
    try:
        try:
            if best is not one_batch:  # one batch's refinement is its own search, below
                plan = _refine_best(graph, cluster, best, refining, deadline, refine)
        except PestoError as e:
            # a fixed strategy is not screened: its replicas may hold the whole state and not fit
            if plan is not None or len(tried) > 1 or not rates.shard or best.strategy.data_parallel < 2 \
                    or best.strategy.optimizer_state == "sharded":
                raise
            first = first_reason(e)
            sharded = Candidate(best.strategy.sharded(), why_not=f"the whole optimizer state gives no plan ({first})")
            try:
                plan = _refine_best(graph, cluster, sharded, refining, deadline, refine)
            except PestoError:
                raise e from None  # the strategy's own failure, not the retry's
            best = tried[0] = sharded
    except PestoError as e:
        if plan is None:
            if len(tried) == 1:
                raise
            reasons = "; ".join(f"{c.strategy}: {c.why_not}" for c in tried if c.why_not)
            raise PestoError(f"no strategy gave a plan: {best.strategy}: {first_reason(e)}; {reasons}") from e
    except KeyboardInterrupt:
        found = _refined_so_far(refining.incumbent, cluster, best, plan)
        if found is not None and best.graph is not None:
            found.notes = [*found.notes, _summary(tried, best.strategy, found) + "; interrupted (Ctrl-C) refining it"]
            raise kept_on_interrupt(options, best.graph, found) from None
        raise
    assert plan is not None and best.graph is not None  # _refine_best builds the graph
    chosen, chosen_graph = best, best.graph
    if one_batch is not None and (best is one_batch or _worth_refining(one_batch, best, plan)):
        searched = _one_batch_search(graph, cluster, options, refine, one_batch)
        if searched is not None and searched.makespan < plan.makespan:
            chosen, chosen_graph, plan = one_batch, graph, searched
    plan.notes = [*plan.notes, _summary(tried, chosen.strategy, plan)]
    write_plan_attrs(chosen_graph, plan)
    return chosen_graph, plan


def _at_work_bound(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan | None:
    """m-ETF's one-batch plan of the fine graph where the graph's lower bound is its work over the
    devices (`work_bound`: no split of the batch runs less work) and the plan is within
    `NEAR_BOUND` of it: no strategy, engine or refinement can gain more. Else None. A 1 -> 50,000
    star placed in minutes by the search over strategies; it is at its work bound."""
    spread = work_bound(graph, cluster)
    bound = lower_bound(graph, cluster)
    if spread <= 0 or bound > spread:
        return None
    try:
        plan = check_plan(graph, cluster, HEURISTICS["m-etf"](graph, cluster, dataclasses.replace(options, quiet=True)))
    except PestoError:
        return None
    if plan.makespan > spread * (1 + NEAR_BOUND):
        return None
    options.progress(f"place: m-etf's one-batch plan ({human_time(plan.makespan, 4)}) is within {NEAR_BOUND:.0%} "
                     f"of the work bound ({human_time(spread, 4)}); no search")
    plan.lower_bound = bound
    plan.solver = {**(plan.solver or {}), "winner": "m-etf", "status": "skipped"}
    plan.notes = [*plan.notes, f"m-etf's one-batch plan ({plan.makespan:.6g}s) is within {NEAR_BOUND:.0%} of the "
                  f"work bound ({spread:.6g}s), which no strategy beats: no search"]
    plan.timed_on = graph  # the list schedule's simulated times, checked just now
    return plan


def _worth_refining(c: Candidate, best: Candidate, best_plan: Plan | None = None) -> bool:
    """Whether `c`'s screening plan is within `REFINE_MARGIN` of `best`'s plan (`best_plan`, its
    refined plan, where given): refining gains less than that."""
    assert c.plan is not None
    floor = best_plan if best_plan is not None else best.plan
    return floor is None or c.plan.makespan <= floor.makespan * (1 + REFINE_MARGIN)


def _one_batch_search(graph: Graph, cluster: Cluster, options: PlaceOptions, refine: Refine,
                      one_batch: Candidate) -> Plan | None:
    """The one-batch plan exactly as a one-batch place makes it (the same engine, options and
    work), so that searching over strategies is never slower than one batch alone; None where it
    gives none (its screening plan stands)."""
    searching = inner(dataclasses.replace(options, quiet=True))
    try:
        found = refine(graph, cluster, searching, None)
    except PestoError as e:
        options.progress(f"place: the one-batch search gave no plan ({first_reason(e)}); its screening plan stands")
        return None
    except KeyboardInterrupt:
        carried = searching.incumbent.plan_of(graph)
        kept = carried if carried is not None and one_batch.plan is not None and \
            carried.makespan < one_batch.plan.makespan else one_batch.plan
        raise kept_on_interrupt(options, graph, kept) from None
    options.progress(f"place: refined one batch (searched as a one-batch place): {human_time(found.makespan, 4)}")
    return found


def _offer_start(tried: list[Candidate], start: StartPlan) -> None:
    """`start` as its strategy's plan where it is faster than the screening's (that strategy a
    candidate of its own where it was not tried)."""
    c = next((c for c in tried if c.strategy == start.strategy), None)
    if c is None:
        c = Candidate(start.strategy)
        tried.append(c)
    if c.plan is None or start.beats(c.plan.makespan):
        c.graph, c.source, c.plan, c.engine = start.graph, start.rewritten or start.graph, start.checked(), START
        c.why_not = ""


def _refine_best(graph: Graph, cluster: Cluster, best: Candidate, options: PlaceOptions, deadline: float,
                 refine: Refine) -> Plan:
    """`refine` (the full engine, warm-started from the screening plan) on `best`'s replica graph
    (built here if the strategy was not screened) in the time left; the faster of its plan and the
    screening plan, as a plan of the whole step."""
    if best.graph is None:
        best.graph = replica_graph(graph, cluster, best.strategy)
    left = max(deadline - work.now(), 0.05)
    plan = best.plan
    if plan is not None and (left < _refine_floor(best) or len(best.graph.ops) > REPLICA_REFINE_MAX_OPS):
        return plan  # the screening used the time, or the graph is too large to refine in it: its plan stands
    if best.strategy == ONE_BATCH:  # the one-batch plan, as `place` makes it (its heuristics screened)
        refined = refine(best.graph, cluster, dataclasses.replace(options, time_limit=left), best.plan)
    else:
        sub = sub_cluster(cluster, placed_devices(cluster, best.strategy))
        warm = on_replica(best.plan, sub) if best.plan is not None else None
        # the screening plan is the floor to beat: the heuristics need not run again (on a
        # 32-micro-batch pipeline they take seconds the time limit does not have)
        refined = refine(best.graph, sub, dataclasses.replace(options, time_limit=left, warm_start=warm), warm)
        if best.plan is None:  # not screened (a fixed strategy): its all-reduces are not bucketed yet
            best.graph, refined = bucketed(best.graph, cluster, refined, best.strategy)
        else:
            refined = as_hybrid(best.graph, cluster, refined, best.strategy)
    if plan is None or refined.makespan < plan.makespan:
        plan = retimed(best.graph, cluster, refined, plan)
    return plan


def _refined_so_far(held: Incumbent, cluster: Cluster, best: Candidate, screened: Plan | None) -> Plan | None:
    """Ctrl-C while refining `best`: the plan the engine had so far, as a plan of the whole step, if
    it beats the screening plan (else that plan)."""
    assert best.graph is not None
    carried = held.plan_of(best.graph)
    if carried is None:
        return screened
    if best.strategy != ONE_BATCH:
        carried = as_hybrid(best.graph, cluster, carried, best.strategy)
    if screened is not None and carried.makespan >= screened.makespan:
        return screened
    return retimed(best.graph, cluster, carried, screened)


def _refine_floor(best: Candidate) -> float:
    """The least time worth refining `best` in: the engines' set-up (a CP-SAT model of the
    whole graph, the heuristics) grows with a pipeline's ops and is not counted in their limits."""
    assert best.graph is not None
    if best.strategy.microbatches == 1:
        return MIN_REFINE_SECONDS
    return max(MIN_REFINE_SECONDS, REFINE_SECONDS_PER_OP * len(best.graph.ops))


def retimed(graph: Graph, cluster: Cluster, refined: Plan, screened: Plan | None) -> Plan:
    """`refined` re-timed as `expand` and the executable run it (links first come, first served:
    LNS times its plans with the solver's order of transfers), unless that makes it slower than
    the screening plan, which the simulator timed that way already."""
    timed = expand_plan(graph, cluster, refined)
    if screened is not None and timed.makespan >= screened.makespan:
        return screened
    return dataclasses.replace(timed, notes=refined.notes)  # the coarse note, for `expand`


def _summary(tried: list[Candidate], chosen: Strategy, plan: Plan) -> str:
    if len(tried) == 1:
        sharded = f"; optimizer state sharded: {tried[0].why_not}" if chosen.optimizer_state == "sharded" and \
            tried[0].why_not else ""
        return (f"data-parallel {chosen.data_parallel} x {chosen.microbatches} micro-batches (as asked): "
                f"{human_time(plan.makespan, 4)} per step{sharded}")
    parts = []
    for c in sorted(tried, key=lambda c: c.strategy):
        if c.plan is not None:
            why = f" ({c.why_not})" if c.why_not and c.strategy.optimizer_state == "sharded" else ""
            start = " (the start plan)" if c.engine == START else ""
            parts.append(f"{c.strategy} {human_time(c.plan.makespan, 4)}{start}{why}")
        else:
            parts.append(f"{c.strategy} none ({c.why_not})" if c.why_not else f"{c.strategy} not screened")
    return (f"hybrid search: chose {chosen} (data-parallel {chosen.data_parallel} x {chosen.microbatches} "
            f"micro-batches) at {human_time(plan.makespan, 4)}; tried " + "; ".join(parts))
