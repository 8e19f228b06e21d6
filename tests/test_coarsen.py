"""Coarsening: the quotient of every random DAG is acyclic and keeps costs, memory, bytes, colocation."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clusters, cost_graphs

from pesto_ir import PestoError, parse, verify
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, op_memory, value_bytes
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.attributes import StringAttr
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.rewrite import grouping
from pesto_ir.passes.rewrite.coarse_graph import CoarsenError, quotient_graph
from pesto_ir.passes.rewrite.colocation_groups import COLOCATION_MODES
from pesto_ir.passes.rewrite.grouping import all_alive_cap, coarsen_groups, memory_cap, sequential_peak
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.memory import footprints
from pesto_ir.schedule.plan import read_plan_attrs


def _grouped(graph: Graph, groups: list[str]) -> Graph:
    for op, g in zip(graph.ops, groups):
        op.attrs["group"] = StringAttr(g)
    return graph


def _check_quotient(graph: Graph, cluster: Cluster | None) -> None:
    """Every invariant the placement passes rely on."""
    coarse, members = quotient_graph(graph, cluster)
    verify(coarse)  # defined-before-use: the quotient is in topological order, so acyclic
    # every fine op in exactly one group, and groups named as the attributes say
    listed = [name for names in members.values() for name in names]
    assert sorted(listed) == sorted(op.name for op in graph.ops)
    assert all(str(graph.op(n).get("group")) == g for g, names in members.items() for n in names)
    assert [op.name for op in coarse.ops] == list(members)
    # cost per device (or per key without a cluster) and memory are summed
    devices = cluster.devices if cluster is not None else []
    for d in devices:
        fine = sum(op_cost(op, d) for op in graph.ops)
        assert math.isclose(sum(op_cost(op, d) for op in coarse.ops), fine, rel_tol=1e-9, abs_tol=1e-15)
    assert sum(op_memory(op) for op in coarse.ops) == sum(op_memory(op) for op in graph.ops)
    # a group reads, from each other group, exactly the distinct fine values its ops read there
    group_of = {op.name: str(op.get("group")) for op in graph.ops}
    want: dict[tuple[str, str], int] = defaultdict(int)
    seen: set[tuple[str, str]] = set()
    for p, c, v in graph.edges():
        a, b = group_of[p.name], group_of[c.name]
        if a != b and (v.name, b) not in seen:
            seen.add((v.name, b))
            want[(a, b)] += value_bytes(v)
    got: dict[tuple[str, str], int] = defaultdict(int)
    for op in coarse.ops:
        for v in dict.fromkeys(op.operands):
            assert v.owner is not None
            got[(v.owner.name, op.name)] += value_bytes(v)
    assert dict(got) == dict(want)
    # colocated ops share a group, or their groups share one colocate label
    by_colocate: dict[str, set[str]] = defaultdict(set)
    for op in graph.ops:
        if op.get("colocate") is not None:
            by_colocate[str(op.get("colocate"))].add(group_of[op.name])
    for gs in by_colocate.values():
        if len(gs) > 1:
            labels = {coarse.op(g).get("colocate") for g in gs}
            assert len(labels) == 1 and None not in labels


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=cost_graphs(max_ops=12), cluster=st.one_of(st.none(), clusters(3)), data=st.data())
@pytest.mark.slow
def test_quotient_invariants_on_random_dags(graph: Graph, cluster: Cluster | None, data: st.DataObject) -> None:
    target = data.draw(st.integers(1, len(graph.ops) + 1))
    mode = data.draw(st.sampled_from(COLOCATION_MODES))
    groups = coarsen_groups(graph, target, cluster, mode, siblings=data.draw(st.booleans()))
    assert len(groups) == len(graph.ops)
    assert all(g.startswith("g") for g in groups)
    _check_quotient(_grouped(graph, groups), cluster)


@settings(max_examples=200, deadline=None)
@given(parents=st.lists(st.integers(-1, 20), min_size=1, max_size=14), target=st.integers(1, 14))
def test_forests_coarsen_down_to_the_target(parents: list[int], target: int) -> None:
    """Every edge of an in-forest (one producer per op) is safe, so merging along edges stops only at
    the target or at one group per tree; merging siblings too (nodes of one level, roots among
    them, or sinks), it may go below."""
    nodes = [(f"n{i}", None) for i in range(len(parents))]
    edges = [(f"n{p}", f"n{i}", 8) for i, p in enumerate(parents) if 0 <= p < i]
    g = _doc(nodes, edges)
    components = len(parents) - len(edges)
    groups = coarsen_groups(g, target)
    assert len(set(groups)) == max(target, components) or len(set(groups)) == len(parents) <= target
    _check_quotient(_grouped(g, groups), None)
    groups = coarsen_groups(g, target, siblings=True)
    assert min(target, len(parents)) <= len(set(groups)) <= max(target, components)
    _check_quotient(_grouped(g, groups), None)


def _doc(nodes: list[tuple[str, str | None]], edges: list[tuple[str, str, int]]) -> Graph:
    return graph_from_json({
        "format": "pesto-graph/1", "name": "t",
        "nodes": [{"id": n, "cost": 0.001, "memory": 10, **({"colocate": c} if c else {})} for n, c in nodes],
        "edges": [{"src": s, "dst": d, "bytes": b} for s, d, b in edges],
    })


def test_colocation_group_that_would_close_a_cycle_stays_split_but_colocated() -> None:
    # fwd -> mid -> grad with fwd and grad colocated: one node {fwd, grad} would close a cycle
    g = _doc([("fwd", "w"), ("mid", None), ("grad", "w")], [("fwd", "mid", 100), ("mid", "grad", 100)])
    for mode in COLOCATION_MODES:
        groups = coarsen_groups(g, 1, None, mode)
        assert groups[0] != groups[2]
        _check_quotient(_grouped(g, groups), None)


def test_whole_mode_merges_a_colocation_group_without_internal_edges() -> None:
    g = _doc([("a", "w"), ("b", "w"), ("c", None)], [("a", "c", 5), ("b", "c", 5)])
    names = [op.name for op in g.ops]
    whole = dict(zip(names, coarsen_groups(g, 3, None, "whole")))
    assert whole["a"] == whole["b"]
    connected = dict(zip(names, coarsen_groups(g, 3, None, "connected")))
    assert connected["a"] != connected["b"]  # two pieces, kept colocated by the quotient's label
    _check_quotient(_grouped(g, list(connected.values())), None)


def test_a_batch_of_individually_safe_merges_never_closes_a_cycle() -> None:
    # a -> b, c -> d, a -> d, c -> b: each of a-b and c-d is safe alone (b and d one level below a
    # and c), both together would make {a,b} <-> {c,d}.
    g = _doc([("a", None), ("c", None), ("b", None), ("d", None)],
             [("a", "b", 9), ("c", "d", 8), ("a", "d", 1), ("c", "b", 1)])
    groups = coarsen_groups(g, 2)
    _check_quotient(_grouped(g, groups), None)


def test_heaviest_tensor_merges_first() -> None:
    g = _doc([("a", None), ("b", None), ("c", None)], [("a", "b", 1), ("b", "c", 10**6)])
    groups = dict(zip((op.name for op in g.ops), coarsen_groups(g, 2)))
    assert groups["b"] == groups["c"] != groups["a"]


def test_memory_cap_keeps_coarse_nodes_under_half_a_device() -> None:
    g = _doc([(f"n{i}", None) for i in range(6)], [(f"n{i}", f"n{i + 1}", 100) for i in range(5)])
    cluster = Cluster.homogeneous(2, "v100", memory=25)  # each op holds 10 bytes: at most one per node
    groups = coarsen_groups(g, 1, cluster)
    assert len(set(groups)) == 6
    coarse, _ = quotient_graph(_grouped(g, groups), cluster)
    assert max(op_memory(op) for op in coarse.ops) <= 12.5


def test_pass_writes_printed_group_attributes_that_round_trip() -> None:
    g = _doc([("a", None), ("b", None), ("c", None)], [("a", "b", 1), ("b", "c", 2)])
    PassManager("coarsen{target=1}").run(g, PassContext(quiet=True))
    assert {op.get("group") for op in g.ops} == {"g0"}
    again = parse(str(g))
    assert [op.get("group") for op in again.ops] == [op.get("group") for op in g.ops]


def test_pass_rejects_bad_options() -> None:
    g = _doc([("a", None)], [])
    with pytest.raises(PestoError) as info:
        PassManager("coarsen{target=0}").run(g, PassContext(quiet=True))
    assert "target must be at least 1" in info.value.format()
    with pytest.raises(PestoError) as info:
        PassManager("coarsen{colocation=some}").run(g, PassContext(quiet=True))
    assert "colocation must be one of connected, whole" in info.value.format()


def test_quotient_needs_groups_on_every_op() -> None:
    g = _doc([("a", None), ("b", None)], [("a", "b", 1)])
    g.ops[0].attrs["group"] = StringAttr("g0")
    with pytest.raises(CoarsenError, match="no 'group' attribute"):
        quotient_graph(g)


def test_quotient_rejects_groups_that_form_a_cycle() -> None:
    g = _doc([("a", None), ("b", None), ("c", None)], [("a", "b", 1), ("b", "c", 1)])
    _grouped(g, ["g0", "g1", "g0"])
    with pytest.raises(CoarsenError, match="cycle"):
        quotient_graph(g)


def test_quotient_sums_per_kind_costs_per_key_without_a_cluster() -> None:
    g = graph_from_json({"format": "pesto-graph/1", "nodes": [
        {"id": "a", "cost": {"v100": 0.001, "cpu": 0.01}}, {"id": "b", "cost": 0.002}],
        "edges": [{"src": "a", "dst": "b", "bytes": 4}]})
    coarse, _ = quotient_graph(_grouped(g, ["g0", "g0"]))
    assert coarse.op("g0").get("cost") == pytest.approx({"v100": 0.003, "cpu": 0.012})


def test_merging_keeps_parallel_branches_apart_when_the_heaviest_edge_would_join_them() -> None:
    # s feeds a chain a1 -> a2 and, by the heaviest tensor, a branch b; t reads both. Merging the
    # heaviest edge s -> b makes a1 wait for b: the path becomes s+b+a1+a2+t. Merging the chain
    # a1 -> a2 lengthens nothing; the shorter grouping is kept.
    from pesto_ir.schedule.bounds import lower_bound

    cost = {"s": 0.001, "a1": 0.05, "a2": 0.05, "b": 0.1, "t": 0.001}
    edges = [("s", "a1", 10), ("a1", "a2", 10), ("a2", "t", 10), ("s", "b", 10**6), ("b", "t", 10)]
    graph = graph_from_json({"format": "pesto-graph/1", "name": "fork",
                             "nodes": [{"id": n, "cost": c} for n, c in cost.items()],
                             "edges": [{"src": a, "dst": b, "bytes": n} for a, b, n in edges]})
    cluster = Cluster.homogeneous(2, "v100", latency=0.0, bandwidth=1e15)
    groups = coarsen_groups(graph, 4, cluster)
    assert groups[1] == groups[2] and len(set(groups)) == 4  # a1 and a2
    coarse, _ = quotient_graph(_grouped(graph, groups), cluster)
    assert lower_bound(coarse, cluster) == pytest.approx(lower_bound(graph, cluster)) == pytest.approx(0.102)


def _chain_with_side_sinks(n: int) -> Graph:
    """c0 -> c1 -> ... (1 ms each), and off every chain op a sink s_i of 0.5 ms, as each layer's
    optimizer update hangs off the backward pass."""
    nodes = [{"id": f"c{i}", "cost": 1e-3, "memory": 10} for i in range(n)]
    nodes += [{"id": f"s{i}", "cost": 5e-4, "memory": 10} for i in range(n)]
    edges = [{"src": f"c{i}", "dst": f"c{i + 1}", "bytes": 8} for i in range(n - 1)]
    edges += [{"src": f"c{i}", "dst": f"s{i}", "bytes": 8} for i in range(n)]
    return graph_from_json({"format": "pesto-graph/1", "name": "t", "nodes": nodes, "edges": edges})


def test_sinks_merge_with_each_other_rather_than_lengthen_the_chain() -> None:
    """Merging along edges only, most side sinks must join chain nodes (each holds the chain back
    0.5 ms: 13.5 ms at 6 groups, against 10.5 fine); merged with each other where they have slack,
    only the last one's wait for a chain node its cost cap keeps from growing is added."""
    from pesto_ir.passes.rewrite.grouping import grouped_bound

    g = _chain_with_side_sinks(10)
    cluster = Cluster.homogeneous(4, "v100", latency=1e-9, bandwidth=1e15)
    assert grouped_bound(g, cluster, coarsen_groups(g, 6, cluster)) == pytest.approx(13.5e-3)
    groups = coarsen_groups(g, 6, cluster, siblings=True)
    assert len(set(groups)) == 6
    assert grouped_bound(g, cluster, groups) <= 11e-3 * (1 + 1e-9)
    _check_quotient(_grouped(g, groups), cluster)


