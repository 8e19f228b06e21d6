"""The whole-step fit of `python -m bench.calibrate`: whole jitted steps timed (`step_sample`), the
families that hold most of their time fitted to them (`fit_to_steps`, `choose_figures`), the
launch and setups fitted to steps (`fit_step_launch`, `choose_setup`), kept only where they predict
held-out steps better than the kernels' figures (`held_out_error`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.calibrate_kernels import MAX_EFFICIENCY, KernelFigures, datasheet_time, ms_text
from pesto_ir.cluster.devices import OP_FAMILIES, PARENT_FAMILY, Device, family_efficiency, family_figure
from pesto_ir.ir.graph import Graph
from pesto_ir.util.errors import PestoError

# Families holding at least this share of the roofline time of `MIN_FIT_STEPS` calibration steps get
# an efficiency fitted to whole steps; and the steps must outnumber the figures fitted by this many.
STEP_FIT_SHARE = 0.05
MIN_FIT_STEPS = 2
MIN_SPARE_STEPS = 2
# A family's efficiency fitted to whole steps stays within this factor of its kernels timed alone
# (the committed CPU calibration's figures were within 2.1 of them).
FIT_RANGE = 4.0
# The step fit's figures are written only when they predict each step, fitted to the others, with
# at most this share of the error the kernels' own figures make (RMS of log(predicted / measured)).
HELD_OUT_GAIN = 0.9



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
        lines.append(f"{st.model:<14} {st.kernels:>7} {ms_text(st.measured):>11} {ms_text(cal):>13} "
                     f"{cal / st.measured if st.measured else 0:>6.2f} {ms_text(raw):>12} "
                     f"{raw / st.measured if st.measured else 0:>6.2f}")
    return "\n".join(lines)
