"""Every placement algorithm on the MSR graphs, for k = 2 and 4 V100s (16 GiB each, links of
10 us + bytes / 50 GB/s), in one table: makespan, makespan / lower bound, and plan time.

The heuristics place the fine graph; `ilp` (when passes/placement/exact/ilp.py exists) and the other exact
solvers (`--algos cpsat auto ...`) place the graph coarsened to `coarsen`'s default target and are
expanded back, as the default pipeline does; the time column then covers coarsen + place + expand.
The lower bound is always the fine graph's.

    python bench/bench_place.py                          # the whole table (ilp: 30 s per solve)
    python bench/bench_place.py --k 4 --algos m-etf m-sct --graphs resnet50_training_op
    python bench/bench_place.py --coarsen 200            # every algorithm on the coarsened graph
    python bench/bench_place.py --targets 50 100 200 400 --algos m-etf   # choosing coarsen's target
    python bench/bench_place.py --scale 20000            # coarsen speed on a 20k-op graph
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from collections import defaultdict
from pathlib import Path

from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.coarsen import DEFAULT_TARGET
from pesto_ir.passes.place import place_graph
from pesto_ir.passes.placement.expansion import expand_plan
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passes.rewrite.coarse_graph import quotient_graph
from pesto_ir.passes.rewrite.grouping import coarsen_groups
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import read_plan_attrs
from pesto_ir.util.errors import PestoError

MSR = Path(__file__).resolve().parents[1] / "graphs" / "msr"  # the MSR graphs, in the repository
MEMORY = 17185374208
HEURISTIC_ALGOS = ("m-etf", "m-sct", "m-topo", "expert", "single", "random")  # the others run in a child process
DEFAULT_ALGOS = [a for a in (*HEURISTIC_ALGOS, "ilp") if a in ALGORITHMS]  # --algos adds cpsat, auto, ...


def cluster(k: int) -> Cluster:
    return Cluster.homogeneous(k, "v100", memory=MEMORY, latency=1e-5, bandwidth=50e9)


def load(name: str) -> Graph:
    return graph_from_json(json.loads((MSR / f"{name}.json").read_text()), name)


def run_one(name: str, k: int, algo: str, target: int | None, time_limit: float) -> dict[str, object]:
    """One placement: coarsen to `target` first unless None; the fine plan's makespan and timing."""
    graph = load(name)
    cl = cluster(k)
    lb = lower_bound(graph, cl)
    options = PlaceOptions(time_limit=time_limit, quiet=True)
    t0 = time.perf_counter()
    try:
        if target is not None:
            for op, g in zip(graph.ops, coarsen_groups(graph, target, cl)):
                op.set("group", g)
        plan = place_graph(graph, cl, algo, options)
        if target is not None:
            plan = expand_plan(graph, cl, read_plan_attrs(graph))
    except PestoError as e:
        return {"error": " ".join(line.strip() for line in str(e).splitlines())}
    seconds = time.perf_counter() - t0
    groups = len({op.get("group") for op in graph.ops}) if target is not None else len(graph.ops)
    return {"makespan": plan.makespan, "ratio": plan.makespan / lb, "seconds": seconds, "nodes": groups}


def run_isolated(name: str, k: int, algo: str, target: int | None, time_limit: float) -> dict[str, object]:
    """`run_one` in a child process, so a solver that crashes (CBC can) costs one row, not the table."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=lambda: queue.put(run_one(name, k, algo, target, time_limit)))
    child.start()
    try:
        return queue.get(timeout=time_limit * 4 + 120)
    except Exception:  # the child died without answering, or hung past every limit
        child.kill()
        child.join()
        return {"error": f"the solver process died (exit code {child.exitcode})"}
    finally:
        child.join()


def table(graphs: list[str], ks: list[int], algos: list[str], coarsen: int | None, time_limit: float) -> None:
    print(f"{'graph':30s} {'ops':>5s} {'k':>2s} {'algo':7s} {'nodes':>5s} {'makespan ms':>11s} "
          f"{'/ LB':>6s} {'time s':>7s}")
    ratios: dict[tuple[str, int], list[float]] = defaultdict(list)
    for name in graphs:
        ops = len(load(name).ops)
        for k in ks:
            for algo in algos:
                exact = algo not in HEURISTIC_ALGOS
                target = coarsen if coarsen is not None else (DEFAULT_TARGET if exact else None)
                r = (run_isolated if exact else run_one)(name, k, algo, target, time_limit)
                if "error" in r:
                    print(f"{name:30s} {ops:5d} {k:2d} {algo:7s} {'':>5s} {'-':>11s} {'-':>6s} {'-':>7s}  "
                          f"{r['error'][:70]}", flush=True)
                    continue
                ratios[(algo, k)].append(float(r["ratio"]))  # type: ignore[arg-type]
                print(f"{name:30s} {ops:5d} {k:2d} {algo:7s} {r['nodes']:5d} {1e3 * r['makespan']:11.2f} "
                      f"{r['ratio']:6.3f} {r['seconds']:7.2f}", flush=True)
    print("\ngeometric mean of makespan / lower bound (graphs that were placed):")
    for k in ks:
        row = "  ".join(f"{a} {statistics.geometric_mean(ratios[(a, k)]):.3f} ({len(ratios[(a, k)])})"
                        for a in algos if ratios[(a, k)])
        print(f"  k={k}: {row}")


def target_sweep(graphs: list[str], ks: list[int], algos: list[str], targets: list[int], time_limit: float) -> None:
    """Geometric-mean ratio and total time per (algo, k, target): what coarsen's default is chosen by."""
    print(f"{'algo':7s} {'k':>2s} {'target':>6s} {'placed':>6s} {'geomean / LB':>12s} {'worst':>6s} {'time s':>7s}")
    for algo in algos:
        for k in ks:
            exact = algo not in HEURISTIC_ALGOS
            for target in [*targets, *([] if exact else [0])]:  # exact models of fine graphs are too big
                rows = [(run_isolated if exact else run_one)(n, k, algo, target or None, time_limit) for n in graphs]
                ok = [r for r in rows if "error" not in r]
                ratios = [float(r["ratio"]) for r in ok]  # type: ignore[arg-type]
                seconds = sum(float(r["seconds"]) for r in ok)  # type: ignore[arg-type]
                label = str(target) if target else "fine"
                print(f"{algo:7s} {k:2d} {label:>6s} {len(ok):3d}/{len(rows):<2d} "
                      f"{statistics.geometric_mean(ratios) if ratios else float('nan'):12.3f} "
                      f"{max(ratios, default=float('nan')):6.3f} {seconds:7.2f}", flush=True)


