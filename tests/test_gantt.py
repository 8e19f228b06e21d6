"""The Gantt chart as a person reads it: bar labels where they fit, idle devices, visible transfers, legend."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from matplotlib.colors import to_hex

import pesto_ir
from pesto_ir.backends.gantt import (
    MAX_MICROBATCH_LEGEND,
    MIN_TRANSFER_FRACTION,
    ONCE_COLOUR,
    GanttError,
    bar_label,
    collective_labels,
    gantt_figure,
    gantt_image,
    label_fits,
)
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.attributes import IntAttr
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import Plan, read_plan_attrs
from pesto_ir.util.units import human_bytes

ROOT = Path(__file__).resolve().parent.parent

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


# ---------------------------------------------------------------- hybrid plans: micro-batches and all-reduces

@functools.cache
def hybrid_plan() -> tuple[pesto_ir.Graph, Plan]:
    """The MLP step as 2 replicas of 2 devices, 2 micro-batches each (a rewritten replica graph)."""
    g = pesto_ir.load(ROOT / "examples" / "mlp_train_step.pir")
    ctx = PassContext(cluster=Cluster.homogeneous(4, "h100"), quiet=True)
    out = PassManager("annotate-costs,place{algo=m-etf data-parallel=2 microbatches=2}").run(g, ctx)
    plan = read_plan_attrs(out)
    assert plan is not None and plan.parallelism is not None
    return out, plan


def all_reduces(g: pesto_ir.Graph) -> list[str]:
    return [op.name for op in g.ops if op.opcode == "all_reduce"]


def test_hybrid_bars_are_coloured_by_micro_batch() -> None:
    g, plan = hybrid_plan()
    ax = gantt_figure(plan, g).axes[0]
    legend = ax.get_legend()
    assert legend.get_title().get_text() == "colour = micro-batch"
    entries = [t.get_text() for t in legend.get_texts()]
    assert entries[:2] == ["micro-batch 0", "micro-batch 1"] and "micro-batch 2" not in entries
    assert "once per step" in entries and "all-reduce across replicas" in entries
    # copies of one op in different micro-batches get different colours, ops run once the grey one
    bars = collection(ax, f"device:{plan.ops['loss'].device}")
    assert ONCE_COLOUR.lower() in {to_hex(c) for c in bars.get_facecolors()}
    mb = {op.get("microbatch") for op in g.ops if "microbatch" in op.attrs}
    assert mb == {0, 1}


def test_hybrid_all_reduces_are_hatched_bars_with_their_bytes() -> None:
    g, plan = hybrid_plan()
    names = all_reduces(g)
    assert names and {c.op for c in plan.collectives} == set(names)
    fig = gantt_figure(plan, g)
    ax = fig.axes[0]
    comms = [c for c in ax.collections if str(c.get_gid()).startswith("collective:")]
    assert sum(len(c.get_paths()) for c in comms) == len(names)
    assert all(c.get_hatch() for c in comms)
    for c in comms:  # each on the row of its op's device, never among the plain op bars
        device = c.get_gid().split(":", 1)[1]
        assert sum(plan.ops[n].device == device for n in names) == len(c.get_paths())
    labels = [t.get_text() for t in texts(ax, "collective-label")]
    by_op = {c.op: c for c in plan.collectives}
    allowed = {t for n in names for t in collective_labels(by_op, [n])}
    assert labels and set(labels) <= allowed and any(human_bytes(c.nbytes) in labels[0] for c in plan.collectives)
    assert not any(t.get_text() in names for t in texts(ax, "label"))


def test_hybrid_subtitle_names_replicas_and_rows_show_replica_0_only() -> None:
    g, plan = hybrid_plan()
    ax = gantt_figure(plan, g).axes[0]
    title = ax.get_title()
    assert "data-parallel 2 x 2 micro-batches; replicas: gpu0,gpu1 | gpu2,gpu3 (each runs this schedule)" in title
    assert "replica 0 only (gpu2,gpu3 mirror it)" in title and "gpu0+gpu2" in title
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert "gpu0" in rows and "gpu1" in rows and "gpu2" not in rows and "gpu3" not in rows
    assert not texts(ax, "idle")  # the mirrored devices are not drawn as idle rows
    svg = gantt_image(plan, g, "svg").decode()
    assert "micro-batch 1" in svg and "all-reduce" in svg


def test_hybrid_memory_lane_names_mirrors_instead_of_flat_lines() -> None:
    g, plan = hybrid_plan()
    mem_ax = gantt_figure(plan, g, memory=True).axes[1]
    labels = [line.get_label() for line in mem_ax.get_lines() if not line.get_label().startswith("_")]
    assert any(lb.startswith("gpu0 = gpu2 (peak") for lb in labels)
    assert not any(lb.startswith(("gpu2", "gpu3")) for lb in labels)


def test_more_micro_batches_than_the_legend_lists_end_in_dots() -> None:
    g, plan = hybrid_plan()
    g = pesto_ir.parse(str(g))  # a copy: the cached graph stays as placed
    copies = [op for op in g.ops if "microbatch" in op.attrs]
    for i, op in enumerate(copies):  # pretend every copy is its own micro-batch
        op.attrs["microbatch"] = IntAttr(i)
    entries = [t.get_text() for t in gantt_figure(plan, g).axes[0].get_legend().get_texts()]
    listed = [e for e in entries if e.startswith("micro-batch ")]
    assert listed == [f"micro-batch {i}" for i in range(MAX_MICROBATCH_LEGEND)]
    assert any(e.startswith("... to micro-batch") and "colours repeat every 10" in e for e in entries)
