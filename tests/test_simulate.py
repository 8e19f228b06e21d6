"""The discrete-event simulator on small graphs with hand-computed schedules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import clusters, graph_docs, roomy_memory

from pesto_ir import parse
from pesto_ir.cluster.devices import Device, Link
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.schedule.simulate import PlanError, Prepared, order_from_priority, simulate, simulate_eager

MS = 1e-3


def cluster(n: int = 2, latency: float = 1 * MS, bandwidth: float = 1e6) -> Cluster:
    """Devices gpu0..; a link moves 1000 bytes in latency + 1 ms."""
    return Cluster.homogeneous(n, "v100", latency=latency, bandwidth=bandwidth)


FORK = parse("""
graph @fork() {
  %a = opaque() {cost = 1ms} : blob[1000]
  %b = opaque(%a) {cost = 2ms} : blob[0]
  %c = opaque(%a) {cost = 3ms} : blob[0]
}
""")


def test_chain_on_one_device_runs_back_to_back() -> None:
    p = simulate(FORK, cluster(), {"a": "gpu0", "b": "gpu0", "c": "gpu0"}, {"gpu0": ["a", "c", "b"]})
    assert [(n, s.start, s.end) for n, s in sorted(p.ops.items())] == [
        ("a", 0, pytest.approx(1 * MS)), ("b", pytest.approx(4 * MS), pytest.approx(6 * MS)),
        ("c", pytest.approx(1 * MS), pytest.approx(4 * MS))]
    assert p.transfers == []
    assert p.makespan == pytest.approx(6 * MS)


def test_a_tensor_is_sent_once_per_destination_device() -> None:
    p = simulate(FORK, cluster(), {"a": "gpu0", "b": "gpu1", "c": "gpu1"}, {"gpu0": ["a"], "gpu1": ["b", "c"]})
    (t,) = p.transfers
    assert (t.src, t.src_device, t.to, t.nbytes) == ("a", "gpu0", "gpu1", 1000)
    assert (t.start, t.end) == (pytest.approx(1 * MS), pytest.approx(3 * MS))  # 1 ms latency + 1 ms bytes
    assert p.ops["b"].start == pytest.approx(3 * MS) and p.ops["c"].start == pytest.approx(5 * MS)


def test_transfers_on_one_link_run_one_at_a_time() -> None:
    g = parse("""
graph @two_sends() {
  %a1 = opaque() {cost = 1ms} : blob[1000]
  %a2 = opaque() {cost = 1ms} : blob[1000]
  %b = opaque(%a1, %a2) {cost = 1ms} : blob[0]
}
""")
    c = cluster(3)
    p = simulate(g, c, {"a1": "gpu0", "a2": "gpu1", "b": "gpu2"}, order_from_priority(g, {"a1": "gpu0", "a2": "gpu1", "b": "gpu2"}))
    assert len(p.transfers) == 2  # two links: no contention
    assert p.ops["b"].start == pytest.approx(3 * MS)
    p = simulate(g, c, {"a1": "gpu0", "a2": "gpu0", "b": "gpu2"}, {"gpu0": ["a1", "a2"], "gpu2": ["b"]})
    t1, t2 = sorted(p.transfers, key=lambda t: t.start)
    assert (t1.start, t1.end) == (pytest.approx(1 * MS), pytest.approx(3 * MS))
    assert (t2.start, t2.end) == (pytest.approx(3 * MS), pytest.approx(5 * MS))  # waits for the link
    assert p.ops["b"].start == pytest.approx(5 * MS)


def test_heterogeneous_devices_take_their_own_cost() -> None:
    g = parse("""
graph @hetero() {
  %a = opaque() {cost = {h100 = 1ms, cpu = 10ms}} : blob[0]
}
""")
    devices = [Device.of_kind("fast", "h100"), Device.of_kind("slow", "cpu")]
    links = {("fast", "slow"): Link("fast", "slow", 0.0, 1e9), ("slow", "fast"): Link("slow", "fast", 0.0, 1e9)}
    c = Cluster(devices, links)
    assert simulate(g, c, {"a": "fast"}, {"fast": ["a"]}).makespan == pytest.approx(1 * MS)
    assert simulate(g, c, {"a": "slow"}, {"slow": ["a"]}).makespan == pytest.approx(10 * MS)


def test_only_the_results_read_on_a_device_are_sent_there() -> None:
    g = parse("""
