"""`place{algo=... time-limit=... seed=... solver=...}`: choose a device and an order for every op.

The pass reads its options, checks the start plan when it has one, and hands the graph to the
algorithm of the registry (`placement/registry.py`) it names: placed one batch at a time
(`search/driver.py`: on the graph or its coarse quotient), or over data-parallel replicas x
micro-batches (`search/hybrid.py`). Every plan any algorithm returns goes through `check_plan`
before it is recorded.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.expansion import TimedPlan, expand_plan
from pesto_ir.passes.placement.label import plan_label
from pesto_ir.passes.placement.options import (
    COARSE_NOTE,
    AlgorithmEntry,
    PlaceError,
    PlaceOptions,
    inner,
    kept_on_interrupt,
    require_cluster,
    time_limit_problem,
)
from pesto_ir.passes.placement.registry import DEFAULT_ALGO, algorithm
from pesto_ir.passes.placement.search import driver
from pesto_ir.passes.placement.search.driver import MIN_SOLVE_SECONDS, place_hybrid
from pesto_ir.passes.placement.search.start_plan import StartPlan, apply_start, read_start_plan, strategy_of
from pesto_ir.passes.placement.search.strategies import OPTIMIZER_STATE_CHOICES, parse_degree
from pesto_ir.passes.rewrite.replicas import Strategy, place_rewritten
from pesto_ir.passmanager import Pass, PassContext
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import Plan, write_plan_attrs
from pesto_ir.util import work
from pesto_ir.util.loader import seed_problem
from pesto_ir.util.units import human_time

MAX_DEFAULT_TIME_LIMIT = 60.0  # seconds: what a graph of 280 ops or groups and more gets by default
# Of the time limit, the work the search is given (`util/work.py`: counted, so the same input gives
# the same plan however busy the machine is); the rest is a margin for a machine that runs it
# slower, and a search over strategies gets up to `1 + OTHERS_SHARE` times it
# (`search/hybrid.py`), one batch's own search and the others beside it.
WORK_SHARE = 0.35


def default_time_limit(n: int) -> float:
    """4 s plus 0.2 s per op (or coarse group) to place, at most `MAX_DEFAULT_TIME_LIMIT`: the quick
    start's 32-op example need not wait a minute for a MILP that cannot close its gap. The limit
    caps the wall clock; the search does `WORK_SHARE` of it as counted work (so a busy machine
    gives the same plan), which ends well before it on a quiet one."""
    return min(MAX_DEFAULT_TIME_LIMIT, 4.0 + 0.2 * n)


@dataclass(frozen=True)
class PlacePass(Pass):
    """Place and schedule the graph (or its coarse groups) on the context's cluster."""

    name = "place"
    algo: str = DEFAULT_ALGO
    time_limit: float | None = None  # None: `default_time_limit` of the graph's size
    seed: int | None = None  # None: the pipeline's seed
    solver: str = "cbc"
    data_parallel: str | None = None  # N or auto; None: auto for a portfolio (auto), else 1 (search/strategies.py)
    microbatches: str | None = None  # N or auto; None: auto for algo=auto, else 1
    # replicated, sharded across the data-parallel replicas (passes/rewrite/shard_state.py), or auto:
    # sharded where a strategy's replicas with the whole state give no plan (memory), and for
    # one-device replicas where that is faster
    optimizer_state: str = "auto"
    # N or auto: t devices run each op on their blocks of the split parameters (passes/sharding/);
    # None: 1 (the search tries tensor parallelism when asked: N, or auto)
    tensor_parallel: str | None = None
    # replicated, sharded across the data-parallel replicas with the optimizer state (FSDP / ZeRO-3,
    # passes/rewrite/shard_params.py), or auto: sharded where sharding the state alone gives no plan
    parameters: str = "auto"
    start: str | None = None  # a pesto-plan/1 file: the plan to start from and to beat (passes/placement/search/start_plan.py)

    def __post_init__(self) -> None:
        algorithm(self.algo)
        parse_degree(self.data_parallel, "data-parallel")
        parse_degree(self.microbatches, "microbatches")
        parse_degree(self.tensor_parallel, "tensor-parallel")
        if self.parameters not in OPTIMIZER_STATE_CHOICES:
            raise PlaceError(f"parameters must be one of {', '.join(OPTIMIZER_STATE_CHOICES)}, not {self.parameters!r}")
        if self.parameters == "sharded" and self.optimizer_state == "replicated":
            raise PlaceError("parameters=sharded shards the optimizer state with them (FSDP): it cannot be "
                             "optimizer-state=replicated")
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
            if algorithm(self.algo).exact:  # the heuristics finish in their own time
                ctx.progress(f"place: time limit {time_limit:g} s, the default for {n} ops or groups "
                             "(--time-limit S or place{time-limit=S} to change it)")
        entry = algorithm(self.algo)
        options = PlaceOptions(time_limit=time_limit * work_share(entry), seed=ctx.seed if self.seed is None else self.seed,
                               solver=self.solver, quiet=ctx.quiet, log=ctx.log)
        started = time.perf_counter()
        with work.capped(options.time_limit, time_limit) as block:
            try:
                graph, plan = self.place(graph, cluster, options)
            except KeyboardInterrupt:
                held = options.incumbent
                if held.plan is None or held.graph is None:
                    raise KeyboardInterrupt from None  # nothing found yet: the command stops
                graph, plan = held.graph, _kept_on_interrupt(held.graph, cluster, held.plan, self.algo,
                                                             time.perf_counter() - started)
                ctx.progress("place: interrupted (Ctrl-C); keeping the best plan found so far")
            cut, counted = work.was_cut(), block.spent()
        if cut and not entry.wall_bounded:
            _note_cut(graph, plan, time_limit)
            ctx.progress(f"place: {plan.notes[-1]}")
        if entry.exact and not entry.wall_bounded:
            ctx.progress(f"place: {counted:.1f} s of counted work ({options.time_limit:.3g} s given) in "
                         f"{time.perf_counter() - started:.1f} s")
        ctx.progress(f"place: candidate ({plan_label(plan)}): {human_time(plan.makespan, 4)}"
                     + (f", its strategy's bound {human_time(plan.lower_bound, 4)}" if plan.lower_bound else "")
                     + " (simulate times the plan that runs)")
        if plan.timed_on is graph:  # expand would time and check it again to the same plan
            ctx.recorded = TimedPlan(graph, cluster, plan, bounded=plan.parallelism is None)
        plan.timed_on = None
        return graph

    def place(self, graph: Graph, cluster: Cluster, options: PlaceOptions) -> tuple[Graph, Plan]:
        """The graph placed (the replica graph of a hybrid plan) and its plan: with a start plan,
        the faster of it and what the search found from it, in the time limit."""
        if self.start is None:
            return self.search(graph, cluster, options, None)
        began = work.now()
        given = read_start_plan(self.start)
        self._check_start(graph, strategy_of(given))
        start = apply_start(graph, cluster, given, self.start)
        spent = work.now() - began
        options.progress(f"place: start plan {self.start} ({start.strategy}): {human_time(start.claimed, 4)} "
                         f"as written, read in {spent:.1f}s")
        # the search's plans meet the start on Ctrl-C
        searching = inner(dataclasses.replace(options, time_limit=max(options.time_limit - spent, MIN_SOLVE_SECONDS)))
        try:
            found_graph, found = self.search(graph, cluster, searching, start)
        except KeyboardInterrupt:
            held = searching.incumbent
            if held.plan is None or held.graph is None or _faster(start, held.graph, cluster, held.plan):
                raise kept_on_interrupt(options, start.graph, self._kept_start(start, held.plan)) from None
            raise kept_on_interrupt(options, held.graph, held.plan) from None
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
        algo = algorithm(self.algo)
        d, m = self.degrees()
        if rewritten is not None:  # the microbatch pass ran: place its replica graph as it is
            if self.data_parallel not in (None, "1") or self.microbatches not in (None, "1") or \
                    self.optimizer_state != "auto":
                raise PlaceError(f"the graph is already one replica's micro-batched step ({rewritten}): "
                                 "give data-parallel, microbatches and optimizer-state to the microbatch pass or to "
                                 "place, not both")
            if self.tensor_parallel not in (None, "1") or self.parameters == "sharded":
                raise PlaceError(f"the graph is already one replica's micro-batched step ({rewritten}): "
                                 "tensor-parallel and parameters=sharded are planned by place from the whole step; "
                                 "give place data-parallel and microbatches instead of the microbatch pass")
            return graph, place_rewritten(graph, cluster, options, lambda g, c, o: driver.place_graph(g, c, algo, o))
        if d == 1 and self.parameters == "sharded":
            raise PlaceError("parameters=sharded splits the parameters across data-parallel replicas; with "
                             "data-parallel 1 there is nothing to split them across")
        if d == 1 and self.optimizer_state == "sharded":
            raise PlaceError("optimizer-state=sharded splits the optimizer state across data-parallel replicas; "
                             "with data-parallel 1 there is nothing to split it across")
        t = parse_degree(self.tensor_parallel or "1", "tensor-parallel")
        if d == 1 and m == 1 and t == 1:
            return graph, driver.place_graph(graph, cluster, algo, options)
        state = "sharded" if self.parameters == "sharded" else self.optimizer_state
        return place_hybrid(graph, cluster, algo, options, d, m, state, start, t, self.parameters)

    def degrees(self) -> tuple[int | None, int | None]:
        """(data-parallel, microbatches): a number, or None to search; unset means search for
        a portfolio (`auto`) and 1 (a one-batch plan) for the other algorithms."""
        unset = "auto" if algorithm(self.algo).portfolio else "1"
        return (parse_degree(self.data_parallel or unset, "data-parallel"),
                parse_degree(self.microbatches or unset, "microbatches"))


