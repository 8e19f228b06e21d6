"""`place{algo=... time-limit=... seed=... solver=...}`: choose a device and an order for every op.

The pass checks first that the graph can fit in the cluster's memory at all, then runs one
algorithm of `ALGORITHMS` on the graph, or on its coarse quotient when `coarsen` wrote `group`
attributes. Every plan any algorithm returns goes through `check_plan` before it is recorded, and
gets the makespan lower bound of the fine graph. `ilp` starts from the best heuristic plan.

A coarse plan is recorded on the fine ops: each op shows its group's device, start and end, and
the graph's plan carries a note saying so; `expand` turns it into a per-op plan.

Coarsening trades parallelism for a model the exact engines can solve, and sometimes loses more
than they win back: on Inception-v3 training at 4 devices, m-ETF on the 652 fine ops beats the
best plan of the 200 coarse groups. So an exact engine's coarse plan is expanded and compared with
the heuristics run on the fine graph, and the faster plan is recorded, with a note that says which.
`auto` goes one step further, as multilevel partitioners do when they uncoarsen: it spends half its
time on the coarse graph and the rest refining the faster fine plan on the fine graph, first with
critical-path moves (`passes/placement/search/local_search.py`, which needs only the simulator), then, on graphs of
up to `lns.MAX_OPS` ops, where a step of it stays cheap, with LNS. Last, in the `JUSTIFY_SHARE` of
its time kept for it, auto justifies the fine plan's device orders (`passes/placement/justify.py`): a list
schedule run forward cannot know which ready op the end of the step waits for; run backward
from the end it can.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.heuristics.portfolio import (
    ALGORITHMS as ALGORITHMS,  # re-exported, with the exact engines
)
from pesto_ir.passes.placement.heuristics.portfolio import WARM_START_ALGOS as WARM_START_ALGOS  # importable here too
from pesto_ir.passes.placement.heuristics.portfolio import best_heuristic_plan
from pesto_ir.passes.placement.justify import ROUNDS as JUSTIFY_ROUNDS
from pesto_ir.passes.placement.justify import justified
from pesto_ir.passes.placement.options import (  # COARSE_NOTE, PlaceError, require_cluster: shared with expand, importable here too
    COARSE_NOTE,
    Algorithm,
    Interrupted,
    PlaceError,
    PlaceOptions,
    carried_plan,
    interrupted,
    require_cluster,
    time_limit_problem,
)
from pesto_ir.passes.placement.search.start_plan import StartPlan, apply_start, read_start_plan, strategy_of
from pesto_ir.passes.rewrite.coarse_graph import quotient_graph
from pesto_ir.passes.rewrite.replicas import Strategy
from pesto_ir.passmanager import Pass, PassContext
from pesto_ir.schedule.bounds import lower_bound, memory_shortfall
from pesto_ir.schedule.plan import OpSlot, Plan, write_plan_attrs
from pesto_ir.schedule.simulate import PlanError
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import seed_problem
from pesto_ir.util.units import human_time


def _place_ilp(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """The exact MILP (passes/placement/exact/ilp.py), solved in a worker process (passes/placement/exact/ilp_worker.py): a
    solver crash or Ctrl-C keeps the best plan found so far."""
    from pesto_ir.passes.placement.exact.ilp_worker import place_ilp_in_worker

    return place_ilp_in_worker(graph, cluster, options)


def _place_cpsat(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """CP-SAT (passes/placement/exact/cpsat.py), imported only when asked for."""
    from pesto_ir.passes.placement.exact.cpsat import place_cpsat

    return place_cpsat(graph, cluster, options)


def _place_auto(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """The portfolio of heuristics, CP-SAT and LNS (passes/placement/search/auto.py), imported only when asked for."""
    from pesto_ir.passes.placement.search.auto import place_auto

    return place_auto(graph, cluster, options)


def _place_lns(engine: str) -> Algorithm:
    """Large-neighbourhood search with `engine` (passes/placement/search/lns.py), imported only when asked for."""

    def place(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
        from pesto_ir.passes.placement.search.lns import improve_with_lns

        return improve_with_lns(graph, cluster, options, engine=engine)

    return place


# The heuristics are in ALGORITHMS already (passes/placement/heuristics/portfolio.py); the exact engines join them.
if importlib.util.find_spec("pesto_ir.passes.placement.exact.ilp") is not None:
    ALGORITHMS["ilp"] = _place_ilp
    ALGORITHMS["ilp-lns"] = _place_lns("ilp")
if importlib.util.find_spec("ortools") is not None:
    ALGORITHMS.update({"cpsat": _place_cpsat, "cpsat-lns": _place_lns("cpsat"), "auto": _place_auto})

DEFAULT_ALGO = "ilp" if "ilp" in ALGORITHMS else "m-etf"
EXACT_ALGOS = ("ilp", "ilp-lns", "cpsat", "cpsat-lns", "auto")  # their coarse plans meet the fine heuristics
REFINE_MAX_OPS = 20000  # auto refines its expanded plan on fine graphs up to this size ...
REFINE_SHARE = 0.5  # ... with this share of its time limit
REFINE_MIN_SECONDS = 0.3  # below this much time left, no refinement
MIN_SOLVE_SECONDS = 0.05  # what the coarse solve gets when the fine heuristics used the whole limit
FLOOR_SHARE = 0.5  # of the time limit, for the heuristics on the fine graph (the plan to beat)
JUSTIFY_SHARE = 0.05  # of auto's time limit, kept for justifying its plan's orders last (or more: `justify_kept`)


SCREEN_BOTH_MAX_OPS = 5000  # the hybrid search screens with m-SCT too up to this many ops
MAX_DEFAULT_TIME_LIMIT = 30.0  # seconds: what a graph of 280 ops or groups and more gets by default


def default_time_limit(n: int) -> float:
    """2 s plus 0.1 s per op (or coarse group) to place, at most `MAX_DEFAULT_TIME_LIMIT`: the quick
    start's 32-op example need not wait 30 s for a MILP that cannot close its gap."""
    return min(MAX_DEFAULT_TIME_LIMIT, 2.0 + 0.1 * n)


