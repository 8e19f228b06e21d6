"""The Gantt chart as a person reads it: bar labels where they fit, idle devices, visible transfers, legend."""

from __future__ import annotations

import pytest

import pesto_ir
from pesto_ir.backends.gantt import MIN_TRANSFER_FRACTION, GanttError, bar_label, gantt_figure, gantt_image, label_fits
from pesto_ir.cluster import Cluster
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.plan import Plan, read_plan_attrs

# a long op and a short one with a long name on gpu0, one op on gpu1 fed by an 8-byte transfer; gpu2 unused
PLACED = """graph @toy() {
  %wide = opaque() {cost = 10ms, device = @gpu0} : blob[8]
  %a_very_long_name_for_a_short_op = opaque(%wide) {cost = 10us, device = @gpu0} : blob[8]
  %far = opaque(%wide) {cost = 5ms, device = @gpu1} : blob[0]
}"""

# the same ops as a coarse plan draws them: the two ops of group "blockA" share one bar
COARSE = """graph @coarse() {
  %p = opaque() {cost = 4ms, group = "blockA", device = @gpu0} : blob[4]
  %q = opaque() {cost = 4ms, group = "blockA", device = @gpu0} : blob[4]
}"""


def simulated(text: str = PLACED, devices: int = 3) -> tuple[pesto_ir.Graph, Plan]:
    cluster = Cluster.homogeneous(devices, "h100", latency=1e-9, bandwidth=1e12)  # the 8 bytes take ~1 ns
    g = PassManager("annotate-costs,simulate").run(pesto_ir.parse(text), PassContext(cluster=cluster, quiet=True))
    plan = read_plan_attrs(g)
    assert plan is not None
    return g, plan


def texts(ax, gid: str) -> list:
    return [t for t in ax.texts if t.get_gid() == gid]


def collection(ax, gid: str):
    [found] = [c for c in ax.collections if c.get_gid() == gid]
    return found


def test_wide_bars_are_labelled_and_narrow_ones_are_not() -> None:
    g, plan = simulated()
    ax = gantt_figure(plan, g).axes[0]
    labels = {t.get_text(): t for t in texts(ax, "label")}
    assert "wide" in labels and "far" in labels
    assert "a_very_long_name_for_a_short_op" not in labels
    assert labels["wide"].get_position()[1] == 0 and labels["far"].get_position()[1] == 1  # on their rows


def test_an_unused_device_is_marked_idle() -> None:
    g, plan = simulated()
    assert "gpu2" in plan.devices and not any(s.device == "gpu2" for s in plan.ops.values())
    ax = gantt_figure(plan, g).axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    idle = texts(ax, "idle")
    assert [t.get_text() for t in idle] == ["idle"]
    assert rows[round(idle[0].get_position()[1])] == "gpu2"


def test_short_transfers_are_drawn_at_least_the_minimum_width() -> None:
    g, plan = simulated()
    [t] = plan.transfers
    assert t.end - t.start < 1e-6 and t.start > 0  # far shorter than the minimum; its true times are kept
    ax = gantt_figure(plan, g).axes[0]
    rows = [x.get_text() for x in ax.get_yticklabels()]
    assert "gpu0 -> gpu1" in rows
    bars = collection(ax, "link:gpu0 -> gpu1")
    [path] = bars.get_paths()
    xs = path.vertices[:, 0]
    lo, hi = ax.get_xlim()
    assert xs.max() - xs.min() >= MIN_TRANSFER_FRACTION * (hi - lo) * (1 - 1e-9)
    assert xs.min() == pytest.approx(t.start * 1e3)  # ms axis: the bar starts at the true time


def test_legend_says_what_colours_and_link_rows_mean() -> None:
    g, plan = simulated()
    legend = gantt_figure(plan, g).axes[0].get_legend()
    assert legend is not None
    assert legend.get_title().get_text() == "colour = label prefix"
    entries = [t.get_text() for t in legend.get_texts()]
    assert "transfer (rows a -> b)" in entries


def test_a_coarse_group_sharing_a_bar_is_labelled_with_the_group() -> None:
    g, plan = simulated(COARSE, devices=1)
    # simulate gives each op its own times; make them share the bar as a coarse plan does
    slot = plan.ops["p"]
    plan.ops["q"] = type(slot)(slot.device, slot.start, slot.end)
    ax = gantt_figure(plan, g).axes[0]
    assert [t.get_text() for t in texts(ax, "label")] == ["blockA"]
    assert ax.get_legend().get_title().get_text() == "colour = op group"
    assert bar_label(g, ["p", "q"]) == "blockA" and bar_label(None, ["p", "q"]) == "p +1"


def test_label_fits_estimate() -> None:
    assert label_fits("wide", 1.0) and not label_fits("wide", 0.1)
    assert not label_fits("x" * 40, 1.0)


def test_memory_lane_still_drawn_and_png_written() -> None:
    g, plan = simulated()
    fig = gantt_figure(plan, g, memory=True)
    assert len(fig.axes) == 2 and fig.axes[1].get_lines()
    assert texts(fig.axes[0], "idle")
    png = gantt_image(plan, g, "png", memory=True)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(GanttError, match="needs the graph"):
        gantt_figure(plan, None, memory=True)
