"""Placement: every algorithm's plans pass the validator; place, expand and the pipeline end to end."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import placement_problems

from pesto_ir import PestoError, parse
from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.passes import PASSES
from pesto_ir.passes.place import place_graph
from pesto_ir.passes.placement.common import PlaceGraph
from pesto_ir.passes.placement.expansion import expand_plan
from pesto_ir.passes.placement.heuristics.baechi import favorite_children
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.registry import ALGORITHMS, DEFAULT_ALGO
from pesto_ir.passes.rewrite.grouping import coarsen_groups
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import Plan, read_plan_attrs
from pesto_ir.schedule.validate import check_plan

HEURISTICS = ["expert", "m-etf", "m-sct", "m-topo", "random", "single"]  # the exact solvers have their own tests
MSR = Path(__file__).resolve().parents[1] / "graphs" / "msr"
QUIET = PlaceOptions(quiet=True)


def msr_cluster(k: int) -> Cluster:
    return Cluster.homogeneous(k, "v100", memory=17185374208, latency=1e-5, bandwidth=50e9)


@pytest.mark.parametrize("algo", HEURISTICS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=placement_problems(max_ops=10))
def test_every_plan_is_valid_when_memory_is_roomy(algo: str, problem: tuple[Graph, Cluster]) -> None:
    graph, cluster = problem
    if algo == "single" and sum(int(op.get("memory", 0) or 0) for op in graph.ops) > cluster.devices[0].memory:
        with pytest.raises(PestoError, match="single: the graph fits on no one device"):
            ALGORITHMS[algo].run(graph, cluster, QUIET)
        return
    plan = ALGORITHMS[algo].run(graph, cluster, QUIET)
    check_plan(graph, cluster, plan)
    assert plan.algorithm == algo


@pytest.mark.parametrize("algo", [*HEURISTICS, "etf", "heft"])  # list schedulers: tests/test_list_schedulers.py
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=placement_problems(max_ops=10, tight=True))
def test_tight_memory_gives_a_valid_plan_or_a_clean_error(algo: str, problem: tuple[Graph, Cluster]) -> None:
    graph, cluster = problem
    try:
        plan = ALGORITHMS[algo].run(graph, cluster, QUIET)
    except PestoError as e:
        assert "bytes" in str(e)
        return
    check_plan(graph, cluster, plan)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=placement_problems(max_ops=12), algo=st.sampled_from(HEURISTICS), data=st.data())
def test_coarse_plans_expand_to_valid_fine_plans(problem: tuple[Graph, Cluster], algo: str,
                                                 data: st.DataObject) -> None:
    graph, cluster = problem
    target = data.draw(st.integers(1, len(graph.ops)))
    for op, g in zip(graph.ops, coarsen_groups(graph, target, cluster)):
        op.set("group", g)
    try:
        coarse = place_graph(graph, cluster, algo, QUIET)
    except PestoError as e:  # coarse groups may not fit where the fine ops would (single, tight units)
        assert "bytes" in str(e)
        return
    assert any(n.startswith("coarse plan") for n in coarse.notes)
    fine = expand_plan(graph, cluster, read_plan_attrs(graph))
    check_plan(graph, cluster, fine)
    for op in graph.ops:  # expand keeps every op on its group's device
        assert fine.ops[op.name].device == coarse.ops[op.name].device


def _chain_graph() -> Graph:
    return graph_from_json({"format": "pesto-graph/1", "name": "chain", "nodes": [
        {"id": "a", "cost": 0.001, "memory": 100}, {"id": "b", "cost": 0.002, "memory": 100, "colocate": "w"},
        {"id": "c", "cost": 0.002, "memory": 100}, {"id": "d", "cost": 0.001, "memory": 100, "colocate": "w"}],
        "edges": [{"src": "a", "dst": "b", "bytes": 1000}, {"src": "a", "dst": "c", "bytes": 1000},
                  {"src": "b", "dst": "d", "bytes": 10}, {"src": "c", "dst": "d", "bytes": 10}]})


def test_place_pass_needs_a_cluster() -> None:
    with pytest.raises(PestoError) as info:
        PassManager("place{algo=m-etf}").run(_chain_graph(), PassContext(quiet=True))
    assert "place needs a cluster" in info.value.format()


def test_place_pass_rejects_an_unknown_algorithm() -> None:
    with pytest.raises(PestoError) as info:
        PassManager("place{algo=magic}").run(_chain_graph(), PassContext(cluster=msr_cluster(2), quiet=True))
    assert "unknown placement algorithm 'magic'" in info.value.format()
    assert "m-etf" in info.value.format()


def test_place_pass_reports_memory_shortfall_by_device() -> None:
    cluster = Cluster.homogeneous(2, "v100", memory=150)
    with pytest.raises(PestoError) as info:
        PassManager("place{algo=m-etf}").run(_chain_graph(), PassContext(cluster=cluster, quiet=True))
    text = info.value.format()
    assert "cannot fit in the cluster's memory" in text and "gpu0" in text and "short by" in text


def test_place_records_a_valid_plan_with_its_lower_bound() -> None:
    g = _chain_graph()
    cluster = msr_cluster(2)
    PassManager("place{algo=m-sct}").run(g, PassContext(cluster=cluster, quiet=True))
    plan = read_plan_attrs(g)
    assert plan is not None and plan.algorithm == "m-sct"
    check_plan(g, cluster, plan)
    assert plan.lower_bound is not None and plan.lower_bound <= plan.makespan + 1e-12
    assert g.op("b").get("device") == g.op("d").get("device")


def test_default_algorithm_is_auto_once_it_exists() -> None:
    assert DEFAULT_ALGO == next(a for a in ("auto", "ilp", "m-etf") if a in ALGORITHMS)
    assert PASSES["place"]().algo == DEFAULT_ALGO


def test_expand_without_a_plan_is_an_error() -> None:
    with pytest.raises(PestoError) as info:
        PassManager("expand").run(_chain_graph(), PassContext(cluster=msr_cluster(2), quiet=True))
    assert "run place before it" in info.value.format()


def test_expand_on_a_fine_plan_resimulates_it_unchanged() -> None:
    g = _chain_graph()
    cluster = msr_cluster(2)
    PassManager("place{algo=m-etf},expand").run(g, PassContext(cluster=cluster, quiet=True))
    before = read_plan_attrs(g)
    PassManager("expand").run(g, PassContext(cluster=cluster, quiet=True))
    after = read_plan_attrs(g)
    assert before is not None and after is not None
    assert {n: (s.device, s.start, s.end) for n, s in before.ops.items()} == \
        {n: (s.device, s.start, s.end) for n, s in after.ops.items()}


def test_placed_coarse_graph_survives_printing_and_parsing() -> None:
    """Nothing place records hides outside the IR: expand on the re-parsed text gives the same plan."""
    g = graph_from_json(_msr_doc("resnet50_inference_op.json"))
    cluster = msr_cluster(4)
    PassManager("coarsen{target=50},place{algo=m-etf}").run(g, PassContext(cluster=cluster, quiet=True))
    again = parse(str(g))
    a = expand_plan(g, cluster, read_plan_attrs(g))
    b = expand_plan(again, cluster, read_plan_attrs(again))
    assert a.makespan == b.makespan
    assert {n: s.device for n, s in a.ops.items()} == {n: s.device for n, s in b.ops.items()}


def test_heuristics_are_deterministic() -> None:
    g = _chain_graph()
    cluster = msr_cluster(3)
    for algo in HEURISTICS:
        one = ALGORITHMS[algo].run(g, cluster, PlaceOptions(quiet=True, seed=7))
        two = ALGORITHMS[algo].run(g, cluster, PlaceOptions(quiet=True, seed=7))
        assert one.ops == two.ops and one.transfers == two.transfers


def test_m_etf_prefers_the_fast_device_on_a_mixed_cluster() -> None:
    g = graph_from_json({"format": "pesto-graph/1", "nodes": [
        {"id": "a", "cost": {"v100": 0.001, "cpu": 0.05}}, {"id": "b", "cost": {"v100": 0.001, "cpu": 0.05}}],
        "edges": [{"src": "a", "dst": "b", "bytes": 8}]})
    cluster = Cluster.fully_connected([Device.of_kind("cpu0", "cpu"), Device.of_kind("gpu0", "v100")], 1e-5, 1e10)
    plan = ALGORITHMS["m-etf"].run(g, cluster, QUIET)
    assert {s.device for s in plan.ops.values()} == {"gpu0"}


def test_sct_favourite_children_form_a_matching() -> None:
    g = _chain_graph()
    pg = PlaceGraph.build(g, msr_cluster(2))
    favorite, how = favorite_children(pg, QUIET)
    assert how == "LP relaxation"
    chosen = [f for f in favorite if f >= 0]
    assert len(chosen) == len(set(chosen))
    assert all(f < 0 or any(p == i for p, _ in pg.preds[f]) for i, f in enumerate(favorite))


def test_random_depends_on_the_seed() -> None:
    g = graph_from_json({"format": "pesto-graph/1", "nodes": [{"id": f"n{i}", "cost": 0.001} for i in range(12)],
                         "edges": []})
    cluster = msr_cluster(4)
    placements = {tuple(s.device for s in ALGORITHMS["random"].run(g, cluster, PlaceOptions(quiet=True, seed=s)).ops.values())
                  for s in range(4)}
    assert len(placements) > 1


def _msr_doc(name: str) -> dict:
    import json

    return json.loads((MSR / name).read_text())


@pytest.mark.parametrize("name", ["bert_l-3_training_op.json", "resnet50_inference_op.json",
                                  "gnmt_training_layer.json"])
def test_msr_pipeline_end_to_end(name: str) -> None:
    g = graph_from_json(_msr_doc(name), name)
    cluster = msr_cluster(4)
    pipeline = "coarsen{target=100},place{algo=m-etf},expand" + (",simulate" if "simulate" in PASSES else "")
    log = io.StringIO()
    g = PassManager(pipeline).run(g, PassContext(cluster=cluster, log=log))
    plan = read_plan_attrs(g)
    assert plan is not None
    check_plan(g, cluster, plan)
    assert plan.lower_bound is not None and plan.lower_bound <= plan.makespan * (1 + 1e-9)
    assert not any(n.startswith("coarse plan") for n in plan.notes)
    assert "place: candidate (m-etf):" in log.getvalue()
    assert len({op.get("group") for op in g.ops}) == 100  # these graphs coarsen exactly to the target


def _plans_that_fit(graph: Graph, cluster: Cluster, algos: tuple[str, ...]) -> list[Plan]:
    """The plans of the heuristics that find one (a greedy can run out of memory where others fit)."""
    plans = []
    for a in algos:
        try:
            plans.append(ALGORITHMS[a].run(graph, cluster, QUIET))
        except PestoError:
            continue
    assert plans
    return plans


@pytest.mark.slow
def test_an_exact_engine_on_a_coarse_graph_never_loses_to_a_heuristic_on_the_fine_graph() -> None:
    """ResNet-50 training at 4 devices: coarsening to 200 groups loses parallelism m-ETF keeps on the
    fine graph, so `place` keeps m-ETF's fine plan, labelled ilp, and says so."""
    graph = graph_from_json(_msr_doc("resnet50_training_layer.json"))
    cluster = msr_cluster(4)
    fine_best = min(plan.makespan for plan in _plans_that_fit(graph, cluster, ("m-etf", "m-sct", "m-topo", "expert")))
    for op, g in zip(graph.ops, coarsen_groups(graph, 200, cluster)):
        op.set("group", g)
    plan = place_graph(graph, cluster, "ilp", PlaceOptions(time_limit=2, quiet=True))
    expanded = expand_plan(graph, cluster, read_plan_attrs(graph))
    assert expanded.makespan <= fine_best * (1 + 1e-9)
    assert plan.algorithm == "ilp" and plan.solver["winner"].endswith("(fine graph)")
    assert any("beat the ilp plan of the coarse graph" in note for note in plan.notes)


