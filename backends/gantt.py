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

Hybrid plans (`Plan.parallelism`, graphs rewritten by `passes/microbatch.py`): when ops carry a
`microbatch` attribute the bars are coloured by micro-batch instead (ops that run once per step are
grey), so how the schedule interleaves the micro-batches is what the colours show. Collective ops
(`all_reduce`, and a sharded state's `reduce_scatter` and `all_gather`) are hatched and labelled
with their kind and bytes. Only replica 0's devices get rows: the other
replicas run the same schedule, so their rows would repeat it; the subtitle names the replicas and
the collectives' rings instead.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from pesto_ir.backends.figures import FORMATS, image_metadata, mirrored_devices, time_unit
from pesto_ir.backends.memory_plot import draw_live_bytes
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.label import plan_label
from pesto_ir.schedule.plan import RING_PHASES, Collective, Plan, collective_bytes
from pesto_ir.util.errors import PestoError
from pesto_ir.util.units import human_bytes, human_time

if TYPE_CHECKING:  # matplotlib is imported lazily, when a chart is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.typing import ColorType

    # a row's bars: (gid, (start, width) per bar, colour per bar)
    _Bars: TypeAlias = tuple[str, list[tuple[float, float]], list[ColorType]]

MAX_LEGEND = 12  # more categories than this and a legend hides the chart
TRANSFER_COLOUR = "#555555"
MEMORY_LANE_HEIGHT = 2.5  # inches of the live-bytes lane under the device rows
FIG_WIDTH = 12.0  # inches
MIN_TRANSFER_FRACTION = 0.0015  # of the makespan: the narrowest a transfer bar is drawn
LABEL_FONT_SIZE = 7.0  # points
CHAR_WIDTH = 0.6  # of the font size: a generous average width of one character
LABEL_PAD = 4.0  # points of bar left free around a label, both sides together
MICROBATCH_COLOURS = "tab10"  # qualitative; micro-batch i gets colour i mod 10
MAX_MICROBATCH_LEGEND = 8  # micro-batches listed in the legend, then "..."
ONCE_COLOUR = "#bdbdbd"  # ops of a micro-batched graph that run once per step
COLLECTIVE_FACE, COLLECTIVE_EDGE, COLLECTIVE_HATCH = "#fddbc7", "#b2182b", "////"
MAX_GROUPS_NAMED = 4  # replicas (or rings) spelled out in the subtitle before "..."


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


# ---------------------------------------------------------------- hybrid plans (also used by trace.py)

def _named(groups: list[str], sep: str) -> str:
    """`groups` joined by `sep`, the middle ones elided when there are too many to read."""
    if len(groups) > MAX_GROUPS_NAMED:
        groups = groups[:MAX_GROUPS_NAMED - 1] + ["...", groups[-1]]
    return sep.join(groups)


def parallelism_line(plan: Plan) -> str | None:
    """One line naming a hybrid plan's parallelism, or None for a one-replica plan."""
    par = plan.parallelism
    if par is None:
        return None
    if par.tensor_parallel > 1:
        ranks = _named([",".join(g) for g in par.replicas], " | ")
        return (f"tensor-parallel {par.tensor_parallel} x {par.microbatches} micro-batches; "
                f"ranks: {ranks} (each runs this schedule on its blocks)")
    if par.data_parallel == 1:
        return f"{par.microbatches} micro-batches, one replica"
    replicas = _named([",".join(g) for g in par.replicas], " | ")
    state = "; parameters and state sharded" if par.parameters == "sharded" else \
        "; optimizer state sharded" if par.optimizer_state == "sharded" else ""
    return (f"data-parallel {par.data_parallel} x {par.microbatches} micro-batches{state}; "
            f"replicas: {replicas} (each runs this schedule)")


def collectives_of(plan: Plan, graph: Graph | None) -> dict[str, Collective]:
    """The plan's collectives by op name; a collective op of `graph` the plan lists no entry for
    (a plan without parallelism) still counts, over its own device, so it is drawn as one."""
    out = {c.op: c for c in plan.collectives if c.op in plan.ops}
    if graph is not None:
        for op in graph.ops:
            slot = plan.ops.get(op.name)
            if op.opcode in RING_PHASES and slot is not None and op.name not in out:
                out[op.name] = Collective(op.name, op.opcode, [slot.device], collective_bytes(op),
                                          slot.start, slot.end)
    return out


def microbatch_of(graph: Graph | None, name: str) -> int | None:
    """The micro-batch an op is a copy for, or None when it runs once per step (or is unknown)."""
    if graph is None or not graph.has_op(name):
        return None
    mb = graph.op(name).get("microbatch")
    return mb if isinstance(mb, int) and not isinstance(mb, bool) else None


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
    """Whether `text` (its longest line) fits inside a bar `bar_width_in` inches wide (an estimate,
    no renderer)."""
    return max(map(len, text.split("\n"))) * CHAR_WIDTH * fontsize + LABEL_PAD <= bar_width_in * 72.0


def bar_label(graph: Graph | None, names: list[str]) -> str:
    """What a bar shared by the ops `names` says: the one op's name, or the group they all share
    (a coarse plan gives every op of a group the same bar), else the first name and how many more."""
    if len(names) == 1:
        return names[0]
    groups = {str(graph.op(n).get("group")) if graph is not None and graph.has_op(n)
              and "group" in graph.op(n).attrs else None for n in names}
    if len(groups) == 1:
        (group,) = groups
        if group is not None:
            return group
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


def _text_colour(colour: ColorType) -> str:
    from matplotlib.colors import to_rgba

    r, g, b = to_rgba(colour)[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _key_colouring(graph: Graph | None, names: list[str]) -> tuple[dict[str, ColorType], list[Patch], str]:
    """(colour per op, legend handles, what colours mean): by group, opcode or label prefix."""
    import matplotlib
    from matplotlib.patches import Patch

    keys = {name: colour_key(graph, name) for name in names}
    categories = list(dict.fromkeys(keys[n] for n in names))
    cmap = matplotlib.colormaps["tab20"]
    by_key = {c: cmap(i % cmap.N) for i, c in enumerate(categories)}
    handles = [Patch(color=by_key[c], label=c) for c in categories] if len(categories) <= MAX_LEGEND else \
        [Patch(facecolor="none", edgecolor="none", label=f"{len(categories)} colours, too many to list")]
    return {n: by_key[keys[n]] for n in names}, handles, colour_basis(graph, names)


def _microbatch_colouring(graph: Graph | None, names: list[str]) -> tuple[dict[str, ColorType], list[Patch], str]:
    """(colour per op, legend handles, "micro-batch"): one qualitative colour per micro-batch
    (cycling), grey for ops that run once per step, so interleaving is visible at a glance."""
    import matplotlib
    from matplotlib.patches import Patch

    cmap = matplotlib.colormaps[MICROBATCH_COLOURS]
    mbs = {n: microbatch_of(graph, n) for n in names}
    colours: dict[str, ColorType] = {n: ONCE_COLOUR if mb is None else cmap(mb % cmap.N) for n, mb in mbs.items()}
    seen = sorted({mb for mb in mbs.values() if mb is not None})
    handles = [Patch(color=cmap(mb % cmap.N), label=f"micro-batch {mb}") for mb in seen[:MAX_MICROBATCH_LEGEND]]
    if len(seen) > MAX_MICROBATCH_LEGEND:
        repeat = f", colours repeat every {cmap.N}" if len(seen) > cmap.N else ""
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label=f"... to micro-batch {seen[-1]} ({len(seen)} in all{repeat})"))
    if None in mbs.values():
        handles.append(Patch(color=ONCE_COLOUR, label="once per step"))
    return colours, handles, "micro-batch"


