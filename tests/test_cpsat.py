"""The `cpsat` and `auto` placement algorithms and large-neighbourhood search.

CP-SAT is checked against the exact brute force of `test_ilp.py` (every placement, device order
and link order) and against the MILP on the same graphs; LNS and auto must never return a plan
worse than their start; every plan goes through `check_plan`.
"""

from __future__ import annotations

import dataclasses
import io
import sys
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import placement_problems
from test_ilp import (
    brute_exact,
    diamond,
    fork_join,
    gpu_and_cpu,
    layered_dag,
    link_order_matters,
    make_graph,
    round_robin_plan,
    small_dags,
    two_chains,
    two_gpus,
)

from pesto_ir.cluster.devices import Device, Link
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost
from pesto_ir.ir.attributes import BytesAttr
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.budget import Budget
from pesto_ir.passes.placement.exact.common import earliest_schedule
from pesto_ir.passes.placement.exact.cpsat import place_cpsat
from pesto_ir.passes.placement.exact.cpsat_problem import Problem, Request, tick_for
from pesto_ir.passes.placement.exact.cpsat_worker import SolverProcess
from pesto_ir.passes.placement.exact.ilp import place_ilp
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.search.auto import place_auto
from pesto_ir.passes.placement.search.lns import _Search, improve_with_lns, relaxed_memory
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util.errors import PestoError

TOL = 1e-6
QUIET = PlaceOptions(time_limit=20, quiet=True)


def assert_optimal(graph: Graph, cluster: Cluster, plan: Any, exact: float | None = None) -> float:
    exact = brute_exact(graph, cluster) if exact is None else exact
    check_plan(graph, cluster, plan)
    assert plan.solver["status"] == "optimal", plan.solver
    assert plan.makespan == pytest.approx(exact, abs=TOL, rel=TOL)
    assert plan.solver["bound"] <= plan.makespan + 1e-12
    return exact


# ---------------------------------------------------------------- optimality, and agreement with the MILP

@pytest.mark.parametrize("build", [diamond, fork_join, two_chains])
def test_matches_brute_force_and_the_milp(build: Any) -> None:
    graph, cluster = build(), two_gpus()
    plan = place_cpsat(graph, cluster, QUIET)
    exact = assert_optimal(graph, cluster, plan)
    assert plan.algorithm == "cpsat" and plan.solver["name"] == "cp-sat"
    assert plan.solver["gap"] <= 1e-6
    assert place_ilp(graph, cluster, QUIET).makespan == pytest.approx(exact, abs=TOL)


def test_keeps_a_link_order_first_come_first_served_cannot() -> None:
    graph, cluster = link_order_matters(), two_gpus(memory=15e9)
    plan = place_cpsat(graph, cluster, QUIET)
    exact = assert_optimal(graph, cluster, plan)
    assert place_ilp(graph, cluster, QUIET).makespan == pytest.approx(exact, abs=TOL)
    assert any("replayed" in n for n in plan.notes)


def test_heterogeneous_devices_and_links() -> None:
    nodes = [{"id": "a", "cost": {"v100": 0.01, "cpu": 0.05}}, {"id": "b", "cost": {"v100": 0.2, "cpu": 2.0}},
             {"id": "c", "cost": {"v100": 0.2, "cpu": 0.25}}, {"id": "d", "cost": {"v100": 0.01, "cpu": 0.05}}]
    graph = make_graph(nodes, [("a", "b", 10**6), ("a", "c", 10**6), ("b", "d", 10**6), ("c", "d", 10**6)])
    cluster = gpu_and_cpu()
    plan = place_cpsat(graph, cluster, QUIET)
    assert plan.ops["b"].device == "gpu0"
    exact = assert_optimal(graph, cluster, plan)
    assert exact < 0.42  # better than everything on the GPU
    slow_back = Cluster(cluster.devices, {**cluster.links, ("cpu0", "gpu0"): Link("cpu0", "gpu0", 0.05, 1e8)})
    assert_optimal(graph, slow_back, place_cpsat(graph, slow_back, QUIET))