def test_siblings_is_a_pass_option_checked_like_the_others() -> None:
    g = _chain_with_side_sinks(10)
    ctx = PassContext(cluster=Cluster.homogeneous(4, "v100", latency=1e-9, bandwidth=1e15), quiet=True)
    on = PassManager("coarsen{target=6 siblings=true}").run(g.clone(), ctx)
    off = PassManager("coarsen{target=6}").run(g.clone(), ctx)
    assert [op.get("group") for op in on.ops] == coarsen_groups(g, 6, ctx.cluster, siblings=True)
    assert [op.get("group") for op in off.ops] != [op.get("group") for op in on.ops]
    with pytest.raises(PestoError, match="siblings"):
        PassManager("coarsen{siblings=3}")


def _activation_chain(n: int, floats: int = 256) -> Graph:
    """x -> a0 -> a1 -> ... -> a(n-1), 1 ms each, every tensor f32[floats] and read only by the next
    op: run in order, at most two of them are alive at once, beside the input."""
    lines = [f"graph @chain(%x: f32[{floats}]) {{"]
    previous = "%x"
    for i in range(n):
        lines.append(f"  %a{i} = opaque({previous}) {{cost = 1ms}} : f32[{floats}]")
        previous = f"%a{i}"
    lines += [f"  return {previous}", "}"]
    return parse("\n".join(lines))


