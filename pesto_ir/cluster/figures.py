"""What every part of the machine model checks its figures against (devices and links,
`devices.py`; a cluster file, `json_fields.py`; the cluster, `model.py`): the range each figure may
take, the measured all-reduce fit (`pesto_ir.jaxrt.measure_collectives` fits it), and the model's error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import MAX_SECONDS, brief


class ClusterError(PestoError):
    pass


def is_real(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# What a device or link can have. Past these a kernel's or a transfer's time overflows to infinity
# or rounds to nothing, and every plan's times with it: a link of 5e-324 bytes per second gave
# makespans of inf, which no plan file, chart or trace can hold.
FIGURE_RANGES: dict[str, tuple[float, float, str]] = {
    "latency": (0.0, MAX_SECONDS, "seconds"),
    "launch_overhead": (0.0, MAX_SECONDS, "seconds"),
    "setup": (0.0, MAX_SECONDS, "seconds"),
    "bandwidth": (1.0, 1e21, "bytes per second"),
    "mem_bandwidth": (1.0, 1e21, "bytes per second"),
    "peak_flops": (1.0, 1e21, "FLOP per second"),
    "efficiency": (1e-6, 1e6, "(the fraction of the roofline reached)"),
    "memory": (0.0, 2.0 ** 63, "bytes (or infinite: no limit)"),
}


def out_of_range(key: str, value: float) -> str | None:
    """Why figure `key` (a name in `FIGURE_RANGES`) cannot be `value`, or None when it can
    (infinite memory means no limit)."""
    low, high, unit = FIGURE_RANGES[key]
    if low <= value <= high or (key == "memory" and value == math.inf):
        return None
    return f"{key} {value:.6g} is out of range: from {low:g} to {high:g} {unit}"


@dataclass(frozen=True)
class AllReduceFit:
    """Measured per-ring-step cost of the runtime's own all-reduce: each of the 2 (n - 1) steps
    of a ring over n devices of one host takes `latency + (bytes / n) / bandwidth`."""

    latency: float  # seconds per step
    bandwidth: float  # bytes/s per step

    def __post_init__(self) -> None:
        for key in ("latency", "bandwidth"):
            v = getattr(self, key)
            if not is_real(v) or not 0 <= v < math.inf or (key == "bandwidth" and v == 0):
                want = "a finite number of seconds >= 0" if key == "latency" else "positive and finite (bytes per second)"
                raise ClusterError(f"all_reduce: {key} must be {want}, got {brief(repr(v))}")
            if (why := out_of_range(key, v)) is not None:
                raise ClusterError(f"all_reduce: {why}")
