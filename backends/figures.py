"""What the figures (`gantt.py`, `memory_plot.py`, `trace.py`) share: the image formats, the
devices a hybrid plan's other replicas mirror, and the time unit of an axis."""

from __future__ import annotations

from pesto_ir.schedule.plan import Plan

FORMATS = ("png", "svg", "pdf")


def mirrored_devices(plan: Plan) -> set[str]:
    """Devices of replicas 1.. that hold no op: they run replica 0's schedule, so a row (or trace
    thread) for them would only repeat replica 0's, or look idle when it is not."""
    par = plan.parallelism
    if par is None:
        return set()
    return {d for g in par.replicas[1:] for d in g} - {s.device for s in plan.ops.values()}


def time_unit(span: float) -> tuple[str, float]:
    """(unit, seconds -> unit factor) that keeps the axis of a `span`-long step readable."""
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("us", 1e6)):
        if span * scale >= 1:
            return unit, scale
    return "ns", 1e9


def image_metadata(fmt: str) -> dict[str, None]:
    """No dates or versions in the file, so the same plan draws the same bytes."""
    return {"svg": {"Date": None}, "pdf": {"CreationDate": None}, "png": {"Software": None}}[fmt]
