"""Calibrate the cost model on the accelerator JAX sees: write a measured `pesto-cluster/1` file.

The roofline model times a kernel as `max(flops / peak_flops, bytes / mem_bandwidth)` of the
datasheet, plus a launch overhead. Real kernels reach only a fraction of the datasheet roofline,
and a different fraction per kind of kernel, so this measures, on the local JAX devices:

* kernels: zoo training steps (`bench/zoo_jax.py`) at sizes that run on a CPU, cut into the
  kernels XLA runs (`pesto_ir.fusion.fusion_groups`), each timed as one executable
  (`Profiler.time_ops`). The launch overhead is the median time of the smallest quarter of the
  kernels (by roofline time: there the launch is all there is); each op family's efficiency is
  its kernels' roofline time over their measured time less the launches, so that
  `launch + roofline / efficiency` adds up to what was measured (a family whose kernels are
  mostly launch, or that has fewer than 3 kernels, gets no entry: its efficiency stays 1);
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
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster import OP_FAMILIES, Cluster, ClusterError, Device
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph, Op

# A family is calibrated only when its kernels spend at least this share of their measured time,
# and this many seconds, beyond the launches: kernels that are all launch (or timer noise) say
# nothing about throughput.
MIN_BEYOND_LAUNCH = 0.25
MIN_BEYOND_LAUNCH_S = 2e-5
# Fewer kernels than this make no figure for a whole family: one odd timing would decide it.
MIN_KERNELS = 3
# At most this fraction of the datasheet roofline (a sanity bound: datasheets are peaks).
MAX_EFFICIENCY = 10.0
# The share of kernels, smallest roofline time first, whose median time is the launch overhead.
LAUNCH_QUANTILE = 0.25


def _models(quick: bool) -> dict[str, Any]:
    """Zoo models at sizes a CPU runs quickly, yet big enough that large kernels are not all launch."""
    from bench.zoo_jax import GptConfig, MlpConfig, ResNetConfig, Seq2SeqConfig

    if quick:
        return {"mlp": MlpConfig(2, 1024, 256, 10)}
    return {"mlp": MlpConfig(3, 1024, 256, 100), "gpt": GptConfig(2, 256, 4, 256, 4, 2048),
            "resnet": ResNetConfig(((16, 1, 1), (32, 1, 2)), 16, 64, 8, 10),
            "lstm_seq2seq": Seq2SeqConfig(1, 128, 4, 32, 512)}


# ---------------------------------------------------------------- kernels

@dataclass(frozen=True)
class Sample:
    """One timed kernel: its family, datasheet roofline seconds (no launch) and measured seconds."""

    family: str
    roofline: float
    measured: float


def datasheet_time(work: Any, device: Device) -> float:
    """Roofline seconds of `work` by the datasheet alone: the device without calibrated figures,
    less its launch overhead (what the efficiency divides)."""
    from pesto_ir.roofline import launch_overhead, work_time

    bare = dataclasses.replace(device, launch_overhead=None, efficiency=())
    return max(work_time(work, bare) - launch_overhead(bare), 0.0)


def _timed_ops(group: Any, free: set[int], order: dict[int, int]) -> list[Op]:
    """The group's ops, after the free ops it reads (broadcasts, iotas): XLA recomputes those in
    each kernel, and `group_work` counts what they read, not the tensor they make."""
    producers = {id(v.owner): v.owner for v in group.inputs if v.owner is not None and id(v.owner) in free}
    return sorted([*producers.values(), *group.ops], key=lambda op: order[id(op)])


def kernel_samples(graph: Graph, device: Device, jax_device: Any, profiler: Any,
                   progress: Callable[[str], None]) -> list[Sample]:
    """Every kernel of `graph` that does work, timed on `jax_device` (identical kernels once).
    A kernel JAX cannot run alone is left out, and counted in the progress line."""
    from pesto_ir.fusion import fusion_groups, group_work
    from pesto_ir.profile import ProfileError, group_signature
    from pesto_ir.roofline import NO_KERNEL

    groups = fusion_groups(graph)
    order = {id(op): i for i, op in enumerate(graph.ops)}
    free = {id(op) for g in groups if g.free for op in g.ops}
    seen: dict[str, float | None] = {}
    samples, failed = [], []
    started = time.perf_counter()
    for g in groups:
        if g.free or all(op.opcode in NO_KERNEL for op in g.ops):
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


def fit_efficiency(samples: Sequence[Sample], launch: float) -> tuple[dict[str, float], dict[str, str]]:
    """Per family: its roofline seconds over its measured seconds less one launch per kernel (at
    most `MAX_EFFICIENCY`), and for each family left out, why."""
    out, why = {}, {}
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
            out[family] = min(roofline / beyond_launch, MAX_EFFICIENCY)
    return out, why


# ---------------------------------------------------------------- the cluster

def calibrated_cluster(devices: Sequence[Any], kind: str | None, launch: float,
                       efficiency: dict[str, float]) -> Cluster:
    """The cluster of `devices` with links and all-reduce measured now (no disk cache), every
    device carrying the calibrated launch overhead and efficiencies."""
    cluster = Cluster.from_jax_devices(devices, kind=kind, measure=True, cache=False)
    calibrated = [dataclasses.replace(d, launch_overhead=launch, efficiency=tuple(efficiency.items()))
                  for d in cluster.devices]
    return dataclasses.replace(cluster, devices=calibrated)


# ---------------------------------------------------------------- report

def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def family_table(samples: Sequence[Sample], efficiency: dict[str, float], why: dict[str, str],
                 datasheet_launch: float) -> str:
    """Per family: kernels, roofline and measured milliseconds, their ratio, the efficiency, and
    what the uncalibrated model (roofline plus the kind's built-in launch overhead) says."""
    head = ("family", "kernels", "roofline ms", "measured ms", "measured/roofline", "efficiency", "uncalibrated ms")
    rows = [head]
    for family in OP_FAMILIES:
        mine = [s for s in samples if s.family == family]
        roofline, measured = sum(s.roofline for s in mine), sum(s.measured for s in mine)
        ratio = f"{measured / roofline:.3g}" if roofline > 0 else "-"
        eff = efficiency.get(family)
        shown = f"none ({why[family]})" if eff is None else f"{eff:.3g}" + (" (capped)" if eff >= MAX_EFFICIENCY else "")
        rows.append((family, str(len(mine)), _ms(roofline), _ms(measured), ratio, shown,
                     _ms(roofline + datasheet_launch * len(mine))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def summary(cluster: Cluster) -> str:
    """Launch overhead, a link's and the all-reduce's fitted figures."""
    d = cluster.devices[0]
    lines = [f"launch overhead: {d.launch_overhead * 1e6:.2f} us per kernel"]  # type: ignore[operator]
    if len(cluster) > 1:
        lk = cluster.link(cluster.names[0], cluster.names[1])
        lines.append(f"link {lk.src}->{lk.dst}: latency {lk.latency * 1e6:.2f} us, bandwidth {lk.bandwidth / 1e9:.3g} GB/s")
    fit = cluster.all_reduce
    lines.append("all-reduce: " + (f"{fit.latency * 1e6:.2f} us + chunk / {fit.bandwidth / 1e9:.3g} GB/s per ring step"
                                   if fit is not None else "not measured (one device)"))
    return "\n".join(lines)


# ---------------------------------------------------------------- command line

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {value}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one small MLP (under a minute on a 2-core CPU)")
    p.add_argument("--out", help="the pesto-cluster/1 file to write (default: calibrated-<kind>.json)")
    p.add_argument("--runs", type=_positive_int, default=5, help="timed runs per kernel (default 5)")
    p.add_argument("--warmup", type=_non_negative_int, default=2, help="untimed runs first (default 2)")
    p.add_argument("--stat", choices=("min", "median"), default="min",
                   help="how the runs become one time (default min: other work on the machine only adds time)")
    p.add_argument("--kind", help="built-in device kind whose datasheet is the roofline (default: read off the device)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    import jax

    from pesto_ir.cluster import jax_device_kind, kind_named
    from pesto_ir.loader import write_atomic
    from pesto_ir.profile import Profiler
    from pesto_ir.roofline import launch_overhead

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
    profiler = Profiler(runs=args.runs, warmup=args.warmup, cache=False, devices=devices[:1], stat=args.stat)

    from bench.zoo_jax import lower_config

    samples: list[Sample] = []
    for name, config in _models(args.quick).items():
        samples += kernel_samples(lower_config(name, config, f"{name}_calibrate"), device, devices[0], profiler, say)
    launch = fit_launch_overhead(samples)
    efficiency, why = fit_efficiency(samples, launch)
    started = time.perf_counter()
    cluster = calibrated_cluster(devices, kind, launch, efficiency)
    say(f"links and all-reduce measured in {time.perf_counter() - started:.1f} s")
    out = args.out or f"calibrated-{kind}.json"
    write_atomic(out, json.dumps(cluster.to_json(), indent=1) + "\n")
    Cluster.load(out)  # what was written reads back
    if not args.quiet:
        print(family_table(samples, efficiency, why, launch_overhead(device)))
        print(summary(cluster))
        print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
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