graph @multi() {
  %a, %a_big = opaque() {cost = 1ms} : blob[1000], blob[5000]
  %b = opaque(%a) {cost = 1ms} : blob[0]
  %c = opaque(%a_big) {cost = 1ms} : blob[0]
}
""")
    place = {"a": "gpu0", "b": "gpu1", "c": "gpu2"}
    p = simulate(g, cluster(3), place, order_from_priority(g, place))
    assert sorted((t.to, t.nbytes) for t in p.transfers) == [("gpu1", 1000), ("gpu2", 5000)]


def test_an_order_against_the_dependencies_is_reported_not_hung() -> None:
    with pytest.raises(PlanError, match="deadlock: gpu0 waits at op 'b'"):
        simulate(FORK, cluster(), {"a": "gpu0", "b": "gpu0", "c": "gpu0"}, {"gpu0": ["b", "a", "c"]})


def test_missing_and_misplaced_ops_are_reported() -> None:
    with pytest.raises(PlanError) as info:
        simulate(FORK, cluster(), {"a": "gpu0", "b": "gpu9"}, {"gpu0": ["a", "b"]})
    text = str(info.value)
    assert "op 'b' is placed on unknown device 'gpu9'" in text
    assert "op 'c' is not placed" in text



@st.composite
def timed_problems(draw: st.DrawFn) -> tuple[Graph, Cluster]:
    """A random graph whose ops all take time (so no two ops of a device share a start), on a roomy
    random cluster."""
    doc = draw(graph_docs(max_ops=12, per_kind_costs=False, colocation=False))
    for node in doc["nodes"]:
        node["cost"] = draw(st.floats(1e-6, 1e-3))
    graph = graph_from_json(doc)
    return graph, draw(clusters(4)).with_memory(roomy_memory(graph))


@settings(max_examples=100, deadline=None)
@given(problem=timed_problems(), data=st.data())
def test_expand_keeps_a_simulated_plans_times(problem: tuple[Graph, Cluster], data: st.DataObject) -> None:
    """A plan the simulator timed, re-timed by `expand` from its start and end times alone, gives
    every op and transfer the same times (ops that end together send in graph order, whatever
    the device orders said)."""
    from pesto_ir.passes.placement.expansion import expand_plan

    graph, cl = problem
    placement = {op.name: data.draw(st.sampled_from(cl.names)) for op in graph.ops}
    priority = {op.name: data.draw(st.floats(0.0, 1.0)) for op in graph.ops}
    plan = simulate(graph, cl, placement, order_from_priority(graph, placement, priority))
    again = expand_plan(graph, cl, plan)
    assert again.ops == plan.ops
    assert sorted((t.src, t.to, t.start, t.end) for t in again.transfers) == \
        sorted((t.src, t.to, t.start, t.end) for t in plan.transfers)


def test_expand_runs_a_zero_length_op_before_the_longer_op_that_starts_with_it() -> None:
    """`z` (no time) and `b` (2 ms) both start at 1 ms on gpu0, `z` first as the order says; `z`
    feeds gpu1. Re-timed from start times with ties by graph position, `b` would go first and the
    transfer would leave 2 ms late."""
    from pesto_ir.passes.placement.expansion import expand_plan

    g = parse("""
