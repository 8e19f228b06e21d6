"""Placing one graph with one algorithm, the way the place pass runs every algorithm.

The algorithm runs on the graph, or on its coarse quotient when `coarsen` wrote `group`
attributes; every plan it returns goes through `check_plan` and gets the fine graph's lower bound.
A coarse plan is recorded on the fine ops (each op shows its group's device, start and end, and
the plan carries a note saying so) until `expand` turns it into a per-op plan.

Coarsening trades parallelism for a model the exact engines can solve, and sometimes loses more
than they win back: on Inception-v3 training at 4 devices, m-ETF on the 652 fine ops beats the
best plan of the 200 coarse groups. So an exact engine's coarse plan is expanded and compared with
the heuristics run on the fine graph, and the faster plan is kept, with a note that says which.
`auto` (a `portfolio` entry) goes one step further, as multilevel partitioners do when they
uncoarsen: it spends half its time on the coarse graph and the rest refining the faster fine plan
on the fine graph, first with critical-path moves (`local_search`, which needs only the
simulator), then, on graphs small enough for a step of it to stay cheap, with LNS. Last, in the
share of its time kept for it, auto justifies the fine plan's device orders (`placement/justify.py`):
a list schedule run forward cannot know which ready op the end of the step waits for; run backward
from the end it can.

With data-parallel replicas or micro-batches, `place_hybrid` hands the search over strategies
(`hybrid.py`) this module's `place_graph` to place each replica graph.
"""

from __future__ import annotations

import dataclasses

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.budget import Budget
from pesto_ir.passes.placement.expansion import expand_plan
from pesto_ir.passes.placement.heuristics.portfolio import (
    HEURISTICS,
    best_heuristic_plan,
)
from pesto_ir.passes.placement.justify import ROUNDS as JUSTIFY_ROUNDS
from pesto_ir.passes.placement.justify import justified
from pesto_ir.passes.placement.options import (
    COARSE_NOTE,
    AlgorithmEntry,
    Incumbent,
    PlaceError,
    PlaceOptions,
    inner,
    kept_on_interrupt,
)
from pesto_ir.passes.placement.search.hybrid import NEAR_BOUND, search
from pesto_ir.passes.placement.search.lns import LNS_MAX_OPS, improve_with_lns
from pesto_ir.passes.placement.search.local_search import improve_by_moves
from pesto_ir.passes.placement.search.start_plan import StartPlan
from pesto_ir.passes.rewrite.coarse_graph import quotient_graph
from pesto_ir.schedule.bounds import lower_bound, memory_shortfall
from pesto_ir.schedule.plan import OpSlot, Plan, faster, write_plan_attrs
from pesto_ir.schedule.simulate import PlanError
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError
from pesto_ir.util.units import human_time

FINE_REFINE_MAX_OPS = 20000  # auto refines its expanded plan on fine graphs up to this size ...
REFINE_SHARE = 0.5  # ... with this share of its time limit
REFINE_MIN_SECONDS = 0.3  # below this much time left, no refinement
MIN_SOLVE_SECONDS = 0.05  # what the coarse solve gets when the fine heuristics used the whole limit
FLOOR_SHARE = 0.5  # of the time limit, for the heuristics on the fine graph (the plan to beat)
JUSTIFY_SHARE = 0.05  # of auto's time limit, kept for justifying its plan's orders last (or more: `justify_kept`)
# The hybrid search screens a replica graph with m-SCT as well as m-ETF up to this many ops (m-SCT
# takes 2-3 times as long)
SCREEN_BOTH_MAX_OPS = 5000