def _colouring(graph: Graph | None, names: list[str]) -> tuple[dict[str, ColorType], list[Patch], str]:
    """Micro-batch colours when the graph was split into micro-batches, else the usual keys."""
    if any(microbatch_of(graph, n) is not None for n in names):
        return _microbatch_colouring(graph, names)
    return _key_colouring(graph, names)


def collective_labels(collectives: dict[str, Collective], names: list[str]) -> list[str]:
    """What a collective's bar may say, longest first (the first that fits is drawn): the kind and
    the bytes of its whole value, on one line, on two, or the bytes alone."""
    size = human_bytes(sum(collectives[n].nbytes for n in names))
    kinds = {collectives[n].kind for n in names}
    kind = kinds.pop().replace("_", "-") if len(kinds) == 1 else "collectives"
    return [f"{kind} {size}", f"{kind}\n{size}", size]


def _subtitle(plan: Plan, collectives: dict[str, Collective], hidden: set[str]) -> list[str]:
    """Lines under the title for a hybrid plan: its parallelism, which rows are left out and why,
    and the rings the collectives run over (devices of other replicas have no row to show them)."""
    line = parallelism_line(plan)
    if line is None:
        return []
    notes = []
    if hidden:
        mirrors = ",".join(d for d in plan.devices if d in hidden)
        notes.append(f"rows: replica 0 only ({mirrors} mirror it)")
    order = {d: i for i, d in enumerate(plan.devices)}
    groups = sorted({tuple(c.devices) for c in collectives.values() if len(c.devices) > 1},
                    key=lambda g: [order.get(d, len(order)) for d in g])
    rings = ["+".join(g) for g in groups]
    if rings:
        notes.append("collective rings: " + _named(rings, ", "))
    return [line] + (["; ".join(notes)] if notes else [])