@dataclass(frozen=True)
class PlacePass(Pass):
    """Place and schedule the graph (or its coarse groups) on the context's cluster."""

    name = "place"
    algo: str = DEFAULT_ALGO
    time_limit: float | None = None  # None: `default_time_limit` of the graph's size
    seed: int | None = None  # None: the pipeline's seed
    solver: str = "cbc"
    data_parallel: str | None = None  # N or auto; None: auto for algo=auto, else 1 (passes/placement/search/hybrid.py)
    microbatches: str | None = None  # N or auto; None: auto for algo=auto, else 1
    # replicated, sharded across the data-parallel replicas (passes/rewrite/shard_state.py), or auto:
    # sharded where a strategy's replicas with the whole state give no plan (memory), and for
    # one-device replicas where that is faster
    optimizer_state: str = "auto"
    start: str | None = None  # a pesto-plan/1 file: the plan to start from and to beat (passes/placement/search/start_plan.py)

    def __post_init__(self) -> None:
        _algorithm(self.algo)
        from pesto_ir.passes.placement.search.hybrid import OPTIMIZER_STATE_CHOICES, parse_degree

        parse_degree(self.data_parallel, "data-parallel")
        parse_degree(self.microbatches, "microbatches")
        if self.optimizer_state not in OPTIMIZER_STATE_CHOICES:
            raise PlaceError(f"optimizer-state must be one of {', '.join(OPTIMIZER_STATE_CHOICES)}, "
                             f"not {self.optimizer_state!r}")
        if self.time_limit is not None and (why := time_limit_problem(self.time_limit)) is not None:
            raise PlaceError(f"time-limit {why}")
        if self.seed is not None and (why := seed_problem(self.seed)) is not None:
            raise PlaceError(f"seed {why}")

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        cluster = require_cluster(ctx, self.name)
        time_limit = self.time_limit
        if time_limit is None:
            groups = {op.get("group") for op in graph.ops if "group" in op.attrs}
            n = len(groups) if groups else len(graph.ops)
            time_limit = default_time_limit(n)
            if self.algo in EXACT_ALGOS:  # the heuristics finish in their own time
                ctx.progress(f"place: time limit {time_limit:g} s, the default for {n} ops or groups "
                             "(--time-limit S or place{time-limit=S} to change it)")
        options = PlaceOptions(time_limit=time_limit, seed=ctx.seed if self.seed is None else self.seed,
                               solver=self.solver, quiet=ctx.quiet, log=ctx.log)
        started = time.perf_counter()
        try:
            graph, plan = self.place(graph, cluster, options)
        except Interrupted as e:
            if e.plan is None or e.graph is None:
                raise KeyboardInterrupt from None  # nothing found yet: the command stops
            graph, plan = e.graph, _kept_on_interrupt(e.graph, cluster, e.plan, self.algo,
                                                      time.perf_counter() - started)
            ctx.progress("place: interrupted (Ctrl-C); keeping the best plan found so far")
        ctx.progress(f"place: {plan.algorithm} makespan {human_time(plan.makespan, 4)}"
                     + (f", lower bound {human_time(plan.lower_bound, 4)}" if plan.lower_bound else ""))
        return graph

    def place(self, graph: Graph, cluster: Cluster, options: PlaceOptions) -> tuple[Graph, Plan]:
        """The graph placed (the replica graph of a hybrid plan) and its plan: with a start plan,
        the faster of it and what the search found from it, in the time limit."""
        if self.start is None:
            return self.search(graph, cluster, options, None)
        began = time.perf_counter()
        given = read_start_plan(self.start)
        self._check_start(graph, strategy_of(given))
        start = apply_start(graph, cluster, given, self.start)
        spent = time.perf_counter() - began
        options.progress(f"place: start plan {self.start} ({start.strategy}): {human_time(start.claimed, 4)} "
                         f"as written, read in {spent:.1f}s")
        options = dataclasses.replace(options, time_limit=max(options.time_limit - spent, MIN_SOLVE_SECONDS))
        try:
            found_graph, found = self.search(graph, cluster, options, start)
        except Interrupted as e:
            if e.plan is None or e.graph is None or _faster(start, e.graph, cluster, e.plan):
                raise Interrupted(self._kept_start(start, e.plan), start.graph) from None
            raise
        if _faster(start, found_graph, cluster, found):
            return start.graph, self._kept_start(start, found)
        return found_graph, found

    def _check_start(self, graph: Graph, strategy: Strategy) -> None:
        """A start plan's strategy must be one this pass may return."""
        if "microbatched" in graph.attrs:
            raise PlaceError(f"{self.start}: a start plan is not taken after the microbatch pass: give place "
                             "data-parallel and microbatches instead, and the start plan the strategy")
        d, m = self.degrees()
        asked = [f"{what} {n}" for what, n, have in (("data-parallel", d, strategy.data_parallel),
                                                     ("microbatches", m, strategy.microbatches))
                 if n is not None and n != have]
        if strategy.data_parallel > 1 and self.optimizer_state not in ("auto", strategy.optimizer_state):
            asked.append(f"optimizer-state {self.optimizer_state}")
        if asked:
            raise PlaceError(f"{self.start}: the start plan is {strategy}, but place asks for {asked[0]}")

    def _kept_start(self, start: StartPlan, found: Plan | None) -> Plan:
        """The start plan as this pass's result, recorded in its graph, saying what it beat."""
        beat = "the search found nothing" if found is None else \
            f"the search's best plan took {human_time(found.makespan, 4)}"
        plan = dataclasses.replace(start.checked(), algorithm=self.algo,
                                   notes=[f"kept the start plan {start.source} ({start.strategy}): {beat}"])
        write_plan_attrs(start.graph, plan)
        return plan

    def search(self, graph: Graph, cluster: Cluster, options: PlaceOptions,
               start: StartPlan | None) -> tuple[Graph, Plan]:
        """`algo`'s plan: of the graph, of a micro-batched replica graph, or over strategies."""
        rewritten = graph.attrs.get("microbatched")
        d, m = self.degrees()
        if rewritten is not None:  # the microbatch pass ran: place its replica graph as it is
            from pesto_ir.passes.rewrite.replicas import place_rewritten

            if self.data_parallel not in (None, "1") or self.microbatches not in (None, "1") or \
                    self.optimizer_state != "auto":
                raise PlaceError(f"the graph is already one replica's micro-batched step ({rewritten}): "
                                 "give data-parallel, microbatches and optimizer-state to the microbatch pass or to "
                                 "place, not both")
            return graph, place_rewritten(graph, cluster, options, lambda g, c, o: place_graph(g, c, self.algo, o))
        if d == 1 and self.optimizer_state == "sharded":
            raise PlaceError("optimizer-state=sharded splits the optimizer state across data-parallel replicas; "
                             "with data-parallel 1 there is nothing to split it across")
        if d == 1 and m == 1:
            return graph, place_graph(graph, cluster, self.algo, options)
        return place_hybrid(graph, cluster, self.algo, options, d, m, self.optimizer_state, start)

    def degrees(self) -> tuple[int | None, int | None]:
        """(data-parallel, microbatches): a number, or None to search; unset means search for
        `auto` and 1 (a one-batch plan) for the other algorithms."""
        from pesto_ir.passes.placement.search.hybrid import parse_degree

        unset = "auto" if self.algo == "auto" else "1"
        return (parse_degree(self.data_parallel or unset, "data-parallel"),
                parse_degree(self.microbatches or unset, "microbatches"))


