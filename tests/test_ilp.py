"""The `ilp` placement algorithm: optimal against brute force, constraints kept, never worse.

Two brute forces over graphs of at most 6 ops on 2 devices:

- `brute_simulated`: every placement x every topological order, run through `simulate` (links
  first come, first served). It is an upper bound of the true optimum.
- `brute_exact`: every placement x every per-device order x every per-link transfer order, each
  evaluated as its earliest schedule by an evaluator written here (not the one under test). Any
  valid plan keeps some such orders and can only get earlier when left-shifted, so this is the
  true optimum of the plan rules in docs/contracts.md, which the MILP models. It can beat
  `brute_simulated` when holding a link for a later, more urgent tensor pays.
"""

from __future__ import annotations

import io
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, op_memory
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.exact import ilp as algo_ilp
from pesto_ir.passes.placement.exact.cbc_log import parse_cbc_line
from pesto_ir.passes.placement.exact.ilp import place_ilp
from pesto_ir.passes.placement.exact.ilp_instance import Instance, relabel_for_symmetry
from pesto_ir.passes.placement.exact.ilp_model import highs_available
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import OpSlot, Plan, Transfer
from pesto_ir.schedule.simulate import simulate, transfer_bytes
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util.errors import PestoError

TOL = 1e-6
QUIET = PlaceOptions(time_limit=30, quiet=True)


# ---------------------------------------------------------------- graphs and clusters

def make_graph(nodes: list[dict[str, Any]], edges: list[tuple[str, str, int]], name: str = "g") -> Graph:
    return graph_from_json({"format": "pesto-graph/1", "name": name, "nodes": nodes,
                            "edges": [{"src": a, "dst": b, "bytes": n} for a, b, n in edges]})


def two_gpus(memory: float = 16e9, bandwidth: float = 1e9, latency: float = 1e-3) -> Cluster:
    return Cluster.homogeneous(2, "v100", memory=memory, latency=latency, bandwidth=bandwidth)


def gpu_and_cpu() -> Cluster:
    return Cluster.fully_connected([Device.of_kind("gpu0", "v100"), Device.of_kind("cpu0", "cpu")],
                                   latency=1e-3, bandwidth=1e9)


def diamond() -> Graph:
    nodes = [{"id": "a", "cost": 0.1}, {"id": "b", "cost": 0.4}, {"id": "c", "cost": 0.4}, {"id": "d", "cost": 0.1}]
    return make_graph(nodes, [("a", "b", 10**7), ("a", "c", 10**7), ("b", "d", 10**7), ("c", "d", 10**7)], "diamond")


def fork_join() -> Graph:
    nodes = [{"id": "s", "cost": 0.05}] + [{"id": f"w{i}", "cost": 0.1 * (i + 1)} for i in range(4)] + \
        [{"id": "t", "cost": 0.05}]
    edges = [("s", f"w{i}", 5 * 10**6) for i in range(4)] + [(f"w{i}", "t", 2 * 10**7) for i in range(4)]
    return make_graph(nodes, edges, "fork_join")


def two_chains() -> Graph:
    nodes = [{"id": f"{c}{i}", "cost": 0.1 + 0.05 * i} for c in "pq" for i in range(3)]
    edges = [(f"{c}{i}", f"{c}{i + 1}", 10**8) for c in "pq" for i in range(2)]
    return make_graph(nodes, edges, "two_chains")


def link_order_matters() -> Graph:
    """`big` then `small` run on one device, their readers on the other (colocation and memory).
    `big`'s tensor takes a second to send and is read last; `small`'s is quick and feeds the long
    `urgent`. Sending in finishing order delays `urgent` by that second; holding the link does not."""
    # 12 GB resident per group and 15 GB devices: the groups cannot share one, and there is room
    # for the copies the other receives (1 GB + 1 MB)
    nodes = [{"id": "big", "memory": 6 * 10**9, "cost": 0.1, "colocate": "src"},
             {"id": "small", "memory": 6 * 10**9, "cost": 0.2, "colocate": "src"},
             {"id": "urgent", "memory": 6 * 10**9, "cost": 1.0, "colocate": "dst"},
             {"id": "late", "memory": 6 * 10**9, "cost": 0.05, "colocate": "dst"}]
    edges = [("big", "small", 10**9), ("big", "late", 10**9), ("small", "urgent", 10**6)]
    return make_graph(nodes, edges, "link_order")


# ---------------------------------------------------------------- brute forces

