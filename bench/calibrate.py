"""Calibrate the cost model on the accelerator JAX sees: write a measured `pesto-cluster/1` file.

The roofline model times a kernel as `max(flops / peak_flops, bytes / mem_bandwidth)` of the
datasheet, plus a launch overhead. Real kernels reach only a fraction of the datasheet roofline,
and a different fraction per kind of kernel, so this measures, on the local JAX devices:

* kernels: zoo training steps (`bench/zoo_jax.py`) at sizes that run on a CPU, cut into the
  kernels XLA runs (`pesto_ir.cost.fusion.fusion_groups`), each timed as one executable
  (`Profiler.time_ops`). The launch overhead is the median time of the smallest quarter of the
  kernels (by roofline time: there the launch is all there is); each op family gets an
  efficiency and a setup (fixed seconds per kernel, `fit_family`) such that
  `launch + setup + roofline / efficiency` adds up to what its kernels measured, with the least
  relative error per kernel (a family whose kernels are mostly launch, or that has fewer than 3
  kernels, gets no entry: its efficiency stays 1 and its setup 0);
* transfers: `jax.device_put` copies fitted to `latency + bytes / bandwidth` (`measure_links`);
* all-reduces: `psum` under `shard_map` over 2, 4, ... devices fitted to the ring model
  (`measure_all_reduce`).

It writes the cluster of the local devices with those figures (`--out`, default
`calibrated-<kind>.json`), for `pesto-compile --cluster FILE`, and prints roofline against
measured time per op family. Run:

    python -m bench.calibrate [--quick] [--out FILE] [--runs N] [--kind K] [-q]

`--quick` times one small MLP (under a minute on two CPU cores); without it, several zoo models
at reduced sizes (a few minutes). The disk cache is not used: calibrating always measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pesto_ir.cluster.devices import OP_FAMILIES, PARENT_FAMILY, Device, family_efficiency, family_figure
from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.host import describe, machine_of
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.jaxrt.measure_collectives import measured_cluster
from pesto_ir.jaxrt.timing import hold_xla_to_one_core
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
# Families holding at least this share of the roofline time of `MIN_FIT_STEPS` calibration steps get
# an efficiency fitted to whole steps; and the steps must outnumber the figures fitted by this many.
STEP_FIT_SHARE = 0.05
MIN_FIT_STEPS = 2
MIN_SPARE_STEPS = 2
# A family's efficiency fitted to whole steps stays within this factor of its kernels timed alone
# (the committed CPU calibration's figures were within 2.1 of them).
FIT_RANGE = 4.0
# The share of kernels, smallest roofline time first, whose median time is the launch overhead.
LAUNCH_QUANTILE = 0.25
# The step fit's figures are written only when they predict each step, fitted to the others, with
# at most this share of the error the kernels' own figures make (RMS of log(predicted / measured)).
HELD_OUT_GAIN = 0.9


def _step_models(quick: bool) -> dict[str, tuple[str, Any]]:
    """Whole steps to fit the figures to: the kernel models and more sizes and models, so that the
    steps outnumber the figures fitted (name -> (zoo model, config))."""
    from bench.zoo_jax import GptConfig, MlpConfig, MultiTowerConfig, ResNetConfig, Seq2SeqConfig

    steps = {name: (name, config) for name, config in _models(quick).items()}
    if not quick:
        steps.update({"mlp_wide": ("mlp", MlpConfig(2, 2048, 128, 10)),
                      "gpt_short": ("gpt", GptConfig(2, 256, 4, 64, 8, 1024)),
                      "resnet_small": ("resnet", ResNetConfig(((8, 1, 1), (16, 1, 2)), 8, 32, 16, 10)),
                      "resnet_deep": ("resnet", ResNetConfig(((16, 2, 1), (32, 2, 2), (64, 1, 2)), 16, 32, 8, 10)),
                      "lstm_wide": ("lstm_seq2seq", Seq2SeqConfig(1, 256, 2, 64, 256)),
                      "multitower": ("multitower", MultiTowerConfig(3, 64, 256, 2, 256, 64))})
    return steps


def _models(quick: bool) -> dict[str, Any]:
    """Zoo models at sizes a CPU runs quickly, yet big enough that large kernels are not all launch."""
    from bench.zoo_jax import GptConfig, InceptionConfig, MlpConfig, ResNetConfig, Seq2SeqConfig

    if quick:
        return {"mlp": MlpConfig(2, 1024, 256, 10)}
    return {"mlp": MlpConfig(3, 1024, 256, 100), "gpt": GptConfig(2, 256, 4, 256, 4, 2048),
            "resnet": ResNetConfig(((16, 1, 1), (32, 1, 2)), 16, 64, 8, 10),
            "lstm_seq2seq": Seq2SeqConfig(1, 128, 4, 32, 512),
            # max pools (their gradients: the scatter family) and filter gradients of many shapes
            "inception": InceptionConfig(((3, 16, 2, True), (3, 32, 1, True)),
                                         (((16, 12, 16, 16, 24, 8),), ((32, 24, 32, 24, 32, 32),)), 64, 8, 10)}


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


# ---------------------------------------------------------------- whole steps

@dataclass(frozen=True)
class Step:
    """One model's whole jitted step: its kernels, their datasheet roofline seconds per family
    (no launch), the measured seconds of the step, and its kernels per family (for their setups)."""

    model: str
    kernels: int
    roofline: dict[str, float]
    measured: float
    counts: dict[str, int] = field(default_factory=dict)

    def predicted(self, launch: float, efficiency: dict[str, float], setup: dict[str, float] | None = None) -> float:
        return (sum(t / family_efficiency(efficiency, f) for f, t in self.roofline.items()) + launch * self.kernels
                + self.setup_time(setup or {}))

    def setup_time(self, setup: dict[str, float]) -> float:
        """Seconds the step's kernels take in their families' `setup`."""
        return sum(family_figure(setup, f, 0.0) * n for f, n in self.counts.items())


def step_sample(name: str, model: str, config: Any, graph: Graph, device: Device, profiler: Any) -> Step:
    """`graph`'s step (zoo `model` at `config`) timed whole under `jax.jit` on the profiler's device."""
    import jax

    from bench.zoo_jax import concrete_arguments, step_at
    from pesto_ir.cost.fusion import fusion_groups, group_work, runs_a_kernel
    from pesto_ir.jaxrt.timing import call_time

    step, spec = step_at(model, config)
    jax_device = profiler.jax_device_for(device.kind)
    args = jax.device_put(concrete_arguments(spec), jax_device)
    measured = call_time(jax.jit(step), args, profiler.runs, profiler.warmup, profiler.stat, profiler.clock)
    roofline: dict[str, float] = {}
    counts: dict[str, int] = {}
    for g in fusion_groups(graph):
        if not runs_a_kernel(g):
            continue
        family = g.family if g.family in OP_FAMILIES else "other"
        counts[family] = counts.get(family, 0) + 1
        roofline[family] = roofline.get(family, 0.0) + datasheet_time(group_work(g), device)
    return Step(name, sum(counts.values()), roofline, max(measured - profiler.baseline(jax_device), 0.0), counts)


def fit_to_steps(steps: Sequence[Step], kernel_efficiency: dict[str, float],
                 max_launch: float | None = None, setup: dict[str, float] | None = None
                 ) -> tuple[float, dict[str, float], str]:
    """Launch overhead and efficiencies that make the calibrated roofline of whole steps match
    their measured times: least squares on relative error, over the families that hold at least
    `STEP_FIT_SHARE` of the roofline time of `MIN_FIT_STEPS` steps (the others keep the efficiency
    of their kernels timed alone), bounded: every efficiency at most `MAX_EFFICIENCY`, and within
    `FIT_RANGE` of its kernels timed alone where they gave one; the launch at least 0 and at most
    `max_launch` (the launch of a kernel timed alone; also where only the launch is fitted).
    Each family's `setup` per kernel (from its kernels timed alone) is held, not fitted.

    The steps' family shares move together (more convolutions, more elementwise epilogues, more
    kernels), so an unbounded fit trades one family against another: one run on this machine put
    convolutions at 10 times the roofline and reductions at 0.06. A gradient family and its
    forward family (`PARENT_FAMILY`) move together in every training step, so they are fitted as
    one: a single factor scales both from their kernels timed alone, which are what tells them
    apart (fitted apart, a run put weight gradients at 1.87 of the datasheet, forward matmuls at
    0.52). With too few steps to fit them, only the launch is fitted.
    Returns the launch, the efficiencies and how they were fitted (naming the figures held at a bound)."""
    groups = _fitted_groups(steps)
    fitted = [f for g in groups.values() for f in g]
    if len(steps) < _steps_needed(groups):
        return (_capped_launch(steps, kernel_efficiency, max_launch, setup), dict(kernel_efficiency),
                f"launch fitted to {len(steps)} step(s); efficiencies of the kernels timed alone")
    launch, fitted_efficiency, held = _bounded_fit(steps, list(groups.values()), kernel_efficiency, max_launch,
                                                   setup or {})
    efficiency = {f: e for f, e in kernel_efficiency.items() if f not in fitted}
    efficiency.update(fitted_efficiency)
    at_bound = f"; held at a bound: {', '.join(held)}" if held else ""
    together = [" with ".join(g) for g in groups.values() if len(g) > 1]
    return (launch, efficiency,
            f"{', '.join(fitted) or 'no family'} and the launch fitted to {len(steps)} whole steps"
            + (f" ({'; '.join(together)} by one factor)" if together else "")
            + f"; the other families from their kernels timed alone{at_bound}")


def _fitted_groups(steps: Sequence[Step]) -> dict[str, list[str]]:
    """The families the steps fit (`fit_to_steps`), by the family they are fitted with."""
    groups: dict[str, list[str]] = {}
    for f in OP_FAMILIES:
        if sum(1 for st in steps if st.roofline.get(f, 0.0) >= STEP_FIT_SHARE * sum(st.roofline.values()) > 0) \
                >= MIN_FIT_STEPS:
            groups.setdefault(PARENT_FAMILY.get(f, f), []).append(f)
    return groups


def _steps_needed(groups: dict[str, list[str]]) -> int:
    """Steps it takes to fit `groups` and the launch, with `MIN_SPARE_STEPS` to spare."""
    return len(groups) + 1 + MIN_SPARE_STEPS


def _bounded_fit(steps: Sequence[Step], groups: list[list[str]], kept: dict[str, float], max_launch: float | None,
                 setup: dict[str, float]) -> tuple[float, dict[str, float], list[str]]:
    """Launch and efficiencies of the families in `groups` minimising the steps' relative errors
    within their bounds (`fit_to_steps`; the other families at their `kept` efficiency, else 1),
    and the figures that ended at a bound. Each group's families are scaled by one factor from
    their `kept` figures (a sub-family without one: its parent's, else 1)."""
    import numpy as np
    from scipy.optimize import lsq_linear

    fitted = {f for g in groups for f in g}
    base = {f: family_efficiency(kept, f) for f in fitted}
    a = np.array([[sum(st.roofline.get(f, 0.0) / base[f] for f in g) / st.measured for g in groups]
                  + [st.kernels / st.measured] for st in steps])
    b = np.array([1.0 - (sum(t / family_efficiency(kept, f) for f, t in st.roofline.items() if f not in fitted)
                         + st.setup_time(setup)) / st.measured
                  for st in steps])
    # the unknowns: per group, the inverse of the factor on its families' figures
    anchored = [any(f in kept or PARENT_FAMILY.get(f) in kept for f in g) for g in groups]
    low = [max(1.0 / FIT_RANGE if anchor else 0.0, *(base[f] / MAX_EFFICIENCY for f in g))
           for g, anchor in zip(groups, anchored)]
    high = [FIT_RANGE if anchor else np.inf for anchor in anchored]
    # a launch of 0 timed alone still leaves the solver an interval (its bounds must differ)
    launch_cap = np.inf if max_launch is None else max(max_launch, 1e-12)
    x = lsq_linear(a, b, bounds=([*low, 0.0], [*high, launch_cap])).x
    held = [" and ".join(g) for g, v, lo, hi in zip(groups, x, low, high)
            if math.isclose(v, lo, rel_tol=1e-6) or math.isclose(v, hi, rel_tol=1e-6)]
    if max_launch is not None and math.isclose(x[-1], launch_cap, rel_tol=1e-6):
        held.append("launch")  # at 0 it is not held: kernels inside a step may well cost no launch
    efficiency = {f: min(base[f] / float(v), MAX_EFFICIENCY) for g, v in zip(groups, x[:-1]) for f in g}
    return float(x[-1]), efficiency, held


def choose_figures(steps: Sequence[Step], kernel_efficiency: dict[str, float],
                   max_launch: float | None = None, setup: dict[str, float] | None = None
                   ) -> tuple[float, dict[str, float], str]:
    """The launch and efficiencies to write: the step fit (`fit_to_steps`) where it predicts steps
    it was not fitted to better than the kernels' own figures do (each with the launch fitted to
    the steps), by `HELD_OUT_GAIN`; else the kernels' figures. Leave-one-out over the steps.

    A step fit can match the steps it was fitted to and still be wrong: where families move
    together from step to step, it trades one against another (on this CPU it put elementwise
    kernels at 4 times their kernels' figure and reductions at half theirs), and the steps
    cannot say which figures are right. A model held out of the fit can."""
    launch, efficiency, how = fit_to_steps(steps, kernel_efficiency, max_launch, setup)
    needed = _steps_needed(_fitted_groups(steps))
    if len(steps) < needed:
        return launch, efficiency, how  # only the launch was fitted
    if len(steps) - 1 < needed:
        return launch, efficiency, f"{how}; too few steps to check the fit on steps held out of it"

    def kernels(rest: Sequence[Step]) -> tuple[float, dict[str, float]]:
        return _capped_launch(rest, kernel_efficiency, max_launch, setup), dict(kernel_efficiency)

    def fitted(rest: Sequence[Step]) -> tuple[float, dict[str, float]]:
        return fit_to_steps(rest, kernel_efficiency, max_launch, setup)[:2]

    by_steps, by_kernels = held_out_error(steps, fitted, setup), held_out_error(steps, kernels, setup)
    errors = f"held-out error {by_steps:.3f} with the step fit, {by_kernels:.3f} with the kernels' figures"
    bounded = _at_a_bound(efficiency, kernel_efficiency)
    if by_steps <= HELD_OUT_GAIN * by_kernels and not bounded:
        return launch, efficiency, f"{how}; {errors}"
    why = (f"held {', '.join(bounded)} at a bound, a sign it trades families that move together ({errors})"
           if bounded else f"predicted steps it was not fitted to no better ({errors})")
    launch, efficiency = kernels(steps)
    return (launch, efficiency, f"efficiencies of the kernels timed alone and the launch fitted to {len(steps)} "
            f"whole steps: the step fit ({how}) {why}")


def _at_a_bound(fitted: dict[str, float], kernel_efficiency: dict[str, float]) -> list[str]:
    """The families whose step-fitted figure ended at a bound of `fit_to_steps`: `FIT_RANGE` from
    their kernels' figure, or `MAX_EFFICIENCY`.

    Such a fit is not written even when it predicts held-out steps better: the optimum lay past a
    plausible figure, which is what trading families that move together looks like, and models
    unlike the calibration's steps pay for it: on this CPU a step fit that held reductions at their
    bound put a CNN of larger convolutions than the calibration's at 0.52 of its measured step,
    and one that held elementwise kernels at theirs at 0.44-0.61 (four runs), where the kernels'
    figures gave 0.82-1.06."""
    out = []
    for family, value in sorted(fitted.items()):
        ratio = value / family_efficiency(kernel_efficiency, family)
        if (math.isclose(value, MAX_EFFICIENCY, rel_tol=1e-6) or math.isclose(ratio, FIT_RANGE, rel_tol=1e-6)
                or math.isclose(ratio, 1 / FIT_RANGE, rel_tol=1e-6)):
            out.append(family)
    return out


def choose_setup(steps: Sequence[Step], figures: KernelFigures, max_launch: float | None = None
                 ) -> tuple[dict[str, float], dict[str, float], str]:
    """The kernels' efficiencies and setups to go on with: with their setups where those predict
    whole steps better than the efficiencies fitted without setups do, by `HELD_OUT_GAIN`
    (leave-one-out, the launch fitted to the other steps in both); else without setups.

    A setup is what a kernel timed alone takes beyond its size; inside a step some of that work
    (a convolution's workspace, its first touch of cold buffers) may not recur, so the kernels
    alone cannot say whether a step pays it; steps held out of the launch fit can."""
    if not figures.setup:
        return dict(figures.efficiency), {}, "no family has a setup"
    if len(steps) < 2:
        return dict(figures.efficiency), dict(figures.setup), "setups kept: too few steps to check them on"

    def with_setup(rest: Sequence[Step]) -> tuple[float, dict[str, float]]:
        return _capped_launch(rest, figures.efficiency, max_launch, figures.setup), dict(figures.efficiency)

    def without(rest: Sequence[Step]) -> tuple[float, dict[str, float]]:
        return _capped_launch(rest, figures.plain, max_launch), dict(figures.plain)

    kept, dropped = held_out_error(steps, with_setup, figures.setup), held_out_error(steps, without)
    errors = f"held-out error {kept:.3f} with the kernels' setups, {dropped:.3f} without"
    if kept <= HELD_OUT_GAIN * dropped:
        return dict(figures.efficiency), dict(figures.setup), f"setups kept ({errors})"
    return dict(figures.plain), {}, f"setups left out: they predicted whole steps no better ({errors})"


def held_out_error(steps: Sequence[Step], fit: Callable[[Sequence[Step]], tuple[float, dict[str, float]]],
                   setup: dict[str, float] | None = None) -> float:
    """RMS over the steps of log(predicted / measured), each step predicted by `fit` of the others
    (`setup` held)."""
    logs = []
    for i, st in enumerate(steps):
        launch, efficiency = fit([*steps[:i], *steps[i + 1:]])
        logs.append(math.log(max(st.predicted(launch, efficiency, setup), 1e-30) / st.measured))
    return math.sqrt(sum(x * x for x in logs) / len(logs))


def _capped_launch(steps: Sequence[Step], efficiency: dict[str, float], max_launch: float | None,
                   setup: dict[str, float] | None = None) -> float:
    launch = fit_step_launch(steps, efficiency, setup)
    return launch if max_launch is None else min(launch, max_launch)


def fit_step_launch(steps: Sequence[Step], efficiency: dict[str, float], setup: dict[str, float] | None = None
                    ) -> float:
    """The launch overhead inside a step: per model, what the step measured beyond its kernels'
    calibrated roofline time, per kernel; the median over models (at least 0).

    Kernels timed alone pay a dispatch each (an executable call, its arguments), which kernels of
    one executable do not: on a CPU, 10 us alone against about 1 us inside a step. The efficiency
    per family comes from the large kernels timed alone; the per-kernel overhead from whole steps.
    """
    if not steps:
        raise PestoError("no steps were timed: nothing to calibrate the launch overhead with")
    per_kernel = [(st.measured - st.predicted(0.0, efficiency, setup)) / max(st.kernels, 1) for st in steps]
    return max(float(statistics.median(per_kernel)), 0.0)


def step_table(steps: Sequence[Step], launch: float, efficiency: dict[str, float], setup: dict[str, float],
               datasheet_launch: float) -> str:
    lines = [f"{'step':<14} {'kernels':>7} {'measured ms':>11} {'calibrated ms':>13} {'ratio':>6} "
             f"{'datasheet ms':>12} {'ratio':>6}"]
    for st in steps:
        cal, raw = st.predicted(launch, efficiency, setup), st.predicted(datasheet_launch, {})
        lines.append(f"{st.model:<14} {st.kernels:>7} {_ms(st.measured):>11} {_ms(cal):>13} "
                     f"{cal / st.measured if st.measured else 0:>6.2f} {_ms(raw):>12} "
                     f"{raw / st.measured if st.measured else 0:>6.2f}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the cluster

def calibrated_cluster(devices: Sequence[Any], kind: str | None, launch: float,
                       efficiency: dict[str, float], setup: dict[str, float] | None = None) -> Cluster:
    """The cluster of `devices` with links and all-reduce measured now (no disk cache), every
    device carrying the calibrated launch overhead, efficiencies and setups, and the machine they
    describe (`calibrated_on`)."""
    cluster = measured_cluster(devices, kind=kind, cache=False)
    calibrated = [dataclasses.replace(d, launch_overhead=launch, efficiency=tuple(efficiency.items()),
                                      setup=tuple((setup or {}).items()))
                  for d in cluster.devices]
    return dataclasses.replace(cluster, devices=calibrated, calibrated_on=machine_of(devices[0]))


# ---------------------------------------------------------------- report

def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def family_table(samples: Sequence[Sample], alone: KernelFigures, launch_alone: float,
                 efficiency: dict[str, float], datasheet_launch: float) -> str:
    """Per family: kernels, roofline and measured milliseconds of its kernels timed alone, their
    ratio, the efficiency and setup they give, the efficiency written (fitted to whole steps where
    there were enough), what the uncalibrated model (roofline plus the kind's launch) says, and
    the kernels' relative error (RMS log) with their efficiency alone and with the setup too."""
    head = ("family", "kernels", "roofline ms", "measured ms", "measured/roofline", "alone", "setup us",
            "efficiency", "uncalibrated ms", "error, no setup", "error")
    rows = [head]
    for family in OP_FAMILIES:
        mine = [s for s in samples if s.family == family]
        roofline, measured = sum(s.roofline for s in mine), sum(s.measured for s in mine)
        ratio = f"{measured / roofline:.3g}" if roofline > 0 else "-"
        fixed = alone.setup.get(family, 0.0)
        errors = ("-", "-")
        if family in alone.efficiency:
            errors = (f"{relative_error(mine, launch_alone, alone.plain[family], 0.0):.3f}",
                      f"{relative_error(mine, launch_alone, alone.efficiency[family], fixed):.3f}")
        rows.append((family, str(len(mine)), _ms(roofline), _ms(measured), ratio,
                     _efficiency(alone.efficiency.get(family), alone.why.get(family, "")), f"{fixed * 1e6:.1f}",
                     _efficiency(efficiency.get(family), "1"), _ms(roofline + datasheet_launch * len(mine)), *errors))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def _efficiency(value: float | None, why: str) -> str:
    if value is None:
        return f"none ({why})" if why != "1" else "1"
    return f"{value:.3g}" + (" (capped)" if value >= MAX_EFFICIENCY else "")


def summary(cluster: Cluster) -> str:
    """Launch overhead, a link's and the all-reduce's fitted figures."""
    d = cluster.devices[0]
    lines = [f"calibrated on {describe(cluster.calibrated_on)}"] if cluster.calibrated_on else []
    lines.append(f"launch overhead: {d.launch_overhead * 1e6:.2f} us per kernel")  # type: ignore[operator]
    if len(cluster) > 1:
        lk = cluster.link(cluster.names[0], cluster.names[1])
        lines.append(f"link {lk.src}->{lk.dst}: latency {lk.latency * 1e6:.2f} us, bandwidth {lk.bandwidth / 1e9:.3g} GB/s")
    fit = cluster.all_reduce
    lines.append("all-reduce: " + (f"{fit.latency * 1e6:.2f} us + chunk / {fit.bandwidth / 1e9:.3g} GB/s per ring step"
                                   if fit is not None else "not measured (one device)"))
    return "\n".join(lines)


# ---------------------------------------------------------------- command line

def _whole_at_least(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= `least`, else a clear error naming what was given."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {least}, got '{text}'") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {least}, got {value}")
        return value

    return parse


def _out_file(text: str) -> str:
    """--out, checked before minutes of timing: a file name in a folder that exists and can be written."""
    if not text:
        raise argparse.ArgumentTypeError("must name a file")
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: the folder {folder} cannot be written")
    return text


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one small MLP (under a minute on a 2-core CPU)")
    p.add_argument("--out", type=_out_file, help="the pesto-cluster/1 file to write (default: calibrated-<kind>.json)")
    p.add_argument("--runs", type=_whole_at_least(1), default=5, help="timed runs per kernel (default 5)")
    p.add_argument("--warmup", type=_whole_at_least(0), default=2, help="untimed runs first (default 2)")
    p.add_argument("--stat", choices=("min", "median"), default="min",
                   help="how the runs become one time (default min: other work on the machine only adds time)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time (default), or process CPU time with XLA's CPU backend on one core "
                        "(steady on a shared machine; CPU devices only), as bench/bench_costs.py times")
    p.add_argument("--kind", help="built-in device kind whose datasheet is the roofline (default: read off the device)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    import jax

    from pesto_ir.cluster.devices import kind_named
    from pesto_ir.cluster.model import jax_device_kind
    from pesto_ir.cost.roofline import launch_overhead
    from pesto_ir.jaxrt.profile import Profiler
    from pesto_ir.util.loader import write_atomic

    def say(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)

    devices = jax.devices()
    kinds = {jax_device_kind(d) for d in devices} if args.kind is None else {kind_named(args.kind).name}
    if len(kinds) > 1:
        raise ClusterError(f"the JAX devices are of several kinds ({', '.join(sorted(kinds))}); calibrate one kind")
    (kind,) = kinds
    device = Device.of_kind("calibrating", kind)
    say(f"calibrating {len(devices)} {devices[0].platform} device(s) as kind '{kind}'")
    profiler = Profiler(runs=args.runs, warmup=args.warmup, cache=False, devices=devices[:1], stat=args.stat,
                        clock=args.clock)

    from bench.zoo_jax import lower_config

    samples: list[Sample] = []
    graphs = {name: lower_config(name, config, f"{name}_calibrate") for name, config in _models(args.quick).items()}
    for graph in graphs.values():
        samples += kernel_samples(graph, device, devices[0], profiler, say)
    alone = fit_launch_overhead(samples)
    figures = fit_efficiency(samples, alone)
    steps = []
    for name, (model, config) in _step_models(args.quick).items():
        graph = graphs.get(name) or lower_config(model, config, f"{name}_calibrate")
        steps.append(step_sample(name, model, config, graph, device, profiler))
    kernel_efficiency, setup, setup_note = choose_setup(steps, figures, max_launch=alone)
    launch, efficiency, how = choose_figures(steps, kernel_efficiency, max_launch=alone, setup=setup)
    say(f"launch overhead: {alone * 1e6:.2f} us per kernel timed alone, {launch * 1e6:.2f} us inside a step; {how}; "
        f"{setup_note}")
    started = time.perf_counter()
    cluster = calibrated_cluster(devices, kind, launch, efficiency, setup)
    say(f"links and all-reduce measured in {time.perf_counter() - started:.1f} s")
    out = args.out or f"calibrated-{kind}.json"
    write_atomic(out, json.dumps(cluster.to_json(), indent=1) + "\n")
    Cluster.load(out)  # what was written reads back
    if not args.quiet:
        print(family_table(samples, figures, alone, efficiency, launch_overhead(device)))
        print(step_table(steps, launch, efficiency, setup, launch_overhead(device)))
        print(summary(cluster))
        print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.clock == "cpu":  # before JAX's CPU backend starts (the first jax.devices())
        hold_xla_to_one_core()
    try:
        return run(args)
    except PestoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {e.filename or args.out}: {e.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
