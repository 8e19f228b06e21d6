"""Screening the hybrid search's strategies: each one's replica graph, built once, placed by the
fast engines within a share of the time limit.

One-device replicas are list-scheduled by the heuristics; replicas of several devices place one
batch with the heuristics, then build the pipeline schedules (GPipe, 1F1B, the eager schedule of
their stages and the interleaved layouts) in the order the stage model predicts them
(`passes/placement/pipeline/model.py`). A step is started only where it fits in the time left, by
what rewrites and schedules have cost so far (`Rates`, `BuildCost`), and time is kept for
refining a one-batch plan that leads (`hybrid.py` refines the best strategy after screening).
How one strategy is screened (its rewrite, its engines, its state sharded where the whole gives
no plan) is `screening_core.py`; what the order and the time are predicted by, `screening_rates.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.pipeline.model import MODEL_MICROBATCHES, build_model
from pesto_ir.passes.placement.pipeline.schedules import (
    EAGER,
    INTERLEAVED,
    PIPELINE_SCHEDULES,
    SCHEDULES,
    pipeline_plan,
)
from pesto_ir.passes.placement.search.replica_memory import ReplicaMemory, variant_to_screen
from pesto_ir.passes.placement.search.screening_core import logged, screen
from pesto_ir.passes.placement.search.screening_rates import (
    BuildCost,
    Rates,
    ScreeningTimes,
    cannot_fit,
    first_end,
    first_predicted_to_fit,
    one_batch_ruled_out,
    rank_memory_of,
    rank_screening_order,
    ranks_predicted_to_fit,
)
from pesto_ir.passes.placement.search.strategies import Candidate
from pesto_ir.passes.rewrite.replicas import (
    ONE_BATCH,
    Solve,
    Strategy,
    bucketed,
    replica_graph,
    replica_groups,
    sub_cluster,
)
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError, first_reason
from pesto_ir.util.units import human_bytes, human_time

MAX_HEURISTIC_OPS = 5_000  # the heuristics screen a pipelined replica graph up to this size (m-ETF: 60 s at 19,000)
MIN_REFINE_SECONDS = 0.25  # below this much time left, the best screening plan is not refined (`hybrid.py`)
REPLICA_REFINE_MAX_OPS = 5_000  # a replica graph larger than this is not refined (the engines' set-up alone takes seconds)
REFINE_RESERVE = MIN_REFINE_SECONDS + 0.15  # kept for refining a leading one-batch plan: the floor, and a margin for estimates
PROMISING = 0.05  # a pipeline predicted this much faster than every plan so far may use that reserve (refining gains less)
MIN_HALVED_DEVICES = 4  # replicas of this many devices or more also try the best pipeline over half of them
PATIENCE = 2  # pipelines built in a row no faster than the best end a degree (without the model)
MODEL_SLACK = 0.05  # pipelines predicted within this of the best one built are built too (the model errs)
OTHERS_SLACK = 0.25  # nor one predicted this much slower than a plan of another strategy (batch statistics
# make micro-batches wait for each other, which the model leaves out)


CUT = "not screened: the time limit's wall clock had passed"
RANKS = 0  # `screen_all`'s key of the tensor-parallel strategies' group (a degree d is >= 1)


def screen_all(graph: Graph, cluster: Cluster, todo: list[Strategy], options: PlaceOptions, heuristic: Solve,
               times: ScreeningTimes, log: PlaceOptions, rates: Rates) -> list[Candidate]:
    """Screen the strategies in groups, each degree with an equal share of the screening time (the
    tensor-parallel group a share per degree t, the one-device replicas one per variant of the
    state): pure data parallelism first (one-device replicas:
    the cheapest to screen), then one batch, then the mixes of each data-parallel degree, then the
    tensor-parallel strategies (`_group_order`).
    Strategies that cannot fit, by the memory floor, are not screened (`cannot_fit`). No list
    schedule runs past the last moment a screening step may end (`times.finish_by`, and the spare
    work a tensor-parallel degree may get): a strategy started in time would otherwise run its
    heuristics to their end (on alpa-gpt-39B's replicas over 16 V100s, m-ETF ran three variants of
    d=4 to the memory checks' limit, from 38.7 to 107.5 s on the work clock, where the screening
    ends at 78.8)."""
    with work.stopping_at(times.finish_by + times.spare):
        return _screen_all(graph, cluster, todo, options, heuristic, times, log, rates)


def _screen_all(graph: Graph, cluster: Cluster, todo: list[Strategy], options: PlaceOptions, heuristic: Solve,
                times: ScreeningTimes, log: PlaceOptions, rates: Rates) -> list[Candidate]:
    """`screen_all`, its list schedules stopped at the end of the screening."""
    if rates.memory is None:
        rates.memory = ReplicaMemory.of(graph)
    unfit: list[Candidate] = []  # strategies that cannot fit, by the memory floor: not screened
    groups: dict[int, list[Strategy]] = {}
    for s in sorted(todo):
        if not _unfit(s, cluster, rates, unfit, log):
            groups.setdefault(RANKS if s.tensor_parallel > 1 else s.data_parallel, []).append(s)
    one_batch_fits = ONE_BATCH in todo and ONE_BATCH not in {c.strategy for c in unfit}
    order = _group_order(groups, cluster, one_batch_fits and not ranks_predicted_to_fit(graph, cluster,
                                                                                        groups.get(RANKS, []), rates))
    # each degree has a share: the tensor-parallel group one per degree t, the one-device replicas
    # one per variant of the state they screen (whole, and sharded where the search may shard it)
    weight = {key: len({s.tensor_parallel for s in groups[key]}) if key == RANKS
              else 2 if key == len(cluster) and rates.shard else 1 for key in order}
    tried: list[Candidate] = []
    for i, key in enumerate(order):
        if work.was_cut():  # the wall clock passed the time limit: nothing more starts
            tried.extend(Candidate(s, why_not=CUT) for s in groups[key])
            continue
        share = (times.screened_by - work.now()) * weight[key] / sum(weight[k] for k in order[i:])
        stop = work.now() + max(share, 0.0)
        last = i == len(order) - 1
        if key == RANKS:
            one_batch_next = ONE_BATCH in groups.get(1, []) and 1 in order[i:]
            done = _screen_ranks(graph, cluster, groups[key], options, heuristic, times, stop, last, log, rates,
                                 one_batch_next)
        elif key == len(cluster):
            done = _screen_replicas(graph, cluster, groups[key], options, heuristic, stop, tried == [], log, rates)
        else:
            done = _screen_pipelines(graph, cluster, groups[key], options, heuristic, times, stop, last, tried,
                                     log, rates)
        tried.extend(done)
    return tried + unfit


def _group_order(groups: dict[int, list[Strategy]], cluster: Cluster, others_first: bool) -> list[int]:
    """The order to screen `groups` in: one-device replicas (d = k), one batch's degree (d = 1),
    the other degrees from the largest, the tensor-parallel strategies (`RANKS`) last. Unless
    `others_first`: then the tensor-parallel strategies right after the one-device replicas, and
    one batch last. That is where one batch cannot fit (the memory floor) or the largest degree of
    one device per rank is predicted to fit: a model that outgrows one batch spread over the
    devices, or one whose ranks fit, is what tensor parallelism is made for, and one batch over
    many devices is its slowest plan (on megatron-gpt-7.1B, 16B: 1977 ms, against 425.8 and 355.8);
    screening the other degrees first (list scheduling every replica graph near its memory,
    building pipelines of many micro-batches) can take all the screening time (on alpa-gpt-6.7B it
    did: no plan; on megatron-gpt-16B the tensor-parallel strategies got one screening, t = 8 at
    377.6 ms, not Megatron's t = 4 x d = 2 at 355.8 ms)."""
    k = len(cluster)
    if not others_first:
        return sorted(groups, key=lambda d: (d != k, d != RANKS, d == 1, -d))
    return sorted(groups, key=lambda d: (d != k, d != 1, d == RANKS, -d))


def _unfit(strategy: Strategy, cluster: Cluster, rates: Rates, tried: list[Candidate], log: PlaceOptions) -> bool:
    """Whether `strategy` cannot fit (`cannot_fit`): then it is tried as that, and logged."""
    why = cannot_fit(strategy, cluster, rates)
    if why:
        tried.append(logged(Candidate(strategy, why_not=why, unfit=True), log, rates))
    return bool(why)


def _screen_ranks(graph: Graph, cluster: Cluster, todo: list[Strategy], options: PlaceOptions, heuristic: Solve,
                  times: ScreeningTimes, stop: float, last: bool, log: PlaceOptions, rates: Rates,
                  one_batch_next: bool = False) -> list[Candidate]:
    """Tensor-parallel strategies (their layouts are chosen already), in `rank_screening_order`:
    those predicted to fit, the largest degree first (the one that fits where the others may not,
    on a model too large for a device), one device per rank before pipelines. One batch per rank runs the
    heuristics, micro-batches the fixed pipeline schedules (over one device a rank, 1F1B is
    gradient accumulation: each micro-batch's backward pass frees its activations before the
    next). On one device per rank, more micro-batches than the first that fits cannot be faster
    (`_screen_replicas`), so they are not screened. Each degree's first strategy may be screened
    until the screening ends (`times.finish_by`), past the group's share: each degree has its own
    layout, and on a model too large for a device these are what fits (megatron-gpt-16B's t = 4 x
    d = 2 is 355.8 ms where t = 8 is 377.6); the others while the group's share lasts (`stop`), or
    the screening when it is the `last` group. Where one batch is still to be screened
    (`one_batch_next`) and its lower bound rules it out (`one_batch_ruled_out`), neither it nor its
    own search will run, and a degree's first strategy may use that search's work too
    (`times.spare`): on megatron-gpt-7.1B the screening ended after t = 8 and t = 4 (565.5 ms),
    before Megatron's t = 2."""
    k = len(cluster)
    tried: list[Candidate] = []
    fitted: set[tuple[int, int]] = set()  # (t, d) of one device per rank that gave a plan
    degrees_screened: set[int] = set()  # each degree's first strategy is screened, however late
    end = times.degree_end(stop, last)
    capacity = min(d.memory for d in cluster.devices)
    for strategy in rank_screening_order(graph, cluster, todo, capacity, rates):
        t, d = strategy.tensor_parallel, strategy.data_parallel
        stages = k // (d * t)
        if work.now() > (end if t in degrees_screened else first_end(graph, cluster, times, rates, one_batch_next)):
            tried.append(Candidate(strategy, why_not="not screened: the screening time ran out"))
            continue
        fits_from = first_predicted_to_fit(graph, cluster, [s for s in todo if (s.tensor_parallel, s.data_parallel)
                                                             == (t, d)], capacity, rates)
        if fits_from is not None and strategy.microbatches < fits_from.microbatches:
            tried.append(logged(Candidate(strategy, why_not=(
                f"not screened: predicted over the {human_bytes(capacity)} a device has however sharded, where "
                f"{fits_from} is predicted to fit")), log, rates))
            continue
        if (t, d) in fitted:
            tried.append(Candidate(strategy, why_not=f"not screened: one device per rank is no faster with more "
                                                     f"micro-batches than d={d} t={t} with fewer, which fits"))
            continue
        if d * strategy.microbatches > 1 and strategy.tensor in rates.unsplittable:
            tried.append(Candidate(strategy, why_not=f"not screened: {rates.unsplittable[strategy.tensor]}"))
            continue
        variant: Strategy | None = strategy
        why = ""
        memory = rank_memory_of(graph, cluster, strategy, rates)
        if memory is not None:  # the walk predicts a rank's peak, over its stages where it has several
            variant, why = variant_to_screen(memory, strategy, capacity, rates.shard, rates.fsdp, stages)
        if variant is None:
            tried.append(logged(Candidate(strategy, why_not=why, over=True), log, rates))
            continue
        engines = ("1f1b", "gpipe") if strategy.microbatches > 1 else ("heuristics",)
        degrees_screened.add(t)
        c = screen(graph, cluster, Candidate(variant), options, heuristic, engines, rates, times.finish_by)
        if c.plan is not None and why and not c.why_not:
            c.why_not = why
        tried.append(logged(c, log, rates))
        if c.plan is not None and rates.shard and d > 1 and c.strategy.optimizer_state == "replicated" \
                and work.now() <= times.finish_by:
            tried.extend(_sharded_too(graph, cluster, c, options, heuristic, engines, log, rates, times.finish_by))
        if c.plan is not None and k == d * t:
            fitted.add((t, d))
    return tried


def _sharded_too(graph: Graph, cluster: Cluster, c: Candidate, options: PlaceOptions, heuristic: Solve,
                 engines: Sequence[str], log: PlaceOptions, rates: Rates, until: float | None = None
                 ) -> list[Candidate]:
    """`c` (a plan with the whole state on each replica) screened with the state sharded across
    its replicas, kept where faster (`until`: `screen`'s). Each replica (each rank of it) then
    updates 1/d of its state, with a reduce-scatter and an all-gather for each all-reduce: faster
    or slower by the model (megatron-gpt-16B 355.8 ms against 365.2 whole; 32B 633.0 against
    569.9)."""
    assert c.plan is not None
    sharded = screen(graph, cluster, Candidate(c.strategy.sharded()), options, heuristic, engines, rates, until)
    if sharded.plan is None or sharded.plan.makespan >= c.plan.makespan:
        return []
    sharded.why_not = f"faster than with the whole state, {human_time(c.plan.makespan, 4)}"
    return [logged(sharded, log, rates)]


def _screen_replicas(graph: Graph, cluster: Cluster, todo: list[Strategy], options: PlaceOptions,
                     heuristic: Solve, stop: float, first: bool, log: PlaceOptions, rates: Rates) -> list[Candidate]:
    """One-device replicas: m ascending, up to the first that fits in memory. One device runs all
    its ops one after another, and m micro-batches' copies take at least the whole batch's time
    (the same on a cost graph, more on a roofline-costed one: launch overheads, weights read m
    times), so more micro-batches than memory needs cannot be faster. Where the search may shard
    the optimizer state, the first that fits is screened sharded too, and kept if faster; for the
    first strategy screened at all, past its share of the time too, as the strategy itself is
    (megatron-gpt-1.7B's d = 8: 226.8 ms with the whole state, 216.5 sharded, which the layout
    searches' time had left unscreened)."""
    tried: list[Candidate] = []
    memory = rates.memory
    capacity = min(d.memory for d in cluster.devices)
    for strategy in todo:
        always = first and not tried  # the first strategy screened at all, past its share of the time too
        if not always and work.now() > stop:
            tried.append(Candidate(strategy, why_not="not screened: its share of the time ran out"))
            continue
        variant, why = (strategy, "") if memory is None else \
            variant_to_screen(memory, strategy, capacity, rates.shard, rates.fsdp)
        if variant is None:
            tried.append(logged(Candidate(strategy, why_not=why, over=True), log, rates))
            continue
        c = screen(graph, cluster, Candidate(variant), options, heuristic, _one_device_engines(strategy), rates=rates)
        if c.plan is not None and why and not c.why_not:
            c.why_not = why
        logged(c, log, rates)
        tried.append(c)
        if c.plan is not None and rates.shard and c.strategy.optimizer_state == "replicated" and \
                (always or work.now() <= stop):
            tried.extend(_sharded_too(graph, cluster, c, options, heuristic, _one_device_engines(strategy), log,
                                      rates))
        if c.plan is not None:
            rest = todo[todo.index(strategy) + 1:]
            tried.extend(Candidate(s, why_not=f"not screened: one device is no faster with more micro-batches "
                                              f"than {strategy}, which fits") for s in rest)
            break
    return tried


def _one_device_engines(strategy: Strategy) -> tuple[str, ...]:
    """How a one-device replica's step is ordered: with micro-batches, each one's backward pass
    right after its forward (1F1B over one device: gradient accumulation, which frees a
    micro-batch's activations before the next starts; list scheduling runs every forward pass
    first and holds them all), then the heuristics."""
    return ("1f1b", "heuristics") if strategy.microbatches > 1 else ("heuristics",)


def _screen_pipelines(graph: Graph, cluster: Cluster, todo: list[Strategy], options: PlaceOptions,
                      heuristic: Solve, times: ScreeningTimes, stop: float, last: bool, before: list[Candidate],
                      log: PlaceOptions, rates: Rates) -> list[Candidate]:
    """Replicas of several devices: one batch placed freely (the heuristics), then the fixed
    pipeline schedules in the order `passes/placement/pipeline/model.py` predicts them, while the prediction
    is within `OTHERS_SLACK` of the best plan of any strategy and `MODEL_SLACK` of the best built
    (or the rewrite is built already: the model ranks m better than the two schedules of an
    operator graph) and building one fits in the time (the first, and the other schedule of a graph
    built already, may go on to `times.degree_end`, the end of screening for the last degree
    screened: on large graphs they are what matters, and refining a pipeline gains little), then
    the heuristics on the fastest pipelined replica graph. The first schedule built on a replica
    graph is followed by the eager schedules the model does not predict, those that fit in the
    time by what the fixed one took (`_eager_schedules_that_fit`): the interleaved layouts, and the
    eager schedule of the same stages (on the JAX zoo's GPT, LSTM and ResNet at k = 4 it was faster
    than both fixed schedules).

    One batch is screened unless its lower bound is over a plan in hand (`one_batch_ruled_out`),
    its heuristics given until `times.screened_by`, the end of the screening (on a large graph they
    cannot all run in it). What does not fit is not started: one batch of
    several replicas (the winner on CNNs) starts while the degree's share lasts, and, by the `rates`
    measured so far, it and the pipeline model's rewrite (twice the ops; without it no pipeline of
    the degree is tried) must end by `times.finish_by`."""
    until, hard = times.screened_by, times.finish_by
    deadline = times.degree_end(stop, last)
    tried: list[Candidate] = []
    per_replica = len(cluster) // todo[0].data_parallel
    for strategy in (s for s in todo if s.microbatches == 1):  # one batch is screened unless its bound rules it out
        expected = rates.screening(len(graph.ops), per_replica) or 0.0
        now = work.now()
        ruled_out = one_batch_ruled_out(graph, cluster, rates) if strategy == ONE_BATCH else ""
        if ruled_out:
            tried.append(logged(Candidate(strategy, why_not=ruled_out), log, rates))
        elif strategy != ONE_BATCH and (before or tried) and \
                (now > stop or now + expected > hard - _one_batch_reserve([*before, *tried])):
            why = ("not screened: its share of the time ran out" if now > stop
                   else _no_time(expected, "to screen", now + expected <= hard))
            tried.append(Candidate(strategy, why_not=why))
        else:
            # one batch's heuristics take their degree's share, as long as some plan is in hand
            # or other groups are still to screen (they stop after a plan once past it); else the
            # rest of the screening
            end = stop if not last or any(c.plan is not None for c in before) else until
            given = options if strategy != ONE_BATCH else dataclasses.replace(options, time_limit=max(end - now, 1e-3))
            with work.stopping_at(end if strategy == ONE_BATCH else math.inf):  # all its heuristics, the first too
                tried.append(logged(screen(graph, cluster, Candidate(strategy), given, heuristic, rates=rates), log,
                                     rates))
    pipelined = _predicted_to_fit([s for s in todo if s.microbatches > 1], cluster, rates, tried, log)
    if not pipelined:
        return tried
    if work.was_cut():
        return tried + [Candidate(s, why_not=CUT) for s in pipelined]
    rewrite = rates.rewrite_or_guess(MODEL_MICROBATCHES * len(graph.ops))
    now = work.now()
    if any(c.plan is not None for c in [*before, *tried]) and now + rewrite > hard - _one_batch_reserve([*before, *tried]):
        why = _no_time(rewrite, "for the pipeline model", now + rewrite <= hard)
        return tried + [Candidate(s, why_not=why) for s in pipelined]
    ranked, candidates, cost = _ranked_pipelines(graph, cluster, pipelined, log, rates)
    best: tuple[float, float | None] | None = None  # (makespan, its prediction) of the fastest built
    slower = 0
    other = min((c.plan.makespan for c in [*before, *tried] if c.plan is not None), default=None)
    for predicted, strategy, schedule in ranked:
        c = candidates[strategy]
        if c.graph is None and c.why_not:  # the rewrite failed
            continue
        if predicted is not None and other is not None and predicted > other * (1 + OTHERS_SLACK):
            c.why_not = c.why_not or (f"{schedule} not built: predicted {human_time(predicted, 4)}, slower than "
                                      f"the {human_time(other, 4)} plan found")
            continue
        if best is not None and c.source is None and (slower >= PATIENCE if predicted is None or best[1] is None
                                                      else predicted > best[1] * (1 + MODEL_SLACK)):
            why = "predicted slower" if predicted is not None else f"{PATIENCE} in a row were slower"
            c.why_not = c.why_not or f"{schedule} not built: {why}"
            continue
        promising = predicted is not None and other is not None and predicted < other * (1 - PROMISING)
        kept = 0.0 if promising else _one_batch_reserve([*before, *tried, *candidates.values()])
        end = (deadline if best is None or c.source is not None else stop) - kept
        # another schedule of a graph built, or one-device replicas (every schedule gives the same
        # plan there): the fixed schedule alone
        alone = c.source is not None or per_replica == 1
        estimate = cost.estimate(c, (schedule,))
        if work.now() + estimate > end:
            past = "past the time limit" if not kept else f"into the {kept:g} s kept for refining the one-batch plan"
            c.why_not = c.why_not or f"{schedule} not built: it would take about {estimate:.2g} s, {past}"
            continue
        previous = c.plan.makespan if c.plan is not None else None
        started, built = work.now(), c.graph is not None
        logged(screen(graph, cluster, c, options, heuristic, (schedule,)), log, rates)
        cost.learn(c, work.now() - started, built, (schedule,))
        left = [] if alone or c.source is None else [INTERLEAVED, EAGER]
        while eager := _eager_schedules_that_fit(c, cost, end, left):
            # not learnt: their searches take what is left, the first the most; one left out may
            # still fit once the first has ended (its search may not need all it was given)
            until = end - cost.estimate(c, eager[1:])
            logged(screen(graph, cluster, c, options, heuristic, eager[:1], until=until), log, rates)
            left.remove(eager[0])
        if c.plan is None or c.plan.makespan == previous:
            continue
        slower = slower + 1 if best is not None and c.plan.makespan >= best[0] else 0
        if best is None or c.plan.makespan < best[0]:
            best = (c.plan.makespan, predicted)
    tried.extend(candidates[s] for s in pipelined)
    fastest = sorted((c for c in candidates.values() if c.plan is not None), key=lambda c: c.plan.makespan)  # type: ignore[union-attr]
    for c in fastest[:1]:  # then list scheduling, which grows faster than the ops: small pipelines only
        _on_fewer_devices(cluster, c, options, cost, deadline - _one_batch_reserve([*before, *tried]), log, rates)
        if c.source is not None and len(c.source.ops) <= MAX_HEURISTIC_OPS and \
                work.now() + cost.estimate(c, ("heuristics",)) <= stop:
            logged(screen(graph, cluster, c, options, heuristic), log, rates)
    for c in candidates.values():
        c.pipeline = None  # the schedules are done: their graphs' preparations need not stay in memory
    return tried


def _predicted_to_fit(todo: list[Strategy], cluster: Cluster, rates: Rates, tried: list[Candidate],
                      log: PlaceOptions) -> list[Strategy]:
    """Of pipelined strategies `todo`, those the one-batch walk does not predict far over their
    devices' memory however sharded (`variant_to_screen`); the others join `tried`, saying so.
    Building a pipeline of many micro-batches of a large model takes longer than the screening
    has (the 13B GPT's 16 micro-batches over 8 stages: about 67 s of a 42 s budget)."""
    if rates.memory is None:
        return todo
    capacity = min(d.memory for d in cluster.devices)
    kept = []
    for s in todo:
        variant, why = variant_to_screen(rates.memory, s, capacity, rates.shard, rates.fsdp,
                                         len(cluster) // s.data_parallel)
        if variant is None:
            tried.append(logged(Candidate(s, why_not=why, over=True), log, rates))
        else:
            kept.append(s)
    return kept


def _on_fewer_devices(cluster: Cluster, c: Candidate, options: PlaceOptions, cost: BuildCost, end: float,
                      log: PlaceOptions, rates: Rates) -> None:
    """`c`'s pipeline schedule over the first half of each replica's devices, kept if faster (the
    others idle): where the largest unit holds the step, fewer stages pay fewer transfers for the
    same floor, and a plan on fewer devices is a plan on all of them, so more devices never make
    the pipeline slower (bert_l-3_training_op: 40.97 ms over 8 stages, 40.89 over 4). Run if its
    schedule fits by the estimate before `end`, and no start plan on half the devices or fewer is
    in hand (the search that made it had the whole time limit)."""
    assert c.plan is not None
    engine = c.plan.algorithm
    per_replica = len(cluster) // c.strategy.data_parallel
    if c.source is None or engine not in PIPELINE_SCHEDULES or per_replica < MIN_HALVED_DEVICES or per_replica % 2 \
            or rates.halved:
        return
    if work.now() + cost.estimate(c, (engine,)) > end:
        return
    group = replica_groups(cluster, c.strategy.data_parallel)[0]
    half = sub_cluster(cluster, group[:per_replica // 2])
    try:
        plan = pipeline_plan(c.source, half, engine, options, end)
    except PestoError:  # fewer forward units than half the devices, or it does not fit in memory there
        return
    graph, plan = bucketed(c.source, cluster, dataclasses.replace(plan, devices=list(group), peak_memory=None),
                           c.strategy)
    if plan.makespan < c.plan.makespan:
        plan.notes.append(f"{engine} over {len(half)} of the {per_replica} devices: "
                          f"{human_time(plan.makespan, 4)}, against {human_time(c.plan.makespan, 4)} over all")
        c.graph, c.plan, c.engine = graph, plan, f"{engine} on {len(half)} devices"
        logged(c, log, rates)


def _eager_schedules_that_fit(c: Candidate, cost: BuildCost, end: float, left: Sequence[str]) -> tuple[str, ...]:
    """Of the eager schedules `left` to run on `c`'s graph (built, its fixed schedule timed: the
    estimate scales what that took), those that can end by `end` (their searches stop in time,
    after one justification round), in the order to run them: both, else the interleaved layouts
    (on the MSR training graphs the faster), else the eager schedule of the fixed schedule's
    stages."""
    for engines in ((INTERLEAVED, EAGER), (INTERLEAVED,), (EAGER,)):
        if all(e in left for e in engines) and work.now() + cost.estimate(c, engines) <= end:
            return engines
    return ()


def _ranked_pipelines(graph: Graph, cluster: Cluster, todo: list[Strategy], log: PlaceOptions, rates: Rates
                      ) -> tuple[list[tuple[float | None, Strategy, str]], dict[Strategy, Candidate], BuildCost]:
    """(prediction, strategy, schedule) in the order to build them, a candidate per strategy, and
    what building costs. The prediction is the stage model's, from the two-micro-batch rewrite
    (built here, and kept for m = 2); without it (the batch does not split in two, the rewrite
    fails) the largest m first, both schedules, unpredicted."""
    d = todo[0].data_parallel
    candidates = {s: Candidate(s, graph=rates.prebuilt.pop(s, None)) for s in todo}
    state = todo[0].optimizer_state
    two = candidates.get(Strategy(d, MODEL_MICROBATCHES, state)) or Candidate(Strategy(d, MODEL_MICROBATCHES, state))
    sub = sub_cluster(cluster, replica_groups(cluster, d)[0])
    started = work.now()
    try:
        two.graph = replica_graph(graph, cluster, two.strategy)
    except PestoError as e:
        two.why_not = first_reason(e)
        fallback: list[tuple[float | None, Strategy, str]] = [
            (None, s, schedule) for s in sorted(todo, key=lambda s: -s.microbatches) for schedule in SCHEDULES]
        return fallback, candidates, BuildCost(rewrite=1e-4)
    seconds = work.now() - started
    rates.rewrote(seconds, len(two.graph.ops))
    per_op = seconds / max(len(two.graph.ops), 1)
    copies = sum(1 for op in two.graph.ops if op.get("microbatch") is not None)
    cost = BuildCost(rewrite=per_op, ops_per_microbatch=copies / MODEL_MICROBATCHES,
                     once_ops=len(two.graph.ops) - copies)
    try:
        model = build_model(two.graph, sub, graph)
        ranked = sorted(((model.predict(schedule, s.microbatches), s, schedule) for s in todo for schedule in SCHEDULES),
                        key=lambda x: (x[0], -x[1].microbatches, x[2]))
    except (PestoError, ValueError) as e:
        log.progress(f"place: no pipeline model for d={d} ({first_reason(e)}); trying the largest m first")
        return [(None, s, schedule) for s in sorted(todo, key=lambda s: -s.microbatches)
                for schedule in SCHEDULES], candidates, cost
    best = ", ".join(f"m={s.microbatches} {schedule} {human_time(t, 4)}" for t, s, schedule in ranked[:4])
    log.progress(f"place: pipeline model (predicted), d={d}: {best}")
    return ranked, candidates, cost  # type: ignore[return-value]


def _one_batch_reserve(screened: list[Candidate]) -> float:
    """The time to keep for refining the one-batch plan when it is the fastest screened so far:
    under short limits refining it gains more than screening the pipelines and mixes."""
    fastest = min((c for c in screened if c.plan is not None), key=lambda c: c.plan.makespan, default=None)  # type: ignore[union-attr]
    if fastest is None or fastest.strategy != ONE_BATCH or fastest.graph is None or len(fastest.graph.ops) > REPLICA_REFINE_MAX_OPS:
        return 0.0
    return REFINE_RESERVE


def _no_time(seconds: float, what: str, kept: bool = False) -> str:
    """Why a step was not started: the time left, or (`kept`) the time kept for the refinement."""
    if kept:
        return (f"not screened: its {seconds:.2g} s or so would use the last {REFINE_RESERVE:g} s, kept for "
                "refining the one-batch plan")
    return f"not screened: no time left {what} (about {seconds:.2g} s by the rates measured or guessed so far)"
