"""The kernel fit of `python -m bench.calibrate`: kernels timed one by one (`kernel_samples`), the
launch overhead (`fit_launch_overhead`), and each op family's efficiency and setup fitted to its
kernels (`fit_efficiency`, `fit_family`), with the rules on which kernels say anything."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster.devices import OP_FAMILIES, Device
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.util.errors import PestoError

# A family is calibrated only when its kernels spend at least this share of their measured time,
# and this many seconds, beyond the launches: kernels that are all launch (or timer noise) say
# nothing about throughput.
MIN_BEYOND_LAUNCH = 0.25
MIN_BEYOND_LAUNCH_S = 2e-5
# Fewer kernels than this make no figure for a whole family: one odd timing would decide it.
MIN_KERNELS = 3
# At most this fraction of the datasheet roofline (a sanity bound: datasheets are peaks).
MAX_EFFICIENCY = 10.0
# A family's setup (fixed seconds per kernel) is fitted from at least this many kernels, whose
# roofline times span at least this factor; else the family has an efficiency alone.
MIN_SETUP_KERNELS = 6
SETUP_SIZE_SPREAD = 4.0
# The share of kernels, smallest roofline time first, whose median time is the launch overhead.
LAUNCH_QUANTILE = 0.25


# ---------------------------------------------------------------- kernels

@dataclass(frozen=True)
class Sample:
    """One timed kernel: its family, datasheet roofline seconds (no launch) and measured seconds."""

    family: str
    roofline: float
    measured: float


def datasheet_time(work: Any, device: Device) -> float:
    """Roofline seconds of `work` by the datasheet alone, no launch (what the efficiency divides)."""
    from pesto_ir.cost.roofline import bound_time

    return bound_time(work, device)


def _timed_ops(group: Any, free: set[int], order: dict[int, int]) -> list[Op]:
    """The group's ops, after the free ops it reads (broadcasts, iotas): XLA recomputes those in
    each kernel, and `group_work` counts what they read, not the tensor they make."""
    producers = {id(v.owner): v.owner for v in group.inputs if v.owner is not None and id(v.owner) in free}
    return sorted([*producers.values(), *group.ops], key=lambda op: order[id(op)])


def kernel_samples(graph: Graph, device: Device, jax_device: Any, profiler: Any,
                   progress: Callable[[str], None]) -> list[Sample]:
    """Every kernel of `graph` that does work, timed on `jax_device` (identical kernels once).
    A kernel JAX cannot run alone is left out, and counted in the progress line."""
    from pesto_ir.cost.fusion import fusion_groups, group_work, runs_a_kernel
    from pesto_ir.jaxrt.profile import ProfileError, group_signature

    groups = fusion_groups(graph)
    order = {id(op): i for i, op in enumerate(graph.ops)}
    free = {id(op) for g in groups if g.free for op in g.ops}
    seen: dict[str, float | None] = {}
    samples, failed = [], []
    started = time.perf_counter()
    for g in groups:
        if not runs_a_kernel(g):
            continue  # recomputed inside its readers, or no kernel at all
        ops = _timed_ops(g, free, order)
        key = group_signature(ops)
        if key not in seen:
            try:
                seen[key] = profiler.time_ops(ops, jax_device)
            except ProfileError as e:
                seen[key] = None
                failed.append(str(e))
        measured = seen[key]
        if measured is not None:
            family = g.family if g.family in OP_FAMILIES else "other"
            samples.append(Sample(family, datasheet_time(group_work(g), device), measured))
    progress(f"{graph.name}: {len(samples)} kernels ({len(seen)} distinct) timed in "
             f"{time.perf_counter() - started:.1f} s" + (f"; {len(failed)} left out: {failed[0]}" if failed else ""))
    return samples


def fit_launch_overhead(samples: Sequence[Sample]) -> float:
    """The median measured time of the smallest `LAUNCH_QUANTILE` of kernels by roofline time."""
    if not samples:
        raise PestoError("no kernels were timed: nothing to calibrate the launch overhead with")
    smallest = sorted(samples, key=lambda s: s.roofline)[:max(1, math.ceil(len(samples) * LAUNCH_QUANTILE))]
    return float(statistics.median(s.measured for s in smallest))


@dataclass(frozen=True)
class KernelFigures:
    """What the kernels timed alone give per op family: the efficiency (roofline time is divided
    by it), the setup (seconds each kernel takes beyond the launch whatever its size), the
    efficiency the family would have with no setup (`plain`), and for each family left out, why."""

    efficiency: dict[str, float]
    setup: dict[str, float]
    plain: dict[str, float]
    why: dict[str, str]


def fit_efficiency(samples: Sequence[Sample], launch: float) -> KernelFigures:
    """Per family with enough kernels beyond their launches: `fit_family`'s efficiency and setup."""
    efficiency, setup, plain, why = {}, {}, {}, {}
    for family in OP_FAMILIES:
        mine = [s for s in samples if s.family == family]
        roofline, measured = sum(s.roofline for s in mine), sum(s.measured for s in mine)
        beyond_launch = measured - launch * len(mine)
        if not mine:
            why[family] = "no kernels"
        elif len(mine) < MIN_KERNELS:
            why[family] = f"only {len(mine)} kernel{'s' if len(mine) > 1 else ''}"
        elif not roofline > 0:
            why[family] = "no roofline work"
        elif not beyond_launch >= max(MIN_BEYOND_LAUNCH * measured, MIN_BEYOND_LAUNCH_S):
            why[family] = "launch-bound"
        else:
            efficiency[family], fixed = fit_family(mine, launch)
            plain[family] = fit_family_without_setup(mine, launch)
            if fixed > 0:
                setup[family] = fixed
    return KernelFigures(efficiency, setup, plain, why)


