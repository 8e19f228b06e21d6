"""Screening one strategy of the hybrid search: its replica graph, built once, and its best plan
by the engines given (the heuristics, or pipeline schedules), with the optimizer state (and the
parameters) sharded across replicas where the whole gives no plan. What the screening's groups
(`screening.py`) share, apart from the order they take strategies in.
"""

from __future__ import annotations

from collections.abc import Sequence

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.pipeline.schedules import PipelineGraph, pipeline_plan
from pesto_ir.passes.placement.search.screening_rates import Rates
from pesto_ir.passes.placement.search.strategies import Candidate
from pesto_ir.passes.rewrite.batch_axes import MicrobatchError
from pesto_ir.passes.rewrite.replicas import ONE_BATCH, Solve, bucketed, placed_devices, replica_graph, sub_cluster
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError, first_reason
from pesto_ir.util.units import human_time

MAX_SCREEN_OPS = 150_000  # a rewritten graph larger than this is not built (memory)


def screen(graph: Graph, cluster: Cluster, found: Candidate, options: PlaceOptions, heuristic: Solve,
           engines: Sequence[str] = ("heuristics",), rates: Rates | None = None,
           until: float | None = None) -> Candidate:
    """`found`'s replica graph (built once) and its best plan so far, trying `engines`: the
    pipeline schedules ("gpipe", "1f1b": a simulation each; "eager", "interleaved": several, as
    `schedule_worth` counts them; on replicas of several devices with several micro-batches) or
    "heuristics" (list scheduling the whole graph). Where `rates`
    allows it (`Rates.shard`), replicas that give no plan holding the whole optimizer state (it
    does not fit) are tried with it sharded across them (`passes/rewrite/shard_state.py`), and the
    candidate becomes that strategy. `until` cuts the eager schedules' searches short
    (`pipeline_plan`)."""
    found = _screened(graph, cluster, found, options, heuristic, engines, rates, until)
    strategy = found.strategy
    built = found.graph is not None and len(found.graph.ops) <= MAX_SCREEN_OPS  # else sharding changes nothing
    if rates is None or not rates.shard or found.plan is not None or not built or strategy.data_parallel < 2 \
            or strategy.parameters == "sharded":
        return found
    if strategy.optimizer_state == "sharded":  # screened sharded first (`variant_to_screen`): FSDP is left
        return _fully_sharded(graph, cluster, found, options, heuristic, engines, rates, until) if rates.fsdp \
            else found
    retry = _screened(graph, cluster, Candidate(strategy.sharded()), options, heuristic, engines, rates, until)
    if retry.plan is None and rates.fsdp:  # the parameters too (FSDP), where the state alone is not enough
        retry = _fully_sharded(graph, cluster, retry, options, heuristic, engines, rates, until)
        if retry.plan is not None:
            return retry
    if retry.plan is None:
        found.why_not = f"{found.why_not}; with the optimizer state sharded: {retry.why_not}"
        return found
    retry.why_not = f"the whole optimizer state gives no plan ({found.why_not})"
    return retry


def _fully_sharded(graph: Graph, cluster: Cluster, found: Candidate, options: PlaceOptions, heuristic: Solve,
                   engines: Sequence[str], rates: Rates, until: float | None) -> Candidate:
    """`found` (its optimizer state sharded, no plan) with its parameters sharded too (FSDP):
    that candidate where it gives a plan, else `found` saying why not."""
    fully = _screened(graph, cluster, Candidate(found.strategy.fully_sharded()), options, heuristic, engines, rates,
                      until)
    if fully.plan is not None:
        fully.why_not = f"sharding the optimizer state alone gives no plan ({found.why_not})"
        return fully
    found.why_not = f"{found.why_not}; with the parameters sharded too: {fully.why_not}"
    return found


def _screened(graph: Graph, cluster: Cluster, found: Candidate, options: PlaceOptions, heuristic: Solve,
              engines: Sequence[str], rates: Rates | None, until: float | None = None) -> Candidate:
    """`screen` for `found`'s own strategy."""
    strategy = found.strategy
    if found.graph is None and rates is not None and strategy in rates.prebuilt:
        found.graph = rates.prebuilt.pop(strategy)
    if found.graph is None:
        started = work.now()
        try:
            found.graph = replica_graph(graph, cluster, strategy)
        except PestoError as e:
            found.why_not = first_reason(e)
            if isinstance(e, MicrobatchError) and rates is not None and strategy.tensor_parallel > 1:
                rates.unsplittable.setdefault(strategy.tensor, found.why_not)
            return found
        if rates is not None and found.graph is not graph:
            rates.rewrote(work.now() - started, len(found.graph.ops))
    if len(found.graph.ops) > MAX_SCREEN_OPS:
        found.why_not = f"{len(found.graph.ops)} ops after the rewrite, more than {MAX_SCREEN_OPS} to screen"
        return found
    sub = sub_cluster(cluster, placed_devices(cluster, strategy))
    source = found.source or found.graph
    found.source = source  # the rewrite as built: the plans are of it, or of copies with buckets
    for engine in engines:
        try:
            if engine == "heuristics":
                started = work.now()
                plan = heuristic(source, sub, options)
                if rates is not None and strategy == ONE_BATCH:
                    rates.heuristic = (work.now() - started) / max(len(source.ops) * len(sub), 1)
            else:
                if found.pipeline is None or found.pipeline.graph is not source:
                    found.pipeline = PipelineGraph(source, sub)
                plan = pipeline_plan(source, found.pipeline.cluster, engine, options, until, found.pipeline)
        except PestoError as e:
            found.why_not = found.why_not or f"{engine}: {first_reason(e)}"
            continue
        planned = source
        if strategy != ONE_BATCH:
            planned, plan = bucketed(source, cluster, plan, strategy)
        if found.plan is None or plan.makespan < found.plan.makespan:
            found.graph, found.plan, found.engine = planned, plan, plan.algorithm or engine
    return found


def logged(c: Candidate, log: PlaceOptions, rates: Rates) -> Candidate:
    rates.screened(c)
    if c.plan is not None:
        log.progress(f"place: screened {c.strategy}: {human_time(c.plan.makespan, 4)} ({c.engine})")
    elif c.why_not:
        log.progress(f"place: screened {c.strategy}: no plan ({c.why_not})")
    return c