def place_graph(graph: Graph, cluster: Cluster, algo: AlgorithmEntry, options: PlaceOptions,
                floor: Plan | None = None) -> Plan:
    """Place `graph` (coarse when it has `group` attributes), record the plan in it and return it.

    A coarse plan of an exact algorithm is kept only if it beats, once expanded, the best heuristic
    plan of the fine graph: `floor` when the caller has it, else the heuristics run first, as many
    as fit in `FLOOR_SHARE` of the time limit."""
    _check_placeable(graph)
    _check_memory(graph, cluster, "")
    budget = Budget.start(options.time_limit)
    justify = algo.portfolio and len(cluster) > 1
    solving = budget.share(1 - JUSTIFY_SHARE) if justify else budget.seconds  # seconds before justification
    grouped = any("group" in op.attrs for op in graph.ops)
    if not grouped:
        plan = solve(graph, cluster, algo, dataclasses.replace(options, time_limit=solving))
        plan.lower_bound = lower_bound(graph, cluster)
        if justify:
            plan = justified_plan(graph, cluster, plan, budget.deadline, options)
        write_plan_attrs(graph, plan)
        return plan
    coarse, members = quotient_graph(graph, cluster)
    _check_memory(coarse, cluster, " after coarsening (raise coarsen's target to make groups smaller)")
    bound = lower_bound(graph, cluster) if algo.exact else 0.0
    if algo.exact and floor is None:
        floor = best_heuristic_plan(graph, cluster, dataclasses.replace(options, quiet=True, warm_start=None),
                                    until=budget.at(FLOOR_SHARE), good_enough=bound * (1 + NEAR_BOUND))
    if algo.exact and floor is not None and floor.makespan <= bound * (1 + NEAR_BOUND):
        plan = near_bound_plan(floor, algo.name, bound, len(graph.ops))
        options.progress(f"place: {floor.algorithm} on the {len(graph.ops)} fine ops ({human_time(floor.makespan, 4)}) "
                         f"is within {NEAR_BOUND:.0%} of the lower bound ({human_time(bound, 4)}); no exact solve")
        write_plan_attrs(graph, plan)
        return plan
    left = max(solving - budget.spent(), MIN_SOLVE_SECONDS)
    refine = algo.portfolio and len(members) < len(graph.ops) <= FINE_REFINE_MAX_OPS and len(cluster) > 1
    coarse_options = inner(dataclasses.replace(options, time_limit=left * (1 - REFINE_SHARE) if refine else left))
    try:
        plan = solve(coarse, cluster, algo, coarse_options)
    except KeyboardInterrupt:
        raise _coarse_interrupted(coarse_options.incumbent, graph, cluster, coarse, members, floor, options) from None
    plan.lower_bound = bound if algo.exact else lower_bound(graph, cluster)
    fine = project_coarse_plan(graph, plan, members)
    if algo.exact and floor is not None:
        fine = faster_than_fine_heuristics(graph, cluster, fine, floor, options)
    if refine:  # the plan is expanded there: its times are the fine ops' own, which justification compares
        kept = budget.share(JUSTIFY_SHARE) if justify else 0.0
        fine = refined_on_fine_graph(graph, cluster, fine, options, solving + kept - budget.spent(), justify_seconds=kept)
        if justify:
            fine = justified_plan(graph, cluster, fine, budget.deadline, options)
    write_plan_attrs(graph, fine)
    return fine


def near_bound_plan(floor: Plan, algo: str, bound: float, ops: int) -> Plan:
    """`floor`, a heuristic plan of the fine graph within `NEAR_BOUND` of `bound`, as `algo`'s."""
    solver = {**(floor.solver or {}), "winner": f"{floor.algorithm} (fine graph)", "status": "skipped"}
    note = (f"{floor.algorithm} on the {ops} fine ops ({floor.makespan:.6g}s) is within {NEAR_BOUND:.0%} of the "
            f"lower bound ({bound:.6g}s): no exact solve")
    return dataclasses.replace(floor, algorithm=algo, lower_bound=bound, solver=solver, notes=[*floor.notes, note])