def test_a_chain_whose_peak_fits_but_not_all_its_activations_is_coarsened_and_placed() -> None:
    """All 40 activations held at once would need 2.6 times the two devices; by lifetimes the chain
    holds three tensors at its busiest (12 KiB of the 16 KiB). The all-alive cap is 0 and merged
    nothing; the lifetime cap lets groups of up to half a device merge, and m-ETF's plan of the
    coarse graph, expanded, fits and validates."""
    g = _activation_chain(40)
    cluster = Cluster.homogeneous(2, "h100", memory=8192)
    total = sum(d.memory for d in cluster.devices)
    assert sum(footprints(g).values()) > 2.5 * total
    assert sequential_peak(g) == 3 * 1024
    assert all_alive_cap(sum(footprints(g).values()), cluster) == 0
    assert memory_cap(g, cluster) == 4096  # half a device; (16384 - 3072) / 1 would allow more
    ctx = PassContext(cluster=cluster, quiet=True)
    placed = PassManager("coarsen{target=4},place{algo=m-etf},expand,simulate").run(g, ctx)
    groups = {str(op.get("group")) for op in placed.ops}
    assert 4 <= len(groups) < len(placed.ops)
    plan = read_plan_attrs(placed)
    assert plan is not None and plan.peak_memory is not None
    assert max(plan.peak_memory.values()) <= 8192  # the validator's exact peaks, after expand
    coarse, _ = quotient_graph(placed, cluster)
    assert max(footprints(coarse).values()) <= 4096