def _faster(start: StartPlan, graph: Graph, cluster: Cluster, found: Plan) -> bool:
    """Whether `start` is faster than `found`, a plan of `graph`, as `expand` will run it: a coarse
    plan's groups leave out its transfers (gnmt_training_layer at k = 8: 339.19 ms coarse, 339.39
    expanded, against a start of 339.21). The start is checked only where its own times say it may be."""
    if any(n.startswith(COARSE_NOTE) for n in found.notes):
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
    """Place `graph` (coarse when it has `group` attributes) with the algorithm named `algo`, as the
    pass does for one batch, `options.time_limit` as the pass's time limit (its `WORK_SHARE` as
    work, the rest a margin for a busy machine); record the plan in it and return it
    (`search/driver.py`)."""
    entry, limit = algorithm(algo), options.time_limit
    given = limit * work_share(entry)
    with work.capped(given, limit):
        plan = driver.place_graph(graph, cluster, entry, dataclasses.replace(options, time_limit=given), floor)
        cut = work.was_cut()
    if cut and not entry.wall_bounded:
        _note_cut(graph, plan, limit)
    return plan


def work_share(algo: AlgorithmEntry) -> float:
    """The share of the time limit `algo` gets as counted work: `WORK_SHARE`, or all of it for an
    engine the wall clock stops (CBC's MILP)."""
    return 1.0 if algo.wall_bounded else WORK_SHARE


def _note_cut(graph: Graph, plan: Plan, limit: float) -> None:
    """Say in `plan` (recorded in `graph`) that the wall clock cut its search short."""
    plan.notes = [*plan.notes, f"the {limit:g} s time limit cut the search short (the machine ran it at less than "
                  f"{WORK_SHARE:.0%} of the speed its work is counted at): another run may give another plan"]
    write_plan_attrs(graph, plan)