def test_results_read_by_different_consumers_are_sent_only_where_needed() -> None:
    """`a` has two results (tensors of different sizes) read by different ops: only the one read
    on the other device is sent, as `transfer_bytes` says."""
    nodes = [{"id": "a", "cost": 0.1}, {"id": "b", "cost": 0.3}, {"id": "c", "cost": 0.3}, {"id": "d", "cost": 0.05}]
    graph = make_graph(nodes, [("a", "b", 10**9), ("a", "c", 10**6), ("b", "d", 10**6), ("c", "d", 10**6)])
    cluster = two_gpus(bandwidth=1e9, latency=1e-3)
    assert len(graph.op("a").results) == 2
    plan = place_cpsat(graph, cluster, QUIET)
    exact = assert_optimal(graph, cluster, plan)
    assert place_ilp(graph, cluster, QUIET).makespan == pytest.approx(exact, abs=TOL)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags())
def test_random_small_dags_agree_with_brute_force_and_the_milp(case: tuple[Graph, Cluster]) -> None:
    graph, cluster = case
    exact = assert_optimal(graph, cluster, place_cpsat(graph, cluster, QUIET))
    assert place_ilp(graph, cluster, QUIET).makespan == pytest.approx(exact, abs=TOL, rel=TOL)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placement_problems(max_ops=8, max_devices=3, tight=True))
def test_random_problems_give_a_valid_plan_or_a_clean_memory_error(problem: tuple[Graph, Cluster]) -> None:
    """Mixed device kinds and links, zero costs, colocation and tight memory (tests/strategies.py)."""
    graph, cluster = problem
    try:
        plan = place_cpsat(graph, cluster, PlaceOptions(time_limit=3, quiet=True))
    except PestoError as e:
        assert "bytes" in str(e) or "memory" in str(e)
        return
    check_plan(graph, cluster, plan)
    assert plan.solver["bound"] <= plan.makespan + 1e-12


# ---------------------------------------------------------------- model details

def test_resolution_puts_the_upper_bound_at_1e8_to_1e9_ticks() -> None:
    for ub in (3e-6, 0.0924, 1.0, 1.78, 250.0):
        assert 1e8 <= ub / tick_for(ub) < 1e9 * (1 + 1e-9)
    graph, cluster = fork_join(), two_gpus()
    plan = place_cpsat(graph, cluster, QUIET)
    assert plan.solver["resolution"] == pytest.approx(1e-9)


def test_durations_round_down_so_the_bound_is_a_true_lower_bound() -> None:
    graph = make_graph([{"id": "a", "cost": 1.23456789e-3}, {"id": "b", "cost": 0.0}], [("a", "b", 10)])
    prob = Problem.build(graph, two_gpus(), 1e-3, 0.0)
    assert prob.cost[prob.index["a"]][0] * prob.tick <= 1.23456789e-3
    assert prob.idle[prob.index["b"]] == [True, True]


def test_ops_that_take_no_time_wait_for_their_inputs_only() -> None:
    """A zero-cost op may sit inside another op's run (docs/contracts.md allows it); the exact timing of
    a solution must not hold it behind the device's previous op, as `simulate` does."""
    nodes = [{"id": "src", "cost": 0.1, "colocate": "x"}, {"id": "long", "cost": 1.0, "colocate": "y"},
             {"id": "zero", "cost": 0.0, "colocate": "y"}, {"id": "sink", "cost": 0.1, "colocate": "x"}]
    graph = make_graph(nodes, [("src", "zero", 10**6), ("zero", "sink", 10**6)])
    cluster = two_gpus(bandwidth=1e9, latency=1e-3)
    placement = {"src": "gpu0", "sink": "gpu0", "long": "gpu1", "zero": "gpu1"}
    order = {"gpu0": ["src", "sink"], "gpu1": ["long", "zero"]}
    plan = earliest_schedule(graph, cluster, placement, order, {})
    check_plan(graph, cluster, plan)
    assert plan.ops["zero"].start == pytest.approx(0.102)  # src ends at 0.1, its tensor takes 2 ms
    assert plan.makespan == pytest.approx(1.0)


@pytest.mark.slow
def test_deterministic() -> None:
    graph = layered_dag(14, seed=7)
    cluster = Cluster.homogeneous(3, "v100", latency=1e-5, bandwidth=50e9)
    a = place_cpsat(graph, cluster, PlaceOptions(time_limit=20, quiet=True, seed=1))
    b = place_cpsat(graph, cluster, PlaceOptions(time_limit=20, quiet=True, seed=1))
    assert a.solver["status"] == "optimal"
    assert {n: s.device for n, s in a.ops.items()} == {n: s.device for n, s in b.ops.items()}
    assert a.makespan == b.makespan
    assert place_ilp(graph, cluster, PlaceOptions(time_limit=20, quiet=True)).makespan == \
        pytest.approx(a.makespan, rel=1e-6)