graph @tie() {
  %a = opaque() {cost = 1ms} : blob[0]
  %b = opaque(%a) {cost = 2ms} : blob[0]
  %z = opaque(%a) {cost = 0ms} : blob[1000]
  %c = opaque(%z) {cost = 1ms} : blob[0]
}
""")
    plan = simulate(g, cluster(), {"a": "gpu0", "b": "gpu0", "z": "gpu0", "c": "gpu1"},
                    {"gpu0": ["a", "z", "b"], "gpu1": ["c"]})
    assert plan.ops["z"].start == plan.ops["b"].start == 1 * MS
    assert expand_plan(g, cluster(), plan).ops == plan.ops


# ---------------------------------------------------------------- eager list schedules

def test_eager_starts_what_is_ready_instead_of_waiting_for_its_order() -> None:
    """gpu1 holds `c`, which waits 2 ms for `a` to arrive, and `d`, ready at 0. By priority `c`
    comes first; a fixed order c, d would leave gpu1 idle until `c` can start; eager runs `d` at 0."""
    g = parse("""
graph @wait() {
  %a = opaque() {cost = 1ms} : blob[0]
  %c = opaque(%a) {cost = 1ms} : blob[0]
  %d = opaque() {cost = 1ms} : blob[0]
}
""")
    placement = {"a": "gpu0", "c": "gpu1", "d": "gpu1"}
    fixed = simulate(g, cluster(), placement, {"gpu0": ["a"], "gpu1": ["c", "d"]})
    eager = simulate_eager(g, cluster(), placement, {"a": (0.0,), "c": (0.0,), "d": (1.0,)})
    assert fixed.ops["c"].start == 2 * MS and fixed.makespan == 4 * MS  # a ends at 1 ms, arrives 1 ms later
    assert eager.ops["d"].start == 0.0 and eager.ops["c"].start == 2 * MS and eager.makespan == 3 * MS


def test_eager_takes_the_least_priority_among_ready_ops() -> None:
    placement = {"a": "gpu0", "b": "gpu0", "c": "gpu0"}
    first_c = simulate_eager(FORK, cluster(), placement, {"a": (0.0,), "b": (2.0,), "c": (1.0,)})
    assert first_c.ops["c"].start == 1 * MS and first_c.ops["b"].start == 4 * MS
    tie = simulate_eager(FORK, cluster(), placement, {"a": (0.0,), "b": (1.0,), "c": (1.0,)})
    assert tie.ops["b"].start == 1 * MS  # equal priorities: graph order


def test_eager_refuses_an_op_not_placed_or_without_priority() -> None:
    with pytest.raises(PlanError, match="op 'c' is not placed"):
        simulate_eager(FORK, cluster(), {"a": "gpu0", "b": "gpu0"}, {"a": (0.0,), "b": (0.0,), "c": (0.0,)})
    with pytest.raises(PlanError, match="1 op\\(s\\) have no priority, e.g. 'c'"):
        simulate_eager(FORK, cluster(), {"a": "gpu0", "b": "gpu0", "c": "gpu1"}, {"a": (0.0,), "b": (0.0,)})


def test_eager_chooses_after_every_event_of_the_moment() -> None:
    """On gpu1, `e` ends at 2 ms just as `a`'s result arrives from gpu0. The op's end is popped
    first; choosing then would start `d`, though `c` (less priority) is ready at the same time."""
    g = parse("""
graph @moment() {
  %a = opaque() {cost = 1ms} : blob[0]
  %e = opaque() {cost = 2ms} : blob[0]
  %c = opaque(%a) {cost = 1ms} : blob[0]
  %d = opaque() {cost = 1ms} : blob[0]
}
""")
    placement = {"a": "gpu0", "e": "gpu1", "c": "gpu1", "d": "gpu1"}
    plan = simulate_eager(g, cluster(), placement, {"a": (0.0,), "e": (0.0,), "c": (1.0,), "d": (2.0,)})
    assert plan.ops["c"].start == 2 * MS and plan.ops["d"].start == 3 * MS


def test_eager_plans_of_zero_length_ops_and_repeated_operands_are_valid() -> None:
    from pesto_ir.schedule.validate import validate_plan

    g = parse("""
