"""The hybrid search's screening order on models that outgrow their devices
(`passes/placement/search/screening.py`): strategies the memory floor rules out are not
screened, and say why; the tensor-parallel strategies come before the other degrees, and one
batch after them, where one batch cannot fit or the ranks are predicted to fit."""

from __future__ import annotations

import functools

import pytest

from bench.zoo_jax import lower_config
from bench.zoo_jax_models import GptConfig
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.search.replica_memory import ReplicaMemory
from pesto_ir.passes.placement.search.screening import RANKS, _group_order
from pesto_ir.passes.placement.search.screening_rates import Rates, cannot_fit
from pesto_ir.passes.rewrite.replicas import ONE_BATCH, Strategy
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import read_plan_attrs
from pesto_ir.util.errors import PestoError


@functools.cache
def _costed() -> Graph:
    """Two GPT blocks whose activations outweigh their state (a long batch, a wide vocabulary)."""
    graph = lower_config("gpt", GptConfig(layers=2, d_model=64, heads=4, seq=64, batch=32, vocab=512))
    return PassManager("annotate-costs{model=roofline}").run(
        graph, PassContext(cluster=Cluster.homogeneous(1, "h100"), quiet=True))


def test_a_strategy_over_its_memory_floor_is_not_screened() -> None:
    """On devices smaller than one batch's floor, one batch is refused with the floor it needs;
    the search says so whether or not another strategy gives a plan."""
    graph = _costed()
    memory = ReplicaMemory.of(graph)
    assert memory is not None
    capacity = memory.floor(ONE_BATCH, 4) * 0.9
    cluster = Cluster.homogeneous(4, "h100", memory=capacity)
    rates = Rates(memory=memory)
    assert "cannot fit" in cannot_fit(ONE_BATCH, cluster, rates)
    replicas = Strategy(4, 4)
    assert memory.floor(replicas, 1) < memory.floor(ONE_BATCH, 4)
    try:
        out = PassManager("place{algo=auto time-limit=5 seed=0}").run(
            graph.clone(), PassContext(cluster=cluster, quiet=True, seed=0))
        plan = read_plan_attrs(out)
        assert plan is not None
        said = " ".join(plan.notes)
    except PestoError as e:
        said = str(e)
    assert "d=1 m=1 none (not screened: it cannot fit" in said or "d=1 m=1: not screened: it cannot fit" in said


def test_the_floor_grows_with_what_one_device_must_hold() -> None:
    memory = ReplicaMemory.of(_costed())
    assert memory is not None
    s = Strategy(2, 2)
    assert memory.floor(s.fully_sharded(), 1) <= memory.floor(s.sharded(), 1) <= memory.floor(s, 1)
    assert memory.floor(Strategy(2, 4), 1) <= memory.floor(s, 1)
    assert memory.floor(s, 2) <= memory.floor(s, 1)


@pytest.mark.parametrize("others_first", [True, False])
def test_ranks_come_first_and_one_batch_last_on_models_for_them(others_first: bool) -> None:
    groups = {8: [], 1: [], 4: [], 2: [], RANKS: []}
    order = _group_order(groups, Cluster.homogeneous(8, "h100"), others_first)  # type: ignore[arg-type]
    assert order == ([8, 1, 4, 2, RANKS] if others_first else [8, RANKS, 4, 2, 1])


def test_one_batch_is_not_screened_where_its_bound_is_over_a_plan_in_hand() -> None:
    """Two wider GPT blocks on four devices: one batch's lower bound (its chain of layers) is
    over the four one-device replicas' plan, screened first; so one batch is neither screened nor
    searched, the summary says why, and the plan still beats every one-batch plan."""
    from pesto_ir.schedule.bounds import lower_bound

    graph = lower_config("gpt", GptConfig(layers=2, d_model=512, heads=8, seq=256, batch=32, vocab=1024))
    graph = PassManager("annotate-costs{model=roofline}").run(
        graph, PassContext(cluster=Cluster.homogeneous(1, "h100"), quiet=True))
    cluster = Cluster.homogeneous(4, "h100")
    bound = lower_bound(graph, cluster)
    out = PassManager("place{algo=auto time-limit=5 seed=0}").run(
        graph.clone(), PassContext(cluster=cluster, quiet=True, seed=0))
    plan = read_plan_attrs(out)
    assert plan is not None and plan.parallelism is not None
    assert plan.makespan < bound
    assert "d=1 m=1 none (not screened: one batch's lower bound" in " ".join(plan.notes)