def test_warm_start_is_never_made_worse_and_the_bound_holds() -> None:
    graph = layered_dag(40, seed=3)
    cluster = Cluster.homogeneous(4, "v100", latency=1e-5, bandwidth=50e9)
    warm = round_robin_plan(graph, cluster)
    plan = place_cpsat(graph, cluster, PlaceOptions(time_limit=2, quiet=True, warm_start=warm))
    check_plan(graph, cluster, plan)
    assert plan.makespan <= warm.makespan + 1e-12
    assert plan.solver["status"] in {"optimal", "feasible"}
    assert lower_bound(graph, cluster) <= plan.solver["bound"] + 1e-12 <= plan.makespan + 2e-12


def test_without_a_warm_start_it_builds_one() -> None:
    graph = layered_dag(12, seed=5)
    cluster = two_gpus(bandwidth=50e9, latency=1e-5)
    plan = place_cpsat(graph, cluster, PlaceOptions(time_limit=5, quiet=True))
    check_plan(graph, cluster, plan)
    assert plan.makespan <= sum(op_cost(op, cluster.devices[0]) for op in graph.ops) + 1e-12


def test_invalid_warm_start_is_ignored_with_a_note() -> None:
    graph, cluster = diamond(), two_gpus()
    other = round_robin_plan(fork_join(), cluster)
    plan = place_cpsat(graph, cluster, PlaceOptions(time_limit=10, quiet=True, warm_start=other))
    assert any("not a valid plan" in n for n in plan.notes)
    assert_optimal(graph, cluster, plan)


def test_warm_start_at_the_lower_bound_needs_no_solve() -> None:
    nodes = [{"id": f"n{i}", "cost": 0.1} for i in range(3)]
    graph = make_graph(nodes, [("n0", "n1", 1), ("n1", "n2", 1)])
    plan = place_cpsat(graph, two_gpus(), QUIET)
    assert plan.solver["status"] == "optimal" and plan.makespan == pytest.approx(0.3)
    assert any("no CP-SAT solve needed" in n for n in plan.notes)


def test_progress_reports_incumbent_and_bound_unless_quiet() -> None:
    graph, cluster = fork_join(), two_gpus()
    log = io.StringIO()
    place_cpsat(graph, cluster, PlaceOptions(time_limit=10, log=log))
    text = log.getvalue()
    assert "incumbent" in text and "bound" in text and "optimal" in text and "1 tick = 1e-09 s" in text
    quiet = io.StringIO()
    place_cpsat(graph, cluster, PlaceOptions(time_limit=10, log=quiet, quiet=True))
    assert quiet.getvalue() == ""


def test_or_tools_never_loads_beside_cbc() -> None:
    """OR-tools and python-mip's CBC ship clashing builds of libOsi.so.0: CP-SAT must run in its
    worker process, so the MILP keeps working in this one after a CP-SAT solve."""
    graph, cluster = diamond(), two_gpus()
    place_cpsat(graph, cluster, QUIET)
    assert "ortools.sat.python.cp_model" not in sys.modules
    assert place_ilp(graph, cluster, QUIET).solver["status"] == "optimal"


def test_a_dead_worker_is_restarted_and_a_failed_solve_is_a_clean_error() -> None:
    graph, cluster = diamond(), two_gpus()
    prob = Problem.build(graph, cluster, 1.0, lower_bound(graph, cluster))
    with SolverProcess() as proc:
        proc.start()
        proc.proc.kill()
        proc.proc.wait()
        assert proc.solve(Request(prob, None, 5.0, time.monotonic() + 5.0)).status == "optimal"
        broken = dataclasses.replace(prob, allowed=[[5]] * len(prob.allowed))  # a device that is not there
        with pytest.raises(PestoError, match="CP-SAT failed: "):
            proc.solve(Request(broken, None, 5.0, time.monotonic() + 5.0))
        assert proc.solve(Request(prob, None, 5.0, time.monotonic() + 5.0)).status == "optimal"


# ---------------------------------------------------------------- large-neighbourhood search

@pytest.mark.parametrize("engine", ["cpsat", "ilp"])
@pytest.mark.slow
def test_lns_never_returns_a_worse_plan(engine: str) -> None:
    graph = layered_dag(40, seed=3)
    cluster = Cluster.homogeneous(4, "v100", latency=1e-5, bandwidth=50e9)
    start = round_robin_plan(graph, cluster)
    plan = improve_with_lns(graph, cluster, PlaceOptions(time_limit=3, quiet=True), engine=engine, start=start)
    check_plan(graph, cluster, plan)
    assert plan.makespan <= start.makespan + 1e-12
    assert plan.algorithm == f"{engine}-lns"
    assert plan.solver["steps"] >= 1 and plan.solver["bound"] <= plan.makespan
    if engine == "cpsat":
        assert plan.makespan < start.makespan  # round robin is far from good


