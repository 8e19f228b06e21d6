"""`--gantt`: the plan as a Gantt chart, PNG, SVG or PDF by file extension (matplotlib, Agg).

One row per device, then one per directed link that carries a transfer. Ops are coloured by their
`group` attribute (coarse node) when they have one, else by opcode, or for opaque cost-graph ops
by the prefix of their label. The title gives the makespan and the lower bound. With `memory`, a
lane below (same time axis) shows the bytes each device holds, as `--memory-plot` draws them.
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
    if memory and graph is None:
        raise GanttError("the memory lane of a Gantt chart needs the graph, not only the plan")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    devices = list(plan.devices) + sorted({s.device for s in plan.ops.values()} - set(plan.devices))
    links = sorted({(t.src_device, t.to) for t in plan.transfers})
    rows = devices + [f"{a} -> {b}" for a, b in links]
    row_of = {d: i for i, d in enumerate(devices)}
    link_row = {k: len(devices) + i for i, k in enumerate(links)}
    unit, scale = time_unit(plan.makespan)

    keys = {name: colour_key(graph, name) for name in plan.ops}
    categories = list(dict.fromkeys(keys[n] for n in sorted(plan.ops, key=lambda n: plan.ops[n].start)))
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    colour = {c: cmap(i % cmap.N) for i, c in enumerate(categories)}

    height = min(30.0, 1.2 + 0.45 * max(len(rows), 1))
    fig = Figure(figsize=(12, height + (MEMORY_LANE_HEIGHT if memory else 0)))
    FigureCanvasAgg(fig)
    if memory:
        ax, mem_ax = fig.subplots(2, 1, sharex=True, height_ratios=[height, MEMORY_LANE_HEIGHT])
    else:
        ax, mem_ax = fig.add_subplot(), None
    bars: dict[int, tuple[list[tuple[float, float]], list[object]]] = {}
    for name, slot in plan.ops.items():
        spans, colours = bars.setdefault(row_of[slot.device], ([], []))
        spans.append((slot.start * scale, (slot.end - slot.start) * scale))
        colours.append(colour[keys[name]])
    for t in plan.transfers:
        spans, colours = bars.setdefault(link_row[(t.src_device, t.to)], ([], []))
        spans.append((t.start * scale, (t.end - t.start) * scale))
        colours.append(TRANSFER_COLOUR)
    for row, (spans, colours) in bars.items():
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colours, edgecolor="white", linewidth=0.3)

    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, max(plan.makespan * scale, 1e-9))
    (mem_ax or ax).set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(_title(plan))
    if 0 < len(categories) <= MAX_LEGEND:
        handles = [Patch(color=colour[c], label=c) for c in categories]
        if links:
            handles.append(Patch(color=TRANSFER_COLOUR, label="transfer"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    if mem_ax is not None:
        from pesto_ir.backends.memory_plot import draw_live_bytes

        draw_live_bytes(mem_ax, graph, plan, scale, cluster)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120, metadata=image_metadata(fmt))
    return buf.getvalue()


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