def test_one_batch_is_screened_while_no_plan_beats_its_bound() -> None:
    """Without a plan in hand, or with one slower than one batch's bound, nothing rules one batch
    out; a plan as fast as the bound does."""
    from pesto_ir.passes.placement.search.screening_rates import one_batch_ruled_out
    from pesto_ir.schedule.bounds import lower_bound

    graph = _costed()
    cluster = Cluster.homogeneous(4, "h100")
    rates = Rates()
    assert one_batch_ruled_out(graph, cluster, rates) == ""
    out = PassManager("place{algo=m-etf}").run(graph.clone(), PassContext(cluster=cluster, quiet=True, seed=0))
    plan = read_plan_attrs(out)
    assert plan is not None
    rates.fastest = (graph, plan)
    assert rates.one_batch_bound is None
    assert one_batch_ruled_out(graph, cluster, rates) == ""  # a one-batch plan is never under its bound
    assert rates.one_batch_bound == lower_bound(graph, cluster)
    rates.one_batch_bound = plan.makespan
    assert "no one-batch plan can beat it" in one_batch_ruled_out(graph, cluster, rates)


def test_nothing_is_screened_once_the_time_limit_s_wall_clock_has_passed() -> None:
    """A 1 ms limit passes before the screening starts: no strategy is screened (each says why),
    the place pass still returns a checked plan, and its notes say the limit cut the search."""
    graph = lower_config("gpt", GptConfig(layers=2, d_model=512, heads=8, seq=256, batch=32, vocab=1024))
    graph = PassManager("annotate-costs{model=roofline}").run(
        graph, PassContext(cluster=Cluster.homogeneous(1, "h100"), quiet=True))
    out = PassManager("place{algo=auto time-limit=0.001 seed=0}").run(
        graph.clone(), PassContext(cluster=Cluster.homogeneous(4, "h100"), quiet=True, seed=0))
    plan = read_plan_attrs(out)
    assert plan is not None
    summary = next(note for note in plan.notes if note.startswith("hybrid search:"))
    tried = summary.split("; tried ", 1)[1].split("; ")
    assert len(tried) > 1 and all(t.endswith("none (not screened: the time limit's wall clock had passed)")
                                  for t in tried)
    assert any("time limit cut the search short" in note for note in plan.notes)


def test_a_degree_s_first_strategy_gets_one_batch_s_spare_work_only_where_one_batch_is_ruled_out() -> None:
    """Past the end of the screening, a tensor-parallel degree's first strategy may still start
    within `spare` where one batch is still to come and a plan in hand beats its lower bound (it
    will be neither screened nor searched); not where it ran already, nor where it may still win."""
    from pesto_ir.passes.placement.search.screening_rates import ScreeningTimes, first_end
    from pesto_ir.util import work

    graph = _costed()
    cluster = Cluster.homogeneous(4, "h100")
    times = ScreeningTimes(screened_by=work.now() - 2.0, finish_by=work.now() - 1.0, spare=3600.0)
    rates = Rates()
    assert first_end(graph, cluster, times, rates, False) == times.finish_by  # one batch screened before
    assert first_end(graph, cluster, times, rates, True) == times.finish_by  # no plan in hand to beat it
    out = PassManager("place{algo=m-etf}").run(graph.clone(), PassContext(cluster=cluster, quiet=True, seed=0))
    plan = read_plan_attrs(out)
    assert plan is not None
    rates.fastest = (graph, plan)
    assert first_end(graph, cluster, times, rates, True) == times.finish_by  # one batch's own plan: not beaten
    rates.one_batch_bound = plan.makespan
    assert first_end(graph, cluster, times, rates, True) == times.finish_by + times.spare
    assert first_end(graph, cluster, times, rates, False) == times.finish_by


