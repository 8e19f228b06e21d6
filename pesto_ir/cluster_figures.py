"""Figures of the machine model that its measurements produce, and its error.

Kept apart from `pesto_ir.cluster` so that `pesto_ir.measure_collectives`, which the cluster calls
to measure real devices, can make them without importing the cluster back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from pesto_ir.errors import PestoError
from pesto_ir.loader import brief


class ClusterError(PestoError):
    pass


def is_real(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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
