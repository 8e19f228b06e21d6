"""The classic list schedulers `etf` and `heft` (passes/placement/heuristics/list_scheduling.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import placement_problems, v100s

from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import PlaceGraph
from pesto_ir.passes.placement.heuristics.list_scheduling import upward_ranks
from pesto_ir.passes.placement.heuristics.portfolio import (
    BUDGET_ORDER,
    HEURISTICS,
    RELATIVE_TIME,
    WARM_START_ALGOS,
    best_heuristic_plan,
)
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util import work

LIST = ["etf", "heft"]
MSR = Path(__file__).resolve().parents[1] / "graphs" / "msr"
QUIET = PlaceOptions(quiet=True)


def test_registered_and_tried_for_the_warm_start() -> None:
    for algo in LIST:
        assert algo in HEURISTICS and algo in WARM_START_ALGOS


@pytest.mark.parametrize("algo", LIST)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=placement_problems(max_ops=10))
def test_plans_are_valid_and_deterministic(algo: str, problem: tuple[Graph, Cluster]) -> None:
    graph, cluster = problem
    plan = check_plan(graph, cluster, HEURISTICS[algo](graph, cluster, QUIET))
    assert plan.algorithm == algo
    again = HEURISTICS[algo](graph, cluster, QUIET)
    assert again.ops == plan.ops and again.transfers == plan.transfers
    for op in graph.ops:  # colocation units stay whole
        group = op.get("colocate")
        if group is not None:
            assert len({plan.ops[o.name].device for o in graph.ops if o.get("colocate") == group}) == 1


def _cluster(k: int, memory: float = 1e12) -> Cluster:
    return Cluster.homogeneous(k, "v100", memory=memory, latency=1e-5, bandwidth=1e9)


def test_etf_breaks_equal_starts_by_earliest_finish() -> None:
    # a (10 ms) and b (1 ms) both start at 0 on either device; c reads 1 MB from a and 8 B from b.
    # ETF runs b first (the earlier finish; m-ETF would take a, the first in graph order) on gpu0,
    # then a, which starts at 0 only on gpu1.
    g = graph_from_json({"format": "pesto-graph/1", "nodes": [
        {"id": "a", "cost": 0.010}, {"id": "b", "cost": 0.001}, {"id": "c", "cost": 0.001}],
        "edges": [{"src": "a", "dst": "c", "bytes": 10**6}, {"src": "b", "dst": "c", "bytes": 8}]})
    plan = check_plan(g, _cluster(2), HEURISTICS["etf"](g, _cluster(2), QUIET))
    assert plan.ops["b"].device == "gpu0" and plan.ops["b"].start == 0.0
    assert plan.ops["a"].device == "gpu1" and plan.ops["a"].start == 0.0
    # c starts earliest where a's 1 MB already is: on gpu1, once b's 8 bytes arrive
    assert plan.ops["c"].device == "gpu1"
    assert plan.ops["c"].start == pytest.approx(0.010)


def test_heft_ranks_and_places_by_earliest_finish() -> None:
    # a fork: the long branch x has the higher upward rank, so it is placed first, on gpu0
    g = graph_from_json({"format": "pesto-graph/1", "nodes": [
        {"id": "s", "cost": 0.001}, {"id": "x", "cost": 0.010}, {"id": "y", "cost": 0.002}],
        "edges": [{"src": "s", "dst": "x", "bytes": 8}, {"src": "s", "dst": "y", "bytes": 8}]})
    cluster = _cluster(2)
    rank = upward_ranks(PlaceGraph.build(g, cluster))
    assert rank[0] > rank[1] > rank[2]
    plan = check_plan(g, cluster, HEURISTICS["heft"](g, cluster, QUIET))
    assert plan.ops["x"].device == plan.ops["s"].device  # no transfer before the long branch
    assert plan.ops["y"].device != plan.ops["s"].device  # y runs beside it, after an 8-byte transfer


@pytest.mark.parametrize("algo", LIST)
def test_memory_overrides_the_greedy_choice(algo: str) -> None:
    # a and b each hold 600 bytes; one device holds 1000: the second op cannot join the first,
    # though running both on one device would avoid the transfer
    g = graph_from_json({"format": "pesto-graph/1", "nodes": [
        {"id": "a", "cost": 0.001, "memory": 600}, {"id": "b", "cost": 0.001, "memory": 600},
        {"id": "c", "cost": 0.001}],
        "edges": [{"src": "a", "dst": "b", "bytes": 8}, {"src": "b", "dst": "c", "bytes": 8}]})
    cluster = _cluster(2, memory=1000)
    plan = check_plan(g, cluster, HEURISTICS[algo](g, cluster, QUIET))
    assert plan.ops["a"].device != plan.ops["b"].device
    roomy = HEURISTICS[algo](g, _cluster(2), QUIET)  # without the limit, the chain stays on one device
    assert roomy.ops["a"].device == roomy.ops["b"].device


@pytest.mark.parametrize("algo", LIST)
def test_colocated_ops_share_a_device(algo: str) -> None:
    g = graph_from_json({"format": "pesto-graph/1", "nodes": [
        {"id": "f", "cost": 0.001, "colocate": "w"}, {"id": "p", "cost": 0.005}, {"id": "q", "cost": 0.005},
        {"id": "b", "cost": 0.001, "colocate": "w"}],
        "edges": [{"src": "f", "dst": "p", "bytes": 8}, {"src": "f", "dst": "q", "bytes": 8},
                  {"src": "q", "dst": "b", "bytes": 8}, {"src": "p", "dst": "b", "bytes": 8}]})
    plan = check_plan(g, _cluster(2), HEURISTICS[algo](g, _cluster(2), QUIET))
    assert plan.ops["f"].device == plan.ops["b"].device


def test_etf_beats_m_etf_on_inception_v3_training() -> None:
    # the whole gap is the tie rule: ETF breaks equal starts by earliest finish, m-ETF by graph order
    # (ETF with m-ETF's tie rule gives m-ETF's plan); at k=2 neither fits this graph's memory
    g = graph_from_json(json.loads((MSR / "inceptionv3_training_layer.json").read_text()))
    cluster = Cluster.homogeneous(4, "v100", memory=16 * 2**30, latency=1e-5, bandwidth=50e9)
    etf = check_plan(g, cluster, HEURISTICS["etf"](g, cluster, QUIET))
    m_etf = check_plan(g, cluster, HEURISTICS["m-etf"](g, cluster, QUIET))
    assert etf.makespan < 0.95 * m_etf.makespan


# ---------------------------------------------------------------- the portfolio under a deadline

def test_the_portfolio_under_a_deadline_runs_the_first_heuristic_and_says_what_it_left_out(bert24: Graph) -> None:
    """A deadline already past: the first heuristic of `BUDGET_ORDER` still runs (a plan to start
    from), the others are named as not run."""
    log = io.StringIO()
    options = PlaceOptions(quiet=False, log=log)
    plan = best_heuristic_plan(bert24, v100s(4), options, until=work.now() - 1.0)
    assert plan is not None and plan.algorithm == BUDGET_ORDER[0]
    said = log.getvalue()
    assert f"{', '.join(BUDGET_ORDER[1:])} not run" in said


def test_the_portfolio_with_time_to_spare_is_the_portfolio_without_a_deadline(bert24: Graph) -> None:
    """Every heuristic fits in an hour: the same plan as with no deadline (ties by the same order)."""
    cluster = v100s(4)
    free = best_heuristic_plan(bert24, cluster, QUIET)
    timed = best_heuristic_plan(bert24, cluster, QUIET, until=work.now() + 3600)
    assert free is not None and timed is not None
    assert (timed.algorithm, timed.ops, timed.transfers) == (free.algorithm, free.ops, free.transfers)
    assert set(BUDGET_ORDER) == set(WARM_START_ALGOS) == set(RELATIVE_TIME)


def test_a_heuristic_that_finds_no_plan_does_not_stop_the_next_in_time(bert24: Graph,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the deadline, the first heuristic failing (memory) leaves the next its chance; past
    it, none starts after the first: where none fits, each would run until it finds out."""
    from pesto_ir.passes.placement.heuristics import portfolio as heuristic_portfolio
    from pesto_ir.util.errors import PestoError

    def out_of_memory(*_: object) -> None:
        raise PestoError("no device holds it")

    monkeypatch.setitem(heuristic_portfolio.HEURISTICS, BUDGET_ORDER[0], out_of_memory)
    plan = best_heuristic_plan(bert24, v100s(4), QUIET, until=work.now() + 3600)
    assert plan is not None and plan.algorithm == BUDGET_ORDER[1]
    log = io.StringIO()
    assert best_heuristic_plan(bert24, v100s(4), PlaceOptions(quiet=False, log=log), until=work.now() - 1.0) is None
    assert f"{', '.join(BUDGET_ORDER[1:])} not run: the time they were given had passed" in log.getvalue()


