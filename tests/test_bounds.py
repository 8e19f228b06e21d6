"""Lower bounds and memory infeasibility found before solving."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import KINDS, graph_docs

from pesto_ir import parse
from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, op_memory
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.schedule.bounds import (
    colocated_path,
    critical_path,
    fastest_costs,
    lower_bound,
    memory_cut_path,
    memory_shortfall,
)

MS = 1e-3
CHAIN_AND_SIDE = parse("""
graph @g() {
  %a = opaque() {cost = 2ms} : blob[0]
  %b = opaque(%a) {cost = 2ms} : blob[0]
  %s1 = opaque() {cost = 1ms} : blob[0]
  %s2 = opaque() {cost = 1ms} : blob[0]
}
""")


def test_critical_path_dominates_on_many_devices() -> None:
    assert lower_bound(CHAIN_AND_SIDE, Cluster.homogeneous(4)) == pytest.approx(4 * MS)


def test_total_work_dominates_on_one_device() -> None:
    assert lower_bound(CHAIN_AND_SIDE, Cluster.homogeneous(1)) == pytest.approx(6 * MS)


def test_work_bound_counts_slow_devices_for_what_they_are_worth() -> None:
    g = parse("""
graph @g() {
  %a = opaque() {cost = {fast = 3ms, slow = 6ms}} : blob[0]
  %b = opaque() {cost = {fast = 3ms, slow = 6ms}} : blob[0]
  %c = opaque() {cost = {fast = 3ms, slow = 6ms}} : blob[0]
}
""")
    devices = [Device("fast", "fast", 1e12, 1e11, 1e9), Device("slow", "slow", 1e12, 1e11, 1e9)]
    c = Cluster.fully_connected(devices, 0.0, 1e9)
    # the slow device is worth half a fast one: 9 ms of fast work over 1.5 devices
    assert lower_bound(g, c) == pytest.approx(6 * MS)


def test_a_join_waits_for_a_transfer_or_for_both_branches_on_its_device() -> None:
    """a -> (b, c) -> d, 1 ms each, 10 MB tensors over 1 GB/s links (10 ms): the plain critical path
    (3 ms) runs b and c in parallel for free; with transfers counted, d either waits 10 ms for one
    branch or runs after both on one device, so 4 ms, which is the optimum (all on one device)."""
    g = parse("""
graph @g() {
  %a = opaque() {cost = 1ms} : blob[10000000]
  %b = opaque(%a) {cost = 1ms} : blob[10000000]
  %c = opaque(%a) {cost = 1ms} : blob[10000000]
  %d = opaque(%b, %c) {cost = 1ms} : blob[0]
}
""")
    assert lower_bound(g, Cluster.homogeneous(2, latency=0.0, bandwidth=1e9)) == pytest.approx(4 * MS)
    assert lower_bound(g, Cluster.homogeneous(2, latency=0.0, bandwidth=1e12)) == pytest.approx(3.01 * MS)


def test_memory_shortfall_names_devices_and_bytes() -> None:
    g = parse("""
graph @g() {
  %w1 = opaque() {memory = 700B, colocate = "layer"} : blob[0]
  %w2 = opaque() {memory = 700B, colocate = "layer"} : blob[0]
  %big = opaque() {memory = 1200B} : blob[0]
}
""")
    c = Cluster.homogeneous(2, memory=1000)
    assert memory_shortfall(g, c) == [
        "the graph holds 2600 bytes for the whole step (resident memory and inputs) but all 2 devices together "
        "hold 2000 (short by 600 bytes)",
        "op 'big' needs 1200 bytes but the largest device, gpu0, holds 1000 (short by 200 bytes)",
        "colocation group 'layer' needs 1400 bytes on one device but the largest, gpu0, holds 1000 (short by 400 bytes)",
    ]
    assert memory_shortfall(g, Cluster.homogeneous(2, memory=2000)) == []


def _chain_over_memory(first_edge_bytes: int, second_edge_bytes: int) -> Graph:
    return graph_from_json({"format": "pesto-graph/1", "name": "chain", "nodes": [
        {"id": "a", "cost": 0.001, "memory": 10}, {"id": "b", "cost": 0.001, "memory": 10},
        {"id": "c", "cost": 0.001, "memory": 10}],
        "edges": [{"src": "a", "dst": "b", "bytes": first_edge_bytes},
                  {"src": "b", "dst": "c", "bytes": second_edge_bytes}]})


def test_memory_that_splits_the_critical_path_adds_its_cheapest_cut() -> None:
    """a -> b -> c, 1 ms and 10 resident bytes each, on devices of 20 bytes: the path is cut once,
    and the cut costs at least the cheaper edge's transfer (1 MB over 1 GB/s: 1 ms)."""
    cluster = Cluster.homogeneous(2, memory=20, latency=0.0, bandwidth=1e9)
    assert lower_bound(_chain_over_memory(10**9, 10**6), cluster) == pytest.approx(4 * MS)
    assert lower_bound(_chain_over_memory(10**6, 10**9), cluster) == pytest.approx(4 * MS)
    roomy = Cluster.homogeneous(2, memory=30, latency=0.0, bandwidth=1e9)
    assert lower_bound(_chain_over_memory(10**6, 10**9), roomy) == pytest.approx(3 * MS)


