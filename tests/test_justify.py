"""Forward-backward improvement of eager schedules (`passes/placement/justify.py`): never slower than the
schedule it starts from, a valid plan of the same placement, and it finds what a forward list
schedule cannot know (which ready op the end of the step waits for)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clusters, cost_graphs

from pesto_ir import parse
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.justify import RoundClock, backward_starts, justified, step_tasks
from pesto_ir.schedule.simulate import simulate_eager
from pesto_ir.schedule.validate import validate_plan
from pesto_ir.util import work

MS = 1e-3

# on gpu0, `x` (read by nobody) and `y` (read by the long `z` on gpu1) are ready at once
WAITS = parse("""
graph @waits() {
  %x = opaque() {cost = 1ms} : blob[0]
  %y = opaque() {cost = 1ms} : blob[1000]
  %z = opaque(%y) {cost = 5ms} : blob[0]
}
""")
PLACED = {"x": "gpu0", "y": "gpu0", "z": "gpu1"}


def two_devices() -> Cluster:
    return Cluster.homogeneous(2, "v100", latency=0.0, bandwidth=1e9)  # 1000 bytes: 1 us


def test_justification_runs_first_what_the_end_waits_for() -> None:
    cluster = two_devices()
    graph_order = simulate_eager(WAITS, cluster, PLACED, {n: (0.0,) for n in PLACED})
    assert graph_order.ops["y"].start == 1 * MS  # x first, by graph order: z starts late
    better = justified(WAITS, cluster, PLACED, graph_order)
    assert better.ops["y"].start == 0.0 and better.ops["x"].start == 1 * MS
    assert better.makespan < graph_order.makespan - 0.9 * MS
    assert validate_plan(WAITS, cluster, better) == []


def test_backward_starts_mirror_a_schedule_run_from_the_end() -> None:
    cluster = two_devices()
    plan = simulate_eager(WAITS, cluster, PLACED, {n: (0.0,) for n in PLACED})
    tasks = step_tasks(WAITS, cluster, PLACED)
    starts = backward_starts(tasks, tasks.reversed_after(), plan)
    assert starts["y"] < starts["z"] and starts["y"] < starts["x"]  # y feeds the longest tail


def test_tasks_send_a_result_once_per_device() -> None:
    graph = parse("""
graph @fan() {
  %a = opaque() {cost = 1ms} : blob[1000]
  %b = opaque(%a) {cost = 1ms} : blob[0]
  %c = opaque(%a) {cost = 1ms} : blob[0]
  %d = opaque(%a) {cost = 1ms} : blob[0]
}
""")
    tasks = step_tasks(graph, two_devices(), {"a": "gpu0", "b": "gpu1", "c": "gpu1", "d": "gpu0"})
    assert list(tasks.message) == [("a", "gpu1")]
    message = tasks.message[("a", "gpu1")]
    assert sorted(tasks.after[0]) == sorted([message, 3])  # a: its message to gpu1, and d beside it
    assert tasks.after[message] == [1, 2] and tasks.resource[message] == ("link", "gpu0", "gpu1")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_graphs(max_ops=12, colocation=False), clusters(), st.data())
def test_justified_is_valid_and_never_slower(graph: Graph, cluster: Cluster, data: st.DataObject) -> None:
    placement = {op.name: data.draw(st.sampled_from(cluster.names)) for op in graph.ops}
    priority = {op.name: (data.draw(st.floats(0, 1)),) for op in graph.ops}
    plan = simulate_eager(graph, cluster, placement, priority)
    better = justified(graph, cluster, placement, plan)
    assert better.makespan <= plan.makespan
    assert all(better.ops[n].device == placement[n] for n in placement)
    assert validate_plan(graph, cluster, better) == []


def test_no_round_is_kept_that_does_not_fit_in_memory() -> None:
    tiny = Cluster.homogeneous(2, "v100", memory=100, latency=0.0, bandwidth=1e9)  # y's 1000 bytes never fit
    graph_order = simulate_eager(WAITS, tiny, PLACED, {n: (0.0,) for n in PLACED})
    assert justified(WAITS, tiny, PLACED, graph_order) is graph_order


def test_no_round_starts_that_would_end_past_the_deadline() -> None:
    """A deadline passed: nothing starts. One the rounds timed so far (`RoundClock`) would pass:
    no round, and no first round either once a set-up and first round took longer than is left."""

    cluster = two_devices()
    graph_order = simulate_eager(WAITS, cluster, PLACED, {n: (0.0,) for n in PLACED})
    assert justified(WAITS, cluster, PLACED, graph_order, deadline=work.now() - 1.0) is graph_order
    clock = RoundClock()
    better = justified(WAITS, cluster, PLACED, graph_order, deadline=work.now() + 60.0, clock=clock)
    assert better.makespan < graph_order.makespan and 0.0 < clock.round <= clock.first
    slow = RoundClock(first=60.0, round=60.0)  # rounds as long as what is left: none starts
    assert justified(WAITS, cluster, PLACED, graph_order, deadline=work.now() + 30.0, clock=slow) is graph_order
    once = RoundClock(first=0.0, round=60.0)  # the first round fits, none after it
    assert justified(WAITS, cluster, PLACED, graph_order, deadline=work.now() + 30.0, clock=once) \
        .makespan == better.makespan


def test_the_time_kept_for_justification_is_what_its_rounds_take() -> None:
    """`auto` keeps its share of the limit for justifying the plan, or as long as `ROUNDS`
    simulations take if that is longer (so the rounds do not depend on the limit), but never more
    than half the time left."""
    from pesto_ir.passes.placement.justify import ROUNDS
    from pesto_ir.passes.placement.search.driver import justify_kept

    assert justify_kept(share=0.3, simulation=0.1, seconds=10.0) == pytest.approx(ROUNDS * 0.1)
    assert justify_kept(share=1.0, simulation=0.01, seconds=10.0) == 1.0
    assert justify_kept(share=0.3, simulation=1.0, seconds=4.0) == 2.0
