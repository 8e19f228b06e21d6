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
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.calibrate_kernels import (
    MAX_EFFICIENCY,
    KernelFigures,
    Sample,
    fit_efficiency,
    fit_launch_overhead,
    kernel_samples,
    ms_text,
    relative_error,
)
from bench.calibrate_steps import choose_figures, choose_setup, step_sample, step_table
from pesto_ir.cluster.devices import OP_FAMILIES, Device
from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.host import describe, machine_of
from pesto_ir.cluster.model import Cluster
from pesto_ir.jaxrt.measure_collectives import measured_cluster
from pesto_ir.jaxrt.timing import hold_xla_to_one_core
from pesto_ir.util.errors import PestoError


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
        rows.append((family, str(len(mine)), ms_text(roofline), ms_text(measured), ratio,
                     _efficiency(alone.efficiency.get(family), alone.why.get(family, "")), f"{fixed * 1e6:.1f}",
                     _efficiency(efficiency.get(family), "1"), ms_text(roofline + datasheet_launch * len(mine)), *errors))
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
