"""pesto-compile end to end: outputs written whole, JSON graphs imported, errors without tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pesto_ir
from pesto_ir.cli import main

ROOT = Path(__file__).resolve().parent.parent
MSR = ROOT.parent / "shared" / "graphs" / "msr"
EXAMPLE = ROOT / "examples" / "mlp_train_step.pir"


def test_compile_writes_output_that_parses_back(tmp_path: Path) -> None:
    out = tmp_path / "out.pir"
    assert main([str(EXAMPLE), "-p", "verify", "-o", str(out), "-q"]) == 0
    assert pesto_ir.load(out).structurally_equal(pesto_ir.load(EXAMPLE))


@pytest.mark.skipif(not MSR.exists(), reason="shared MSR graphs not present")
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
