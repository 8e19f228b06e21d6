"""Pipelines on the MSR training layer graphs: how close the best plan gets to its bound.

A one-batch plan of a deep sequential model is capped by its critical path; m micro-batches in a
pipeline over k devices can approach the total work spread over them. For every MSR training
layer graph and k devices, `place{algo=auto microbatches=auto}` (micro-batches up to 32; these
graphs declare no gradient bytes, so there are no data-parallel replicas), the fixed GPipe and
1F1B schedules, the eager schedule of the same stages and the interleaved layouts' eager schedule
(`passes/placement/pipeline/schedules.py`) at m = 1, 2, 4, ..., 32 are run side by side; the table gives each
plan's step time, its m, and the ratio to

    bound(m) = max(total work / k, critical path / m)

(the critical path on the fastest device, transfers free). The goal is a ratio of at most 1.15 for
the best plan; where it is missed, the last column says which term the plan is held by: its
stages' imbalance (the largest stage's work against total / k, beside the least any placement of
the colocated units can reach, by CP-SAT), the links, or memory.

    python3 bench/bench_pipeline.py                    # k = 4 and 6, auto's time limit 20 s
    python3 bench/bench_pipeline.py --k 4 --time-limit 10 --graphs bert24_training_layer
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.unit_balance import in_own_process  # noqa: E402
from bench.zoo import msr_cluster, msr_model  # noqa: E402
from pesto_ir.cluster.model import Cluster  # noqa: E402
from pesto_ir.ir.graph import Graph  # noqa: E402
from pesto_ir.passes.placement.common import colocation_units  # noqa: E402
from pesto_ir.passes.placement.options import PlaceOptions  # noqa: E402
from pesto_ir.passes.placement.pipeline.schedules import PIPELINE_SCHEDULES, PipelineGraph, pipeline_plan  # noqa: E402
from pesto_ir.passes.rewrite.replicas import Strategy, as_hybrid, replica_graph  # noqa: E402
from pesto_ir.passmanager import PassContext, PassManager  # noqa: E402
from pesto_ir.schedule.bounds import critical_path, fastest_costs  # noqa: E402
from pesto_ir.schedule.plan import Plan, read_plan_attrs  # noqa: E402
from pesto_ir.util.errors import PestoError  # noqa: E402

GRAPHS = ("bert24_training_layer", "gnmt_training_layer", "inceptionv3_training_layer", "resnet50_training_layer")
MICROBATCHES = (1, 2, 4, 8, 16, 32)
GOAL = 1.15


def bound(graph: Graph, cluster: Cluster, m: int) -> float:
    fast = fastest_costs(graph, cluster)
    return max(sum(fast.values()) / len(cluster), critical_path(graph, fast) / m)


def best_by_schedule(graph: Graph, cluster: Cluster) -> dict[str, tuple[Plan | None, str]]:
    """Per pipeline schedule, its fastest plan over `MICROBATCHES` (None and the reasons when none
    fits); each m's replica graph is built once for all schedules."""
    best: dict[str, Plan | None] = {s: None for s in PIPELINE_SCHEDULES}
    why: dict[str, list[str]] = {s: [] for s in PIPELINE_SCHEDULES}
    for m in MICROBATCHES:
        try:
            replica = replica_graph(graph, cluster, Strategy(1, m))
        except PestoError as e:
            for s in PIPELINE_SCHEDULES:
                why[s].append(f"m={m}: {str(e).splitlines()[0][:120]}")
            continue
        pipeline = PipelineGraph(replica, cluster)  # the schedules share its units and stages
        for s in PIPELINE_SCHEDULES:
            try:
                plan = as_hybrid(replica, cluster, pipeline_plan(replica, cluster, s, PlaceOptions(quiet=True),
                                                                 pipeline=pipeline), Strategy(1, m))
            except PestoError as e:
                why[s].append(f"m={m}: {str(e).splitlines()[0][:120]}")
                continue
            found = best[s]
            if found is None or plan.makespan < found.makespan:
                best[s] = plan
    return {s: (best[s], "; ".join(why[s])) for s in PIPELINE_SCHEDULES}


def auto_plan(graph: Graph, cluster: Cluster, time_limit: float) -> tuple[Plan | None, float, str]:
    started = time.perf_counter()
    try:
        out = PassManager(f"place{{algo=auto microbatches=auto data-parallel=1 time-limit={time_limit:g}}}",
                          verify_each=False).run(graph, PassContext(cluster=cluster, quiet=True))
    except PestoError as e:
        return None, time.perf_counter() - started, " ".join(str(getattr(e, "cause", e)).split())[:200]
    return read_plan_attrs(out), time.perf_counter() - started, ""