graph @odd() {
  %a, %b = opaque() {cost = 1ms} : blob[1000], blob[2000]
  %z = opaque(%a, %a) {cost = 0ms} : blob[1000]
  %c = opaque(%a, %b, %z) {cost = 1ms} : blob[0]
  %f = opaque() {cost = 0ms} : blob[0]
}
""")
    cl = cluster()
    placement = {"a": "gpu0", "z": "gpu1", "c": "gpu1", "f": "gpu1"}
    plan = simulate_eager(g, cl, placement, {n: (0.0,) for n in placement})
    assert validate_plan(g, cl, plan) == []
    assert [(t.src, t.to, t.nbytes) for t in plan.transfers] == [("a", "gpu1", 3000)]  # a and b, one message


@settings(max_examples=100, deadline=None)
@given(problem=timed_problems(), data=st.data())
def test_eager_plans_are_work_conserving_list_schedules(problem: tuple[Graph, Cluster], data: st.DataObject) -> None:
    """On random graphs and placements: the plan is what `simulate` gives its own orders (the
    ops of each device by start time), and no device is idle while one of its ops is ready (all
    inputs there), and it then starts the ready op of least priority."""
    graph, cl = problem
    placement = {op.name: data.draw(st.sampled_from(cl.names)) for op in graph.ops}
    priority = {op.name: (data.draw(st.integers(0, 3)), data.draw(st.floats(0.0, 1.0))) for op in graph.ops}
    plan = simulate_eager(graph, cl, placement, priority)
    order = {d: sorted((n for n in plan.ops if plan.ops[n].device == d), key=lambda n: plan.ops[n].start)
             for d in cl.names}
    again = simulate(graph, cl, placement, order)
    assert again.ops == plan.ops and again.transfers == plan.transfers
    arrival = {(t.src, t.to): t.end for t in plan.transfers}
    index = {op.name: i for i, op in enumerate(graph.ops)}
    for op in graph.ops:
        d = placement[op.name]
        ready = max((plan.ops[p.name].end if placement[p.name] == d else arrival[(p.name, d)]
                     for p in op.producers()), default=0.0)
        mine = plan.ops[op.name]
        for other, slot in plan.ops.items():  # what started on d while op was ready came first by priority
            if slot.device == d and other != op.name and ready <= slot.start < mine.start:
                assert (priority[other], index[other]) < (priority[op.name], index[op.name])
        idle = mine.start - ready - sum(min(s.end, mine.start) - max(s.start, ready) for s in plan.ops.values()
                                        if s.device == d and s.end > ready and s.start < mine.start)
        assert idle <= 1e-12, f"{d} idled {idle} s while '{op.name}' was ready"


@settings(max_examples=60, deadline=None)
@given(problem=timed_problems(), data=st.data())
def test_one_preparation_serves_every_placement(problem: tuple[Graph, Cluster], data: st.DataObject) -> None:
    """A search prepares the graph once (`Prepared`) and simulates many placements with it: each
    plan, fixed order or eager, is the one `simulate` gives unprepared."""
    graph, cl = problem
    prepared = Prepared(graph, cl)
    for _ in range(3):
        placement = {op.name: data.draw(st.sampled_from(cl.names)) for op in graph.ops}
        priority = {op.name: (data.draw(st.floats(0.0, 1.0)),) for op in graph.ops}
        order = order_from_priority(graph, placement, priority)
        fixed = simulate(graph, cl, placement, order, prepared=prepared)
        assert fixed == simulate(graph, cl, placement, order)
        eager = simulate_eager(graph, cl, placement, priority, prepared=prepared)
        assert eager == simulate_eager(graph, cl, placement, priority)


def test_a_preparation_of_another_graph_is_refused() -> None:
    """A `Prepared` of one graph handed to the simulation of another would time the wrong ops."""
    doc = {"format": "pesto-graph/1", "name": "g", "nodes": [{"id": "a", "cost": 0.001}], "edges": []}
    one, other = graph_from_json(doc), graph_from_json(doc)
    cl = cluster()
    with pytest.raises(ValueError, match="prepared for another graph or cluster than graph 'g'"):
        simulate(other, cl, {"a": "gpu0"}, {"gpu0": ["a"]}, prepared=Prepared(one, cl))