@pytest.mark.slow
def test_lns_keeps_memory_and_colocation_on_heterogeneous_devices() -> None:
    graph = layered_dag(30, seed=4)
    for i, op in enumerate(graph.ops):
        op.set("memory", 10**9)  # resident, its output inside it (a GPU holds 13 ops, with room for copies)
        op.attrs["activation"] = BytesAttr(0)
        if i % 7 == 0:
            op.set("colocate", "p")
        op.set("cost", {"v100": float(op.get("cost")), "cpu": 4 * float(op.get("cost"))})
    devices = [Device.of_kind("gpu0", "v100", 13.9e9), Device.of_kind("gpu1", "v100", 13.9e9),
               Device.of_kind("cpu0", "cpu", 100e9)]
    cluster = Cluster.fully_connected(devices, latency=1e-5, bandwidth=10e9)
    start = place_auto(graph, cluster, PlaceOptions(time_limit=0.1, quiet=True))
    plan = improve_with_lns(graph, cluster, PlaceOptions(time_limit=3, quiet=True, seed=3), start=start)
    check_plan(graph, cluster, plan)
    assert plan.makespan <= start.makespan + 1e-12
    assert len({plan.ops[op.name].device for op in graph.ops if op.get("colocate") == "p"}) == 1


def test_lns_reports_progress_and_rejects_an_unknown_engine() -> None:
    graph = layered_dag(30, seed=2)
    cluster = Cluster.homogeneous(3, "v100", latency=1e-5, bandwidth=50e9)
    log = io.StringIO()
    improve_with_lns(graph, cluster, PlaceOptions(time_limit=2, log=log), start=round_robin_plan(graph, cluster))
    assert "incumbent" in log.getvalue() and "bound" in log.getvalue()
    with pytest.raises(PestoError, match="unknown LNS engine 'gurobi'"):
        improve_with_lns(graph, cluster, QUIET, engine="gurobi")


# ---------------------------------------------------------------- auto

def test_auto_solves_a_small_graph_exactly_and_says_which_engine_won() -> None:
    graph, cluster = fork_join(), two_gpus()
    plan = place_auto(graph, cluster, QUIET)
    assert_optimal(graph, cluster, plan)
    assert plan.algorithm == "auto" and plan.solver["winner"] == "cpsat"
    assert any("cpsat won" in n and "above the lower bound" in n for n in plan.notes)


def test_auto_keeps_a_heuristic_plan_at_the_lower_bound() -> None:
    nodes = [{"id": f"n{i}", "cost": 0.1} for i in range(3)]
    graph = make_graph(nodes, [("n0", "n1", 1), ("n1", "n2", 1)])
    plan = place_auto(graph, two_gpus(), QUIET)
    assert plan.solver["status"] == "optimal" and plan.solver["gap"] == 0.0
    assert plan.solver["winner"] != "cpsat"


@pytest.mark.slow
def test_auto_on_four_devices_starts_from_its_own_plan_on_two() -> None:
    """A plan on two of the devices is a plan on all four: auto places the graph on the first two
    first and offers that plan, so its result on four is no slower. Its bound is four devices' (the
    two-device plan's bound, higher, is not carried over)."""
    import re

    graph = layered_dag(80, seed=9)
    cluster = Cluster.homogeneous(4, "v100", latency=1e-5, bandwidth=50e9)
    warm = round_robin_plan(graph, cluster)  # far from the bound: the heuristics would already be at it
    plan = place_auto(graph, cluster, PlaceOptions(time_limit=4, quiet=True, warm_start=warm))
    check_plan(graph, cluster, plan)
    found = re.search(r"auto on 2 devices ([\d.]+) (\w+)", plan.solver["portfolio"])
    assert found, plan.solver["portfolio"]
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}[found.group(2)]
    assert plan.makespan <= float(found.group(1)) * scale * (1 + 1e-3)
    assert plan.lower_bound is not None and plan.lower_bound <= plan.makespan
    assert plan.lower_bound <= max(lower_bound(graph, cluster), plan.solver["bound"])
    assert plan.lower_bound < lower_bound(graph, Cluster.homogeneous(2, "v100", latency=1e-5, bandwidth=50e9))