@pytest.mark.parametrize("name", ["m-etf", "m-sct", "m-topo", "etf", "heft", "expert"])
def test_a_heuristic_stops_once_the_time_limit_s_wall_clock_has_passed(name: str) -> None:
    """A heuristic reads no clock of its own: inside a capped block whose wall-clock cap has
    passed it stops within `CHECK_EVERY` steps, saying so, instead of running to its end."""
    import pesto_ir
    from pesto_ir.passes.placement.heuristics.portfolio import HEURISTICS
    from pesto_ir.passes.placement.links import CHECK_EVERY
    from pesto_ir.util.errors import PestoError

    graph = pesto_ir.load(str(Path(__file__).resolve().parents[1] / "graphs" / "msr" / "bert_l-3_training_op.json"))
    assert len(graph.ops) > CHECK_EVERY
    with work.capped(3600.0, 0.0):
        with pytest.raises(PestoError, match=f"{name}: stopped by the time limit after placing ") as stopped:
            HEURISTICS[name](graph, v100s(4), QUIET)
    assert int(str(stopped.value).rsplit(" ", 2)[-2]) <= CHECK_EVERY
    assert len(HEURISTICS[name](graph, v100s(4), QUIET).ops) == len(graph.ops)  # outside the block it runs to its end


def _bert3() -> Graph:
    import pesto_ir

    return pesto_ir.load(str(Path(__file__).resolve().parents[1] / "graphs" / "msr" / "bert_l-3_training_op.json"))