def fit_family(samples: Sequence[Sample], launch: float) -> tuple[float, float]:
    """One family's efficiency and setup: each kernel costs `launch + setup + roofline / efficiency`,
    the family's kernels adding up to what they measured, with the least relative error over its
    kernels (setup >= 0, efficiency at most `MAX_EFFICIENCY`). With fewer than
    `MIN_SETUP_KERNELS` kernels, or kernels of too alike a size to tell a setup from a slope
    (`SETUP_SIZE_SPREAD`), the setup is 0: the efficiency is the kernels' roofline time over
    their time beyond the launches.

    One efficiency alone cannot cost a library kernel's fixed work: on this CPU a convolution
    of 0.26 MFLOP took 40 us alone and one of 38 MFLOP 250 us (one run's kernels)."""
    n = len(samples)
    x_sum = sum(s.roofline for s in samples)
    y_sum = sum(s.measured - launch for s in samples)
    setup = 0.0
    sizes = [s.roofline for s in samples if s.roofline > 0]
    if n >= MIN_SETUP_KERNELS and sizes and max(sizes) >= SETUP_SIZE_SPREAD * min(sizes):
        # with the total held, setup c gives slope (y_sum - n c) / x_sum; residual_i = c a_i + b_i
        a = [1.0 - n * s.roofline / x_sum for s in samples]
        b = [y_sum * s.roofline / x_sum - (s.measured - launch) for s in samples]
        w2 = [1.0 / max(s.measured, launch, 1e-12) ** 2 for s in samples]  # relative; a kernel timed at
        # about nothing (the baseline subtracted) weighs as one timed at the launch
        aa = sum(w * ai * ai for w, ai in zip(w2, a))
        if aa > 0:
            best = -sum(w * ai * bi for w, ai, bi in zip(w2, a, b)) / aa
            setup = min(max(best, 0.0), max((y_sum - x_sum / MAX_EFFICIENCY) / n, 0.0))
    return min(x_sum / (y_sum - n * setup), MAX_EFFICIENCY), setup  # y_sum - n setup >= x_sum / MAX_EFFICIENCY


def fit_family_without_setup(samples: Sequence[Sample], launch: float) -> float:
    """The efficiency a family's kernels give with no setup: their roofline time over their time
    beyond the launches (at most `MAX_EFFICIENCY`)."""
    return min(sum(s.roofline for s in samples) / sum(s.measured - launch for s in samples), MAX_EFFICIENCY)


def relative_error(samples: Sequence[Sample], launch: float, efficiency: float, setup: float) -> float:
    """RMS over `samples` of log(predicted / measured), each kernel costed `launch + setup +
    roofline / efficiency` (a time under the launch counted as the launch, as `fit_family` weighs it)."""
    logs = [math.log(max(launch + setup + s.roofline / efficiency, launch, 1e-12) / max(s.measured, launch, 1e-12))
            for s in samples]
    return math.sqrt(sum(v * v for v in logs) / len(logs)) if logs else 0.0


def ms_text(seconds: float) -> str:
    """Seconds as milliseconds in a table cell."""
    return f"{seconds * 1e3:.3f}"
