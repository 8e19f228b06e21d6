"""pesto-compile end to end: outputs written whole, JSON graphs imported, errors without tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pesto_ir
from pesto_ir.cli import main

ROOT = Path(__file__).resolve().parent.parent
MSR = ROOT / "graphs" / "msr"
EXAMPLE = ROOT / "examples" / "mlp_train_step.pir"


def test_compile_writes_output_that_parses_back(tmp_path: Path) -> None:
    out = tmp_path / "out.pir"
    assert main([str(EXAMPLE), "-p", "verify", "-o", str(out), "-q"]) == 0
    assert pesto_ir.load(out).structurally_equal(pesto_ir.load(EXAMPLE))


def test_json_cost_graph_imports_and_parses_back(tmp_path: Path) -> None:
    out = tmp_path / "x.pir"
    assert main([str(MSR / "bert_l-3_training_op.json"), "-p", "verify", "-o", str(out), "-q"]) == 0
    g = pesto_ir.load(out)
    pesto_ir.verify(g)
    assert len(g) == 600
    src = pesto_ir.load(MSR / "bert_l-3_training_op.json")
    assert g.structurally_equal(src)


def test_failed_compile_leaves_previous_output_untouched(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pir"
    bad.write_text("graph @g() {\n  %y = neg(%nope) : f32[2]\n}\n")
    out = tmp_path / "out.pir"
    out.write_text("previous\n")
    assert main([str(bad), "-o", str(out), "-q"]) == 1
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pir", "out.pir"]  # no temporary left behind


def test_missing_file_and_bad_pipeline_are_plain_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope.pir")]) == 1
    assert "cannot read file" in capsys.readouterr().err
    assert main([str(EXAMPLE), "-p", "verify,frobnicate"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("<pipeline>:1:8: error: unknown pass 'frobnicate'")
    assert "^^^^^^^^^^" in err


def test_console_script_exits_nonzero_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pir"
    bad.write_text("graph @g( {\n}\n")
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "pesto_ir.cli", str(bad)], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"{bad}:1:11: error: unexpected '{{'" in proc.stderr


def test_placement_reports_are_consistent(tmp_path: Path) -> None:
    """The default pipeline with --algo: plan JSON, trace, Gantt and .pir all describe one valid plan."""
    import json

    from pesto_ir.cluster.model import Cluster
    from pesto_ir.schedule.plan import Plan, read_plan_attrs
    from pesto_ir.schedule.validate import validate_plan

    out, plan_json, trace, gantt = (tmp_path / n for n in ("out.pir", "plan.json", "trace.json", "gantt.png"))
    example = ROOT / "examples" / "inception_block.pir"
    assert main([str(example), "--devices", "3", "--algo", "m-etf", "-o", str(out), "--plan-json", str(plan_json),
                 "--trace", str(trace), "--gantt", str(gantt), "-q"]) == 0
    placed = pesto_ir.load(out)
    plan = Plan.from_json(json.loads(plan_json.read_text()))
    assert plan.algorithm == "m-etf" and plan.devices == ["gpu0", "gpu1", "gpu2"]
    assert validate_plan(placed, Cluster.homogeneous(3, "h100"), plan) == []
    recorded = read_plan_attrs(placed)
    assert recorded is not None and recorded.makespan == pytest.approx(plan.makespan)
    assert plan.lower_bound is not None and plan.lower_bound <= plan.makespan
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events if e.get("ph") == "X"} >= set(plan.ops)
    assert gantt.read_bytes().startswith(b"\x89PNG")


def test_emit_python_writes_a_module_that_runs(tmp_path: Path) -> None:
    module = tmp_path / "placed.py"
    assert main([str(EXAMPLE), "--devices", "2", "--algo", "m-etf", "--emit", "python", "-o", str(module), "-q"]) == 0
    text = module.read_text()
    compile(text, str(module), "exec")
    assert "def run(" in text and "mlp_train_step" in text


def test_reports_without_a_place_pass_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(EXAMPLE), "-p", "verify", "--plan-json", str(tmp_path / "p.json")]) == 1
    assert "has no plan to report" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_algo_without_place_pass_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(EXAMPLE), "-p", "verify", "--algo", "m-etf"]) == 1
    assert "--algo needs a place pass" in capsys.readouterr().err


@pytest.mark.parametrize("text, nbytes", [("16GiB", 16 * 2**30), ("80e9", 80 * 10**9), ("3 MiB", 3 * 2**20),
                                          ("17179869184", 17179869184)])
def test_memory_flag_takes_bytes_or_sizes(tmp_path: Path, text: str, nbytes: int) -> None:
    plan = tmp_path / "plan.json"
    assert main([str(EXAMPLE), "--devices", "1", "--memory", text, "-p", "annotate-costs,simulate",
                 "--plan-json", str(plan), "-q"]) == 0
    assert 0 < json.loads(plan.read_text())["peak_memory"]["gpu0"] < nbytes


@pytest.mark.parametrize("flag, value", [("--memory", "0"), ("--memory", "-5"), ("--memory", "nan"),
                                         ("--memory", "inf"), ("--memory", "1.5"), ("--memory", "lots"),
                                         ("--devices", "0"), ("--devices", "-1")])
def test_memory_and_devices_refuse_what_is_not_a_positive_amount(flag: str, value: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([str(EXAMPLE), flag, value, "-q"])
    assert e.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_a_step_that_does_not_fit_names_the_device_peak_moment_and_tensors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(EXAMPLE), "--devices", "1", "--memory", "2MB", "-p", "annotate-costs,simulate", "-q"]) == 1
    err = capsys.readouterr().err
    assert "out of memory: gpu0 peaks at" in err and "bytes more than its" in err and "alive then: " in err