@pytest.mark.parametrize("name", ["m-etf", "m-sct", "etf", "heft"])
def test_a_list_scheduler_stops_at_the_same_step_once_its_counted_work_passes_its_deadline(name: str) -> None:
    """The work a list scheduler does is counted as it goes (the inputs it looks up), so a
    deadline on the work clock stops it at the same op on every run, however busy the machine;
    outside the deadline it runs to its end."""
    from pesto_ir.passes.placement.heuristics.portfolio import HEURISTICS
    from pesto_ir.util.errors import PestoError

    graph = _bert3()
    whole = work.now()
    HEURISTICS[name](graph, v100s(4), QUIET)
    whole = work.now() - whole
    stops = []
    for _ in range(2):
        with work.stopping_at(work.now() + whole / 2):
            with pytest.raises(PestoError, match=f"{name}: stopped at the end of the work it was given") as stopped:
                HEURISTICS[name](graph, v100s(4), QUIET)
        stops.append(int(str(stopped.value).rsplit(" ", 2)[-2]))
    assert stops[0] == stops[1] and 0 < stops[0] < len(graph.ops)


def test_a_list_scheduler_is_charged_every_input_it_looks_up() -> None:
    """A list scheduler's time follows the inputs it looks up, not ops x devices (m-SCT looks up
    8 per op and device on jax_gpt24 over 8 devices, 19 on alpa-gpt-39B over 64, and 2-5 here):
    the clock is charged each one (`data-ready`), once, and the tables once per op."""
    from pesto_ir.passes.placement.heuristics.portfolio import HEURISTICS
    from pesto_ir.passes.placement.links import LinkQueues

    graph = _bert3()
    looked: list[int] = []
    real = LinkQueues.charge

    def counting(self: LinkQueues) -> None:
        looked[-1] = self.looked_up
        real(self)

    for k in (2, 8):
        looked.append(0)
        with pytest.MonkeyPatch.context() as patch, work.recording() as charges:
            patch.setattr(LinkQueues, "charge", counting)
            HEURISTICS["m-sct"](graph, v100s(k), QUIET)
        assert sum(units for kind, units, _, _ in charges if kind == "data-ready") == looked[-1] > 0
        assert [units for kind, units, _, _ in charges if kind == "list-schedule-op"] == [len(graph.ops)]


def test_the_portfolio_s_first_heuristic_runs_to_its_end_unless_its_caller_stops_it() -> None:
    """Under a deadline already passed the first heuristic still runs to its end (the plan no exact
    engine may be slower than) and none starts after it; inside a caller's own deadline
    (`work.stopping_at`) the first stops too, and the log says why."""
    graph = _bert3()
    log = io.StringIO()
    plan = best_heuristic_plan(graph, v100s(4), PlaceOptions(quiet=False, log=log), until=work.now())
    assert plan is not None and plan.algorithm == BUDGET_ORDER[0]
    assert f"{', '.join(BUDGET_ORDER[1:])} not run" in log.getvalue()
    log = io.StringIO()
    with work.stopping_at(work.now()):
        assert best_heuristic_plan(graph, v100s(4), PlaceOptions(quiet=False, log=log), until=work.now()) is None
    assert f"place: {BUDGET_ORDER[0]} gives no plan to start from: {BUDGET_ORDER[0]}: stopped at the end of the " \
           "work it was given" in log.getvalue()
