"""--memory-plot and the Gantt memory lane: files written, the lines drawn are the plan's live bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import pesto_ir
from pesto_ir.backends.memory_plot import MemoryPlotError, byte_unit, step_series, write_memory_plot
from pesto_ir.cli import main
from pesto_ir.cluster.model import Cluster
from pesto_ir.schedule.memory import live_bytes, peak_memory
from pesto_ir.schedule.plan import read_plan_attrs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mlp_train_step.pir"
MiB = 2**20


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> pesto_ir.Graph:
    out = tmp_path_factory.mktemp("placed") / "mlp.pir"
    assert main([str(EXAMPLE), "--devices", "2", "--algo", "m-etf", "-o", str(out), "-q"]) == 0
    return pesto_ir.load(out)


def test_cli_writes_a_memory_plot(tmp_path: Path) -> None:
    plot = tmp_path / "memory.png"
    assert main([str(EXAMPLE), "--devices", "2", "--algo", "m-etf", "--memory-plot", str(plot), "-q"]) == 0
    width, height = png_size(plot.read_bytes())
    assert width > 0 and height > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.png"]  # no temporary left behind


def test_cli_gantt_with_a_memory_lane_is_taller(tmp_path: Path) -> None:
    plain, laned = tmp_path / "g.png", tmp_path / "gm.png"
    args = [str(EXAMPLE), "--devices", "2", "--algo", "m-etf", "-q"]
    assert main([*args, "--gantt", str(plain)]) == 0
    assert main([*args, "--gantt", str(laned), "--gantt-memory"]) == 0
    (w0, h0), (w1, h1) = png_size(plain.read_bytes()), png_size(laned.read_bytes())
    assert w1 == w0 and h1 > h0


def test_plotted_lines_are_the_live_bytes(placed: pesto_ir.Graph, tmp_path: Path) -> None:
    plan = read_plan_attrs(placed)
    assert plan is not None
    cluster = Cluster.homogeneous(2, "h100", memory=4 * MiB)  # in view of the ~2.5 MiB peak: drawn
    fig = write_memory_plot(placed, plan, tmp_path / "m.svg", cluster)
    assert "<svg" in (tmp_path / "m.svg").read_text()
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (us)" and ax.get_ylabel() == "live memory (MiB)"
    assert plan.graph in ax.get_title() and plan.algorithm in ax.get_title()
    lines = {line.get_label(): line for line in ax.get_lines()}
    live, peaks = live_bytes(placed, plan), peak_memory(placed, plan)
    assert set(live) == {"gpu0", "gpu1"}
    for device, steps in live.items():
        (label,) = [k for k in lines if k.startswith(f"{device} (peak")]
        xs, ys = lines[label].get_xdata(), lines[label].get_ydata()
        expected = ([(0.0, 0)] if steps[0][0] > 0 else []) + steps
        if plan.makespan > steps[-1][0]:
            expected.append((plan.makespan, steps[-1][1]))
        assert list(xs) == pytest.approx([t * 1e6 for t, _ in expected])
        assert list(ys) == pytest.approx([b / MiB for _, b in expected])
        assert max(ys) == pytest.approx(peaks[device].nbytes / MiB)
        assert lines[label].get_drawstyle() == "steps-post"
        capacity = lines[f"{device} capacity 4 MiB"]
        assert capacity.get_linestyle() == "--" and list(capacity.get_ydata()) == [4.0, 4.0]


def test_capacities_far_above_the_peak_are_named_not_drawn(placed: pesto_ir.Graph, tmp_path: Path) -> None:
    plan = read_plan_attrs(placed)
    assert plan is not None
    fig = write_memory_plot(placed, plan, tmp_path / "m.png", Cluster.homogeneous(2, "h100"))
    ax = fig.axes[0]
    assert not [line for line in ax.get_lines() if "capacity" in line.get_label()]
    assert any("80 GiB (above the chart)" in t.get_text() for t in ax.texts)


def test_step_series_and_units() -> None:
    assert step_series([(1.0, 5), (2.0, 3)], 4.0) == ([0.0, 1.0, 2.0, 4.0], [0, 5, 3, 3])
    assert step_series([(0.0, 5)], 0.0) == ([0.0], [5])
    assert step_series([], 2.0) == ([0.0, 2.0], [0, 0])
    assert byte_unit(3 * 2**30) == ("GiB", 2**30) and byte_unit(2 * MiB) == ("MiB", MiB)
    assert byte_unit(10) == ("bytes", 1.0)


def test_bad_memory_plot_paths_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(EXAMPLE), "--devices", "2", "--algo", "m-etf", "-q"]
    assert main([*args, "--memory-plot", str(tmp_path / "m.gif")]) == 1
    err = capsys.readouterr().err
    assert "a memory plot file must end in .png, .svg, .pdf" in err and "Traceback" not in err
    assert main([*args, "--memory-plot", str(tmp_path / "no" / "such" / "m.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does not exist" in err and "Traceback" not in err  # checked before any work
    assert main([*args, "--gantt-memory"]) == 1
    assert "give --gantt FILE too" in capsys.readouterr().err
    assert main([str(EXAMPLE), "-p", "verify", "--memory-plot", str(tmp_path / "m.png")]) == 1
    assert "has no plan to report" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(MemoryPlotError, match="must end in"):
        write_memory_plot(pesto_ir.load(EXAMPLE), None, "m.jpg")  # type: ignore[arg-type]