def placements(graph: Graph, cluster: Cluster) -> list[dict[str, str]]:
    """Every placement that keeps colocation groups together and fits in memory."""
    out = []
    for devs in itertools.product(cluster.names, repeat=len(graph.ops)):
        pl = {op.name: d for op, d in zip(graph.ops, devs)}
        groups: dict[str, set[str]] = {}
        for op in graph.ops:
            if op.get("colocate") is not None:
                groups.setdefault(str(op.get("colocate")), set()).add(pl[op.name])
        used = {d.name: sum(op_memory(op) for op in graph.ops if pl[op.name] == d.name) for d in cluster.devices}
        if all(len(s) == 1 for s in groups.values()) and all(used[d.name] <= d.memory for d in cluster.devices):
            out.append(pl)
    return out


def topological_orders(graph: Graph) -> list[list[str]]:
    preds = {op.name: {p.name for p in op.producers()} for op in graph.ops}
    out: list[list[str]] = []

    def extend(done: list[str]) -> None:
        if len(done) == len(preds):
            out.append(list(done))
            return
        for n in preds:
            if n not in done and preds[n] <= set(done):
                done.append(n)
                extend(done)
                done.pop()

    extend([])
    return out


def brute_simulated(graph: Graph, cluster: Cluster) -> float:
    best = float("inf")
    orders = topological_orders(graph)
    for pl in placements(graph, cluster):
        for topo in orders:
            order = {d: [n for n in topo if pl[n] == d] for d in cluster.names}
            best = min(best, simulate(graph, cluster, pl, order).makespan)
    return best


def brute_exact(graph: Graph, cluster: Cluster) -> float:
    best = float("inf")
    ancestors = {op.name: set() for op in graph.ops}
    for op in graph.topo_order():
        for p in op.producers():
            ancestors[op.name] |= ancestors[p.name] | {p.name}
    for pl in placements(graph, cluster):
        sends = {(op.name, dst): nbytes for op in graph.ops for dst, nbytes in transfer_bytes(op, pl).items()}
        per_device = [[list(seq) for seq in itertools.permutations([o.name for o in graph.ops if pl[o.name] == d])
                       if all(not (set(seq[k + 1:]) & ancestors[n]) for k, n in enumerate(seq))]
                      for d in cluster.names]
        links = [(a, b) for a in cluster.names for b in cluster.names if a != b]
        per_link = [list(itertools.permutations([s for s in sends if pl[s[0]] == a and s[1] == b])) for a, b in links]
        for dev_orders in itertools.product(*per_device):
            for link_orders in itertools.product(*per_link):
                t = earliest_makespan(graph, cluster, pl, dev_orders, link_orders, sends)
                best = min(best, t)
    return best


def earliest_makespan(graph: Graph, cluster: Cluster, pl: dict[str, str], dev_orders: Any, link_orders: Any,
                      sends: dict[tuple[str, str], int]) -> float:
    """Makespan of the earliest schedule keeping these orders (inf when they deadlock)."""
    preds: dict[Any, list[Any]] = {}
    dur: dict[Any, float] = {}
    for seq in dev_orders:
        for k, n in enumerate(seq):
            op = graph.op(n)
            preds[n] = ([seq[k - 1]] if k else []) + [
                p.name if pl[p.name] == pl[n] else (p.name, pl[n]) for p in op.producers()]
            dur[n] = op_cost(op, cluster.device(pl[n]))
    for (src, dst), nbytes in sends.items():
        preds[(src, dst)] = [src]
        dur[(src, dst)] = cluster.transfer_time(pl[src], dst, nbytes)
    for seq in link_orders:
        for k in range(1, len(seq)):
            preds[seq[k]].append(seq[k - 1])
    finish: dict[Any, float] = {}
    visiting: set[Any] = set()

    def end(n: Any) -> float:
        if n in finish:
            return finish[n]
        if n in visiting:
            raise RecursionError
        visiting.add(n)
        finish[n] = max((end(p) for p in preds[n]), default=0.0) + dur[n]
        return finish[n]

    try:
        return max(end(op.name) for op in graph.ops)
    except RecursionError:
        return float("inf")


def assert_optimal(graph: Graph, cluster: Cluster, plan: Any) -> float:
    exact = brute_exact(graph, cluster)
    check_plan(graph, cluster, plan)
    assert plan.solver["status"] == "optimal", plan.solver
    assert plan.makespan == pytest.approx(exact, abs=TOL, rel=TOL)
    assert exact <= brute_simulated(graph, cluster) + TOL
    return exact


