"""Hypothesis strategies for placement tests: random cost DAGs and random clusters.

Graphs go through the `pesto-graph/1` importer, so they look like what profilers give us: costs
(one duration, or per device kind), memory, colocation groups and tensor sizes on edges.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from pesto_ir.cluster.devices import Device, Link
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_memory
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.schedule.memory import footprints

KINDS = ("v100", "cpu")  # the keys per-kind costs use; random clusters mix these kinds


@st.composite
def graph_docs(draw: st.DrawFn, max_ops: int = 10, per_kind_costs: bool = True,
               colocation: bool = True, memory: bool = True) -> dict[str, Any]:
    """A random acyclic `pesto-graph/1` document (edges only go from lower to higher node index)."""
    n = draw(st.integers(1, max_ops))
    density = draw(st.floats(0.0, 0.6))
    groups = draw(st.integers(1, max(1, n // 2))) if colocation else 0
    nodes = []
    for i in range(n):
        node: dict[str, Any] = {"id": f"n{i}", "cost": _cost(draw, per_kind_costs)}
        if memory:
            node["memory"] = draw(st.integers(0, 1000))
        if groups and draw(st.booleans()):
            node["colocate"] = f"c{draw(st.integers(0, groups - 1))}"
        nodes.append(node)
    edges = []
    for j in range(1, n):
        for i in range(j):
            if draw(st.floats(0.0, 1.0)) < density:
                edges.append({"src": f"n{i}", "dst": f"n{j}", "bytes": draw(st.sampled_from((0, 4, 1000, 10**6)))})
    order = draw(st.permutations(nodes))  # the importer must put them in topological order itself
    return {"format": "pesto-graph/1", "name": "random", "nodes": list(order), "edges": edges}


def _cost(draw: st.DrawFn, per_kind: bool) -> float | dict[str, float]:
    seconds = st.one_of(st.just(0.0), st.floats(1e-6, 1e-3))
    if per_kind and draw(st.booleans()):
        return {k: draw(seconds) for k in KINDS}
    return draw(seconds)


def cost_graphs(max_ops: int = 10, per_kind_costs: bool = True, colocation: bool = True,
                memory: bool = True) -> st.SearchStrategy[Graph]:
    """Random cost DAGs as Graphs."""
    return graph_docs(max_ops, per_kind_costs, colocation, memory).map(graph_from_json)


@st.composite
def clusters(draw: st.DrawFn, max_devices: int = 4, memory: float = 1e18) -> Cluster:
    """Up to `max_devices` devices of mixed kinds with per-link latency and bandwidth."""
    k = draw(st.integers(1, max_devices))
    devices = [Device.of_kind(f"d{i}", draw(st.sampled_from(KINDS)), memory) for i in range(k)]
    links = {}
    for a in devices:
        for b in devices:
            if a.name != b.name:
                links[(a.name, b.name)] = Link(a.name, b.name, draw(st.sampled_from((0.0, 1e-6, 1e-5))),
                                               draw(st.sampled_from((1e9, 5e10, 1e12))))
    return Cluster(devices, links)


def v100s(n: int) -> Cluster:
    """n V100s as the MSR graphs were profiled on: 16 GiB, links of 10 us + bytes / 50 GB/s."""
    return Cluster.homogeneous(n, "v100", memory=16 * 2**30, latency=1e-5, bandwidth=50e9)


def roomy_memory(graph: Graph, slack: float = 0.0) -> float:
    """Per-device memory with which no greedy memory check can fail: room for every unit and a copy
    of every tensor at once. (Before copies counted, total / k + the largest unit was enough,
    Baechi's m-TOPO bound; now a colocated op pinned to a device a greedy filled must still find
    room there for the copies it reads.)"""
    total = sum(footprints(graph).values())
    copies = sum(r.type.nbytes for op in graph.ops for r in op.results)
    return total + copies + slack * total + 1


@st.composite
def placement_problems(draw: st.DrawFn, max_ops: int = 10, max_devices: int = 4,
                       tight: bool = False) -> tuple[Graph, Cluster]:
    """A random graph and a cluster whose memory fits it (roomy), or may just not (tight)."""
    graph = draw(cost_graphs(max_ops))
    cluster = draw(clusters(max_devices))
    k = len(cluster)
    if tight:
        total = sum(op_memory(op) for op in graph.ops)
        memory = draw(st.floats(0.3, 1.2)) * roomy_memory(graph) / k if total else 1.0
    else:
        memory = roomy_memory(graph, draw(st.sampled_from((0.0, 0.5))))
    return graph, cluster.with_memory(memory)


@st.composite
def layered_graphs(draw: st.DrawFn, max_layers: int = 7) -> tuple[Graph, int]:
    """A random training step as a cost graph, and its layer count: a forward chain, a backward
    chain back down it that reads each layer's activation, a per-layer weight update (not per
    sample)."""
    layers = draw(st.integers(1, max_layers))
    cost = st.floats(1e-5, 1e-3)
    size = st.sampled_from((4, 4096, 10**6))
    nodes, edges = [], []
    for i in range(layers):
        nodes.append({"id": f"f{i}", "cost": draw(cost), "colocate": f"L{i}"})
        nodes.append({"id": f"b{i}", "cost": draw(cost), "colocate": f"L{i}", "backward": True})
        nodes.append({"id": f"u{i}", "cost": draw(cost), "per_sample": False})
        edges.append({"src": f"f{i}", "dst": f"b{i}", "bytes": draw(size)})
        edges.append({"src": f"b{i}", "dst": f"u{i}", "bytes": draw(size)})
        if i:
            edges.append({"src": f"f{i - 1}", "dst": f"f{i}", "bytes": draw(size)})
            edges.append({"src": f"b{i}", "dst": f"b{i - 1}", "bytes": draw(size)})
    graph = graph_from_json({"format": "pesto-graph/1", "name": "layered", "nodes": nodes, "edges": edges})
    return graph, layers
