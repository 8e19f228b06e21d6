"""What the work clock's rates (`pesto_ir/util/work.py`, `RATES`) are on this machine, and how far
its counted seconds are from the wall clock's on real searches.

    python3 -m bench.work_clock [--time-limit 8] [--only NAME] [--wall]

Runs `coarsen,place{algo=auto}` on a few MSR graphs and examples, recording every charge the
searches make. The time from one charge to the next is the work of the first (a charge is made
where its work starts; CP-SAT's is made when its solve ends, so the time before it is its); the
rates are fitted to those spans by non-negative least squares. CPU time of this process is used
(`--wall`: wall-clock time), so that other jobs on the machine distort them less, except for the
spans of CP-SAT solves, which run in another process. Prints, per kind, the units counted, the
fitted rate beside `RATES`, and per run the counted seconds beside the measured ones.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends import load
from pesto_ir.ir.graph import Graph
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.util import work

ROOT = Path(__file__).resolve().parent.parent
RUNS = (  # (name, file, devices)
    ("bert_l-12_training_op", "graphs/msr/bert_l-12_training_op.json", 8),
    ("resnet50_training_layer", "graphs/msr/resnet50_training_layer.json", 4),
    ("gnmt_training_layer", "graphs/msr/gnmt_training_layer.json", 4),
    ("inceptionv3_training_layer", "graphs/msr/inceptionv3_training_layer.json", 8),
    ("bert_l-3_training_op", "graphs/msr/bert_l-3_training_op.json", 2),
    ("transformer_block", "examples/transformer_block.pir", 4),
    ("jax_gpt24", "zoo:jax_gpt24", 8),  # a lowered JAX step: rewrites of arrays (`rewrite-typed`)
)
# charged when their work ends: the span before the charge is theirs (and the work charged at its
# start, a CP-SAT model's or a list schedule's tables); CP-SAT's runs in another process: wall clock
AFTER = {"cpsat", "data-ready"}
OTHER_PROCESS = {"cpsat"}


@dataclass
class Run:
    name: str
    charges: list[tuple[str, float, float, float]]
    wall: float
    cpu: float


def record(name: str, path: Path, devices: int, limit: float) -> Run:
    graph = _build(path)
    cluster = Cluster.homogeneous(devices, "h100")
    ctx = PassContext(cluster=cluster, quiet=True)
    pipeline = f"annotate-costs,coarsen,place{{algo=auto time-limit={limit:g}}}"
    with work.recording() as charges:
        wall, cpu = time.perf_counter(), time.process_time()
        PassManager(pipeline, verify_each=False).run(graph, ctx)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return Run(name, list(charges), wall, cpu)


def _build(path: Path) -> Graph:
    """The graph of a RUNS entry: a file, or `zoo:NAME`, a model of `bench/zoo.py` (costed)."""
    if path.name.startswith("zoo:"):
        from bench.zoo import zoo

        return next(m for m in zoo() if m.name == path.name.removeprefix("zoo:")).build()
    return load(str(path))


def spans(run: Run, use_wall: bool) -> list[tuple[dict[str, float], float]]:
    """(units by kind, seconds) of each span between two charges."""
    out = []
    for (kind, units, wall, cpu), (nxt, n_units, n_wall, n_cpu) in zip(run.charges, run.charges[1:]):
        if nxt in AFTER:  # the work charged at its end, and the work charged at its start
            units_by_kind = {nxt: n_units, **({} if kind in AFTER else {kind: units})}
            out.append((units_by_kind, (n_wall - wall) if use_wall or nxt in OTHER_PROCESS else (n_cpu - cpu)))
            continue
        if kind in AFTER:
            continue  # its span was the one before it
        out.append(({kind: units}, (n_wall - wall) if use_wall else (n_cpu - cpu)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.work_clock", description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=float, default=8.0, help="place's time limit per run (default 8 s)")
    ap.add_argument("--only", help="run only this graph")
    ap.add_argument("--wall", action="store_true", help="fit to wall-clock time instead of CPU time")
    args = ap.parse_args(argv)
    if not (args.time_limit > 0 and args.time_limit < 1e4):
        ap.error("--time-limit must be a number of seconds in (0, 10000)")
    runs = []
    for name, file, devices in RUNS:
        if args.only and name != args.only:
            continue
        runs.append(record(name, ROOT / file, devices, args.time_limit))
        print(f"recorded {name} at {devices} devices: {len(runs[-1].charges)} charges", flush=True)
    if not runs:
        ap.error(f"no run named {args.only}")
    kinds = sorted(work.RATES)
    rows = [s for run in runs for s in spans(run, args.wall)]
    matrix = np.array([[units.get(k, 0.0) for k in kinds] for units, _ in rows])
    seconds = np.array([t for _, t in rows])
    fitted, _ = nnls(matrix, seconds)
    print(f"\n{'kind':<14} {'units':>12} {'fitted s/unit':>14} {'RATES':>10} {'RATES/fitted':>13}")
    for k, rate, total in zip(kinds, fitted, matrix.sum(axis=0)):
        ratio = f"{work.RATES[k] / rate:.2f}" if rate > 0 else "-"
        print(f"{k:<14} {total:>12.0f} {rate:>14.3g} {work.RATES[k]:>10.3g} {ratio:>13}")
    print(f"\n{'run':<28} {'wall s':>8} {'cpu s':>8} {'counted s':>10} {'by fitted':>10}")
    for run in runs:
        counted = sum(work.RATES[k] * u for k, u, _, _ in run.charges)
        by_fit = sum(fitted[kinds.index(k)] * u for k, u, _, _ in run.charges)
        print(f"{run.name:<28} {run.wall:>8.2f} {run.cpu:>8.2f} {counted:>10.2f} {by_fit:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
