"""Critical-path moves (passes/placement/search/local_search.py): never worse, always valid, deterministic, and they
find the move a plan obviously needs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import placement_problems

from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passes.placement.search.local_search import improve_by_moves
from pesto_ir.schedule.simulate import simulate
from pesto_ir.schedule.validate import check_plan

QUIET = PlaceOptions(quiet=True)


def _split_chain() -> tuple[Graph, Cluster]:
    """a -> b -> c, with 1 GB between them: one device does it in 3 ms, two pay 20 ms per hop."""
    graph = graph_from_json({"format": "pesto-graph/1", "name": "chain", "nodes": [
        {"id": "a", "cost": 0.001, "memory": 10}, {"id": "b", "cost": 0.001, "memory": 10, "colocate": "w"},
        {"id": "c", "cost": 0.001, "memory": 10, "colocate": "w"}],
        "edges": [{"src": "a", "dst": "b", "bytes": 10**9}, {"src": "b", "dst": "c", "bytes": 10**9}]})
    return graph, Cluster.homogeneous(2, "v100", memory=100, latency=1e-5, bandwidth=50e9)


def test_a_transfer_on_the_critical_path_is_moved_away() -> None:
    graph, cluster = _split_chain()
    start = simulate(graph, cluster, {"a": "gpu0", "b": "gpu1", "c": "gpu1"}, {"gpu0": ["a"], "gpu1": ["b", "c"]})
    assert start.makespan > 0.02
    better = check_plan(graph, cluster, improve_by_moves(graph, cluster, start, 5.0))
    assert better.makespan == 0.003
    assert len({slot.device for slot in better.ops.values()}) == 1 and not better.transfers
    assert "critical-path moves: 1 improving moves" in better.notes[-1]


def test_a_move_that_overfills_a_device_is_not_made() -> None:
    graph, cluster = _split_chain()
    cluster = cluster.with_memory(25)  # two of the three ops fit on a device, not three
    start = simulate(graph, cluster, {"a": "gpu0", "b": "gpu1", "c": "gpu1"}, {"gpu0": ["a"], "gpu1": ["b", "c"]})
    assert improve_by_moves(graph, cluster, start, 5.0).makespan == start.makespan


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=placement_problems(max_ops=12, tight=True))
def test_moves_keep_plans_valid_never_worse_and_deterministic(problem: tuple[Graph, Cluster]) -> None:
    graph, cluster = problem
    try:
        start = check_plan(graph, cluster, ALGORITHMS["m-topo"].run(graph, cluster, QUIET))
    except Exception:  # noqa: BLE001 - memory too tight for the greedy start: nothing to improve
        return
    moved = check_plan(graph, cluster, improve_by_moves(graph, cluster, start, 2.0))
    assert moved.makespan <= start.makespan
    again = improve_by_moves(graph, cluster, start, 2.0)
    assert {n: (s.device, s.start) for n, s in again.ops.items()} == {n: (s.device, s.start) for n, s in moved.ops.items()}
    for op in graph.ops:  # colocated ops stay together
        group = op.get("colocate")
        if group is not None:
            mates = {moved.ops[o.name].device for o in graph.ops if o.get("colocate") == group}
            assert len(mates) == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=placement_problems(), data=st.data())
def test_the_start_time_sequence_is_the_orders_of_the_start_times(problem: tuple[Graph, Cluster],
                                                                   data: st.DataObject) -> None:
    """The moves split one sequence of the incumbent's ops by start time among the devices of each
    trial placement: the orders `order_from_priority` gives with the start times as priorities."""
    from pesto_ir.passes.placement.search.local_search import _by_start, _split
    from pesto_ir.schedule.simulate import order_from_priority

    graph, cluster = problem
    placement = {op.name: data.draw(st.sampled_from(cluster.names)) for op in graph.ops}
    priority = {op.name: data.draw(st.floats(0.0, 1.0)) for op in graph.ops}
    plan = simulate(graph, cluster, placement, order_from_priority(graph, placement, priority))
    starts = {name: slot.start for name, slot in plan.ops.items()}
    sequence = _by_start(graph, plan)
    trial = {op.name: data.draw(st.sampled_from(cluster.names)) for op in graph.ops}
    assert _split(sequence, trial) == order_from_priority(graph, trial, starts)
