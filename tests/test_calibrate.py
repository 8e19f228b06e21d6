"""`python -m bench.calibrate`: a measured pesto-cluster/1 file that Pesto reads back and plans with."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.calibrate import parse_args
from bench.calibrate_kernels import (
    MAX_EFFICIENCY,
    Sample,
    fit_efficiency,
    fit_family,
    fit_family_without_setup,
    fit_launch_overhead,
    relative_error,
)
from pesto_ir.cli import main as pesto_compile
from pesto_ir.cluster.devices import OP_FAMILIES
from pesto_ir.cluster.host import describe, machine_of
from pesto_ir.cluster.model import Cluster

ROOT = Path(__file__).resolve().parent.parent


def run_calibrate(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=3", "JAX_PLATFORMS": "cpu",
           "PESTO_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "bench.calibrate", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_quick_calibration_writes_a_cluster_pesto_compile_reads(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    done = run_calibrate("--quick", "--runs", "3", "--out", str(out), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "measured/roofline" in done.stdout and "matmul" in done.stdout and "all-reduce:" in done.stdout
    cluster = Cluster.load(out)
    assert cluster.names == ["cpu0", "cpu1", "cpu2"]
    for d in cluster.devices:
        assert d.launch_overhead is not None and 0 <= d.launch_overhead < 1e-2
        assert d.efficiency and dict(d.efficiency).keys() <= set(OP_FAMILIES)
        assert "matmul" in dict(d.efficiency)
        assert all(0 < e <= MAX_EFFICIENCY for _, e in d.efficiency)
    fit = cluster.all_reduce
    assert fit is not None and math.isfinite(fit.latency) and fit.bandwidth > 0
    import jax

    assert cluster.calibrated_on == machine_of(jax.devices()[0]), "the file says which machine it describes"
    assert f"calibrated on {describe(machine_of(jax.devices()[0]))}" in done.stdout
    assert not (tmp_path / "cache").exists(), "calibration measures; it neither reads nor fills the disk cache"
    assert pesto_compile(["examples/mlp_train_step.pir", "--cluster", str(out), "-o", str(tmp_path / "x.pir"),
                          "-q"]) == 0


def test_bad_options_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in ((["--runs", "0"], "must be a whole number >= 1, got 0"),
                          (["--runs", "two"], "must be a whole number >= 1, got 'two'"),
                          (["--warmup", "-1"], "must be a whole number >= 0, got -1"),
                          (["--stat", "mean"], "invalid choice"),
                          # checked before minutes of timing, not when the file is written
                          (["--out", str(tmp_path / "no" / "c.json")], f"the folder {tmp_path / 'no'} does not exist"),
                          (["--out", str(tmp_path)], f"{tmp_path} is a folder, not a file"),
                          (["--out", ""], "--out: must name a file")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err
    done = run_calibrate("--quick", "--kind", "z80", "--out", str(tmp_path / "c.json"), tmp_path=tmp_path)
    assert done.returncode == 1 and "unknown device kind 'z80'" in done.stderr and "Traceback" not in done.stderr


def test_fits_on_made_up_kernels() -> None:
    launch, speed = 5e-6, {"matmul": 0.5, "elementwise": 0.1}
    samples = [Sample(f, r, launch + r / speed[f]) for f in speed for r in (1e-7, 1e-6, 1e-4, 1e-3)]
    samples += [Sample("movement", 1e-8, launch)] * 3 + [Sample("other", 0.0, launch)] * 3
    samples += [Sample("reduction", 1e-3, 1.0)]  # one odd kernel makes no figure for its family
    assert fit_launch_overhead(samples) == pytest.approx(launch, rel=0.05)
    figures = fit_efficiency(samples, launch)
    assert figures.efficiency == pytest.approx(speed)
    assert figures.setup == {}  # four kernels each: too few to tell a setup from the slope
    assert figures.why == {"matmul_weight_grad": "no kernels", "conv": "no kernels", "conv_filter_grad": "no kernels",
                   "window": "no kernels",
                   "scatter": "no kernels",
                   "reduction": "only 1 kernel", "movement": "launch-bound", "other": "no roofline work"}


def test_a_familys_setup_is_fitted_beside_its_efficiency_and_the_total_is_kept() -> None:
    launch = 2e-6
    truth = {"conv": (0.8, 4e-5), "elementwise": (0.4, 0.0)}
    samples = [Sample(f, r, launch + setup + r / eff) for f, (eff, setup) in truth.items()
               for r in (1e-6, 3e-6, 1e-5, 4e-5, 1e-4, 5e-4, 2e-3)]
    figures = fit_efficiency(samples, launch)
    assert figures.efficiency == pytest.approx({f: eff for f, (eff, _) in truth.items()}, rel=1e-6)
    assert figures.setup == pytest.approx({"conv": 4e-5}, rel=1e-6)  # none for elementwise: 0 is not written
    # with noise the family's kernels still add up to what they measured
    noisy = [Sample(s.family, s.roofline, s.measured * (1.3 if i % 2 else 0.8)) for i, s in enumerate(samples)]
    conv = [s for s in noisy if s.family == "conv"]
    eff, setup = fit_family(conv, launch)
    assert sum(launch + setup + s.roofline / eff for s in conv) == pytest.approx(sum(s.measured for s in conv))
    assert relative_error(conv, launch, eff, setup) < relative_error(conv, launch, fit_family_without_setup(conv, launch), 0.0)
    # kernels of one size cannot tell a setup from a slope: none is fitted
    alike = [Sample("conv", 1e-4 * (1 + i / 10), launch + 4e-5 + 1e-4 * (1 + i / 10) / 0.8) for i in range(8)]
    assert fit_family(alike, launch)[1] == 0.0


def test_a_steps_setups_count_in_its_prediction_and_are_held_in_the_step_fit() -> None:
    from bench.calibrate_steps import Step, fit_step_launch

    steps = [Step(f"s{i}", 10 + n, {"conv": 1e-3 * (i + 1), "elementwise": 2e-4}, 0.0, {"conv": n, "elementwise": 10})
             for i, n in enumerate((4, 9, 20))]
    setup = {"conv": 5e-5}
    truth = [st.predicted(1e-6, {"conv": 0.5, "elementwise": 0.3}, setup) for st in steps]
    assert truth[0] == pytest.approx(1e-3 / 0.5 + 2e-4 / 0.3 + 14 * 1e-6 + 4 * 5e-5)
    measured = [Step(st.model, st.kernels, st.roofline, t, st.counts) for st, t in zip(steps, truth)]
    assert fit_step_launch(measured, {"conv": 0.5, "elementwise": 0.3}, setup) == pytest.approx(1e-6)
    # left out, the setups would be taken for launches
    assert fit_step_launch(measured, {"conv": 0.5, "elementwise": 0.3}) > 1e-5


def test_setups_are_kept_only_where_they_predict_whole_steps_better() -> None:
    from bench.calibrate_kernels import KernelFigures
    from bench.calibrate_steps import Step, choose_setup

    figures = KernelFigures(efficiency={"conv": 0.5}, setup={"conv": 5e-5}, plain={"conv": 0.3}, why={})
    shapes = [(1e-3, 4), (4e-3, 9), (2e-3, 20), (8e-3, 30), (5e-4, 12), (3e-3, 6)]

    def steps(efficiency: float, setup: float) -> list[Step]:  # `setup` per convolution, 1 us launches
        return [Step(f"s{i}", n, {"conv": r}, r / efficiency + n * setup + n * 1e-6, {"conv": n})
                for i, (r, n) in enumerate(shapes)]

    efficiency, setup, how = choose_setup(steps(0.5, 5e-5), figures)
    assert (efficiency, setup) == ({"conv": 0.5}, {"conv": 5e-5}) and how.startswith("setups kept")
    # steps that pay no setup: the figures fitted without one predict them better
    efficiency, setup, how = choose_setup(steps(0.3, 0.0), figures)
    assert (efficiency, setup) == ({"conv": 0.3}, {}) and how.startswith("setups left out")
    assert choose_setup(steps(0.3, 0.0), KernelFigures({"conv": 0.3}, {}, {"conv": 0.3}, {}))[1:] == ({}, "no family has a setup")


def test_fits_whole_steps_to_their_launch_and_family_efficiencies() -> None:
    from bench.calibrate_steps import Step, fit_to_steps

    launch, speed = 3e-6, {"matmul": 0.6, "elementwise": 0.25, "reduction": 0.2}
    mixes = [(8e-3, 1e-3, 2e-4, 50), (2e-3, 4e-3, 1e-3, 300), (5e-3, 5e-4, 3e-3, 120), (1e-2, 2e-3, 5e-4, 80),
             (1e-3, 1e-3, 1e-3, 400), (6e-3, 3e-3, 2e-3, 200)]
    steps = [Step(f"s{i}", kernels, {"matmul": m, "elementwise": e, "reduction": r, "movement": 1e-6},
                  m / 0.6 + e / 0.25 + r / 0.2 + 1e-6 / 0.5 + kernels * launch)
             for i, (m, e, r, kernels) in enumerate(mixes)]
    fitted_launch, efficiency, how = fit_to_steps(steps, {"movement": 0.5, "matmul": 0.9})
    assert fitted_launch == pytest.approx(launch, rel=1e-6)
    assert {f: efficiency[f] for f in speed} == pytest.approx(speed, rel=1e-6)
    assert efficiency["movement"] == 0.5  # too small a share of the steps to fit: its kernels' figure
    assert "fitted to 6 whole steps" in how
    for st in steps:
        assert st.predicted(fitted_launch, efficiency) == pytest.approx(st.measured, rel=1e-6)
    # one step cannot fit four figures: only the launch is fitted, the kernels' efficiencies kept
    only_launch, kept, how = fit_to_steps(steps[:1], {"matmul": 0.6, "elementwise": 0.25, "reduction": 0.2,
                                                      "movement": 0.5})
    assert only_launch == pytest.approx(launch, rel=1e-6) and kept["matmul"] == 0.6
    assert "launch fitted to 1 step" in how



def test_a_gradient_family_is_fitted_with_its_forward_family_by_one_factor() -> None:
    """Every training step has a weight gradient per forward matmul, so the steps cannot tell the
    two families apart: the fit scales both from their kernels timed alone by one factor, keeping
    the ratio the kernels measured."""
    from bench.calibrate_steps import Step, fit_to_steps

    truth = {"matmul": 0.8, "matmul_weight_grad": 0.4, "elementwise": 0.3}
    mixes = [(8e-3, 1e-3, 50), (2e-3, 4e-3, 300), (5e-3, 5e-4, 120), (1e-2, 2e-3, 80), (1e-3, 1e-3, 400),
             (6e-3, 3e-3, 200)]
    steps = []
    for i, (m, e, kernels) in enumerate(mixes):  # weight gradients: half the forward matmuls' work
        roofline = {"matmul": m, "matmul_weight_grad": m / 2, "elementwise": e}
        steps.append(Step(f"s{i}", kernels, roofline, sum(t / truth[f] for f, t in roofline.items()) + kernels * 2e-6))
    # the kernels timed alone ran both matmul families at half their speed inside a step
    launch, efficiency, how = fit_to_steps(steps, {"matmul": 0.4, "matmul_weight_grad": 0.2, "elementwise": 0.3})
    assert efficiency == pytest.approx(truth, rel=1e-6) and launch == pytest.approx(2e-6, rel=1e-6)
    assert "matmul with matmul_weight_grad by one factor" in how
    # without a figure of its own the gradient family is scaled from its forward family's
    _, efficiency, _ = fit_to_steps(steps, {"matmul": 0.4, "elementwise": 0.3})
    assert efficiency["matmul_weight_grad"] == pytest.approx(efficiency["matmul"])


def test_the_step_fit_is_written_only_where_it_predicts_steps_it_was_not_fitted_to() -> None:
    from bench.calibrate_steps import Step, choose_figures

    mixes = [(8e-3, 1e-3, 2e-4, 50), (2e-3, 4e-3, 1e-3, 300), (5e-3, 5e-4, 3e-3, 120), (1e-2, 2e-3, 5e-4, 80),
             (1e-3, 1e-3, 1e-3, 400), (6e-3, 3e-3, 2e-3, 200), (3e-3, 2e-3, 4e-3, 150)]
    alone = {"matmul": 0.6, "elementwise": 0.5, "reduction": 0.4}

    def steps(truth: dict[str, float], noise: list[float]) -> list[Step]:
        return [Step(f"s{i}", kernels, {"matmul": m, "elementwise": e, "reduction": r},
                     (m / truth["matmul"] + e / truth["elementwise"] + r / truth["reduction"] + kernels * 2e-6) * z)
                for i, ((m, e, r, kernels), z) in enumerate(zip(mixes, noise))]

    # steps that run every family at half its kernels' speed: the step fit predicts each held-out step
    slower = {f: e / 2 for f, e in alone.items()}
    launch, efficiency, how = choose_figures(steps(slower, [1.0] * 7), alone)
    assert efficiency == pytest.approx(slower, rel=1e-6) and "held-out error 0.000 with the step fit" in how
    # steps at the kernels' figures with +-15% of noise: the fit bends the figures to the noise,
    # which predicts held-out steps worse than the kernels' figures
    launch, efficiency, how = choose_figures(steps(alone, [1.15, 0.85, 1.0, 0.87, 1.13, 1.0, 0.9]), alone)
    assert efficiency == alone and how.startswith("efficiencies of the kernels timed alone")
    assert "predicted steps it was not fitted to no better" in how
    # steps that run the reductions 8 times slower than their kernels: the fit predicts them, but
    # only with reductions held at `FIT_RANGE`, so it is not written
    far = {**alone, "reduction": alone["reduction"] / 8}
    launch, efficiency, how = choose_figures(steps(far, [1.0] * 7), alone)
    assert efficiency == alone and "held reduction at a bound" in how
    # one step fewer: enough to fit, too few to hold one out; the fit stands, and says so
    launch, efficiency, how = choose_figures(steps(slower, [1.0] * 6), alone)
    assert efficiency == pytest.approx(slower, rel=1e-6) and how.endswith("too few steps to check the fit on steps "
                                                                          "held out of it")


def test_the_step_fit_keeps_each_family_near_its_kernels_timed_alone() -> None:
    """Steps that say convolutions cost nothing (as noise and families that move together can): the
    fit holds conv at `FIT_RANGE` times its kernels' efficiency, names it as held at a bound, and
    keeps the launch at most the launch of a kernel timed alone."""
    from bench.calibrate_steps import FIT_RANGE, Step, fit_to_steps

    mixes = [(8e-3, 1e-3, 50), (2e-3, 4e-3, 300), (5e-3, 5e-4, 120), (1e-2, 2e-3, 80), (1e-3, 1e-3, 400)]
    steps = [Step(f"s{i}", kernels, {"matmul": m, "conv": c}, m / 0.5 + kernels * 4e-6)
             for i, (m, c, kernels) in enumerate(mixes)]
    launch, efficiency, how = fit_to_steps(steps, {"matmul": 0.4, "conv": 0.2}, max_launch=2e-6)
    assert efficiency["conv"] == pytest.approx(0.2 * FIT_RANGE)
    assert 0.4 / FIT_RANGE <= efficiency["matmul"] <= 0.4 * FIT_RANGE
    assert 0.0 <= launch <= 2e-6 * (1 + 1e-9)
    assert how.endswith("held at a bound: conv")  # a launch fitted to 0 is not held
    # steps that cost 4 us a kernel beyond their matmuls, against 2 us for a kernel timed alone
    launch, efficiency, how = fit_to_steps([Step(f"m{i}", kernels, {"matmul": m}, m / 0.5 + kernels * 4e-6)
                                            for i, (m, _, kernels) in enumerate(mixes)], {"matmul": 0.5},
                                           max_launch=2e-6)
    assert launch == pytest.approx(2e-6)
    assert "held at a bound: launch" in how