# ---------------------------------------------------------------- optimality

@pytest.mark.parametrize("build", [diamond, fork_join, two_chains])
def test_matches_brute_force(build: Any) -> None:
    graph, cluster = build(), two_gpus()
    plan = place_ilp(graph, cluster, QUIET)
    exact = assert_optimal(graph, cluster, plan)
    assert plan.makespan == pytest.approx(brute_simulated(graph, cluster), abs=TOL)
    assert plan.solver["name"] == "cbc" and plan.solver["gap"] <= 1e-6
    assert plan.solver["bound"] == pytest.approx(exact, rel=1e-5)
    assert plan.algorithm == "ilp"


def test_keeps_a_link_order_simulation_cannot() -> None:
    graph, cluster = link_order_matters(), two_gpus(memory=15e9)
    plan = place_ilp(graph, cluster, QUIET)
    exact = assert_optimal(graph, cluster, plan)
    assert exact < brute_simulated(graph, cluster) - 0.5
    assert any("link order" in n for n in plan.notes)


def test_heterogeneous_devices() -> None:
    nodes = [{"id": "a", "cost": {"v100": 0.01, "cpu": 0.05}}, {"id": "b", "cost": {"v100": 0.2, "cpu": 2.0}},
             {"id": "c", "cost": {"v100": 0.2, "cpu": 0.25}}, {"id": "d", "cost": {"v100": 0.01, "cpu": 0.05}}]
    graph = make_graph(nodes, [("a", "b", 10**6), ("a", "c", 10**6), ("b", "d", 10**6), ("c", "d", 10**6)])
    cluster = gpu_and_cpu()
    plan = place_ilp(graph, cluster, QUIET)
    assert plan.ops["b"].device == "gpu0"
    assert_optimal(graph, cluster, plan)
    assert plan.makespan < 0.42  # better than everything on the GPU


def test_results_read_by_different_consumers_send_only_what_is_read() -> None:
    """`a` has two results (a big one for `b`, a small one for `c`): a transfer carries the
    results read on its destination only, which the MILP must know to find the optimum."""
    nodes = [{"id": "a", "cost": 0.1}, {"id": "b", "cost": 0.5}, {"id": "c", "cost": 0.5}, {"id": "d", "cost": 0.1}]
    edges = [("a", "b", 10**9), ("a", "c", 10**6), ("b", "d", 10**6), ("c", "d", 10**6)]
    graph, cluster = make_graph(nodes, edges), two_gpus()
    assert len(graph.op("a").results) == 2
    plan = place_ilp(graph, cluster, QUIET)
    assert plan.ops["b"].device == plan.ops["a"].device != plan.ops["c"].device
    assert_optimal(graph, cluster, plan)


def test_one_device_is_optimal_without_a_solve() -> None:
    graph = fork_join()
    cluster = Cluster.homogeneous(1, "v100")
    plan = place_ilp(graph, cluster, QUIET)
    assert plan.solver["status"] == "optimal"
    assert plan.makespan == pytest.approx(sum(op_cost(op, cluster.devices[0]) for op in graph.ops))
    check_plan(graph, cluster, plan)


@st.composite
def small_dags(draw: st.DrawFn) -> tuple[Graph, Cluster]:
    n = draw(st.integers(3, 6))
    costs = [draw(st.integers(1, 20)) / 20 for _ in range(n)]
    hetero = draw(st.booleans())
    nodes: list[dict[str, Any]] = []
    for i, c in enumerate(costs):
        node: dict[str, Any] = {"id": f"n{i}", "cost": {"v100": c, "cpu": c * draw(st.integers(1, 4))} if hetero else c}
        if draw(st.integers(0, 5)) == 0:
            node["colocate"] = "g"
        nodes.append(node)
    edges = [(f"n{i}", f"n{j}", draw(st.integers(0, 4)) * 10**8)
             for j in range(n) for i in range(j) if draw(st.integers(0, 2)) == 0]
    graph = make_graph(nodes, edges, "random")
    cluster = gpu_and_cpu() if hetero else two_gpus(bandwidth=1e9, latency=0.01)
    return graph, cluster


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags())
def test_random_small_dags_are_solved_to_optimality(case: tuple[Graph, Cluster]) -> None:
    graph, cluster = case
    plan = place_ilp(graph, cluster, QUIET)
    assert_optimal(graph, cluster, plan)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags())