def justified_plan(graph: Graph, cluster: Cluster, plan: Plan, deadline: float, options: PlaceOptions) -> Plan:
    """`plan` (of the fine ops, one replica) with its devices' orders justified
    (`passes/placement/justify.py`: same placement, the eager schedule of the priorities a schedule run
    backward from the end gives), where that is faster and valid; auto's last step (MSR graphs
    at 4 devices, `bench/place_row.py`: Inception-V3's layers 324.1 to 315.1 ms, BERT-3's ops
    118.5 to 117.0 ms)."""
    placement = {name: slot.device for name, slot in plan.ops.items()}
    try:
        found = justified(graph, cluster, placement, plan, deadline=deadline)
    except KeyboardInterrupt:
        raise kept_on_interrupt(options, graph, plan) from None
    if found is plan:
        return plan
    try:
        check_plan(graph, cluster, found)
    except PlanError:
        return plan
    solver = {**(plan.solver or {}), "winner": f"{(plan.solver or {}).get('winner') or plan.algorithm} + justified"}
    return dataclasses.replace(found, algorithm=plan.algorithm, lower_bound=plan.lower_bound, solver=solver,
                               notes=[*plan.notes, f"justified: {plan.makespan:.6g}s -> {found.makespan:.6g}s"])


def _coarse_interrupted(held: Incumbent, graph: Graph, cluster: Cluster, coarse: Graph,
                        members: dict[str, list[str]], floor: Plan | None, options: PlaceOptions) -> KeyboardInterrupt:
    """Ctrl-C during the coarse solve: its best plan on the fine ops, unless the fine heuristics'
    plan (`floor`) beats it once expanded."""
    carried = held.plan_of(coarse)
    if carried is None:
        return kept_on_interrupt(options, graph, floor)
    carried.lower_bound = lower_bound(graph, cluster)
    fine = project_coarse_plan(graph, carried, members)
    if floor is not None:
        fine = faster_than_fine_heuristics(graph, cluster, fine, floor, options)
    return kept_on_interrupt(options, graph, fine)


def place_hybrid(graph: Graph, cluster: Cluster, algo: AlgorithmEntry, options: PlaceOptions, data_parallel: int | None,
                 microbatches: int | None, optimizer_state: str = "auto",
                 start: StartPlan | None = None, tensor_parallel: int | None = 1,
                 parameters: str = "auto") -> tuple[Graph, Plan]:
    """The fastest plan over data-parallel replicas x micro-batches (`passes/placement/search/hybrid.py`), `algo`
    placing each replica, the search taking `start` as its strategy's plan so far; the replica
    graph it is a plan of, and the plan."""
    def heuristic(g: Graph, c: Cluster, o: PlaceOptions) -> Plan:
        if g is graph:  # the one-batch step: the heuristics (the plan auto must never be slower than),
            # as many as fit in the time the search gives them
            deadline = Budget.start(o.time_limit).deadline
            found = best_heuristic_plan(g, c, o, until=deadline)
            if found is None:  # each stops at the deadline, and none starts after it
                raise PlaceError("no heuristic plan of the one-batch step " + (
                    "within the work it was given" if work.now() > deadline else "fits in memory"))
            return found
        # m-ETF and m-SCT (m-ETF alone on large graphs: m-SCT takes 2-3 times as long); on a
        # replica of one device any order of the ops takes their total
        best: Plan | None = None
        names = ("single",) if len(c) == 1 else ("m-etf", "m-sct") if len(g.ops) <= SCREEN_BOTH_MAX_OPS else ("m-etf",)
        failed: list[PestoError] = []
        for name in names:  # one that runs out of memory leaves the others their chance
            try:
                plan = check_plan(g, c, HEURISTICS[name](g, c, o))
            except PestoError as e:
                failed.append(e)
                continue
            if best is None or plan.makespan < best.makespan:
                best = plan
        if best is None:
            raise failed[0]
        return best

    def refine(g: Graph, c: Cluster, o: PlaceOptions, floor: Plan | None) -> Plan:
        return place_graph(g, c, algo, o, floor)

    try:
        out, plan = search(graph, cluster, options, data_parallel, microbatches, heuristic, refine, optimizer_state,
                           start, tensor_parallel, parameters)
    except KeyboardInterrupt:  # the search kept its best plan: labelled as this algorithm's
        if options.incumbent.plan is not None:
            _labelled(options.incumbent.plan, algo.name)
        raise
    if _labelled(plan, algo.name):
        write_plan_attrs(out, plan)
    return out, plan