def test_expand_orders_a_zero_length_producer_before_its_consumer_despite_rounding() -> None:
    """A solver's plan may print a zero-length producer's start one rounding error after its
    consumer's; ordering by start alone deadlocked there (bert_l-3_training_op, k=4, LNS)."""
    from pesto_ir.schedule.plan import OpSlot, Plan

    graph = graph_from_json({"format": "pesto-graph/1", "name": "tie", "nodes": [
        {"id": "a", "cost": 0.001}, {"id": "z", "cost": 0.0}, {"id": "b", "cost": 0.001}],
        "edges": [{"src": "a", "dst": "z", "bytes": 8}, {"src": "z", "dst": "b", "bytes": 8}]})
    cluster = msr_cluster(2)
    t = 0.0004013703830137352
    plan = Plan("tie", "cpsat-lns", list(cluster.names), {
        "a": OpSlot("gpu0", t - 0.001, t), "z": OpSlot("gpu0", t, t),
        "b": OpSlot("gpu0", 0.00040137038301373516, 0.00040137038301373516 + 0.001)})
    assert plan.ops["z"].start > plan.ops["b"].start
    fine = expand_plan(graph, cluster, plan)
    assert fine.device_order("gpu0") == ["a", "z", "b"]


@pytest.mark.parametrize("algo", ["m-etf", pytest.param("ilp", marks=pytest.mark.slow), "auto"])
def test_infinite_memory_means_no_limit_for_every_engine(algo: str) -> None:
    """`Cluster.with_memory(inf)` (no limit, as documented) crashed the timed plan's overshoot
    (ceil of -inf) and the MILP worker's request (a cluster file holds finite figures only)."""
    import math

    from pesto_ir import load

    cluster = Cluster.homogeneous(2, "h100").with_memory(math.inf)
    graph = PassManager(f"annotate-costs,place{{algo={algo} time-limit=2}},simulate").run(
        load(Path(__file__).resolve().parents[1] / "examples" / "mlp_train_step.pir"),
        PassContext(cluster=cluster, quiet=True))
    plan = read_plan_attrs(graph)
    assert plan is not None and math.isfinite(plan.makespan) and plan.makespan > 0


def test_screening_keeps_the_reason_after_an_introducing_line() -> None:
    from pesto_ir.util.errors import first_reason

    e = PestoError("the 1f1b plan for 'g' is invalid:\n  out of memory: gpu0 peaks at 9 GiB\n  more")
    assert first_reason(e) == "the 1f1b plan for 'g' is invalid: out of memory: gpu0 peaks at 9 GiB"
    assert first_reason(PestoError("no room\nsecond")) == "no room"