def test_a_cap_the_coarse_graph_cannot_pack_is_halved() -> None:
    """The check behind the lifetime cap: forced to 4 KiB, groups of four ops hold 5 KiB at once in
    the coarse graph, which on two devices of 4 KiB leaves the 3 KiB such a group needs, and on two
    of 3.5 KiB does not; there the cap is halved, and groups of two ops hold 4 KiB and leave room
    for their 2 KiB."""
    g = _activation_chain(40)
    cluster = Cluster.homogeneous(2, "h100", memory=3584)
    original = grouping.memory_cap
    try:
        grouping.memory_cap = lambda graph, c: 4096.0  # type: ignore[assignment]
        halved = len(set(coarsen_groups(g, 1, cluster)))
        packed = len(set(coarsen_groups(g, 1, Cluster.homogeneous(2, "h100", memory=4096))))  # 3 KiB spare
    finally:
        grouping.memory_cap = original
    assert packed == 11 and halved == 21
    groups = coarsen_groups(g, 1, cluster)  # the cap itself: half a device
    coarse, _ = quotient_graph(_grouped(g, groups), cluster)
    assert 2 * 3584 - sequential_peak(coarse) >= max(footprints(coarse).values())


def _merged(graph: Graph, groups: list[str]) -> dict[str, list[str]]:
    """Groups that merging under the caps built: more than one op, not all of one colocation group
    (those are contracted before any cap applies)."""
    members: dict[str, list[str]] = defaultdict(list)
    for op, g in zip(graph.ops, groups):
        members[g].append(op.name)
    out = {}
    for g, names in members.items():
        labels = {graph.op(n).get("colocate") for n in names}
        if len(names) > 1 and (None in labels or len(labels) > 1):
            out[g] = names
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=cost_graphs(max_ops=12, memory=False), cluster=clusters(3).filter(lambda c: len(c) > 1),
       share=st.floats(0.0, 1.2), data=st.data())
