"""High fan-out graphs (issue 45): stars and reverse stars place validly, and the pieces that made
them fast give what the plain versions gave (timings: `bench/fanout.py`)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.attributes import StringAttr
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import PairQueue
from pesto_ir.passes.placement.heuristics.baechi import LP_MAX_DEGREE, _fixed_edges
from pesto_ir.passes.placement.heuristics.portfolio import HEURISTICS
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.registry import DEFAULT_ALGO
from pesto_ir.passes.rewrite.coarse_graph import quotient_graph
from pesto_ir.passes.rewrite.grouping import TWIN_CLASS, coarsen_groups
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule import bounds
from pesto_ir.schedule.plan import read_plan_attrs
from pesto_ir.schedule.validate import check_plan, validate_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.fanout import fanout_graph  # noqa: E402

QUIET = PlaceOptions(quiet=True)
N = 2000


def _graph(shape: str, n: int = N) -> Graph:
    return graph_from_json(fanout_graph(shape, n))


def _annotated(graph: Graph, cluster: Cluster) -> Graph:
    return PassManager("annotate-costs").run(graph, PassContext(cluster=cluster, quiet=True))


@pytest.mark.parametrize("algo", ["m-etf", "m-sct"])
@pytest.mark.parametrize("shape", ["star", "reverse-star"])
def test_fan_out_places_validly(shape: str, algo: str) -> None:
    cluster = Cluster.homogeneous(4, "h100")
    graph = _annotated(_graph(shape), cluster)
    plan = HEURISTICS[algo](graph, cluster, QUIET)
    assert validate_plan(graph, cluster, plan) == []
    work = sum(slot.end - slot.start for slot in plan.ops.values())
    assert plan.makespan < work / 2  # spread over the devices, not run one after another
    assert plan.makespan >= bounds.lower_bound(graph, cluster) * (1 - 1e-9)


@pytest.mark.parametrize("algo", ["m-etf", DEFAULT_ALGO])
@pytest.mark.parametrize("shape", ["star", "reverse-star", "wide-layer"])
def test_default_pipeline_coarsens_and_places(shape: str, algo: str) -> None:
    cluster = Cluster.homogeneous(4, "h100")
    pipeline = f"annotate-costs,coarsen,place{{algo={algo} time-limit=20}},expand,simulate"
    graph = PassManager(pipeline).run(_graph(shape, 1000), PassContext(cluster=cluster, quiet=True))
    groups = {op.get("group") for op in graph.ops}
    assert len(groups) <= 200
    plan = read_plan_attrs(graph)
    assert plan is not None
    check_plan(graph, cluster, plan)
    assert plan.makespan <= 1.05 * bounds.lower_bound(graph, cluster)


@st.composite
def _hubs(draw: Any) -> dict[str, Any]:
    """Graphs of a few hubs, each read by (or reading) more than `TWIN_CLASS` ops, with some edges
    between the readers: twins, and near-twins that must not merge across a path."""
    hubs = draw(st.integers(1, 3))
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for h in range(hubs):  # nodes in a topological order: leaves before the hub they feed, after the one they read
        inward = draw(st.booleans())
        hub = {"id": f"h{h}", "cost": draw(st.sampled_from([1e-5, 2e-4])), "memory": 1024}
        leaves = [{"id": f"h{h}_{k}", "cost": draw(st.sampled_from([1e-5, 3e-5, 1e-4])), "memory": 256}
                  for k in range(draw(st.integers(TWIN_CLASS + 1, 2 * TWIN_CLASS)))]
        nodes += [*leaves, hub] if inward else [hub, *leaves]
        edges += [{"src": leaf["id"] if inward else hub["id"], "dst": hub["id"] if inward else leaf["id"],
                   "bytes": 512} for leaf in leaves]
    names = [n["id"] for n in nodes]
    for a, b in draw(st.lists(st.tuples(st.integers(0, len(names) - 1), st.integers(0, len(names) - 1)),
                              max_size=12)):
        if a < b:  # ids in creation order: edges forward keep it acyclic
            edges.append({"src": names[a], "dst": names[b], "bytes": 64})
    return {"format": "pesto-graph/1", "name": "hubs", "nodes": nodes, "edges": edges}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_hubs(), target=st.integers(1, 12))
def test_twin_merges_keep_the_coarse_graph_acyclic(doc: dict[str, Any], target: int) -> None:
    cluster = Cluster.homogeneous(2, "h100")
    graph = _annotated(graph_from_json(doc), cluster)
    groups = coarsen_groups(graph, target, cluster)  # raises if a merge closed a cycle
    for op, g in zip(graph.ops, groups):
        op.attrs["group"] = StringAttr(g)
    coarse, members = quotient_graph(graph, cluster)
    assert coarse.topo_order()  # a cycle would raise
    assert sorted(n for names in members.values() for n in names) == sorted(op.name for op in graph.ops)


def _etf_like(start: float, x: float, v: int, d: int) -> tuple[float, int, int]:
    return (start + x, v, d)


@settings(max_examples=150, deadline=None)
@given(k=st.integers(1, 3), steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 11), st.integers(0, 2),
                                                     st.sampled_from([0.0, 1e-17, 0.5, 1.0, 1.5, 3.0]),
                                                     st.sampled_from([0.0, 2e-17, 0.25, 1.0])),
                                           min_size=1, max_size=60))
def test_pair_queue_pops_what_a_heap_of_fresh_keys_would(k: int, steps: list[tuple[int, int, int, float, float]]
                                                           ) -> None:
    """Random pushes, device free times moving later, and pops: each pop is the least key
    recomputed from scratch (start = max(free, ready)) over the pairs held."""
    free = [0.0] * k
    queue = PairQueue(free, _etf_like)
    held: dict[tuple[int, int], tuple[float, float]] = {}  # (v, d) -> (ready, x)
    for action, v, d, t, x in steps:
        d %= k
        if action <= 1 and (v, d) not in held:
            held[v, d] = (t, x)
            queue.push(v, d, t, x)
        elif action == 2:
            free[d] = max(free[d], t)
            queue.touch(d)
        else:
            popped = queue.pop()
            fresh = [(_etf_like(max(free[e], ready), x_, w, e), w, e) for (w, e), (ready, x_) in held.items()]
            if not fresh:
                assert popped is None
                continue
            assert popped is not None
            key, w, e, _ = popped
            least = min(fresh)
            assert (key, w, e) == least
            del held[w, e]
        assert len(queue) == len(held)


@settings(max_examples=150, deadline=None)
@given(k=st.integers(1, 3), steps=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 11), st.integers(0, 2),
                                                     st.sampled_from([0.0, 1e-17, 0.5, 1.0, 1.5, 3.0]),
                                                     st.sampled_from([0.0, 2e-17, 0.25, 1.0])),
                                           min_size=1, max_size=60))
def test_pair_queue_never_pops_ahead_of_a_placed_ops_pairs(k: int, steps: list[tuple[int, int, int, float, float]]
                                                            ) -> None:
    """With `placed` (ops placed while their pairs are queued, as a list scheduler places an op on
    one of its devices): the pairs popped of unplaced ops are, in order, the least fresh keys over
    the unplaced ops' pairs held; a placed op's pair may still come out (the scheduler skips it),
    and once every op is placed the queue runs dry."""
    free = [0.0] * k
    placed = [-1] * 12
    queue = PairQueue(free, _etf_like, placed=placed)
    held: dict[tuple[int, int], tuple[float, float]] = {}  # (v, d) -> (ready, x), v unplaced when pushed
    for action, v, d, t, x in steps:
        d %= k
        if action <= 1 and (v, d) not in held and placed[v] < 0:
            held[v, d] = (t, x)
            queue.push(v, d, t, x)
        elif action == 2:
            free[d] = max(free[d], t)
            queue.touch(d)
        elif action == 3:
            placed[v] = d
        else:
            popped = queue.pop()
            while popped is not None and placed[popped[1]] >= 0:
                del held[popped[1], popped[2]]
                popped = queue.pop()
            fresh = [(_etf_like(max(free[e], ready), x_, w, e), w, e)
                     for (w, e), (ready, x_) in held.items() if placed[w] < 0]
            if not fresh:
                assert popped is None
                continue
            assert popped is not None
            key, w, e, _ = popped
            assert (key, w, e) == min(fresh)
            del held[w, e]
        assert len(queue) >= sum(placed[w] < 0 for w, _ in held)
    placed[:] = [0] * 12
    drained = 0
    while queue.pop() is not None:
        drained += 1
    assert drained <= len(held) and len(queue) == 0


def _best_split_by_scan(inputs: list[tuple[str, float, float, float]]) -> float:
    best = math.inf
    for t in sorted({0.0, *(a for *_, a in inputs if a != math.inf)}):
        local = sorted((release, cost) for _, release, cost, arrival in inputs if arrival > t)
        done = 0.0
        for release, cost in local:
            done = max(done, release) + cost
        best = min(best, max(t, done))
    return best


_times = st.sampled_from([0.0, 0.1, 0.25, 1.0, 1.5]) | st.floats(0, 3, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_times, _times, _times | st.just(math.inf)), max_size=40))
def test_best_split_is_the_scan_of_every_split(raw: list[tuple[float, float, float]]) -> None:
    inputs = [(f"p{i}", release, cost, arrival if arrival == math.inf else release + cost + arrival)
              for i, (release, cost, arrival) in enumerate(raw)]
    assert bounds._best_split(inputs) == _best_split_by_scan(inputs)


def test_favourite_lp_keeps_small_degrees_whole() -> None:
    edges = [(0, v, 100 * v) for v in range(1, LP_MAX_DEGREE + 1)]
    assert _fixed_edges(edges, [1.0] * len(edges), LP_MAX_DEGREE + 1) == set()
    edges.append((0, LP_MAX_DEGREE + 1, 1))
    comm = [float(nbytes) for _, _, nbytes in edges]
    assert _fixed_edges(edges, comm, LP_MAX_DEGREE + 2) == {LP_MAX_DEGREE}  # the lightest, 1 byte


def test_work_bound_is_part_of_the_lower_bound() -> None:
    cluster = Cluster.homogeneous(4, "h100")
    graph = _annotated(_graph("star", 200), cluster)
    assert bounds.work_bound(graph, cluster) <= bounds.lower_bound(graph, cluster)
