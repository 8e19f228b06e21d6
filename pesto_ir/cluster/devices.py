"""The devices of the machine model and the links between them: built-in device kinds with their
datasheet figures, the op families a device's calibrated figures are given for, and the checks
every device and link passes however it was made (in code or from a `pesto-cluster/1` file).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster.figures import ClusterError, is_real, out_of_range
from pesto_ir.util.loader import brief

MAX_HOST = (1 << 20) - 1  # a process index; a larger one is a broken file, not a machine


def kind_key(kind: str) -> str:
    """A device kind as every part of Pesto compares it: without regard to case, so that "H100"
    in a cluster file, in a graph's costs or on the command line is the built-in h100. A device
    keeps its kind in this form (`Device`); costs keyed by kind are looked up through it
    (`pesto_ir.cost.lookup.op_cost`)."""
    return kind.lower()


@dataclass(frozen=True)
class DeviceKind:
    """Datasheet figures of one accelerator model (dense FP32/TF32-class peak as used for costs)."""

    name: str
    peak_flops: float  # FLOP/s
    mem_bandwidth: float  # bytes/s
    memory: float  # bytes
    link_bandwidth: float  # bytes/s to a peer of the same kind (NVLink, or PCIe for the CPU)
    link_latency: float  # seconds


# Public datasheet figures. peak_flops is the dense bf16/fp16 tensor-core peak for GPUs (what
# training step graphs mostly run), the CPU figure is a 2-core AVX2 host like this machine.
KINDS: dict[str, DeviceKind] = {
    "cpu": DeviceKind("cpu", 1.0e11, 2.0e10, 16 * 2**30, 1.0e10, 2e-6),
    "v100": DeviceKind("v100", 125e12, 900e9, 16 * 2**30, 150e9, 1e-5),
    "a100": DeviceKind("a100", 312e12, 2039e9, 80 * 2**30, 300e9, 1e-5),
    "h100": DeviceKind("h100", 989e12, 3350e9, 80 * 2**30, 450e9, 1e-5),
    "h200": DeviceKind("h200", 989e12, 4800e9, 141 * 2**30, 450e9, 1e-5),
}


# Op families the roofline model tells apart (`pesto_ir.cost.roofline.op_family`); a device may reach a
# different fraction of its datasheet roofline in each (`Device.efficiency`). `matmul_weight_grad`:
# matmuls that contract their left operand over leading dimensions, as a weight gradient x^T dy
# does (XLA's CPU backend relayouts them and runs them on another library); `conv_filter_grad`:
# convolutions whose window is larger than their output, as the gradient of a convolution's kernel
# is (cuDNN's "backward filter"); `window`: pooling (`reduce_window`) and the max-pool gradient
# (`select_and_scatter_add`), a loop over every window; `scatter`: read-modify-write at computed
# indices, serial loops on a CPU, atomics on a GPU.
OP_FAMILIES: tuple[str, ...] = ("matmul", "matmul_weight_grad", "conv", "conv_filter_grad", "elementwise",
                                "reduction", "window", "scatter", "movement", "other")
# A gradient family a device has no figure for takes its forward family's (files calibrated before
# the split, or with too few such kernels to time, still cost them as what they are).
PARENT_FAMILY: dict[str, str] = {"matmul_weight_grad": "matmul", "conv_filter_grad": "conv"}


def family_efficiency(figures: Mapping[str, float], family: str) -> float:
    """`family`'s figure in `figures`, else its `PARENT_FAMILY`'s, else 1.0 (not calibrated)."""
    return family_figure(figures, family, 1.0)


def family_figure(figures: Mapping[str, float], family: str, default: float) -> float:
    """`family`'s figure in `figures`, else its `PARENT_FAMILY`'s, else `default`."""
    return figures.get(family, figures.get(PARENT_FAMILY.get(family, family), default))


@dataclass(frozen=True)
class Device:
    name: str
    kind: str
    peak_flops: float | None  # None: not known (a custom kind whose op costs are given)
    mem_bandwidth: float | None
    memory: float
    host: int = 0  # the process (machine) the device belongs to; links across hosts are slower
    launch_overhead: float | None = None  # measured seconds per kernel launch; None: the kind's default
    # (op family, fraction of the roofline it reaches), sorted by family; a mapping is accepted too.
    efficiency: tuple[tuple[str, float], ...] = ()
    # (op family, seconds each of its kernels takes beyond the launch whatever its size): a library
    # kernel's fixed work (a convolution's packing and workspace), measured; sorted like `efficiency`.
    setup: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise ClusterError(f"device {self.name}: kind must be a name like 'h100', got {brief(repr(self.kind))}")
        object.__setattr__(self, "kind", kind_key(self.kind))
        for key in ("efficiency", "setup"):
            if isinstance(getattr(self, key), Mapping):
                object.__setattr__(self, key, tuple(getattr(self, key).items()))
        check_calibration(f"device {self.name}", self.launch_overhead, self.efficiency, self.setup)
        # sorted pairs: hashable, and equal devices compare equal whatever order the families came in
        object.__setattr__(self, "efficiency", tuple(sorted(self.efficiency)))
        object.__setattr__(self, "setup", tuple(sorted(self.setup)))
        if isinstance(self.host, bool) or not isinstance(self.host, int) or not 0 <= self.host <= MAX_HOST:
            raise ClusterError(f"device {self.name}: host must be a whole number from 0 to {MAX_HOST} (a process index), "
                               f"got {brief(repr(self.host))}")
        for key in ("peak_flops", "mem_bandwidth", "memory"):
            v = getattr(self, key)
            if v is None and key != "memory":
                continue  # only the roofline model needs the figures; it says so when they are missing
            if not is_real(v) or not v > 0:  # NaN fails `> 0`; infinite memory means no limit
                raise ClusterError(f"device {self.name}: {key} must be a positive number, got {brief(repr(v))}")
            if (why := out_of_range(key, v)) is not None:
                raise ClusterError(f"device {self.name}: {why}")

    @staticmethod
    def of_kind(name: str, kind: str, memory: float | None = None, host: int = 0) -> Device:
        k = kind_named(kind)
        return Device(name, k.name, k.peak_flops, k.mem_bandwidth, k.memory if memory is None else memory, host)

    def efficiency_for(self, family: str) -> float:
        """The fraction of the roofline ops of `family` reach here (roofline time is divided by
        it): the family's figure, else its `PARENT_FAMILY`'s, else 1.0 (not calibrated)."""
        if family not in OP_FAMILIES:
            raise ClusterError(f"unknown op family '{family}' (op families: {', '.join(OP_FAMILIES)})")
        return family_efficiency(dict(self.efficiency), family)

    def setup_for(self, family: str) -> float:
        """Seconds each kernel of `family` takes here beyond its launch and its roofline time: the
        family's figure, else its `PARENT_FAMILY`'s, else 0 (none measured)."""
        if family not in OP_FAMILIES:
            raise ClusterError(f"unknown op family '{family}' (op families: {', '.join(OP_FAMILIES)})")
        return family_figure(dict(self.setup), family, 0.0)


def check_calibration(who: str, launch: Any, efficiency: Any, setup: Any = ()) -> None:
    """Refuse a launch overhead that is not a finite number >= 0, efficiencies that are not
    (known op family, positive finite factor) pairs, and setups that are not (known op family,
    finite seconds >= 0) pairs."""
    if launch is not None and (not is_real(launch) or not 0 <= launch < math.inf):
        raise ClusterError(f"{who}: launch_overhead must be a finite number of seconds >= 0, "
                           f"got {brief(repr(launch))}")
    if launch is not None and (why := out_of_range("launch_overhead", launch)) is not None:
        raise ClusterError(f"{who}: {why}")
    _check_family_figures(who, "efficiency", efficiency, lambda v: 0 < v < math.inf,
                          "a positive finite factor (the fraction of the roofline reached)")
    _check_family_figures(who, "setup", setup, lambda v: 0 <= v < math.inf,
                          "a finite number of seconds >= 0")


def _check_family_figures(who: str, key: str, figures: Any, ok: Callable[[float], bool], want: str) -> None:
    if not isinstance(figures, tuple):
        raise ClusterError(f"{who}: {key} must map op families to figures, got {brief(repr(figures))}")
    seen: set[str] = set()
    for pair in figures:
        family, value = pair if isinstance(pair, tuple) and len(pair) == 2 else (pair, None)
        if family not in OP_FAMILIES:
            raise ClusterError(f"{who}: {key}: unknown op family {brief(repr(family))} "
                               f"(op families: {', '.join(OP_FAMILIES)})")
        if family in seen:
            raise ClusterError(f"{who}: {key}: op family '{family}' is given twice")
        seen.add(family)
        if not is_real(value) or not ok(value):
            raise ClusterError(f"{who}: {key} of '{family}' must be {want}, got {brief(repr(value))}")
        if (why := out_of_range(key, value)) is not None:
            raise ClusterError(f"{who}: {why.replace(key, f'{key} of {family!r}', 1)}")


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    latency: float  # seconds
    bandwidth: float  # bytes/s

    def __post_init__(self) -> None:
        if not is_real(self.latency) or not 0 <= lenient_float(self.latency) < math.inf:
            raise ClusterError(f"link {self.src}->{self.dst}: latency must be a finite number of seconds >= 0, "
                               f"got {brief(repr(self.latency))}")
        if not is_real(self.bandwidth) or not self.bandwidth > 0:
            raise ClusterError(f"link {self.src}->{self.dst}: bandwidth must be positive (bytes per second), "
                               f"got {brief(repr(self.bandwidth))}")
        for key in ("latency", "bandwidth"):
            if (why := out_of_range(key, getattr(self, key))) is not None:
                raise ClusterError(f"link {self.src}->{self.dst}: {why}")

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


def lenient_float(v: Any) -> float:
    """`v` as a float as `float()` reads it (so "1e9" too); NaN, which every check refuses, for a
    boolean or anything float() cannot read; inf for an integer too large for a float."""
    if isinstance(v, bool):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
    except OverflowError:
        return math.inf


def kind_named(kind: str) -> DeviceKind:
    if not isinstance(kind, str):
        raise ClusterError(f"a device kind is a name like 'h100', got {brief(repr(kind))}")
    k = KINDS.get(kind_key(kind))
    if k is None:
        raise ClusterError(f"unknown device kind '{kind}' (built in: {', '.join(KINDS)}; "
                           "describe others in a pesto-cluster/1 file)")
    return k
