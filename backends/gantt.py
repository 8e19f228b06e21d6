"""`--gantt`: the plan as a Gantt chart, PNG, SVG or PDF by file extension (matplotlib, Agg).

One row per device, then one per directed link that carries a transfer. Ops are coloured by their
`group` attribute (coarse node) when they have one, else by opcode, or for opaque cost-graph ops
by the prefix of their label. The title gives the makespan and the lower bound.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph
from pesto_ir.plan import Plan
from pesto_ir.units import human_time

FORMATS = ("png", "svg", "pdf")
MAX_LEGEND = 12  # more categories than this and a legend hides the chart
TRANSFER_COLOUR = "#555555"


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


def _time_unit(span: float) -> tuple[str, float]:
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("us", 1e6)):
        if span * scale >= 1:
            return unit, scale
    return "ns", 1e9


def gantt_image(plan: Plan, graph: Graph | None = None, fmt: str = "png") -> bytes:
    """The chart as image bytes in `fmt` (png, svg or pdf)."""
    if fmt not in FORMATS:
        raise GanttError(f"cannot draw a Gantt chart as '{fmt}' (use one of: {', '.join(FORMATS)})")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    devices = list(plan.devices) + sorted({s.device for s in plan.ops.values()} - set(plan.devices))
    links = sorted({(t.src_device, t.to) for t in plan.transfers})
    rows = devices + [f"{a} -> {b}" for a, b in links]
    row_of = {d: i for i, d in enumerate(devices)}
    link_row = {k: len(devices) + i for i, k in enumerate(links)}
    unit, scale = _time_unit(plan.makespan)

    keys = {name: colour_key(graph, name) for name in plan.ops}
    categories = list(dict.fromkeys(keys[n] for n in sorted(plan.ops, key=lambda n: plan.ops[n].start)))
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    colour = {c: cmap(i % cmap.N) for i, c in enumerate(categories)}

    fig = Figure(figsize=(12, min(30.0, 1.2 + 0.45 * max(len(rows), 1))))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
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
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(_title(plan))
    if 0 < len(categories) <= MAX_LEGEND:
        handles = [Patch(color=colour[c], label=c) for c in categories]
        if links:
            handles.append(Patch(color=TRANSFER_COLOUR, label="transfer"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    metadata = {"svg": {"Date": None}, "pdf": {"CreationDate": None}, "png": {"Software": None}}[fmt]
    fig.savefig(buf, format=fmt, dpi=120, metadata=metadata)
    return buf.getvalue()


def _title(plan: Plan) -> str:
    head = plan.graph + (f" ({plan.algorithm})" if plan.algorithm else "")
    text = f"{head}: makespan {human_time(plan.makespan)}"
    if plan.lower_bound is not None:
        text += f", lower bound {human_time(plan.lower_bound)}"
    return text


def gantt_for_path(plan: Plan, graph: Graph | None, path: str | Path) -> bytes:
    """The chart in the format `path`'s extension names (`.png`, `.svg`, `.pdf`)."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise GanttError(f"{path}: a Gantt chart file must end in " + ", ".join(f".{f}" for f in FORMATS))
    return gantt_image(plan, graph, fmt)