def _faster(start: StartPlan, graph: Graph, cluster: Cluster, found: Plan) -> bool:
    """Whether `start` is faster than `found`, a plan of `graph`, as `expand` will run it: a coarse
    plan's groups leave out its transfers (gnmt_training_layer at k = 8: 339.19 ms coarse, 339.39
    expanded, against a start of 339.21). The start is checked only where its own times say it may be."""
    if any(n.startswith(COARSE_NOTE) for n in found.notes):
        from pesto_ir.passes.expand import expand_plan  # expand builds on this module

        found = expand_plan(graph, cluster, found)
    return start.beats(found.makespan)


def _kept_on_interrupt(graph: Graph, cluster: Cluster, plan: Plan, algo: str, seconds: float) -> Plan:
    """The best plan found before Ctrl-C, recorded in `graph` as a finished search's would be:
    labelled `algo`'s, with its status and a note; a one-batch plan with the fine graph's bound."""
    plan.algorithm = algo
    plan.solver = {**(plan.solver or {}), "status": "interrupted"}
    plan.notes = [*plan.notes, f"interrupted (Ctrl-C) after {seconds:.1f}s: the best plan found so far"]
    if plan.parallelism is None:
        plan.lower_bound = lower_bound(graph, cluster)
    write_plan_attrs(graph, plan)
    return plan