def _labelled(plan: Plan, algo: str) -> bool:
    """Label `plan` as `algo`'s search's (the engine that made it is its winner); whether it was not."""
    if plan.algorithm == algo:
        return False
    plan.solver = {**(plan.solver or {}), "winner": plan.algorithm}
    plan.algorithm = algo
    return True


def refined_on_fine_graph(graph: Graph, cluster: Cluster, plan: Plan, options: PlaceOptions, seconds: float,
                          justify_seconds: float = 0.0) -> Plan:
    """`plan` (coarse or fine) expanded and improved on the fine graph for `seconds`: critical-path
    moves, then CP-SAT LNS on graphs small enough for its steps. With `justify_seconds` (the share
    of the time limit kept for justifying the plan next), the last `justify_kept` seconds are left
    for that.

    LNS times its plans with the solver's order of transfers on each link; `expand` re-times them
    first come, first served, as the JAX executable runs them, so that is the time compared."""
    began = work.now()
    start = expand_plan(graph, cluster, plan)
    simulation = work.now() - began
    if justify_seconds:
        seconds -= justify_kept(justify_seconds, simulation, seconds)
    budget = Budget(seconds, began)
    if budget.left() < REFINE_MIN_SECONDS:
        return start
    best = start
    stages = inner(options)  # their plans are re-timed and labelled here on Ctrl-C
    try:
        best = check_plan(graph, cluster, improve_by_moves(graph, cluster, start, budget.left(), stages.incumbent))
        left = budget.left()
        if len(graph.ops) <= LNS_MAX_OPS and left >= REFINE_MIN_SECONDS:
            found = improve_with_lns(graph, cluster, dataclasses.replace(stages, time_limit=left, warm_start=best),
                                     engine="cpsat", start=best)
            best = _faster_retimed(graph, cluster, found, best)
    except KeyboardInterrupt:  # the interrupted stage's plan, re-timed, or the best before it
        carried = stages.incumbent.plan_of(graph)
        if carried is not None:
            best = _faster_retimed(graph, cluster, carried, best)
        raise kept_on_interrupt(options, graph, _refinement(start, best, options, seconds, len(graph.ops))) from None
    return _refinement(start, best, options, seconds, len(graph.ops))


def justify_kept(share: float, simulation: float, seconds: float) -> float:
    """The seconds of `seconds` to keep for justifying a plan: its `share` of the time limit, or
    if longer, as long as `justify.ROUNDS` simulations of the plan take (one took `simulation`
    seconds), so that its rounds do not depend on the time limit where they fit in half of it (on
    the JAX LSTM's 4,441 ops at 4 devices they take 0.6 s, and stopped at 0.3 s they leave the
    plan 0.5% slower)."""
    return min(max(share, JUSTIFY_ROUNDS * simulation), seconds / 2)


def _faster_retimed(graph: Graph, cluster: Cluster, found: Plan, best: Plan) -> Plan:
    """`found` re-timed with FIFO links, as `expand` and the executable run it (LNS times its plans
    with the solver's order of transfers), if that is faster than `best`; else `best`."""
    timed = expand_plan(graph, cluster, found)
    if faster(timed.makespan, best.makespan):
        return dataclasses.replace(timed, notes=[*best.notes, found.notes[-1]])
    return best


def _refinement(start: Plan, best: Plan, options: PlaceOptions, seconds: float, ops: int) -> Plan:
    """`best`, the refinement of `start`, labelled as `start`'s algorithm's; `start` if no faster."""
    if not faster(best.makespan, start.makespan):
        return start
    options.progress(f"place: refined on the {ops} fine ops: the plan from "
                     f"{human_time(start.makespan, 4)} to {human_time(best.makespan, 4)}")
    solver = dict(start.solver or {})
    solver["winner"] = f"{solver.get('winner') or start.algorithm} + fine refinement"
    return dataclasses.replace(best, algorithm=start.algorithm, lower_bound=start.lower_bound, solver=solver,
                               notes=[*best.notes, f"refined on the fine graph: {start.makespan:.6g}s -> "
                                      f"{best.makespan:.6g}s in {seconds:.3g}s"])


