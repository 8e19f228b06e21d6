"""`--gantt`: the plan as a Gantt chart, PNG, SVG or PDF by file extension (matplotlib, Agg).

One row per device, then one per directed link that carries a transfer. Ops are coloured by their
`group` attribute (coarse node) when they have one, else by opcode, or for opaque cost-graph ops
by the prefix of their label; the legend's title says which. The title gives the makespan and the
lower bound. With `memory`, a lane below (same time axis) shows the bytes each device holds, as
`--memory-plot` draws them.

For a person reading it: a bar carries its op's name (or, when a coarse plan gives every op of a
group the same bar, the group's name) where that text fits inside the bar; transfers on link rows
are drawn at least `MIN_TRANSFER_FRACTION` of the makespan wide, so short ones do not vanish (their
start is the true one, only the drawn width grows); a device without ops says "idle" on its row.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from pesto_ir.cluster import Cluster
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph
from pesto_ir.plan import Plan
from pesto_ir.units import human_time

FORMATS = ("png", "svg", "pdf")
MAX_LEGEND = 12  # more categories than this and a legend hides the chart
TRANSFER_COLOUR = "#555555"
MEMORY_LANE_HEIGHT = 2.5  # inches of the live-bytes lane under the device rows
FIG_WIDTH = 12.0  # inches
MIN_TRANSFER_FRACTION = 0.0015  # of the makespan: the narrowest a transfer bar is drawn
LABEL_FONT_SIZE = 7.0  # points
CHAR_WIDTH = 0.6  # of the font size: a generous average width of one character
LABEL_PAD = 4.0  # points of bar left free around a label, both sides together


class GanttError(PestoError):
    pass


def colour_key(graph: Graph | None, name: str) -> str:
    """What an op is coloured by: group, else opcode, else (opaque ops) its label's prefix."""
    if graph is None or not graph.has_op(name):
        return _prefix(name)
    op = graph.op(name)
    if "group" in op.attrs:
        return str(op.get("group"))
    if op.opcode != "opaque":
        return op.opcode
    return _prefix(str(op.get("label") or op.name))


def _prefix(text: str) -> str:
    """`bert/layer_3/attn` -> `bert`; `node12` -> `node`."""
    head = text.split("/", 1)[0]
    return re.sub(r"[\d._\-#]+$", "", head) or head


def time_unit(span: float) -> tuple[str, float]:
    """(unit, seconds -> unit factor) that keeps the axis of a `span`-long step readable."""
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("us", 1e6)):
        if span * scale >= 1:
            return unit, scale
    return "ns", 1e9


def image_metadata(fmt: str) -> dict[str, None]:
    """No dates or versions in the file, so the same plan draws the same bytes."""
    return {"svg": {"Date": None}, "pdf": {"CreationDate": None}, "png": {"Software": None}}[fmt]


def gantt_image(plan: Plan, graph: Graph | None = None, fmt: str = "png", *, memory: bool = False,
                cluster: Cluster | None = None) -> bytes:
    """The chart as image bytes in `fmt` (png, svg or pdf); `memory` adds the live-bytes lane
    (it needs the graph: lifetimes come from its tensors), with `cluster`'s capacities."""
    if fmt not in FORMATS:
        raise GanttError(f"cannot draw a Gantt chart as '{fmt}' (use one of: {', '.join(FORMATS)})")
    fig = gantt_figure(plan, graph, memory=memory, cluster=cluster)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120, metadata=image_metadata(fmt))
    return buf.getvalue()


def label_fits(text: str, bar_width_in: float, fontsize: float = LABEL_FONT_SIZE) -> bool:
    """Whether `text` fits inside a bar `bar_width_in` inches wide (an estimate, no renderer)."""
    return len(text) * CHAR_WIDTH * fontsize + LABEL_PAD <= bar_width_in * 72.0


def bar_label(graph: Graph | None, names: list[str]) -> str:
    """What a bar shared by the ops `names` says: the one op's name, or the group they all share
    (a coarse plan gives every op of a group the same bar), else the first name and how many more."""
    if len(names) == 1:
        return names[0]
    groups = {str(graph.op(n).get("group")) if graph is not None and graph.has_op(n)
              and "group" in graph.op(n).attrs else None for n in names}
    if len(groups) == 1 and None not in groups:
        return groups.pop()
    return f"{names[0]} +{len(names) - 1}"


def colour_basis(graph: Graph | None, names: list[str]) -> str:
    """What the colours of the ops `names` stand for, in words, for the legend's title."""
    kinds = []
    for name in names:
        if graph is None or not graph.has_op(name):
            kinds.append("name prefix")
        elif "group" in graph.op(name).attrs:
            kinds.append("op group")
        elif graph.op(name).opcode != "opaque":
            kinds.append("op kind")
        else:
            kinds.append("label prefix")
    return " / ".join(dict.fromkeys(kinds)) or "op"