def place_graph(graph: Graph, cluster: Cluster, algo: str, options: PlaceOptions, floor: Plan | None = None) -> Plan:
    """Place `graph` (coarse when it has `group` attributes), record the plan in it and return it.

    A coarse plan of an exact algorithm is kept only if it beats, once expanded, the best heuristic
    plan of the fine graph: `floor` when the caller has it, else the heuristics run first, as many
    as fit in `FLOOR_SHARE` of the time limit."""
    algorithm = _algorithm(algo)
    _check_placeable(graph)
    _check_memory(graph, cluster, "")
    started = time.perf_counter()
    justify = algo == "auto" and len(cluster) > 1
    budget = options.time_limit * (1 - JUSTIFY_SHARE) if justify else options.time_limit
    grouped = any("group" in op.attrs for op in graph.ops)
    if not grouped:
        plan = solve(graph, cluster, algo, algorithm, dataclasses.replace(options, time_limit=budget))
        plan.lower_bound = lower_bound(graph, cluster)
        if justify:
            plan = justified_plan(graph, cluster, plan, started + options.time_limit)
        write_plan_attrs(graph, plan)
        return plan
    coarse, members = quotient_graph(graph, cluster)
    _check_memory(coarse, cluster, " after coarsening (raise coarsen's target to make groups smaller)")
    if algo in EXACT_ALGOS and floor is None:
        floor = best_heuristic_plan(graph, cluster, dataclasses.replace(options, quiet=True, warm_start=None),
                                    until=started + options.time_limit * FLOOR_SHARE)
    left = max(budget - (time.perf_counter() - started), MIN_SOLVE_SECONDS)
    refine = algo == "auto" and len(members) < len(graph.ops) <= REFINE_MAX_OPS and len(cluster) > 1
    coarse_options = dataclasses.replace(options, time_limit=left * (1 - REFINE_SHARE) if refine else left)
    try:
        plan = solve(coarse, cluster, algo, algorithm, coarse_options)
    except KeyboardInterrupt as e:
        raise _coarse_interrupted(e, graph, cluster, coarse, members, floor, options) from None
    plan.lower_bound = lower_bound(graph, cluster)
    fine = project_coarse_plan(graph, plan, members)
    if algo in EXACT_ALGOS and floor is not None:
        fine = faster_than_fine_heuristics(graph, cluster, fine, floor, options)
    if refine:  # the plan is expanded there: its times are the fine ops' own, which justification compares
        kept = options.time_limit * JUSTIFY_SHARE if justify else 0.0
        fine = refined_on_fine_graph(graph, cluster, fine, options, budget + kept - (time.perf_counter() - started),
                                     justify_seconds=kept)
        if justify:
            fine = justified_plan(graph, cluster, fine, started + options.time_limit)
    write_plan_attrs(graph, fine)
    return fine


