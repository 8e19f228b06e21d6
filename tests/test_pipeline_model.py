"""The stage-level pipeline model (`passes/placement/pipeline/model.py`) against the simulator, and the
hybrid search that builds pipelines in the model's order."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import layered_graphs, v100s

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.pipeline.model import MODEL_MICROBATCHES, acyclic, build_model
from pesto_ir.passes.placement.pipeline.schedules import SCHEDULES, pipeline_plan
from pesto_ir.passes.placement.search.strategies import AUTO_MICROBATCHES
from pesto_ir.passes.rewrite.rebatch import rebatch
from pesto_ir.passes.rewrite.replicas import Strategy, as_hybrid, replica_graph
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import read_plan_attrs

OPTIONS = PlaceOptions(quiet=True)




@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered_graphs(), st.integers(1, 4), st.integers(2, 6), st.sampled_from(SCHEDULES))
def test_the_model_is_exact_on_layered_steps(step: tuple[Graph, int], n_devices: int, m: int, schedule: str) -> None:
    """A chain of layers sends one value per micro-batch from each stage to the next, when its last
    layer ends: slots are what the simulator runs, so the model's step time is the simulator's
    (up to a byte of rounding where the batch does not split evenly)."""
    graph, layers = step
    if layers < n_devices:
        return
    cluster = Cluster.homogeneous(n_devices, "v100", latency=1e-6, bandwidth=1e10)
    model = build_model(rebatch(graph, MODEL_MICROBATCHES), cluster, graph)
    simulated = pipeline_plan(rebatch(graph, m), cluster, schedule, OPTIONS).makespan
    assert model.predict(schedule, m) == pytest.approx(simulated, rel=1e-6)


@pytest.mark.parametrize("n_devices", [2, 4])
def test_the_model_follows_the_simulator_on_bert24(bert24: Graph, n_devices: int) -> None:
    """On a real layer graph (its backward chain runs from the first layer to the last, against
    the schedule) the model is within 1% of the simulated step for every m and both schedules."""
    cluster = v100s(n_devices)
    model = build_model(replica_graph(bert24, cluster, Strategy(1, MODEL_MICROBATCHES)), cluster, bert24)
    for m in (2, 4, 8, 16):
        replica = replica_graph(bert24, cluster, Strategy(1, m))
        for schedule in SCHEDULES:
            simulated = pipeline_plan(replica, cluster, schedule, OPTIONS).makespan
            assert model.predict(schedule, m) == pytest.approx(simulated, rel=0.01), (m, schedule)


def test_reads_that_close_a_cycle_go_the_schedules_way() -> None:
    """Backward ops of two stages that feed each other (operator graphs do this): only the read
    that runs backward down the stages is kept, so the slots can be ordered."""
    reads = {(0, "F"): set(), (1, "F"): {(0, "F")}, (1, "B"): {(1, "F"), (0, "B")}, (0, "B"): {(0, "F"), (1, "B")}}
    kept = acyclic(reads)
    assert kept[(0, "B")] == {(0, "F"), (1, "B")}
    assert kept[(1, "B")] == {(1, "F")}
    assert kept[(1, "F")] == {(0, "F")}


def test_predict_refuses_what_it_does_not_model(bert24: Graph) -> None:
    cluster = v100s(2)
    model = build_model(replica_graph(bert24, cluster, Strategy(1, MODEL_MICROBATCHES)), cluster, bert24)
    with pytest.raises(ValueError, match="no model"):
        model.predict("interleaved", 4)
    with pytest.raises(ValueError, match="no model"):
        model.predict("gpipe", 0)


@pytest.mark.slow
def test_auto_is_at_least_as_fast_as_every_fixed_pipeline(bert24: Graph) -> None:
    """The search builds the pipelines the model ranks first; on bert24 over 4 devices it finds a
    plan no slower than the best GPipe or 1F1B at any m it may choose, within its time limit."""
    cluster = v100s(4)
    best = min(as_hybrid(replica, cluster, pipeline_plan(replica, cluster, schedule, OPTIONS), Strategy(1, m)).makespan
               for m in AUTO_MICROBATCHES if m > 1
               for replica in [replica_graph(bert24, cluster, Strategy(1, m))] for schedule in SCHEDULES)
    graph = PassManager("place{algo=auto time-limit=5}", verify_each=False).run(
        bert24.clone(), PassContext(cluster=cluster, quiet=True))
    plan = read_plan_attrs(graph)
    assert plan is not None and plan.parallelism is not None
    assert plan.makespan <= best * (1 + 1e-9)
    assert len(plan.parallelism.replicas[0]) == 4  # a pipeline over all four devices