def _bars(shared: dict[tuple[str, float, float], list[str]], row_of: dict[str, int],
          colour: dict[str, ColorType], collectives: dict[str, Collective], scale: float
          ) -> tuple[dict[int, _Bars], dict[int, _Bars]]:
    """Op bars per row, gid `device:<d>`, and collective bars, gid `collective:<d>` (hatched, so an
    collective reads as communication, not compute, whatever the colours mean)."""
    ops: dict[int, _Bars] = {}
    comms: dict[int, _Bars] = {}
    for (device, start, end), names in shared.items():
        is_comm = all(n in collectives for n in names)
        gid = f"collective:{device}" if is_comm else f"device:{device}"
        _, spans, colours = (comms if is_comm else ops).setdefault(row_of[device], (gid, [], []))
        spans.append((start * scale, (end - start) * scale))
        colours.append(COLLECTIVE_FACE if is_comm else colour[_coloured(names, collectives)])
    return ops, comms


def _coloured(names: list[str], collectives: dict[str, Collective]) -> str:
    """The op whose colour a shared bar takes: its first that is not a collective."""
    return next(n for n in names if n not in collectives)


def gantt_figure(plan: Plan, graph: Graph | None = None, *, memory: bool = False,
                 cluster: Cluster | None = None) -> Figure:
    """The chart as a matplotlib Figure (Agg canvas), as `gantt_image` saves it. The op bars of a
    device are one collection with gid `device:<name>`, its collectives `collective:<name>`, the
    transfers of a link `link:<a> -> <b>`; bar labels ("label", "collective-label") and "idle" marks
    are texts of the first axes."""
    if memory and graph is None:
        raise GanttError("the memory lane of a Gantt chart needs the graph, not only the plan")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    hidden = mirrored_devices(plan)
    devices = [d for d in plan.devices if d not in hidden]
    devices += sorted({s.device for s in plan.ops.values()} - set(devices))
    links = sorted({(t.src_device, t.to) for t in plan.transfers})
    rows = devices + [f"{a} -> {b}" for a, b in links]
    row_of = {d: i for i, d in enumerate(devices)}
    link_row = {k: len(devices) + i for i, k in enumerate(links)}
    unit, scale = time_unit(plan.makespan)
    span = max(plan.makespan * scale, 1e-9)

    collectives = collectives_of(plan, graph)
    in_order = sorted(plan.ops, key=lambda n: plan.ops[n].start)
    coloured = [n for n in in_order if n not in collectives]
    colour, handles, basis = _colouring(graph, coloured)
    subtitle = _subtitle(plan, collectives, hidden)

    height = min(30.0, 1.2 + 0.45 * max(len(rows), 1) + 0.25 * len(subtitle))
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
    bars, comms = _bars(shared, row_of, colour, collectives, scale)
    min_width = MIN_TRANSFER_FRACTION * span
    for t in plan.transfers:
        a, b = t.src_device, t.to
        _, spans, colours = bars.setdefault(link_row[(a, b)], (f"link:{a} -> {b}", [], []))
        spans.append((t.start * scale, max((t.end - t.start) * scale, min_width)))
        colours.append(TRANSFER_COLOUR)
    for row, (gid, spans, colours) in sorted(bars.items()):
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colours, edgecolor="white", linewidth=0.3, gid=gid)
    for row, (gid, spans, colours) in sorted(comms.items()):
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colours, edgecolor=COLLECTIVE_EDGE, linewidth=0.6,
                       hatch=COLLECTIVE_HATCH, gid=gid)

    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, span)
    (mem_ax or ax).set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("\n".join([_title(plan)] + subtitle))
    if comms:
        kind = "all-reduce" if {c.kind for c in collectives.values()} == {"all_reduce"} else "collective"
        handles.append(Patch(facecolor=COLLECTIVE_FACE, edgecolor=COLLECTIVE_EDGE, hatch=COLLECTIVE_HATCH,
                             label=f"{kind} across replicas"))
    if links:
        handles.append(Patch(color=TRANSFER_COLOUR, label="transfer (rows a -> b)"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small",
                  title=f"colour = {basis}", title_fontsize="small")
    if mem_ax is not None:
        assert graph is not None  # a memory lane needs the graph: checked above
        draw_live_bytes(mem_ax, graph, plan, scale, cluster)
    fig.tight_layout()
    _label_bars(fig, ax, shared, row_of, colour, collectives, graph, scale, span)
    for device in devices:
        if not any(slot.device == device for slot in plan.ops.values()):
            ax.text(span / 2, row_of[device], "idle", ha="center", va="center", fontsize="small",
                    style="italic", color="grey", gid="idle")
    return fig


def _label_bars(fig: Figure, ax: Axes, shared: dict[tuple[str, float, float], list[str]], row_of: dict[str, int],
                colour: dict[str, ColorType], collectives: dict[str, Collective], graph: Graph | None,
                scale: float, span: float) -> None:
    """Label each bar its text fits in; called once the layout is settled, since the axes' width
    in inches turns time into inches. A collective's bar says "<kind> <bytes>" on a white
    backing, which keeps the hatch from crossing the text."""
    inches_per_unit = ax.get_position().width * fig.get_figwidth() / span
    for (device, start, end), names in shared.items():
        is_comm = all(n in collectives for n in names)
        width = (end - start) * scale * inches_per_unit
        candidates = collective_labels(collectives, names) if is_comm else [bar_label(graph, names)]
        text = next((t for t in candidates if label_fits(t, width)), None)
        if text is not None:
            ink = "black" if is_comm else _text_colour(colour[_coloured(names, collectives)])
            backing = {"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85} if is_comm else None
            ax.text((start + end) / 2 * scale, row_of[device], text, ha="center", va="center",
                    fontsize=LABEL_FONT_SIZE, color=ink, clip_on=True, bbox=backing,
                    gid="collective-label" if is_comm else "label")


def _title(plan: Plan) -> str:
    label = plan_label(plan)
    head = plan.graph + (f" ({label})" if label else "")
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
