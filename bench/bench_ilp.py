"""How far the `ilp` MILP gets past its warm start, on the MSR layer graphs small enough for it
and on random layered DAGs, for k = 2 and 4 identical V100s (the MSR cluster: 16 GiB each,
10 us + bytes / 50 GB/s links).

Prints one row per (graph, k): ops, the warm start's makespan and its ratio to the lower bound,
the same for the ILP's plan, the solver's status, gap, bound ratio and seconds, and the model size.
The warm start is the best heuristic plan of the `place` pass when that pass is installed
(what the default pipeline hands the ILP), else the ILP's own (everything on one device).

    python bench/bench_ilp.py                      # the whole table, 60 s per solve
    python bench/bench_ilp.py --time-limit 20 --k 2 --graphs dag20 gnmt_inference_layer
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import pesto_ir
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.exact.ilp import place_ilp
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import Plan
from pesto_ir.util.errors import PestoError

MSR = Path(__file__).resolve().parents[1] / "graphs" / "msr"  # the MSR graphs, in the repository
LAYER_GRAPHS = ["bert24_inference_layer", "bert24_training_layer", "gnmt_inference_layer",
                "gnmt_training_layer", "resnet50_inference_layer"]
RANDOM_SIZES = [20, 40, 80]
MEMORY = 17185374208


def random_dag(n: int, seed: int = 0) -> Graph:
    """A layered DAG like a DNN step: ops of 1-10 ms, 1-3 inputs from the last few ops,
    tensors of 1-64 MiB (20 us - 1.3 ms on a 50 GB/s link)."""
    rng = random.Random(seed)
    nodes = [{"id": f"v{i}", "cost": rng.uniform(1e-3, 1e-2)} for i in range(n)]
    edges = []
    for i in range(1, n):
        for j in rng.sample(range(max(0, i - 8), i), min(i, rng.randint(1, 3))):
            edges.append({"src": f"v{j}", "dst": f"v{i}", "bytes": rng.randint(1, 64) * 2**20})
    return graph_from_json({"format": "pesto-graph/1", "name": f"dag{n}", "nodes": nodes, "edges": edges})


def load_graph(name: str) -> Graph:
    if name.startswith("dag") and name[3:].isdigit():
        return random_dag(int(name[3:]))
    path = MSR / f"{name}.json"
    if path.exists():
        return pesto_ir.load(path)
    raise SystemExit(f"no graph named {name} (MSR graphs are looked for in {MSR})")


def warm_start(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan | None:
    """The place pass's best heuristic plan, when that pass exists in this checkout."""
    try:
        from pesto_ir.passes.placement.heuristics.portfolio import best_heuristic_plan
    except ImportError:
        return None
    try:
        return best_heuristic_plan(graph, cluster, options)
    except PestoError:
        return None


def run(name: str, k: int, time_limit: float, threads: int) -> str:
    graph = load_graph(name)
    cluster = Cluster.homogeneous(k, "v100", memory=MEMORY, latency=1e-5, bandwidth=50e9)
    options = PlaceOptions(time_limit=time_limit, quiet=True, threads=threads)
    lb = lower_bound(graph, cluster)
    warm = warm_start(graph, cluster, options)
    started = time.perf_counter()
    plan = place_ilp(graph, cluster, PlaceOptions(time_limit=time_limit, quiet=True, threads=threads,
                                                  warm_start=warm))
    wall = time.perf_counter() - started
    s = plan.solver or {}
    warm_ms = warm.makespan if warm is not None else float("nan")
    warm_name = warm.algorithm if warm is not None else "own"
    gap = s.get("gap")
    size = s.get("model", "")
    return (f"| {name} | {k} | {len(graph.ops)} | {warm_name} | {warm_ms * 1e3:.2f} | {warm_ms / lb:.4f} | "
            f"{plan.makespan * 1e3:.2f} | {plan.makespan / lb:.4f} | {s.get('status')} | "
            f"{'-' if gap is None else f'{gap:.2%}'} | {(s.get('bound') or 0) / lb:.4f} | {wall:.1f} | {size} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="*", default=LAYER_GRAPHS + [f"dag{n}" for n in RANDOM_SIZES])
    ap.add_argument("--k", nargs="*", type=int, default=[2, 4])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    print(f"time limit {args.time_limit:g} s, {args.threads} thread(s); ratios are makespan / lower bound")
    print("| graph | k | ops | warm start | warm ms | warm/LB | ilp ms | ilp/LB | status | gap | bound/LB | s | model |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.graphs:
        for k in args.k:
            print(run(name, k, args.time_limit, args.threads), flush=True)


if __name__ == "__main__":
    main()