def _text_colour(rgba: tuple[float, ...]) -> str:
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def gantt_figure(plan: Plan, graph: Graph | None = None, *, memory: bool = False,
                 cluster: Cluster | None = None):  # -> matplotlib.figure.Figure (imported lazily)
    """The chart as a matplotlib Figure (Agg canvas), as `gantt_image` saves it. The op bars of a
    device are one collection with gid `device:<name>`, the transfers of a link `link:<a> -> <b>`;
    bar labels and "idle" marks are texts of the first axes."""
    if memory and graph is None:
        raise GanttError("the memory lane of a Gantt chart needs the graph, not only the plan")
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    devices = list(plan.devices) + sorted({s.device for s in plan.ops.values()} - set(plan.devices))
    links = sorted({(t.src_device, t.to) for t in plan.transfers})
    rows = devices + [f"{a} -> {b}" for a, b in links]
    row_of = {d: i for i, d in enumerate(devices)}
    link_row = {k: len(devices) + i for i, k in enumerate(links)}
    unit, scale = time_unit(plan.makespan)
    span = max(plan.makespan * scale, 1e-9)

    keys = {name: colour_key(graph, name) for name in plan.ops}
    in_order = sorted(plan.ops, key=lambda n: plan.ops[n].start)
    categories = list(dict.fromkeys(keys[n] for n in in_order))
    cmap = matplotlib.colormaps["tab20"]
    colour = {c: cmap(i % cmap.N) for i, c in enumerate(categories)}

    height = min(30.0, 1.2 + 0.45 * max(len(rows), 1))
    fig = Figure(figsize=(FIG_WIDTH, height + (MEMORY_LANE_HEIGHT if memory else 0)))
    FigureCanvasAgg(fig)
    if memory:
        ax, mem_ax = fig.subplots(2, 1, sharex=True, height_ratios=[height, MEMORY_LANE_HEIGHT])
    else:
        ax, mem_ax = fig.add_subplot(), None

    # one bar per (device, start, end): the ops of a coarse group share theirs
    shared: dict[tuple[str, float, float], list[str]] = {}
    for name in in_order:
        slot = plan.ops[name]
        shared.setdefault((slot.device, slot.start, slot.end), []).append(name)
    bars: dict[int, tuple[str, list[tuple[float, float]], list[object]]] = {}
    for (device, start, end), names in shared.items():
        _, spans, colours = bars.setdefault(row_of[device], (f"device:{device}", [], []))
        spans.append((start * scale, (end - start) * scale))
        colours.append(colour[keys[names[0]]])
    min_width = MIN_TRANSFER_FRACTION * span
    for t in plan.transfers:
        a, b = t.src_device, t.to
        _, spans, colours = bars.setdefault(link_row[(a, b)], (f"link:{a} -> {b}", [], []))
        spans.append((t.start * scale, max((t.end - t.start) * scale, min_width)))
        colours.append(TRANSFER_COLOUR)
    for row, (gid, spans, colours) in sorted(bars.items()):
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colours, edgecolor="white", linewidth=0.3, gid=gid)

    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, span)
    (mem_ax or ax).set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(_title(plan))
    handles = [Patch(color=colour[c], label=c) for c in categories] if len(categories) <= MAX_LEGEND else \
        [Patch(facecolor="none", edgecolor="none", label=f"{len(categories)} colours, too many to list")]
    if links:
        handles.append(Patch(color=TRANSFER_COLOUR, label="transfer (rows a -> b)"))
    if categories or links:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small",
                  title=f"colour = {colour_basis(graph, in_order)}", title_fontsize="small")
    if mem_ax is not None:
        from pesto_ir.backends.memory_plot import draw_live_bytes

        draw_live_bytes(mem_ax, graph, plan, scale, cluster)
    fig.tight_layout()

    # labels once the layout is settled: the axes' width in inches turns time into inches
    inches_per_unit = ax.get_position().width * fig.get_figwidth() / span
    for (device, start, end), names in shared.items():
        text = bar_label(graph, names)
        if label_fits(text, (end - start) * scale * inches_per_unit):
            ax.text((start + end) / 2 * scale, row_of[device], text, ha="center", va="center",
                    fontsize=LABEL_FONT_SIZE, color=_text_colour(colour[keys[names[0]]]), clip_on=True,
                    gid="label")
    for device in devices:
        if not any(slot.device == device for slot in plan.ops.values()):
            ax.text(span / 2, row_of[device], "idle", ha="center", va="center", fontsize="small",
                    style="italic", color="grey", gid="idle")
    return fig


def _title(plan: Plan) -> str:
    head = plan.graph + (f" ({plan.algorithm})" if plan.algorithm else "")
    text = f"{head}: makespan {human_time(plan.makespan)}"
    if plan.lower_bound is not None:
        text += f", lower bound {human_time(plan.lower_bound)}"
    return text


def gantt_for_path(plan: Plan, graph: Graph | None, path: str | Path, *, memory: bool = False,
                   cluster: Cluster | None = None) -> bytes:
    """The chart in the format `path`'s extension names (`.png`, `.svg`, `.pdf`)."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise GanttError(f"{path}: a Gantt chart file must end in " + ", ".join(f".{f}" for f in FORMATS))
    return gantt_image(plan, graph, fmt, memory=memory, cluster=cluster)
