"""Reading the parts of a `pesto-cluster/1` document that `Cluster.from_json` assembles: a device
entry (built-in kinds fill in missing figures), its per-family figures, a link's figures and the
measured all-reduce fit, each refused with where it is in the file.
"""

from __future__ import annotations

import math
from typing import Any

from pesto_ir.cluster.devices import (
    KINDS,
    MAX_HOST,
    OP_FAMILIES,
    Device,
    check_calibration,
    kind_key,
    lenient_float,
)
from pesto_ir.cluster.figures import AllReduceFit, ClusterError, out_of_range
from pesto_ir.util.loader import brief


def device_from_json(i: int, d: Any, source: str) -> Device:
    """One entry of a pesto-cluster/1 "devices" list; built-in kinds fill in missing figures."""
    if not isinstance(d, dict) or not isinstance(d.get("name"), str):
        raise ClusterError(f"{source}: devices[{i}] needs a string \"name\"")
    kind = str(d.get("kind", "cpu"))  # a non-string is its string (docs/contracts.md)
    if not kind.strip():
        raise ClusterError(f"{source}: devices[{i}] ({d['name']}): \"kind\" must be a non-empty name such as "
                           f"\"h100\", not {brief(repr(kind))}")
    base = KINDS.get(kind_key(kind))

    def num(key: str, required: bool = True) -> float | None:
        v = d.get(key, getattr(base, key) if base is not None else None)
        if v is None and not required:
            return None  # a custom kind: the roofline model will ask for it, given costs do not
        if v is None:
            raise ClusterError(f"{source}: devices[{i}] ({d['name']}): kind '{kind}' is not built in, "
                               f"so \"{key}\" is required")
        v = lenient_float(v)
        if not math.isfinite(v) or v <= 0:
            raise ClusterError(f"{source}: devices[{i}] ({d['name']}): \"{key}\" must be a positive number")
        if (why := out_of_range(key, v)) is not None:
            raise ClusterError(f"{source}: devices[{i}] ({d['name']}): {why}")
        return v

    host = d.get("host", 0)
    if isinstance(host, bool) or not isinstance(host, int) or not 0 <= host <= MAX_HOST:
        raise ClusterError(f"{source}: devices[{i}] ({d['name']}): \"host\" must be a whole number from 0 to "
                           f"{MAX_HOST} (the process the device belongs to), got {brief(repr(host))}")
    launch = d.get("launch_overhead")
    who = f"{source}: devices[{i}] ({d['name']})"
    efficiency = _family_figures_from_json(d, "efficiency", "factor", who)
    setup = _family_figures_from_json(d, "setup", "seconds", who)
    launch = launch if launch is None or math.isnan(lenient_float(launch)) else lenient_float(launch)
    check_calibration(who, launch, efficiency, setup)
    peak, bandwidth, memory = num("peak_flops", required=False), num("mem_bandwidth", required=False), num("memory")
    assert memory is not None  # required: num raises without it
    return Device(d["name"], kind, peak, bandwidth, memory, host, launch, efficiency, setup)


def _family_figures_from_json(d: dict[str, Any], key: str, unit: str, who: str) -> tuple[tuple[str, Any], ...]:
    """The device's `key` object {op family: figure} as pairs, numbers read with float() as the
    other figures are ("1e-6" too); what float() cannot read stays as is, for the check to refuse."""
    figures = d.get(key) or {}  # null (or {}): none given
    if not isinstance(figures, dict):
        raise ClusterError(f"{who}: \"{key}\" must be an object {{op family: {unit}}} "
                           f"(op families: {', '.join(OP_FAMILIES)}), got {brief(repr(figures))}")
    return tuple((k, v if math.isnan(lenient_float(v)) else lenient_float(v)) for k, v in figures.items())


def all_reduce_from_json(raw: Any, bad: Any) -> AllReduceFit | None:
    """The top-level `all_reduce` object, both figures required; absent or null: none."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise bad("\"all_reduce\" must be an object {\"latency\": seconds, \"bandwidth\": bytes per second}, "
                  f"got {brief(repr(raw))}")
    for key in ("latency", "bandwidth"):
        if key not in raw:
            raise bad(f"all_reduce: \"{key}\" is required (the measured all-reduce fit has both figures)")
    return AllReduceFit(link_figure(raw, "latency", 0.0, bad, "all_reduce"),
                        link_figure(raw, "bandwidth", 1.0, bad, "all_reduce"))


def link_figure(obj: dict[str, Any], key: str, default: float, bad: Any, where: str) -> float:
    """`latency` (finite, >= 0) or `bandwidth` (finite, > 0) of a link object, else `default`."""
    raw = obj.get(key, default)
    v = lenient_float(raw)
    if not math.isfinite(v) or v < 0 or (key == "bandwidth" and v == 0):
        want = "a finite number of seconds >= 0" if key == "latency" else "positive and finite (bytes per second)"
        raise bad(f"{where}: {key} must be {want}, got {brief(repr(raw))}")
    if (why := out_of_range(key, v)) is not None:
        raise bad(f"{where}: {why}")
    return v
