"""Scenarios both exact engines (the MILP and CP-SAT) must solve to the brute-force optimum."""

from __future__ import annotations

import pytest
from test_ilp import QUIET, assert_optimal, make_graph, two_gpus

from pesto_ir.passes.placement.exact.cpsat import place_cpsat
from pesto_ir.passes.placement.exact.ilp import place_ilp
from pesto_ir.passes.placement.options import Algorithm
from pesto_ir.util.errors import PestoError

ENGINES = pytest.mark.parametrize("place", [place_ilp, place_cpsat], ids=["ilp", "cpsat"])


@ENGINES
def test_colocation_is_kept_and_optimal(place: Algorithm) -> None:
    nodes = [{"id": "a", "cost": 0.1, "colocate": "g"}, {"id": "b", "cost": 0.4}, {"id": "c", "cost": 0.4},
             {"id": "d", "cost": 0.1, "colocate": "g"}, {"id": "e", "cost": 0.3, "colocate": "h"},
             {"id": "f", "cost": 0.2, "colocate": "h"}]
    edges = [("a", "b", 1000), ("a", "c", 1000), ("b", "d", 1000), ("c", "d", 1000), ("e", "f", 1000)]
    graph, cluster = make_graph(nodes, edges), two_gpus()
    plan = place(graph, cluster, QUIET)
    assert plan.ops["a"].device == plan.ops["d"].device
    assert plan.ops["e"].device == plan.ops["f"].device
    assert_optimal(graph, cluster, plan)


@ENGINES
def test_memory_capacity_forces_a_split(place: Algorithm) -> None:
    # 4 GB resident per op on 11 GB devices: two ops each, with room for the 1 GB copy between them
    nodes = [{"id": f"n{i}", "cost": 0.1, "memory": 4 * 10**9} for i in range(4)]
    graph = make_graph(nodes, [("n0", "n1", 10**9), ("n1", "n2", 10**9), ("n2", "n3", 10**9)], "chain")
    cluster = two_gpus(memory=11e9)
    plan = place(graph, cluster, QUIET)
    for d in cluster.names:
        assert sum(1 for s in plan.ops.values() if s.device == d) <= 2
    assert len({s.device for s in plan.ops.values()}) == 2
    assert_optimal(graph, cluster, plan)


@ENGINES
def test_memory_that_cannot_fit_is_a_clean_error(place: Algorithm) -> None:
    graph = make_graph([{"id": "a", "cost": 0.1, "memory": 200}], [])
    with pytest.raises(PestoError, match="bytes"):
        place(graph, two_gpus(memory=100), QUIET)
