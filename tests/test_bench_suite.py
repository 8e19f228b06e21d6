"""`python -m bench --quick`, the CI smoke run of the benchmark suite: it runs, writes whole reports,
and its numbers keep the invariants every row must have."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import suite, suite_report  # noqa: E402

README = """# A project

Some text.

<!-- bench-results:begin -->
old results
<!-- bench-results:end -->

More text.
"""


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("bench")
    (out / "README.md").write_text(README)
    argv = ["--quick", "--time-limit", "5", "--out", str(out), "--readme", str(out / "README.md"),
            "--gantt", str(out / "plan.png"), "--gantt-row", "jax_mlp_quick:2", "-q"]
    assert suite.main(argv) == 0
    return out, json.loads((out / "quick.json").read_text())


@pytest.mark.slow
def test_quick_run_covers_every_quick_model_and_algorithm(quick_run: tuple[Path, dict]) -> None:
    _, doc = quick_run
    assert doc["format"] == "pesto-bench/1" and doc["quick"] is True
    models = {r["model"] for r in doc["rows"]}
    assert {"jax_mlp_quick", "jax_lstm_seq2seq_quick"} <= models
    assert {"bert24_training_layer", "gnmt_training_layer"} <= models
    assert {r["k"] for r in doc["rows"]} == {2, 4}
    for row in doc["rows"]:
        assert set(row["results"]) == set(suite_report.ALGOS)


@pytest.mark.slow
def test_no_plan_beats_the_lower_bound_and_auto_beats_every_baseline(quick_run: tuple[Path, dict]) -> None:
    """ilp and auto start from the heuristics and keep a fine heuristic plan when it is faster, so they
    are never slower than any one-batch baseline; no valid one-batch plan is faster than the lower
    bound (a hybrid plan splits the batch, and with it the critical path); a hybrid plan says which."""
    _, doc = quick_run
    one_batch = (*suite_report.BASELINES, "ilp", suite_report.ONE_BATCH)
    for row in doc["rows"]:
        lb = row["lower_bound"]
        done = {a: r["makespan"] for a, r in row["results"].items() if r["makespan"] is not None}
        assert done.keys() >= {"m-etf", "m-sct", "m-topo", "ilp", "auto", suite_report.ONE_BATCH}, row["model"]
        assert all(done[a] >= lb * (1 - 1e-9) for a in one_batch if a in done), row["model"]
        fastest_baseline = min(done[a] for a in suite_report.BASELINES if a in done)
        for exact in suite_report.EXACT:
            assert done[exact] <= fastest_baseline * (1 + 1e-9), (exact, row["model"], row["k"])
        assert row["coarse_lower_bound"] >= lb * (1 - 1e-9)
        for algo in ("dp", "gpipe", "1f1b"):
            if algo in done:
                assert row["results"][algo]["strategy"].startswith("d="), (algo, row["model"])
        if done["auto"] < lb * (1 - 1e-9):
            assert row["results"]["auto"]["strategy"], row["model"]


@pytest.mark.slow
def test_more_devices_never_give_a_slower_plan(quick_run: tuple[Path, dict]) -> None:
    """auto-1b and auto at k = 4 start from their plans at k = 2 (`place{start=FILE}`), which are
    plans on 4 devices too."""
    _, doc = quick_run
    by_model: dict[str, dict[int, dict]] = {}
    for row in doc["rows"]:
        by_model.setdefault(row["model"], {})[row["k"]] = row["results"]
    for model, at in by_model.items():
        for algo in suite_report.STARTED:
            two, four = at[2][algo]["makespan"], at[4][algo]["makespan"]
            if two is not None:
                assert four is not None and four <= two * (1 + 1e-12), (model, algo, two, four)


@pytest.mark.slow
def test_rows_above_the_goal_say_why(quick_run: tuple[Path, dict]) -> None:
    _, doc = quick_run
    for row in doc["rows"]:
        auto = row["results"]["auto"]["makespan"]
        fastest = min(r["makespan"] for r in row["results"].values() if r["makespan"] is not None)
        one_batch = not row["results"]["auto"]["strategy"]
        took, limit = row["results"]["auto"]["place_seconds"], row["results"]["auto"]["time_limit"]
        flagged = (one_batch and auto / row["lower_bound"] - 1 > suite_report.GAP_GOAL or auto > fastest * (1 + suite_report.TIE)
                   or took > limit * (1 + suite_report.OVERTIME))
        assert bool(row["findings"]) == flagged, (row["model"], row["k"], row["findings"])


@pytest.mark.slow
def test_reports_are_written_whole(quick_run: tuple[Path, dict]) -> None:
    out, doc = quick_run
    table = (out / "quick.md").read_text()
    for row in doc["rows"]:
        assert f"| {row['model']} | {row['ops']} | {row['k']} |" in table
    readme = (out / "README.md").read_text()
    assert "old results" not in readme and readme.startswith("# A project") and readme.endswith("More text.\n")
    assert "| model | ops | k |" in readme and "![Gantt chart of auto's plan](plan.png)" in readme
    assert (out / "plan.png").read_bytes().startswith(b"\x89PNG")
    assert not list(out.glob(".*.tmp"))


def test_unknown_models_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert suite.main(["--models", "no_such_model"]) == 2
    assert "unknown model(s) no_such_model" in capsys.readouterr().err


def test_a_missing_readme_is_a_clear_error_before_the_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"missing\.md: No such file or directory \(--readme names"):
        suite.main(["--quick", "--out", str(tmp_path), "--readme", str(tmp_path / "missing.md")])
    assert not list(tmp_path.iterdir())  # nothing was run or written


def test_a_readme_without_markers_is_left_alone(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# nothing to replace\n")
    with pytest.raises(SystemExit, match="markers"):
        suite_report.update_readme(readme, "| table |", None, "python -m bench")
    assert readme.read_text() == "# nothing to replace\n"


def test_a_gantt_row_outside_the_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--quick", "--out", str(tmp_path), "--gantt", str(tmp_path / "g.png"), "--gantt-row", "jax_gpt:4"]
    assert suite.main(argv) == 2
    assert "--gantt-row jax_gpt:4 is not among the rows" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def _part(tmp_path: Path, name: str, models: list[str], **header: object) -> Path:
    """A run's `.json` with rows of `models` at k = 2 and 4 (each algorithm its own step time)."""
    rows = [suite_report.Row(model=m, source="msr", description="", ops=10, k=k, cluster="", lower_bound=1e-3,
                      bound="total work", coarse_lower_bound=1e-3, groups=10, free_comm=None, free_comm_bound=1e-3,
                      results={a: suite_report.Outcome((1 + i / 10) * 1e-3, 0.1, place_seconds=0.1, time_limit=1.0)
                               for i, a in enumerate(suite_report.ALGOS)})
            for m in models for k in (2, 4)]
    head = {"command": f"run {name}", "created": "2026-12-03T00:00:00Z", "quick": False, "time_limit": 8.0,
            "search_time_limit": None, "target": 200, "seed": 0, "k": [2, 4], "seconds": 10.0, **header}
    path = tmp_path / f"{name}.json"
    path.write_text(suite_report.to_json(rows, head))
    return path