def test_no_list_schedule_runs_past_the_end_of_the_screening(monkeypatch: pytest.MonkeyPatch) -> None:
    """A strategy started in time does not run its heuristics to their end once the screening's
    last moment (`finish_by`, plus the spare work a tensor-parallel degree may get) has passed:
    the list schedule stops there, on the work clock, and says so."""
    from pathlib import Path

    import pesto_ir
    from pesto_ir.passes.placement.heuristics.portfolio import HEURISTICS
    from pesto_ir.passes.placement.options import PlaceOptions
    from pesto_ir.passes.placement.search import screening
    from pesto_ir.passes.placement.search.screening_rates import ScreeningTimes
    from pesto_ir.passes.placement.search.strategies import Candidate
    from pesto_ir.util import work

    bert = pesto_ir.load(str(Path(__file__).resolve().parents[1] / "graphs" / "msr" / "bert_l-3_training_op.json"))
    stopped: list[str] = []

    def replicas(g: Graph, c: Cluster, todo: list[Strategy], *_: object) -> list[Candidate]:
        with pytest.raises(PestoError) as e:
            HEURISTICS["m-etf"](bert, Cluster.homogeneous(4, "v100"), PlaceOptions(quiet=True))
        stopped.append(str(e.value))
        return [Candidate(s, why_not="stopped") for s in todo]

    monkeypatch.setattr(screening, "cannot_fit", lambda *_: "")
    monkeypatch.setattr(screening, "_screen_replicas", replicas)
    now = work.now()
    quiet = PlaceOptions(quiet=True)
    screening.screen_all(_costed(), Cluster.homogeneous(8, "h100"), [Strategy(8, 1)], quiet, lambda *_: None,
                         ScreeningTimes(now, now, spare=0.0), quiet, Rates())  # type: ignore[arg-type]
    assert len(stopped) == 1 and "m-etf: stopped at the end of the work it was given" in stopped[0]
    HEURISTICS["m-etf"](bert, Cluster.homogeneous(4, "v100"), PlaceOptions(quiet=True))  # outside it, no stop


def test_pipelines_of_ranks_predicted_to_fit_are_screened_first() -> None:
    """On devices that one device per rank is predicted to overflow (the whole state on each, no
    sharding) but pipelines of ranks are not: the ranks count as predicted to fit, so they are
    screened before one batch; the pipelines go first, the fewest replicas first, each from m = its
    stage count."""
    from pesto_ir.passes.placement.search.screening_rates import (
        rank_memory_of,
        rank_screening_order,
        ranks_predicted_to_fit,
    )
    from pesto_ir.passes.sharding.choose import pairs_layout

    graph = lower_config("gpt", GptConfig(layers=2, d_model=256, heads=4, seq=16, batch=8, vocab=512))
    graph = PassManager("annotate-costs{model=roofline}").run(  # its state outweighs its activations
        graph, PassContext(cluster=Cluster.homogeneous(1, "h100"), quiet=True))
    layout = pairs_layout(graph, 2)
    ranks = [Strategy(d, m, tensor=layout) for d in (4, 2, 1) for m in (1, 2, 4, 8)]  # 1, 2 and 4 stages on 8 devices
    rates = Rates(memory=ReplicaMemory.of(graph))  # the state whole: no variant shards it
    memory = rank_memory_of(graph, Cluster.homogeneous(8, "h100"), ranks[0], rates)
    assert memory is not None
    one_per_rank = min(memory.predicted_peak(s, 1) for s in ranks[:4])
    piped = max([memory.predicted_peak(s, 2) for s in ranks[4:8]] + [memory.predicted_peak(s, 4) for s in ranks[8:]])
    assert piped < one_per_rank
    capacity = (piped + one_per_rank) / 2
    cluster = Cluster.homogeneous(8, "h100", memory=capacity)
    assert ranks_predicted_to_fit(graph, cluster, ranks, rates)
    assert not ranks_predicted_to_fit(graph, cluster, ranks[:4], rates)  # one device per rank alone: no
    order = rank_screening_order(graph, cluster, ranks, capacity, rates)
    # pipelines of the fewest replicas first (no gradient all-reduce between them), each from m = its stages
    assert [(s.data_parallel, s.microbatches) for s in order] == [(1, 4), (1, 8), (1, 1), (1, 2),
                                                                  (2, 2), (2, 4), (2, 8), (2, 1),
                                                                  (4, 1), (4, 2), (4, 4), (4, 8)]
    # where one device per rank is predicted to fit, it goes first
    roomy = Cluster.homogeneous(8, "h100", memory=2 * one_per_rank)
    assert [(s.data_parallel, s.microbatches) for s in rank_screening_order(graph, roomy, ranks, 2 * one_per_rank,
                                                                            rates)][:5] == \
        [(4, 1), (4, 2), (4, 4), (4, 8), (1, 4)]