def scale(n_ops: int) -> None:
    """Coarsen speed: copies of the largest MSR graph chained into one graph of about `n_ops` ops."""
    base = json.loads((MSR / "bert_l-12_training_op.json").read_text())
    copies = max(1, round(n_ops / len(base["nodes"])))
    nodes, edges = [], []
    for c in range(copies):
        for n in base["nodes"]:
            nodes.append({**n, "id": f"c{c}_{n['id']}",
                          **({"colocate": f"c{c}_{n['colocate']}"} if "colocate" in n else {})})
        edges += [{**e, "src": f"c{c}_{e['src']}", "dst": f"c{c}_{e['dst']}"} for e in base["edges"]]
        if c:
            edges.append({"src": f"c{c - 1}_{base['nodes'][-1]['id']}", "dst": f"c{c}_{base['nodes'][0]['id']}",
                          "bytes": 1 << 20})
    graph = graph_from_json({"format": "pesto-graph/1", "name": "scaled", "nodes": nodes, "edges": edges})
    cl = Cluster.homogeneous(4, "v100", memory=1e13, latency=1e-5, bandwidth=50e9)  # 16 GiB would not hold it
    for target in (DEFAULT_TARGET, 1000):
        t0 = time.perf_counter()
        groups = coarsen_groups(graph, target, cl)
        t1 = time.perf_counter()
        for op, g in zip(graph.ops, groups):
            op.set("group", g)
        coarse, _ = quotient_graph(graph, cl)
        t2 = time.perf_counter()
        print(f"{len(graph.ops)} ops -> {len(coarse.ops)} groups (target {target}): coarsen {t1 - t0:.2f} s, "
              f"quotient graph {t2 - t1:.2f} s")
    t0 = time.perf_counter()
    plan = ALGORITHMS["m-etf"].run(graph, cl, PlaceOptions(quiet=True))
    print(f"m-etf on all {len(graph.ops)} ops, k=4: {time.perf_counter() - t0:.2f} s, makespan {plan.makespan:.4f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", nargs="*", default=sorted(p.stem for p in MSR.glob("*.json")))
    ap.add_argument("--k", nargs="*", type=int, default=[2, 4])
    ap.add_argument("--algos", nargs="*", default=DEFAULT_ALGOS, help=f"any of {', '.join(ALGORITHMS)}")
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per exact solve")
    ap.add_argument("--coarsen", type=int, default=None, help="coarsen every graph to this many nodes first")
    ap.add_argument("--targets", nargs="*", type=int, help="sweep coarsen targets instead of the table")
    ap.add_argument("--scale", type=int, help="time coarsen (and m-etf) on a graph of about this many ops")
    args = ap.parse_args()
    unknown = [a for a in args.algos if a not in ALGORITHMS]
    if unknown:
        raise SystemExit(f"unknown algorithm(s) {', '.join(unknown)}; known: {', '.join(ALGORITHMS)}")
    if args.scale:
        scale(args.scale)
    elif args.targets:
        target_sweep(args.graphs, args.k, args.algos, args.targets, args.time_limit)
    else:
        table(args.graphs, args.k, args.algos, args.coarsen, args.time_limit)


if __name__ == "__main__":
    main()
