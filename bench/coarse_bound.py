"""How much coarsening raises the lower bound: the fine graph's bound, the bound of its fused
kernels (each kernel one node, as XLA runs it), and the coarse graph's at `--target` groups (by
default, and with `coarsen{siblings=true}`), on the zoo's JAX models and the MSR training graphs,
as `python -m bench` builds and costs them.

    python3 bench/coarse_bound.py [--target 200] [--k 4,8] [--models jax_gpt,jax_resnet,...]

A coarse node starts when all of its inputs are ready and its readers wait for all of it, so
grouping parallel work lengthens the critical path; placement on the coarse graph cannot beat
the coarse bound. Deterministic (no timing but coarsening's own seconds).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.zoo` when run as a script

from bench.zoo import Model, zoo  # noqa: E402
from pesto_ir.ir.graph import Graph  # noqa: E402
from pesto_ir.passes.rewrite.grouping import coarsen_groups, grouped_bound  # noqa: E402
from pesto_ir.schedule.bounds import lower_bound  # noqa: E402


def _cell(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3f}"


def row(model: Model, graph: Graph, k: int, target: int) -> tuple[str, float, float, float]:
    """The table row, coarse / fine, siblings / fine and the fused kernels' bound / fine (NaN
    when the graph has no fused kernels: the MSR graphs; all NaN when coarsening merged nothing)."""
    cluster = model.cluster(k)
    fine = lower_bound(graph, cluster)
    kernels = math.nan
    if any(op.get("fusion") is not None for op in graph.ops):
        kernels = grouped_bound(graph, cluster, [str(op.get("fusion") or op.name) for op in graph.ops]) / fine
    started = time.perf_counter()
    groups = coarsen_groups(graph, target, cluster)
    seconds = time.perf_counter() - started
    coarse, count = grouped_bound(graph, cluster, groups), len(set(groups))
    siblings = grouped_bound(graph, cluster, coarsen_groups(graph, target, cluster, siblings=True))
    line = (f"| {model.name} | {k} | {len(graph.ops)} | {count} | {fine * 1e3:.3f} | {_cell(kernels)} | "
            f"{coarse * 1e3:.3f} | {coarse / fine:.3f} | {siblings / fine:.3f} | {_cell(coarse / fine / kernels)} | "
            f"{_cell(siblings / fine / kernels)} | {seconds:.1f} |")
    if count == len(graph.ops):  # nothing merged (coarsen's memory cap): no coarsening to measure
        return line, math.nan, math.nan, math.nan
    return line, coarse / fine, siblings / fine, kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=int, default=200, help="coarse groups (default 200, as the suite)")
    ap.add_argument("--k", default="4,8", help="device counts, comma-separated (default 4,8)")
    ap.add_argument("--models", help="comma-separated suite model names (default: JAX zoo and MSR training graphs)")
    args = ap.parse_args()
    try:
        ks = [int(x) for x in args.k.split(",")]
    except ValueError:
        ap.error(f"--k must be whole numbers separated by commas, not {args.k!r}")
    if args.target < 1 or any(k < 1 for k in ks):
        ap.error("--target and every --k must be at least 1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    models = {m.name: m for m in zoo() if m.source == "jax" or "training" in m.name}
    names = args.models.split(",") if args.models else list(models)
    unknown = [n for n in names if n not in models]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)} (models: {', '.join(models)})")
    print("| model | k | ops | groups | fine bound ms | kernels / fine | coarse bound ms | coarse / fine | "
          "siblings / fine | coarse / kernels | siblings / kernels | coarsen s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios, with_siblings, over_kernels, siblings_over_kernels = [], [], [], []
    for name in names:
        graph = models[name].build()
        for k in ks:
            line, ratio, sibling_ratio, kernels = row(models[name], graph, k, args.target)
            print(line, flush=True)
            if math.isnan(ratio):
                continue
            ratios.append(ratio)
            with_siblings.append(sibling_ratio)
            if not math.isnan(kernels):
                over_kernels.append(ratio / kernels)
                siblings_over_kernels.append(sibling_ratio / kernels)
    for what, values in (("coarse / fine", ratios), ("siblings / fine", with_siblings),
                         ("coarse / kernels", over_kernels), ("siblings / kernels", siblings_over_kernels)):
        if not values:
            continue
        print(f"\n{what}: geometric mean {math.exp(sum(map(math.log, values)) / len(values)):.3f}, "
              f"max {max(values):.3f}")
    print("kernels / fine: the bound with each fused kernel one node; siblings: coarsen{siblings=true}; "
          "coarse / kernels: the coarse bound over the fused kernels' (JAX models); coarsen s: the default's; "
          "rows where coarsening merged nothing (groups = ops) are left out of the means and maxima")
    return 0


if __name__ == "__main__":
    sys.exit(main())