def justified_plan(graph: Graph, cluster: Cluster, plan: Plan, deadline: float) -> Plan:
    """`plan` (of the fine ops, one replica) with its devices' orders justified
    (`passes/placement/justify.py`: same placement, the eager schedule of the priorities a schedule run
    backward from the end gives), where that is faster and valid; auto's last step (MSR graphs
    at 4 devices, `bench/place_row.py`: Inception-V3's layers 324.1 to 315.1 ms, BERT-3's ops
    118.5 to 117.0 ms)."""
    placement = {name: slot.device for name, slot in plan.ops.items()}
    try:
        found = justified(graph, cluster, placement, plan, deadline=deadline)
    except KeyboardInterrupt as e:
        raise interrupted(e, graph, plan) from None
    if found is plan:
        return plan
    try:
        check_plan(graph, cluster, found)
    except PlanError:
        return plan
    solver = {**(plan.solver or {}), "winner": f"{(plan.solver or {}).get('winner') or plan.algorithm} + justified"}
    return dataclasses.replace(found, algorithm=plan.algorithm, lower_bound=plan.lower_bound, solver=solver,
                               notes=[*plan.notes, f"justified: {plan.makespan:.6g}s -> {found.makespan:.6g}s"])


def _coarse_interrupted(caught: KeyboardInterrupt, graph: Graph, cluster: Cluster, coarse: Graph,
                        members: dict[str, list[str]], floor: Plan | None, options: PlaceOptions) -> Interrupted:
    """Ctrl-C during the coarse solve: its best plan on the fine ops, unless the fine heuristics'
    plan (`floor`) beats it once expanded."""
    carried = carried_plan(caught, coarse)
    if carried is None:
        return interrupted(caught, graph, floor)
    carried.lower_bound = lower_bound(graph, cluster)
    fine = project_coarse_plan(graph, carried, members)
    if floor is not None:
        fine = faster_than_fine_heuristics(graph, cluster, fine, floor, options)
    return Interrupted(fine, graph)