def test_parts_of_a_run_merge_in_the_zoo_order(tmp_path: Path) -> None:
    late = _part(tmp_path, "b", ["jax_mlp", "gnmt_training_layer"])  # out of order: the merge sorts them back
    early = _part(tmp_path, "a", ["bert24_training_layer"])
    out = tmp_path / "merged"
    assert suite.main(["--merge", str(late), str(early), "--out", str(out), "-q"]) == 0
    doc = json.loads((out / "suite.json").read_text())
    assert [(r["model"], r["k"]) for r in doc["rows"]] == [
        ("bert24_training_layer", 2), ("bert24_training_layer", 4), ("gnmt_training_layer", 2),
        ("gnmt_training_layer", 4), ("jax_mlp", 2), ("jax_mlp", 4)]
    assert doc["command"].startswith("run b and run a, merged by python -m bench --merge") and doc["seconds"] == 20.0
    table = (out / "suite.md").read_text()
    assert table.count("| jax_mlp | 10 |") == 2 and "| gnmt_training_layer | 10 | 4 |" in table


def test_parts_made_otherwise_or_sharing_a_row_are_refused(tmp_path: Path) -> None:
    a, b = _part(tmp_path, "a", ["jax_mlp"]), _part(tmp_path, "b", ["jax_gpt"], seed=1)
    with pytest.raises(SystemExit, match=r"b\.json: made with other options than .*a\.json \(seed\)"):
        suite.main(["--merge", str(a), str(b), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="the row jax_mlp k=2 is in more than one part"):
        suite.main(["--merge", str(a), str(a), "--out", str(tmp_path)])
    b.write_text("{}")
    with pytest.raises(SystemExit, match="not a pesto-bench/1 file"):
        suite.main(["--merge", str(b), "--out", str(tmp_path)])


def test_bound_gap_recomputes_the_bound_of_recorded_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recorded row keeps its plan; the bound is the current code's, the ratios both."""
    from bench import bound_gap
    from bench.zoo import msr_model
    from pesto_ir.schedule.bounds import lower_bound

    model = msr_model("bert24_training_layer")
    now = lower_bound(model.build(), model.cluster(4))
    row = {"model": model.name, "source": "msr", "k": 4, "lower_bound": now / 2,
           "results": {"auto-1b": {"makespan": now * 1.1}}}
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"rows": [row]}))
    assert bound_gap.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert f"| {now * 1e3:.4g} | critical path | 2.200 | 1.100 |" in out
    assert "k=4 MSR graphs (1 rows): geometric mean auto-1b / LB 2.2000 then, 1.1000 now" in out
    with pytest.raises(SystemExit):
        bound_gap.main([str(tmp_path / "missing.json")])