def test_a_step_that_cannot_be_split_by_samples_skips_to_one_batch_per_rank() -> None:
    """transformer_block's attention multiplies across samples, so no replica or micro-batch of
    it can be built: after the first such rewrite fails, the other strategies of the same layout
    that split the batch are not built (each would fail the same way), and one batch over the
    ranks' stages is screened within a 2 s limit."""
    from pathlib import Path

    import pesto_ir

    graph = pesto_ir.load(str(Path(__file__).resolve().parents[1] / "examples" / "transformer_block.pir"))
    out = PassManager("annotate-costs,place{algo=auto tensor-parallel=2 time-limit=2 seed=0}").run(
        graph, PassContext(cluster=Cluster.homogeneous(4, "h100"), quiet=True, seed=0))
    plan = read_plan_attrs(out)
    assert plan is not None and plan.parallelism is not None and plan.parallelism.tensor_parallel == 2
    summary = next(note for note in plan.notes if note.startswith("hybrid search:"))
    built = [t for t in summary.split("; ") if "none (cannot micro-batch op 'scores'" in t]
    skipped = [t for t in summary.split("; ") if "none (not screened: cannot micro-batch op 'scores'" in t]
    assert len(built) == 1 and len(skipped) >= 5, summary


@pytest.mark.parametrize(("whole", "sharded", "kept"), [(1.0, 0.9, True), (1.0, 1.0, False), (1.0, 1.2, False)])
def test_a_replicated_rank_plan_is_screened_sharded_too_and_kept_where_faster(
        monkeypatch: pytest.MonkeyPatch, whole: float, sharded: float, kept: bool) -> None:
    """After a tensor-parallel strategy of several replicas gives a plan with the whole state on
    each, the same strategy with the state sharded is screened, and kept only where faster."""
    from types import SimpleNamespace

    from pesto_ir.passes.placement.options import PlaceOptions
    from pesto_ir.passes.placement.search import screening
    from pesto_ir.passes.placement.search.strategies import Candidate
    from pesto_ir.util import work

    asked: list[Strategy] = []

    def screen(g: Graph, c: Cluster, found: Candidate, *_: object) -> Candidate:
        asked.append(found.strategy)
        found.plan = SimpleNamespace(makespan=sharded)  # type: ignore[assignment]
        return found

    monkeypatch.setattr(screening, "screen", screen)
    replicated = Candidate(Strategy(2, 1), plan=SimpleNamespace(makespan=whole))  # type: ignore[arg-type]
    quiet = PlaceOptions(quiet=True)
    now = work.now()
    out = screening._sharded_too(_costed(), Cluster.homogeneous(4, "h100"), replicated, quiet, lambda *_: None,
                                 ("heuristics",), quiet, Rates(), now + 1)
    assert asked == [Strategy(2, 1).sharded()]
    assert [c.strategy for c in out] == ([Strategy(2, 1).sharded()] if kept else [])
    if kept:
        assert out[0].why_not.startswith("faster than with the whole state")