def place_hybrid(graph: Graph, cluster: Cluster, algo: str, options: PlaceOptions, data_parallel: int | None,
                 microbatches: int | None, optimizer_state: str = "auto",
                 start: StartPlan | None = None) -> tuple[Graph, Plan]:
    """The fastest plan over data-parallel replicas x micro-batches (`passes/placement/search/hybrid.py`), `algo`
    placing each replica, the search taking `start` as its strategy's plan so far; the replica
    graph it is a plan of, and the plan."""
    from pesto_ir.passes.placement.search.hybrid import search

    def heuristic(g: Graph, c: Cluster, o: PlaceOptions) -> Plan:
        if g is graph:  # the one-batch step: the heuristics (the plan auto must never be slower than),
            # as many as fit in the time the search gives them
            found = best_heuristic_plan(g, c, o, until=time.perf_counter() + o.time_limit)
            if found is None:
                raise PlaceError("no heuristic plan of the one-batch step fits in memory")
            return found
        # m-ETF and m-SCT (m-ETF alone on large graphs: m-SCT takes 2-3 times as long); on a
        # replica of one device any order of the ops takes their total
        best: Plan | None = None
        names = ("single",) if len(c) == 1 else ("m-etf", "m-sct") if len(g.ops) <= SCREEN_BOTH_MAX_OPS else ("m-etf",)
        failed: list[PestoError] = []
        for name in names:  # one that runs out of memory leaves the others their chance
            try:
                plan = check_plan(g, c, ALGORITHMS[name](g, c, o))
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
                           start)
    except Interrupted as e:
        if e.plan is not None:
            _labelled(e.plan, algo)
        raise
    if _labelled(plan, algo):
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
    from pesto_ir.passes.expand import expand_plan  # expand builds on this module
    from pesto_ir.passes.placement.search.lns import MAX_OPS as LNS_MAX_OPS
    from pesto_ir.passes.placement.search.lns import improve_with_lns
    from pesto_ir.passes.placement.search.local_search import improve_by_moves

    began = time.perf_counter()
    start = expand_plan(graph, cluster, plan)
    simulation = time.perf_counter() - began
    if justify_seconds:
        seconds -= justify_kept(justify_seconds, simulation, seconds)
    deadline = began + seconds
    if deadline - time.perf_counter() < REFINE_MIN_SECONDS:
        return start
    best = start
    try:
        best = check_plan(graph, cluster, improve_by_moves(graph, cluster, start, deadline - time.perf_counter()))
        left = deadline - time.perf_counter()
        if len(graph.ops) <= LNS_MAX_OPS and left >= REFINE_MIN_SECONDS:
            found = improve_with_lns(graph, cluster, dataclasses.replace(options, time_limit=left, warm_start=best),
                                     engine="cpsat", start=best)
            best = _faster_retimed(graph, cluster, found, best)
    except KeyboardInterrupt as e:  # the interrupted stage's plan, re-timed, or the best before it
        carried = carried_plan(e, graph)
        if carried is not None:
            best = _faster_retimed(graph, cluster, carried, best)
        raise Interrupted(_refinement(start, best, options, seconds, len(graph.ops)), graph) from None
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
    from pesto_ir.passes.expand import expand_plan  # expand builds on this module

    timed = expand_plan(graph, cluster, found)
    if timed.makespan < best.makespan * (1 - 1e-12):
        return dataclasses.replace(timed, notes=[*best.notes, found.notes[-1]])
    return best


def _refinement(start: Plan, best: Plan, options: PlaceOptions, seconds: float, ops: int) -> Plan:
    """`best`, the refinement of `start`, labelled as `start`'s algorithm's; `start` if no faster."""
    if best.makespan >= start.makespan * (1 - 1e-12):
        return start
    options.progress(f"place: refining on the {ops} fine ops took the plan from "
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
    from pesto_ir.passes.expand import expand_plan  # expand builds on this module

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


def solve(graph: Graph, cluster: Cluster, algo: str, algorithm: Algorithm, options: PlaceOptions) -> Plan:
    """Run `algorithm` (with the best heuristic plan as warm start for `ilp`) and validate the result."""
    if algo == "ilp":
        warm = best_heuristic_plan(graph, cluster, options)
        options = dataclasses.replace(options, warm_start=warm)
    plan = algorithm(graph, cluster, options)
    if not plan.algorithm:
        plan.algorithm = algo
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


def _algorithm(algo: str) -> Algorithm:
    found = ALGORITHMS.get(algo)
    if found is None:
        raise PlaceError(f"unknown placement algorithm '{algo}' (known: {', '.join(sorted(ALGORITHMS))})")
    return found


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