def m_of(plan: Plan) -> int:
    return plan.parallelism.microbatches if plan.parallelism is not None else 1


def unit_balance(graph: Graph, cluster: Cluster, seconds: float = 10.0) -> tuple[float, bool]:
    """The least any placement can give its busiest device, whatever the schedule: the colocation
    units (every micro-batch copy of a unit stays with it) split over the devices to minimise the
    largest load (`bench/unit_balance.py`); the proven lower bound of that minimum in seconds, and
    whether it is optimal."""
    fast = fastest_costs(graph, cluster)
    loads = [round(sum(fast[op.name] for op in unit) * 1e9) for unit in colocation_units(graph.ops)]  # ns
    bound, optimal = in_own_process(loads, len(cluster), seconds)
    return bound / 1e9, optimal


def held_by(graph: Graph, cluster: Cluster, plan: Plan) -> str:
    """The plan's ratio to total / k, split into its two factors: how much more than total / k the
    busiest device works (the stages' balance at this graph's granularity), and how much longer
    than its work the step takes (waiting for transfers and for other stages); and, for a pipeline
    of S stages, the part of that waiting its fill and drain alone cost: with perfectly balanced
    stages and free links a fixed schedule still takes (m + S - 1) / m x total / k."""
    k = len(cluster)
    total = sum(fastest_costs(graph, cluster).values())
    busy = max(sum(s.end - s.start for s in plan.ops.values() if s.device == d) for d in plan.devices[:k])
    moved = sum(t.end - t.start for t in plan.transfers)
    par = plan.parallelism
    least = ""
    if par is None or par.data_parallel == 1:  # replicas split each unit's work: the units bound does not hold
        bound, proven = unit_balance(graph, cluster)
        least = (f" (no placement of the {len(colocation_units(graph.ops))} colocated units gives less than "
                 f"{bound / (total / k):.3f}{'' if proven else ', a bound'})")
    out = (f"balance: the busiest device works {busy / (total / k):.3f} x total / k{least}; waiting: the step is "
           f"{plan.makespan / busy:.3f} x its work (transfers {moved * 1e3:.3g} ms in all)")
    if par is not None and par.microbatches > 1 and len(par.replicas[0]) > 1:
        stages, m = len(par.replicas[0]), par.microbatches
        out += f"; fill and drain of {stages} stages over {m} micro-batches alone: {(m + stages - 1) / m:.3f}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", nargs="+", type=int, default=[4, 6])
    ap.add_argument("--graphs", nargs="+", default=list(GRAPHS))
    ap.add_argument("--time-limit", type=float, default=20.0, help="auto's time limit per row (s)")
    args = ap.parse_args(argv)
    print("| graph | k | one batch | auto (m) | " + " | ".join(f"{s} (m)" for s in PIPELINE_SCHEDULES)
          + " | best / bound(m) | plan s | held by |")
    print("|---|---:|---:|---:|" + "---:|" * len(PIPELINE_SCHEDULES) + "---:|---:|---|")
    for name in args.graphs:
        model = msr_model(name)
        for k in args.k:
            graph, cluster = model.build(), msr_cluster(k)
            one = PassManager("place{algo=auto data-parallel=1 microbatches=1 time-limit=8}", verify_each=False)
            try:
                single_batch = read_plan_attrs(one.run(model.build(), PassContext(cluster=cluster, quiet=True)))
                one_ms = f"{single_batch.makespan * 1e3:.4g}" if single_batch else "—"
            except PestoError:
                one_ms = "—"
            auto, seconds, why = auto_plan(graph, cluster, args.time_limit)
            by_schedule = best_by_schedule(model.build(), cluster)
            plans = [p for p in (auto, *(p for p, _ in by_schedule.values())) if p is not None]
            cells = [f"{p.makespan * 1e3:.4g} ({m_of(p)})" if p else "—" for p in
                     (auto, *(p for p, _ in by_schedule.values()))]
            if not plans:
                print(f"| {name} | {k} | {one_ms} | " + " | ".join(cells) + f" | — | {seconds:.1f} | "
                      f"memory: {why or by_schedule['gpipe'][1][:200]} |", flush=True)
                continue
            best = min(plans, key=lambda p: p.makespan)
            ratio = best.makespan / bound(model.build(), cluster, m_of(best))
            note = "" if ratio <= GOAL else held_by(model.build(), cluster, best)
            print(f"| {name} | {k} | {one_ms} | " + " | ".join(cells) + f" | {ratio:.3f} | {seconds:.1f} | {note} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