def test_the_lower_bound_never_passes_the_optimum(case: tuple[Graph, Cluster]) -> None:
    graph, cluster = case
    assert lower_bound(graph, cluster) <= brute_exact(graph, cluster) * (1 + 1e-9)


# ---------------------------------------------------------------- warm starts, limits, options

def layered_dag(n: int, seed: int) -> Graph:
    import random

    rng = random.Random(seed)
    nodes = [{"id": f"v{i}", "cost": rng.uniform(1e-3, 1e-2)} for i in range(n)]
    edges = [(f"v{j}", f"v{i}", rng.randint(1, 64) * 2**20)
             for i in range(1, n) for j in rng.sample(range(max(0, i - 6), i), min(i, rng.randint(1, 2)))]
    return make_graph(nodes, edges, f"dag{n}")


def round_robin_plan(graph: Graph, cluster: Cluster) -> Any:
    pl = {op.name: cluster.names[i % len(cluster)] for i, op in enumerate(graph.ops)}
    order = {d: [op.name for op in graph.topo_order() if pl[op.name] == d] for d in cluster.names}
    return simulate(graph, cluster, pl, order, algorithm="round-robin")


@pytest.mark.slow
def test_warm_start_is_never_made_worse() -> None:
    graph = layered_dag(40, seed=3)
    cluster = Cluster.homogeneous(4, "v100", latency=1e-5, bandwidth=50e9)
    warm = round_robin_plan(graph, cluster)
    plan = place_ilp(graph, cluster, PlaceOptions(time_limit=2, quiet=True, warm_start=warm))
    check_plan(graph, cluster, plan)
    assert plan.makespan <= warm.makespan + 1e-12
    assert plan.solver["status"] in {"optimal", "feasible"}
    assert plan.solver["bound"] <= plan.makespan + 1e-12
    assert plan.lower_bound == plan.solver["bound"]


@pytest.mark.slow
def test_neighbourhood_search_improves_a_poor_warm_start() -> None:
    graph = layered_dag(30, seed=2)
    cluster = two_gpus(bandwidth=50e9, latency=1e-5)
    warm = round_robin_plan(graph, cluster)
    plan = place_ilp(graph, cluster, PlaceOptions(time_limit=8, quiet=True, warm_start=warm))
    check_plan(graph, cluster, plan)
    assert plan.makespan < 0.95 * warm.makespan
    if plan.solver["status"] != "optimal":
        assert plan.solver["lns_rounds"] > 0
        assert any("neighbourhood search" in n for n in plan.notes)


@pytest.mark.slow
def test_without_a_warm_start_it_builds_one() -> None:
    graph = layered_dag(12, seed=5)
    cluster = two_gpus(bandwidth=50e9, latency=1e-5)
    plan = place_ilp(graph, cluster, PlaceOptions(time_limit=5, quiet=True))
    check_plan(graph, cluster, plan)
    one_device = sum(op_cost(op, cluster.devices[0]) for op in graph.ops)
    assert plan.makespan <= one_device + 1e-12


def test_invalid_warm_start_is_ignored_with_a_note() -> None:
    graph, cluster = diamond(), two_gpus()
    other = round_robin_plan(fork_join(), cluster)
    plan = place_ilp(graph, cluster, PlaceOptions(time_limit=10, quiet=True, warm_start=other))
    assert any("not a valid plan" in n for n in plan.notes)
    assert_optimal(graph, cluster, plan)