def test_memory_cap_never_lets_a_group_outgrow_the_devices(graph: Graph, cluster: Cluster, share: float,
                                                           data: st.DataObject) -> None:
    """On random DAGs whose bytes are the tensors on their edges (so lifetimes matter), with devices
    that hold together from the graph's sequential peak (share 0) to its all-alive sum (share 1)
    and more, every group merging builds fits half the smallest device, and the merged groups pack
    by one of the two arguments: the all-alive sum, or the coarse graph's own peak by lifetimes
    (`memory_cap`)."""
    held = sum(footprints(graph).values())
    peak = sequential_peak(graph)
    assert peak <= held
    cluster = cluster.with_memory(max(1.0, (peak + share * (held - peak)) / len(cluster)))
    target = data.draw(st.integers(1, len(graph.ops)))
    mode = data.draw(st.sampled_from(COLOCATION_MODES))
    groups = coarsen_groups(graph, target, cluster, mode, siblings=data.draw(st.booleans()))
    coarse, _ = quotient_graph(_grouped(graph, groups), cluster)
    size = footprints(coarse)
    fine = footprints(graph)
    merged = _merged(graph, groups)
    for g, names in merged.items():
        assert size[g] <= sum(fine[n] for n in names) <= memory_cap(graph, cluster)
        assert size[g] <= min(d.memory for d in cluster.devices) / 2
    largest = max((size[g] for g in merged), default=0)
    if largest:  # groups of no bytes fit anywhere, even where the graph does not
        total = sum(d.memory for d in cluster.devices)
        spare = max(total - held, total - sequential_peak(coarse))
        assert spare >= (len(cluster) - 1) * largest