def test_auto_says_so_when_the_graph_does_not_fit_on_half_the_devices() -> None:
    graph = layered_dag(30, seed=4)
    for op in graph.ops:
        op.set("memory", 10**9)  # resident: 30 GB in all, where two devices hold 2 x 10 GB
        op.attrs["activation"] = BytesAttr(0)
    cluster = Cluster.homogeneous(4, "v100", memory=10e9, latency=1e-5, bandwidth=10e9)
    plan = place_auto(graph, cluster, PlaceOptions(time_limit=3, quiet=True))
    check_plan(graph, cluster, plan)
    assert any("no plan on 2 of the 4 devices to start from" in n for n in plan.notes), plan.notes


@pytest.mark.slow
def test_auto_uses_lns_on_larger_graphs_and_is_never_worse_than_its_start() -> None:
    graph = layered_dag(80, seed=9)
    cluster = Cluster.homogeneous(4, "v100", latency=1e-5, bandwidth=50e9)
    warm = round_robin_plan(graph, cluster)
    plan = place_auto(graph, cluster, PlaceOptions(time_limit=3, quiet=True, warm_start=warm))
    check_plan(graph, cluster, plan)
    assert plan.makespan < warm.makespan
    assert "cpsat-lns" in plan.solver["portfolio"] and plan.solver["winner"] == "cpsat-lns"


def _memory_tight_lns_search(k: int) -> _Search:
    """An LNS run on ResNet-50's training layers on k V100s, started from ETF's plan: it fits the
    16 GiB by tensor lifetimes, not by the models' whole-step count of memory."""
    from bench.zoo import msr_cluster, msr_model
    from pesto_ir.passes.placement.exact.cpsat_worker import shared_solver
    from pesto_ir.passes.placement.heuristics.portfolio import HEURISTICS

    model = msr_model("resnet50_training_layer")
    graph, cluster = model.build(), msr_cluster(k)
    options = PlaceOptions(time_limit=30, seed=0, quiet=True)
    start = check_plan(graph, cluster, HEURISTICS["etf"](graph, cluster, options))
    return _Search(graph, cluster, options, "cpsat", start, Budget.start(options.time_limit), shared_solver())


def test_lns_steps_on_a_memory_tight_plan_are_not_infeasible() -> None:
    """Its own incumbent is a solution of every step's model: the step's memory rule lets each device
    hold what the incumbent holds there, and the plans a step finds are kept only if their
    lifetimes fit (ETF's plan broke the whole-step count, and every small step was infeasible)."""
    search = _memory_tight_lns_search(4)
    relaxed = relaxed_memory(search.problem, search._devices())
    assert any(r > c for r, c in zip(relaxed, search.problem.memory))  # the case: the whole-step count overflows
    result, plan = search._solve(search._neighbourhood("time slice"))
    assert result.status in ("optimal", "feasible"), result.status
    assert plan is not None and plan.makespan <= search.best.makespan * (1 + 1e-9)
    check_plan(search.graph, search.cluster, plan)


def test_lns_offers_one_empty_device_of_each_kind() -> None:
    """Five empty, interchangeable V100s are one choice, not five (a step searched them all)."""
    search = _memory_tight_lns_search(8)
    dev = search._devices()
    used = set(dev)
    assert 1 < len(used) < 7
    offered = search._offered(dev)
    assert used < offered and len(offered) == len(used) + 1
    free = search._neighbourhood("subgraph")
    assert all(set(devices) <= offered for devices in free.values())


def test_auto_does_not_start_cp_sat_from_scratch_on_a_model_it_cannot_build_in_time() -> None:
    """Where no heuristic plan fits in memory, CP-SAT is the only engine that needs no start;
    its model of 2,000 ops on 2 devices takes longer to build (by the work clock's rate) than a
    3 s limit has, so auto says so at once rather than spending the limit building it."""
    nodes = [{"id": f"op{i}", "cost": 1e-3, "memory": 20 * 10**9} for i in range(2000)]
    graph = make_graph(nodes, [(f"op{i}", f"op{i + 1}", 10**3) for i in range(1999)], "too_big_to_build")
    with pytest.raises(PestoError, match=r"CP-SAT's model of 2000 ops on 2 devices takes about 7.2s of work to build, "
                                         r"more than the .*s left to search from scratch"):
        place_auto(graph, two_gpus(), PlaceOptions(time_limit=3, quiet=True))