def _path_with_transfers(graph: Graph, cluster: Cluster, placement: dict[str, str]) -> float:
    """The longest path of `placement`, each edge between devices waiting for its bytes: no plan
    of this placement is shorter."""
    link = next(iter(cluster.links.values()))
    finish: dict[str, float] = {}
    for op in graph.topo_order():
        start = 0.0
        for r in op.operands:
            p = r.owner
            if p is None:
                continue
            wait = 0.0 if placement[p.name] == placement[op.name] else link.latency + r.type.nbytes / link.bandwidth
            start = max(start, finish[p.name] + wait)
        finish[op.name] = start + op_cost(op, cluster.devices[0])
    return max(finish.values(), default=0.0)


@settings(max_examples=150, deadline=None)
@given(doc=graph_docs(max_ops=7, per_kind_costs=False), data=st.data())
def test_the_memory_cut_path_never_passes_what_a_placement_that_fits_needs(doc: dict[str, Any],
                                                                          data: st.DataObject) -> None:
    """Over every placement on 2 or 3 devices that keeps colocated ops together and fits their
    resident bytes, the fastest path bound (transfers on the edges it cuts) is at least the
    memory-cut path: the bound never passes a plan that memory allows."""
    graph = graph_from_json(doc)
    k = data.draw(st.integers(2, 3))
    total = sum(op_memory(op) for op in graph.ops)
    cluster = Cluster.homogeneous(k, memory=data.draw(st.integers(0, total)) + max(op_memory(op) for op in graph.ops) + 1,
                                  latency=data.draw(st.sampled_from((0.0, 1e-5))), bandwidth=1e9)
    fast = fastest_costs(graph, cluster)
    bound = memory_cut_path(graph, cluster, fast)
    assert bound >= critical_path(graph, fast) - 1e-15
    def key(op: Any) -> str:
        return f"group {op.get('colocate')}" if op.get("colocate") is not None else f"op {op.name}"

    units = [[op for op in graph.ops if key(op) == k] for k in dict.fromkeys(key(op) for op in graph.ops)]
    best = math.inf
    for devices in itertools.product(cluster.names, repeat=len(units)):
        held = {d: 0 for d in cluster.names}
        placement: dict[str, str] = {}
        for unit, d in zip(units, devices):
            held[d] += sum(op_memory(op) for op in unit)
            placement.update(dict.fromkeys((op.name for op in unit), d))
        if all(held[d] <= cluster.device(d).memory for d in cluster.names):
            best = min(best, _path_with_transfers(graph, cluster, placement))
    if best < math.inf:
        assert bound <= best * (1 + 1e-9) + 1e-15


def test_colocated_siblings_wait_for_each_other() -> None:
    """Two 2 ms branches from a fork to a join must share a device (one colocation group): the
    join starts 4 ms after the fork, not 2, on any number of devices."""
    graph = parse("""
graph @g() {
  %f = opaque() {cost = 1ms} : blob[0]
  %x = opaque(%f) {cost = 2ms, colocate = "w"} : blob[0]
  %y = opaque(%f) {cost = 2ms, colocate = "w"} : blob[0]
  %j = opaque(%x, %y) {cost = 1ms} : blob[0]
}
""")
    fast = fastest_costs(graph, Cluster.homogeneous(4))
    assert critical_path(graph, fast) == pytest.approx(4 * MS)
    assert colocated_path(graph, fast) == pytest.approx(6 * MS)
    assert lower_bound(graph, Cluster.homogeneous(4)) == pytest.approx(6 * MS)


@settings(max_examples=150, deadline=None)
@given(doc=graph_docs(max_ops=7), data=st.data())
def test_the_colocated_path_never_passes_a_plan(doc: dict[str, Any], data: st.DataObject) -> None:
    """Every placement that keeps colocated ops together (on 2 or 3 devices, per-kind costs on
    devices of two kinds), each timed in topological order and in a drawn priority order, takes
    at least the colocated path."""
    from pesto_ir.schedule.simulate import order_from_priority, simulate

    graph = graph_from_json(doc)
    k = data.draw(st.integers(2, 3))
    devices = [Device.of_kind(f"d{i}", data.draw(st.sampled_from(KINDS)), 1e15) for i in range(k)]
    cluster = Cluster.fully_connected(devices, data.draw(st.sampled_from((0.0, 1e-5))), 1e9)
    bound = colocated_path(graph, fastest_costs(graph, cluster))
    def key(op: Any) -> str:
        return f"group {op.get('colocate')}" if op.get("colocate") is not None else f"op {op.name}"

    units = [[op.name for op in graph.ops if key(op) == u] for u in dict.fromkeys(key(op) for op in graph.ops)]
    drawn = {op.name: data.draw(st.floats(0.0, 1.0)) for op in graph.ops}
    topological = {op.name: float(i) for i, op in enumerate(graph.topo_order())}
    for chosen in itertools.product(cluster.names, repeat=len(units)):
        placement = {name: d for unit, d in zip(units, chosen) for name in unit}
        for priority in (topological, drawn):
            plan = simulate(graph, cluster, placement, order_from_priority(graph, placement, priority))
            assert bound <= plan.makespan * (1 + 1e-9) + 1e-15, (placement, plan.makespan, bound)
