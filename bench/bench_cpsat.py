"""Placement quality and plan time of m-ETF, ilp, cpsat and auto on the MSR graphs, and scale.

Each run is what `pesto-compile --algo A` does: graphs above `--target` ops are coarsened to that
many groups (the default pipeline's `coarsen`), the place pass solves the (coarse) graph within
`--time-limit`, and `expand` times the per-op plan. Ratios are the expanded plan's makespan over
the lower bound of the whole graph; plan time is coarsen + place + expand, in seconds. The cluster
is the MSR one: k V100s with 16 GiB each, links of 10 us + bytes / 50 GB/s.

    python bench/bench_cpsat.py                                  # every MSR graph, k = 2 4 8, 10 s
    python bench/bench_cpsat.py --graphs gnmt_training_layer --k 4 --time-limit 30
    python bench/bench_cpsat.py --scale 20000 --k 8 --time-limit 20   # a generated 20k-op DAG

`--scale N` builds a DNN-like layered DAG of about N ops (blocks of 4 parallel chains of 10 ops
between a fork and a join; 0.1-1 ms ops, 1-64 MiB tensors), coarsens it, runs auto and expand, and
reports each phase's time and the peak resident memory of this process and of the CP-SAT worker.
"""

from __future__ import annotations

import argparse
import random
import resource
import time
from pathlib import Path

import pesto_ir
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.attributes import StringAttr
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.place import place_graph
from pesto_ir.passes.placement.exact.cpsat_worker import shared_solver
from pesto_ir.passes.placement.expansion import expand_plan
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passes.rewrite.grouping import coarsen_groups
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.util.errors import PestoError

MSR = Path(__file__).resolve().parents[1] / "graphs" / "msr"  # the MSR graphs, in the repository
MEMORY = 17185374208
ALGOS = ["m-etf", "ilp", "cpsat", "auto"]


def msr_graphs() -> list[str]:
    return sorted(p.stem for p in MSR.glob("*.json"))


def cluster_of(k: int) -> Cluster:
    return Cluster.homogeneous(k, "v100", memory=MEMORY, latency=1e-5, bandwidth=50e9)


def coarsen(graph: Graph, cluster: Cluster, target: int) -> None:
    """What the pipeline's `coarsen{target=...}` pass does (nothing at or below the target)."""
    if len(graph.ops) > target:
        for op, g in zip(graph.ops, coarsen_groups(graph, target, cluster)):
            op.attrs["group"] = StringAttr(g)


def plan_once(path: Path, algo: str, k: int, time_limit: float, target: int) -> tuple[float, float, str]:
    """(makespan / lower bound, plan seconds, winner) of one pipeline run; (nan, s, error) on failure."""
    graph = pesto_ir.load(path)
    cluster = cluster_of(k)
    lb = lower_bound(graph, cluster)
    started = time.perf_counter()
    try:
        coarsen(graph, cluster, target)
        plan = place_graph(graph, cluster, algo, PlaceOptions(time_limit=time_limit, quiet=True))
        fine = expand_plan(graph, cluster, plan)
    except PestoError as e:
        return float("nan"), time.perf_counter() - started, str(e).splitlines()[0][:40]
    return fine.makespan / lb, time.perf_counter() - started, str((plan.solver or {}).get("winner", ""))


def table(graphs: list[str], ks: list[int], algos: list[str], time_limit: float, target: int) -> None:
    print(f"time limit {time_limit:g} s per exact solve, coarsen to {target} groups above that; "
          "each cell: makespan / lower bound, plan seconds (coarsen + place + expand)")
    print("| graph | ops | k | " + " | ".join(algos) + " | auto winner |")
    print("|---|---|---|" + "---|" * (len(algos) + 1))
    for name in graphs:
        path = MSR / f"{name}.json"
        n = len(pesto_ir.load(path).ops)
        for k in ks:
            cells, winner = [], ""
            for algo in algos:
                if algo not in ALGORITHMS:
                    cells.append("n/a")
                    continue
                ratio, seconds, extra = plan_once(path, algo, k, time_limit, target)
                cells.append(f"{ratio:.4f} ({seconds:.1f} s)")
                if algo == "auto":
                    winner = extra
            print(f"| {name} | {n} | {k} | " + " | ".join(cells) + f" | {winner} |", flush=True)


def layered_dag(n: int, seed: int = 0, branches: int = 4, depth: int = 10) -> Graph:
    """A DNN-like DAG of about `n` ops: blocks in sequence, each a fork into `branches` chains of
    `depth` ops and a join (an Inception-style step); 0.1-1 ms ops, 1-64 MiB tensors."""
    rng = random.Random(seed)
    nodes: list[dict[str, object]] = []
    edges: list[dict[str, object]] = []

    def node() -> str:
        name = f"v{len(nodes)}"
        nodes.append({"id": name, "cost": rng.uniform(1e-4, 1e-3), "memory": rng.randint(1, 16) * 2**18})
        return name

    def edge(a: str, b: str) -> None:
        edges.append({"src": a, "dst": b, "bytes": rng.randint(1, 64) * 2**20})

    last = node()
    while len(nodes) + branches * depth + 1 <= n:
        ends = []
        for _ in range(branches):
            prev = last
            for _ in range(depth):
                cur = node()
                edge(prev, cur)
                prev = cur
            ends.append(prev)
        last = node()
        for e in ends:
            edge(e, last)
    return graph_from_json({"format": "pesto-graph/1", "name": f"blocks{len(nodes)}", "nodes": nodes, "edges": edges})


def scale(n: int, k: int, time_limit: float, target: int) -> None:
    t0 = time.perf_counter()
    graph = layered_dag(n)
    cluster = cluster_of(k)
    lb = lower_bound(graph, cluster)
    t1 = time.perf_counter()
    coarsen(graph, cluster, target)
    t2 = time.perf_counter()
    plan = place_graph(graph, cluster, "auto", PlaceOptions(time_limit=time_limit, quiet=True))
    t3 = time.perf_counter()
    fine = expand_plan(graph, cluster, plan)
    t4 = time.perf_counter()
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker = shared_solver().peak_rss()
    print(f"{n} ops, k={k}: build {t1 - t0:.1f} s, coarsen to {target} {t2 - t1:.1f} s, "
          f"place (auto, limit {time_limit:g} s) {t3 - t2:.1f} s, expand {t4 - t3:.1f} s; "
          f"plan time {t4 - t1:.1f} s")
    print(f"makespan {fine.makespan:.4f} s, lower bound {lb:.4f} s, ratio {fine.makespan / lb:.3f}; "
          f"auto: {plan.solver.get('portfolio')} (winner {plan.solver.get('winner')})")
    print(f"peak RSS: this process {self_rss:.0f} MiB, CP-SAT worker "
          f"{worker / 2**20:.0f} MiB" if worker is not None else f"peak RSS: this process {self_rss:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="*", default=None, help="MSR graph names (default: all)")
    ap.add_argument("--k", nargs="*", type=int, default=[2, 4, 8])
    ap.add_argument("--algos", nargs="*", default=ALGOS)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--target", type=int, default=200, help="coarsen graphs above this many ops to this many")
    ap.add_argument("--scale", type=int, default=None, help="instead: a generated layered DAG of this many ops")
    args = ap.parse_args()
    if args.scale is not None:
        for k in args.k:
            scale(args.scale, k, args.time_limit, args.target)
        return
    table(args.graphs or msr_graphs(), args.k, args.algos, args.time_limit, args.target)


if __name__ == "__main__":
    main()