def faster_than_fine_heuristics(graph: Graph, cluster: Cluster, coarse: Plan, heuristic: Plan,
                                options: PlaceOptions) -> Plan:
    """`coarse` (a coarse plan on the fine ops), unless `heuristic`, the best heuristic plan of the
    fine graph, beats it once expanded: then that plan, labelled with the asked algorithm and a note."""
    expanded = expand_plan(graph, cluster, coarse).makespan
    if heuristic.makespan >= expanded:
        return coarse
    name = heuristic.algorithm
    options.progress(f"place: {name} on the {len(graph.ops)} fine ops ({human_time(heuristic.makespan, 4)}) "
                     f"beats the expanded coarse plan ({human_time(expanded, 4)}); keeping it")
    solver = dict(coarse.solver or {})
    solver["winner"] = f"{name} (fine graph)"
    note = (f"{name} on the fine graph ({heuristic.makespan:.6g}s) beat the {coarse.algorithm} plan of the coarse "
            f"graph once expanded ({expanded:.6g}s), so its plan is kept")
    notes = [n for n in coarse.notes if not n.startswith(COARSE_NOTE)]
    return dataclasses.replace(heuristic, algorithm=coarse.algorithm, lower_bound=coarse.lower_bound,
                               solver=solver, notes=[*notes, *heuristic.notes, note])


def solve(graph: Graph, cluster: Cluster, algo: AlgorithmEntry, options: PlaceOptions) -> Plan:
    """Run `algo` (from the best heuristic plan where it takes a warm start) and validate the result."""
    if algo.warm_start:
        warm = best_heuristic_plan(graph, cluster, options)
        options = dataclasses.replace(options, warm_start=warm)
    plan = algo.run(graph, cluster, options)
    if not plan.algorithm:
        plan.algorithm = algo.name
    return check_plan(graph, cluster, plan)


def project_coarse_plan(graph: Graph, plan: Plan, members: dict[str, list[str]]) -> Plan:
    """The coarse plan on the fine ops: every op gets its group's device, start and end."""
    ops = {}
    for g, names in members.items():
        slot = plan.ops[g]
        for name in names:
            ops[name] = OpSlot(slot.device, slot.start, slot.end)
    note = (f"{COARSE_NOTE} over {len(members)} groups of {len(graph.ops)} ops: each op shows its "
            "group's device, start and end, transfers are left out; run expand for a per-op plan")
    return Plan(graph.name, plan.algorithm, list(plan.devices), {op.name: ops[op.name] for op in graph.ops},
                [], plan.lower_bound, plan.solver, [*plan.notes, note])


def _check_placeable(graph: Graph) -> None:
    """Refuse what placing would get silently wrong: no costs at all (every plan would take no time),
    or devices a person set by hand (a place pass would replace them)."""
    if graph.ops and not any("cost" in op.attrs for op in graph.ops):
        raise PlaceError(f"place needs op costs, and none of the {len(graph.ops)} ops has one: run annotate-costs "
                         "first (e.g. -p annotate-costs,place)")
    pinned = [op for op in graph.ops if "device" in op.attrs]
    if pinned and "plan" not in graph.attrs:
        op = pinned[0]
        raise PlaceError(f"op '{op.name}' ({op.where()}) has device = @{op.get('device')}, set by hand (the graph "
                         f"has no plan), and {len(pinned)} op(s) in all: place would replace them; remove those "
                         "attributes to place the graph, or run simulate to time the placement they give")


def _check_memory(graph: Graph, cluster: Cluster, where: str) -> None:
    problems = memory_shortfall(graph, cluster)
    if problems:
        raise PlaceError(f"the graph cannot fit in the cluster's memory{where}:\n  " + "\n  ".join(problems))
