"""`--memory-plot`: the bytes each device holds over one step, PNG, SVG or PDF (matplotlib, Agg).

One step line per device (`pesto_ir.schedule.memory.live_bytes`: tensor lifetimes of the timed plan), a
marker at each device's peak and, when the cluster is known, a dashed line at each device's
capacity. `draw_live_bytes` also draws the memory lane under the Gantt chart (`--gantt-memory`).

A hybrid plan's other replicas hold what replica 0 holds, device for device, so only replica 0's
devices get lines; a line's label names the devices that mirror it (`gpu0 = gpu2`), since a flat
zero line for them would read as an idle device.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from pesto_ir.backends.figures import FORMATS, image_metadata, mirrored_devices, time_unit
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.schedule.memory import live_bytes, peak_memory
from pesto_ir.schedule.plan import Plan
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import write_atomic
from pesto_ir.util.units import human_bytes

CAPACITY_IN_VIEW = 4.0  # capacities above this many times the highest peak would flatten the lines


class MemoryPlotError(PestoError):
    pass


def byte_unit(nbytes: float) -> tuple[str, float]:
    """The largest binary unit `nbytes` is at least one of, so axis labels stay short."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return unit, float(size)
    return "bytes", 1.0


def step_series(steps: list[tuple[float, int]], end: float) -> tuple[list[float], list[int]]:
    """The points of a `where='post'` step line: from 0 bytes at time 0 until the first change, and
    the last value held until `end`, so every device's line spans the whole step."""
    points = list(steps)
    if not points or points[0][0] > 0:
        points.insert(0, (0.0, 0))
    if end > points[-1][0]:
        points.append((end, points[-1][1]))
    return [t for t, _ in points], [b for _, b in points]


def capacities(plan: Plan, cluster: Cluster | None) -> dict[str, float]:
    """Bytes of memory of each plan device the cluster knows (a placed .pir may name others)."""
    if cluster is None:
        return {}
    known = {d.name: d.memory for d in cluster.devices}
    return {d: known[d] for d in plan.devices if d in known and known[d] and math.isfinite(known[d])}


def draw_live_bytes(ax: Any, graph: Graph, plan: Plan, time_scale: float,
                    cluster: Cluster | None = None) -> dict[str, tuple[list[float], list[int]]]:
    """Draw live bytes per device on `ax`; returns what was drawn, in seconds and bytes."""
    live = live_bytes(graph, plan)
    peaks = peak_memory(graph, plan)
    end = max([plan.makespan] + [t for steps in live.values() for t, _ in steps[-1:]])
    top = max((p.nbytes for p in peaks.values()), default=0)
    caps = capacities(plan, cluster)
    shown_caps = {d: c for d, c in caps.items() if c <= CAPACITY_IN_VIEW * max(top, 1)}
    unit, size = byte_unit(max([top, *shown_caps.values()]))
    drawn: dict[str, tuple[list[float], list[int]]] = {}
    hidden = mirrored_devices(plan)
    for device, steps in live.items():
        if device in hidden:
            continue
        xs, ys = step_series(steps, end)
        drawn[device] = (xs, ys)
        peak = peaks[device]
        (line,) = ax.step([x * time_scale for x in xs], [y / size for y in ys], where="post",
                          label=f"{_with_mirrors(plan, device)} (peak {human_bytes(peak.nbytes)})")
        ax.plot([peak.time * time_scale], [peak.nbytes / size], marker="o", color=line.get_color())
        if device in shown_caps:
            ax.axhline(shown_caps[device] / size, linestyle="--", linewidth=1, color=line.get_color(),
                       label=f"{device} capacity {human_bytes(shown_caps[device])}")
    _note_hidden_capacities(ax, caps, shown_caps)
    ax.set_ylabel(f"live memory ({unit})")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return drawn


def _with_mirrors(plan: Plan, device: str) -> str:
    """`device`, or `gpu0 = gpu2 = ...` when other replicas' devices mirror it (and hold the same)."""
    par = plan.parallelism
    if par is None or device not in par.replicas[0]:
        return device
    return " = ".join(par.group(device))


def _note_hidden_capacities(ax: Any, caps: dict[str, float], shown: dict[str, float]) -> None:
    """Say which capacities were left off: drawn, they would squash the lines to the axis."""
    hidden = sorted({c for d, c in caps.items() if d not in shown})
    if hidden:
        text = "capacity " + ", ".join(human_bytes(c) for c in hidden) + " (above the chart)"
        ax.text(0.01, 0.97, text, transform=ax.transAxes, va="top", fontsize="small", color="#555555")


def memory_figure(graph: Graph, plan: Plan, cluster: Cluster | None = None) -> Any:
    """The memory plot as a matplotlib Figure (Agg canvas), for saving or inspecting."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    unit, scale = time_unit(plan.makespan)
    draw_live_bytes(ax, graph, plan, scale, cluster)
    ax.set_xlim(0, max(plan.makespan * scale, 1e-9))
    ax.set_xlabel(f"time ({unit})")
    head = plan.graph + (f" ({plan.algorithm})" if plan.algorithm else "")
    ax.set_title(f"{head}: live memory per device")
    fig.tight_layout()
    return fig


def memory_plot_image(graph: Graph, plan: Plan, fmt: str = "png", cluster: Cluster | None = None) -> bytes:
    """The plot as image bytes in `fmt` (png, svg or pdf)."""
    if fmt not in FORMATS:
        raise MemoryPlotError(f"cannot draw a memory plot as '{fmt}' (use one of: {', '.join(FORMATS)})")
    return _image(memory_figure(graph, plan, cluster), fmt)


def _image(fig: Any, fmt: str) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120, metadata=image_metadata(fmt))
    return buf.getvalue()


def path_format(path: str | Path) -> str:
    """The image format `path`'s extension names; an error before anything is drawn otherwise."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise MemoryPlotError(f"{path}: a memory plot file must end in " + ", ".join(f".{f}" for f in FORMATS))
    return fmt


def memory_plot_for_path(graph: Graph, plan: Plan, path: str | Path, cluster: Cluster | None = None) -> bytes:
    """The plot in the format `path`'s extension names (`.png`, `.svg`, `.pdf`)."""
    return memory_plot_image(graph, plan, path_format(path), cluster)


def write_memory_plot(graph: Graph, plan: Plan, path: str | Path, cluster: Cluster | None = None) -> Any:
    """Draw and write the plot atomically; returns the Figure so callers can check what it shows."""
    fmt = path_format(path)
    fig = memory_figure(graph, plan, cluster)
    write_atomic(path, _image(fig, fmt))
    return fig
