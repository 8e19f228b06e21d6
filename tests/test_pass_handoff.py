"""A plan a pass simulated and checked goes to the next pass as it is (`PassContext.recorded`, handed on
by `PassManager.run` as `checked`): `simulate` after `expand` takes expand's plan instead of timing
and checking the same 50,000 ops again. The hand-off must never show: a pipeline run by one manager
prints exactly what its passes print run one by one (no hand-off), and nothing is handed past the
next pass, across a pass that changes the graph, or out of the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import placement_problems

from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends import load
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.expansion import TimedPlan
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passmanager import Pass, PassContext, PassManager, Pipeline
from pesto_ir.schedule.plan import read_plan_attrs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HEURISTICS = sorted(name for name, entry in ALGORITHMS.items() if not entry.exact)


def one_run(graph: Graph, cluster: Cluster, pipeline: str) -> str:
    return str(PassManager(pipeline).run(graph.clone(), PassContext(cluster=cluster, quiet=True)))


def pass_by_pass(graph: Graph, cluster: Cluster, pipeline: str) -> str:
    """Each pass through its own manager, so none is handed a plan."""
    graph = graph.clone()
    for p in Pipeline.parse(pipeline).passes:
        graph = PassManager(Pipeline([p])).run(graph, PassContext(cluster=cluster, quiet=True))
    return str(graph)


@settings(deadline=None, database=None, derandomize=True, max_examples=60,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problem=placement_problems(max_ops=10), algo=st.sampled_from([*HEURISTICS, "auto"]))
def test_a_pipeline_prints_what_its_passes_print_one_by_one(problem: tuple[Graph, Cluster], algo: str) -> None:
    graph, cluster = problem
    pipeline = f"annotate-costs,coarsen{{target=4}},place{{algo={algo} time-limit=2}},expand,simulate"
    assert one_run(graph, cluster, pipeline) == pass_by_pass(graph, cluster, pipeline)


def test_the_bundled_examples_print_the_same_with_and_without_the_hand_off() -> None:
    cluster = Cluster.homogeneous(4, "h100")
    for path in sorted(EXAMPLES.glob("*.pir")):
        graph = load(path)
        pipeline = "annotate-costs,coarsen,place{algo=m-etf},expand,simulate"
        assert one_run(graph, cluster, pipeline) == pass_by_pass(graph, cluster, pipeline), path.name


def test_a_star_at_its_work_bound_prints_the_same_with_and_without_the_hand_off() -> None:
    """auto's m-ETF plan of a star at its work bound goes from place to expand to simulate as it is."""
    doc = {"format": "pesto-graph/1", "name": "star",
           "nodes": [{"id": "hub", "cost": 2e-5, "memory": 1 << 20}]
           + [{"id": f"n{k}", "cost": 1e-3 * (1 + k % 7), "memory": 4096} for k in range(300)],
           "edges": [{"src": "hub", "dst": f"n{k}", "bytes": 1024} for k in range(300)]}
    graph = graph_from_json(doc, "star.json")
    cluster = Cluster.homogeneous(4, "h100")
    pipeline = "annotate-costs,coarsen,place,expand,simulate"
    printed = one_run(graph, cluster, pipeline)
    assert "within 1% of the work bound" in printed  # the plan that is handed on
    assert printed == pass_by_pass(graph, cluster, pipeline)


@dataclass(frozen=True)
class _Spy(Pass):
    """Records what it was handed, and, where asked, hands on a plan of its own."""

    name = "spy"
    seen: Any = None
    record: bool = False

    def run(self, graph: Graph, ctx: PassContext) -> None:
        self.seen.append(ctx.checked)
        if self.record:
            ctx.recorded = TimedPlan(graph, ctx.cluster, read_plan_attrs(graph))  # type: ignore[arg-type]


def test_a_plan_is_handed_to_the_next_pass_alone_and_not_out_of_the_run() -> None:
    cluster = Cluster.homogeneous(2, "h100")
    graph = PassManager("annotate-costs,place{algo=m-etf}").run(load(EXAMPLES / "mlp_train_step.pir"),
                                                               PassContext(cluster=cluster, quiet=True))
    seen: list[Any] = []
    ctx = PassContext(cluster=cluster, quiet=True)
    PassManager(Pipeline([_Spy(seen, record=True), _Spy(seen), _Spy(seen)])).run(graph, ctx)
    assert seen[0] is None and isinstance(seen[1], TimedPlan) and seen[2] is None
    assert ctx.checked is None and ctx.recorded is None


def test_a_plan_recorded_for_another_graph_or_cluster_is_not_taken() -> None:
    cluster = Cluster.homogeneous(2, "h100")
    graph = PassManager("annotate-costs,place{algo=m-etf}").run(load(EXAMPLES / "mlp_train_step.pir"),
                                                               PassContext(cluster=cluster, quiet=True))
    plan = read_plan_attrs(graph)
    assert plan is not None
    timed = TimedPlan(graph, cluster, plan)
    assert TimedPlan.of(timed, graph, cluster) is timed
    assert TimedPlan.of(timed, graph.clone(), cluster) is None
    assert TimedPlan.of(timed, graph, Cluster.homogeneous(2, "h100")) is None
    assert TimedPlan.of(None, graph, cluster) is None
