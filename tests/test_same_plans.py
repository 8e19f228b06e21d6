"""`python -m bench.same_plans`: the plans it writes are the CLI's, and a changed plan is found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import same_plans

ROOT = Path(__file__).resolve().parent.parent


def test_written_plans_compare_equal_and_a_changed_one_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(same_plans, "models", lambda: [ROOT / "examples" / "mlp_train_step.pir"])
    monkeypatch.setattr(same_plans, "DETERMINISTIC", ("m-etf", "single"))
    before, after = tmp_path / "before", tmp_path / "after"
    assert same_plans.write(before, 2) == 0 and same_plans.write(after, 2) == 0
    plan = json.loads((before / "mlp_train_step.m-etf.json").read_text())
    assert plan["format"] == "pesto-plan/1" and plan["algorithm"] == "m-etf"
    assert same_plans.compare(before, after) == 0
    assert "4 of 4 files identical" in capsys.readouterr().out
    changed = after / "mlp_train_step.single.json"
    changed.write_text(changed.read_text().replace("gpu0", "gpu1"))
    assert same_plans.compare(before, after) == 1
    assert "differs: mlp_train_step.single.json" in capsys.readouterr().out
