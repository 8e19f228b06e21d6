"""A plan is labelled with the engine that produced it: a skipped MILP or a warm start returned
unchanged says so in the plan JSON (`solver.winner`), the summary, the chart's title and the last
line of the log, which gives the plan's step time, its bound and its strategy, once."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from pesto_ir.backends.gantt import gantt_image
from pesto_ir.cli import main
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.passes.placement.label import answer_line, plan_label, strategy_text
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import OpSlot, Parallelism, Plan, read_plan_attrs

ROOT = Path(__file__).parent.parent
GNMT = ROOT / "graphs" / "msr" / "gnmt_training_layer.json"


def _plan(algorithm: str, solver: dict[str, object] | None = None, parallelism: Parallelism | None = None) -> Plan:
    ops = {"a": OpSlot("gpu0", 0.0, 1e-3), "b": OpSlot("gpu1", 0.0, 2e-3)}
    return Plan("g", algorithm, ["gpu0", "gpu1", "gpu2"], ops, [], lower_bound=1e-3, solver=solver, parallelism=parallelism)


def test_the_label_names_the_winner_where_it_is_another_engine() -> None:
    assert plan_label(_plan("m-etf")) == "m-etf"
    assert plan_label(_plan("auto", {"winner": "auto"})) == "auto"
    assert plan_label(_plan("auto", {"winner": "cpsat-lns + justified"})) == "auto: cpsat-lns + justified"
    assert plan_label(_plan("ilp", {"winner": "m-etf's warm start, MILP skipped"})) == \
        "ilp: m-etf's warm start, MILP skipped"


def test_the_answer_line_gives_step_time_bound_and_strategy() -> None:
    line = answer_line(_plan("auto", {"winner": "cpsat"}))
    assert line == "answer: step time 2 ms, lower bound 1 ms (2.000x); one batch on 2 of 3 devices; plan by auto: cpsat"
    hybrid = _plan("auto", parallelism=Parallelism(2, 4, (("gpu0", "gpu1"), ("gpu2", "gpu3")), optimizer_state="sharded"))
    assert strategy_text(hybrid) == ("data-parallel 2 x 4 micro-batches, 2 devices per replica, "
                                     "optimizer state sharded (ZeRO-1)")


@pytest.mark.skipif("ilp" not in ALGORITHMS, reason="python-mip is not installed")
def test_a_skipped_milp_is_reported_as_the_warm_start_everywhere(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """GNMT's 192 layers on 4 devices without coarsening: the MILP would have 38,965 binaries, over
    the limit, so ilp returns m-ETF's warm start and every report says so."""
    plan_json, gantt = tmp_path / "plan.json", tmp_path / "g.svg"
    assert main([str(GNMT), "--devices", "4", "--algo", "ilp", "-p", "annotate-costs,place,simulate",
                 "--plan-json", str(plan_json), "--gantt", str(gantt)]) == 0
    err = capsys.readouterr().err
    doc = json.loads(plan_json.read_text())
    assert doc["algorithm"] == "ilp" and doc["solver"]["status"] == "skipped"
    winner = doc["solver"]["winner"]
    assert winner.endswith("'s warm start, MILP skipped") and winner.split("'")[0] in ALGORITHMS
    assert f"plan for 'gnmt_training_layer' (ilp: {winner}): makespan" in err
    assert f"gnmt_training_layer (ilp: {winner}): makespan" in gantt.read_text()
    last = err.strip().splitlines()[-1]
    assert last.startswith("answer: step time ") and last.endswith(f"plan by ilp: {winner}")
    assert sum(line.startswith("answer:") for line in err.splitlines()) == 1


def test_the_log_labels_its_intermediate_figures() -> None:
    graph = graph_from_json(json.loads(GNMT.read_text()))
    log = io.StringIO()
    cluster = Cluster.homogeneous(2, "v100", memory=17185374208, latency=1e-5, bandwidth=50e9)
    graph = PassManager("coarsen{target=50},place{algo=m-etf},expand,simulate").run(
        graph, PassContext(cluster=cluster, log=log))
    lines = log.getvalue().splitlines()
    assert any(line.startswith("place: candidate (m-etf): ") for line in lines)
    assert any(line.startswith("expand: 192 ops, re-timed with first-come links: ") for line in lines)
    assert not any(" makespan " in line for line in lines if line.startswith(("place:", "expand:")))
    plan = read_plan_attrs(graph)
    assert plan is not None and gantt_image(plan, graph, "svg")