@pytest.mark.parametrize("limit, value, message", [
    ("MILP_MAX_OPS", 10, "limit of 10"),
    ("MAX_INTEGERS", 50, "binary variables, more than the limit of 50"),
])
def test_over_a_size_limit_returns_the_warm_start(limit: str, value: int, message: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(algo_ilp, limit, value)
    graph = layered_dag(20, seed=1)
    cluster = two_gpus(bandwidth=50e9, latency=1e-5)
    warm = round_robin_plan(graph, cluster)
    plan = place_ilp(graph, cluster, PlaceOptions(quiet=True, warm_start=warm))
    assert plan.makespan == warm.makespan and plan.solver["status"] == "skipped"
    assert any(message in n for n in plan.notes)
    check_plan(graph, cluster, plan)


def test_warm_start_at_the_lower_bound_needs_no_solve() -> None:
    nodes = [{"id": f"n{i}", "cost": 0.1} for i in range(3)]
    graph = make_graph(nodes, [("n0", "n1", 1), ("n1", "n2", 1)])
    plan = place_ilp(graph, two_gpus(), QUIET)
    assert plan.solver["status"] == "optimal" and plan.makespan == pytest.approx(0.3)


def test_deterministic() -> None:
    # Solved to optimality in ~1 s, far inside the exact solve's share of the limit, so no
    # wall-clock cut decides the plan (a search stopped by its time limit depends on the machine).
    graph = layered_dag(10, seed=7)
    cluster = Cluster.homogeneous(3, "v100", latency=1e-5, bandwidth=50e9)
    # (a limit of 60 s: the exact solve's share is 15 s, room for a loaded machine; it takes ~1 s)
    a = place_ilp(graph, cluster, PlaceOptions(time_limit=60, quiet=True, seed=1))
    b = place_ilp(graph, cluster, PlaceOptions(time_limit=60, quiet=True, seed=1))
    assert a.solver["status"] == "optimal"
    assert {n: s.device for n, s in a.ops.items()} == {n: s.device for n, s in b.ops.items()}
    assert a.makespan == b.makespan


def test_interchangeable_devices_are_named_in_order_of_first_use() -> None:
    # Two optimal plans that differ only by a permutation of identical devices (the exact solve
    # and the neighbourhood search can each return either) come out named the same way.
    graph = layered_dag(10, seed=7)
    cluster = Cluster.homogeneous(3, "v100", latency=1e-5, bandwidth=50e9)
    plan = place_ilp(graph, cluster, PlaceOptions(time_limit=20, quiet=True, seed=1))
    inst = Instance.build(graph, cluster, plan.makespan, lower_bound(graph, cluster))
    swap = {"gpu0": "gpu2", "gpu2": "gpu1", "gpu1": "gpu0"}
    permuted = Plan(plan.graph, plan.algorithm, list(plan.devices),
                    {n: OpSlot(swap[s.device], s.start, s.end) for n, s in plan.ops.items()},
                    [Transfer(t.src, swap[t.src_device], swap[t.to], t.start, t.end, t.nbytes)
                     for t in plan.transfers])
    assert all(permuted.ops[n].device != s.device for n, s in plan.ops.items())
    back = relabel_for_symmetry(inst, permuted)
    assert {n: s.device for n, s in back.ops.items()} == {n: s.device for n, s in plan.ops.items()}
    assert plan.ops[graph.topo_order()[0].name].device == "gpu0"


def test_progress_reports_incumbent_and_bound_unless_quiet() -> None:
    graph, cluster = fork_join(), two_gpus()
    log = io.StringIO()
    place_ilp(graph, cluster, PlaceOptions(time_limit=30, log=log))  # solved in well under 1 s unloaded
    text = log.getvalue()
    assert "incumbent" in text and "bound" in text and "optimal" in text
    quiet = io.StringIO()
    place_ilp(graph, cluster, PlaceOptions(time_limit=10, log=quiet, quiet=True))
    assert quiet.getvalue() == ""


def test_unknown_solver_is_a_clean_error() -> None:
    with pytest.raises(PestoError, match="unknown MILP solver 'gurobi'"):
        place_ilp(diamond(), two_gpus(), PlaceOptions(solver="gurobi", quiet=True))


def test_highs_when_python_mip_can_load_it() -> None:
    options = PlaceOptions(solver="highs", quiet=True, time_limit=10)
    if not highs_available():
        with pytest.raises(PestoError, match="HiGHS"):
            place_ilp(diamond(), two_gpus(), options)
        return
    plan = place_ilp(diamond(), two_gpus(), options)
    assert plan.solver["name"] == "highs"
    assert_optimal(diamond(), two_gpus(), plan)


def test_parses_both_cbc_log_formats() -> None:
    parse = parse_cbc_line
    assert parse("Cbc0012I Integer solution of 1000 found by feasibility pump after 0 iterations") == (1000.0, None)
    assert parse("Cbc0010I After 100 nodes, 5 on tree, 990.5 best solution, best possible 575.7 (2.0 seconds)") \
        == (990.5, 575.7)
    assert parse("      12        3      4            999.3   DiveCoefficient      575.756   42.42%      18.9") \
        == (999.3, 575.756)
    assert parse("  \u2605DiveCoefficient          solution            999.299    0.343") == (999.299, None)
    assert parse("  rounding                 no solution                    0.000") == (None, None)
