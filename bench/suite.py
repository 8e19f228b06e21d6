"""`python -m bench`: the Pesto paper's comparison over the model zoo, as markdown and JSON.

For every model of the zoo (`bench/zoo.py`) and k devices, the suite places the graph with

- the baselines on the fine graph, as Baechi runs them: `single`, `expert`, `m-topo`, `m-etf`,
  `m-sct`, and the classic list schedulers `etf` and `heft` (`passes/placement/heuristics/list_scheduling.py`);
- what users run beyond one batch: `dp` (every device a replica, gradients all-reduced in buckets,
  as `jax.jit` over a batch-sharded mesh), `gpipe` and `1f1b` (k contiguous stages balanced by
  cost, the fixed schedule, the best micro-batch count up to 32);
- Pesto as `pesto-compile` runs it: `coarsen{target=200},place{algo=A time-limit=T},expand` for
  A in `ilp`, `auto-1b` (the portfolio of heuristics, CP-SAT and LNS on one batch) and `auto`
  (the search over data-parallel replicas x micro-batches x placement; Pesto's plan in the tables),
  `auto-1b` and `auto` at each k starting from their own plans at the k before (`place{start=FILE}`),

and reports each plan's simulated step time, the makespan lower bound, Pesto's gap to it and the
planning time. Every plan has passed the plan validator. Rows where `auto` is not the fastest plan
or is more than 5% above the lower bound get findings that say why, from three numbers:

- the best plan with free communication (m-ETF/m-SCT on the same devices with instant links): how
  far above that cluster's bound a plan gets when transfers cost nothing (the bound's looseness or
  the heuristics'), and how much the real links add to it;
- the lower bound of the coarse graph: how much coarsening alone gives away;
- the best single-device step time: whether parallelism pays for its transfers at all.

    python -m bench                          # everything: 23 models x k = 2, 4, 8 (about 80 min)
    python -m bench --quick                  # 4 small models x k = 2, 4 (about 30 s; CI runs it)
    python -m bench --models gnmt_training_layer jax_gpt --k 4 --time-limit 30
    python -m bench --readme docs/benchmarks.md --gantt docs/images/plan.png   # refresh the results in docs/benchmarks.md
    python -m bench --llm [--quick] [--rows NAME ...]   # the LLM zoo (`bench/llm_zoo.py`), not in the default run

Results go to `bench/results/{suite,quick}.{md,json}` (`--out` to change), each written whole.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pesto_ir
from bench.suite_report import (
    BASELINES,
    EXACT,
    FORMAT,
    ONE_BATCH,
    PESTO,
    RESULTS,
    STARTED,
    TIE,
    Outcome,
    Row,
    findings,
    markdown,
    ms,
    readme_parts,
    to_json,
    update_readme,
)
from bench.zoo import Model, zoo
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.place import default_time_limit, place_graph
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.rewrite.coarse_graph import quotient_graph
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.bounds import colocated_path, fastest_costs, lower_bound, memory_cut_path, transfer_aware_path
from pesto_ir.schedule.plan import Plan, read_plan_attrs
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import write_atomic

# ---------------------------------------------------------------- running one row

def run_row(model: Model, base: Graph, k: int, time_limit: float, target: int, seed: int,
            pipelines: dict[str, Outcome] | None = None, search_limit: float | None = None,
            starts: Starts | None = None) -> tuple[Row, Plan | None, Graph]:
    """Every algorithm on `base` over k devices (`auto-1b` and `auto` with `search_limit`, or place's
    default time limit, each from its plan at the k before in `starts`, where it has one); also
    returns Pesto's plan and its placed graph."""
    cluster = model.cluster(k)
    text = str(base)
    fine = pesto_ir.parse(text)
    lb = lower_bound(fine, cluster)
    row = Row(model.name, model.source, model.description, len(fine.ops), k, cluster_summary(cluster), lb,
              _binding_term(fine, cluster, lb), lb, len(fine.ops),
              *free_comm_makespan(fine, cluster, seed))
    options = PlaceOptions(time_limit=time_limit, seed=seed, quiet=True)
    for algo in BASELINES:
        started = time.perf_counter()
        try:
            plan = place_graph(fine, cluster, algo, options)
            row.results[algo] = Outcome(plan.makespan, time.perf_counter() - started)
        except PestoError as e:
            row.results[algo] = Outcome(None, time.perf_counter() - started, error=failure_reason(e))
    row.results["dp"] = data_parallel_baseline(fine, cluster, options)
    row.results.update(pipelines if pipelines is not None else pipeline_baselines(fine, model, [k], options)[k])
    pesto_plan, pesto_graph = None, fine
    for algo in EXACT:
        settle_heap()
        graph = pesto_ir.parse(text)
        engine = "auto data-parallel=1 microbatches=1" if algo == ONE_BATCH else algo
        start = starts.before(algo, k) if starts is not None and algo in STARTED else None
        if start is not None:
            engine += f" start={start}"
        limit = time_limit if algo == "ilp" else search_limit
        started = time.perf_counter()
        try:
            graph, place_seconds, limit = coarsen_place_expand(graph, cluster, engine, limit, target, seed)
        except PestoError as e:
            row.results[algo] = Outcome(None, time.perf_counter() - started, error=failure_reason(e))
            continue
        seconds = time.perf_counter() - started
        plan = read_plan_attrs(graph)
        assert plan is not None, "expand records a plan"
        if starts is not None and algo in STARTED:
            starts.keep(algo, k, plan)
        row.results[algo] = Outcome(plan.makespan, seconds, winner_of(plan, algo), strategy=strategy_of(plan),
                                    place_seconds=place_seconds, time_limit=limit)
        if algo == ONE_BATCH:
            coarse, members = quotient_graph(graph, cluster)
            row.coarse_lower_bound, row.groups = lower_bound(coarse, cluster), len(members)
        if algo == PESTO:
            pesto_plan, pesto_graph = plan, graph
    row.findings = findings(row)
    return row, pesto_plan, pesto_graph


class Starts:
    """The plans `auto-1b` and `auto` found at each k of one model, as files: each k's search starts
    from its plan at the k before (`place{start=FILE}`), so more devices never give a slower plan."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ks: dict[str, list[int]] = {}

    def before(self, algo: str, k: int) -> Path | None:
        """The file of `algo`'s plan at the largest k below `k`, if any."""
        smaller = [j for j in self.ks.get(algo, []) if j < k]
        return self._path(algo, max(smaller)) if smaller else None

    def keep(self, algo: str, k: int, plan: Plan) -> None:
        write_atomic(self._path(algo, k), json.dumps(plan.to_json()))
        self.ks.setdefault(algo, []).append(k)

    def _path(self, algo: str, k: int) -> Path:
        return self.folder / f"{algo}-k{k}.json"


def settle_heap() -> None:
    """Collect what earlier rows left, then freeze the survivors out of the collector's sight.

    The time-limited search measures how fast it builds and screens, and plans from those rates.
    In a suite the process holds what earlier rows left (3.8 GB resident by the end of a full
    run), and each full collection rescans all of it: the suspected cause of rows that plan worse
    in the suite than alone (bert_l-12_training_op k=2: m=4, 1331 ms, after 5.1 s of a 22 s limit
    in the full run at 7432cf6; m=32, 1022 ms when run alone). Frozen objects are skipped; this
    call unfreezes them first, so what an earlier row dropped is still freed.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _binding_term(graph: Graph, cluster: Cluster, lb: float) -> str:
    """Which term of `lower_bound` binds."""
    fast = fastest_costs(graph, cluster)
    path, cut = transfer_aware_path(graph, cluster, fast), memory_cut_path(graph, cluster, fast)
    colocated = colocated_path(graph, fast)
    if colocated > max(path, cut) and colocated >= lb * (1 - TIE):
        return "colocated path"
    if cut > path and cut >= lb * (1 - TIE):
        return "memory-cut path"
    return "critical path" if path >= lb * (1 - TIE) else "total work"


def coarsen_place_expand(graph: Graph, cluster: Cluster, engine: str, limit: float | None, target: int,
                         seed: int) -> tuple[Graph, float, float]:
    """`coarsen{target},place{algo=engine time-limit=limit},expand` as `pesto-compile` runs it (no
    limit: place's default for the coarse graph); the placed graph, the seconds `place` took and
    its time limit."""
    ctx = PassContext(cluster=cluster, quiet=True, seed=seed)
    graph = PassManager(f"coarsen{{target={target}}}", verify_each=False).run(graph, ctx)
    if limit is None:
        groups = {op.get("group") for op in graph.ops if "group" in op.attrs}
        limit = default_time_limit(len(groups) if groups else len(graph.ops))
    started = time.perf_counter()
    graph = PassManager(f"place{{algo={engine} time-limit={limit:g} seed={seed}}}", verify_each=False).run(graph, ctx)
    seconds = time.perf_counter() - started
    return PassManager("expand", verify_each=False).run(graph, ctx), seconds, limit


def winner_of(plan: Plan, algo: str) -> str:
    """The engine that made the plan, and for a hybrid plan its strategy."""
    winner = str((plan.solver or {}).get("winner", algo))
    return f"{winner}, {strategy_of(plan)}" if plan.parallelism is not None else winner


def strategy_of(plan: Plan) -> str:
    """`d=2 m=4` (and the pipeline's stage count: the devices of a replica its ops use, and whether
    the optimizer state is sharded), or "" for a one-batch plan."""
    par = plan.parallelism
    if par is None:
        return ""
    used = {slot.device for slot in plan.ops.values()}
    stages = sum(1 for device in par.replicas[0] if device in used)
    return (f"d={par.data_parallel} m={par.microbatches}" + (f", {stages} stages" if stages > 1 else "")
            + (", state sharded" if par.optimizer_state == "sharded" else ""))


def data_parallel_baseline(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Outcome:
    """`dp`: every device a replica of the whole step (d = k), the gradients all-reduced in
    buckets, as jax.jit over a batch-sharded mesh runs it."""
    from pesto_ir.passes.rewrite.replicas import Strategy, bucketed, replica_graph, replica_groups, sub_cluster

    started = time.perf_counter()
    k = len(cluster)
    try:
        replica = replica_graph(graph, cluster, Strategy(k, 1))
        sub = sub_cluster(cluster, replica_groups(cluster, k)[0])
        plan = place_graph(replica, sub, "single", options)
        _, plan = bucketed(replica, cluster, plan, Strategy(k, 1))
    except PestoError as e:
        return Outcome(None, time.perf_counter() - started, error=failure_reason(e))
    return Outcome(plan.makespan, time.perf_counter() - started, strategy=strategy_of(plan))


PIPELINE_MICROBATCHES = (1, 2, 4, 8, 16, 32)
MAX_PIPELINE_OPS = 150_000  # a rewritten graph larger than this is not built (memory, minutes)


def pipeline_baselines(graph: Graph, model: Model, ks: list[int], options: PlaceOptions) -> dict[int, dict[str, Outcome]]:
    """`gpipe`, `1f1b` for each k: k contiguous stages balanced by cost, the fixed schedule, the
    best m in `PIPELINE_MICROBATCHES` that fits memory and divides the batch. Each rewritten
    graph is built once and scheduled for every k."""
    from pesto_ir.passes.placement.pipeline.schedules import PipelineGraph, pipeline_plan
    from pesto_ir.passes.rewrite.replicas import Strategy, as_hybrid, replica_graph

    best: dict[tuple[int, str], Outcome] = {}
    errors: dict[tuple[int, str], list[str]] = {}
    seconds: dict[tuple[int, str], float] = {}
    for m in PIPELINE_MICROBATCHES:
        if len(graph.ops) * m > MAX_PIPELINE_OPS:
            for k in ks:
                for schedule in ("gpipe", "1f1b"):
                    errors.setdefault((k, schedule), []).append(f"m={m}: over {MAX_PIPELINE_OPS} ops, not built")
            break
        started = time.perf_counter()
        try:
            replica = replica_graph(graph, model.cluster(ks[0]), Strategy(1, m))
        except PestoError as e:
            for k in ks:
                for schedule in ("gpipe", "1f1b"):
                    errors.setdefault((k, schedule), []).append(f"m={m}: {failure_reason(e)}")
            continue
        built = (time.perf_counter() - started) / (2 * len(ks))
        for k in ks:
            cluster = model.cluster(k)
            pipeline = PipelineGraph(replica, cluster)  # both schedules share its stages
            for schedule in ("gpipe", "1f1b"):
                key = (k, schedule)
                started = time.perf_counter()
                try:
                    plan = as_hybrid(replica, cluster, pipeline_plan(replica, cluster, schedule, options,
                                                                     pipeline=pipeline), Strategy(1, m))
                    if key not in best or plan.makespan < best[key].makespan:  # type: ignore[operator]
                        best[key] = Outcome(plan.makespan, 0.0, strategy=strategy_of(plan))
                except PestoError as e:
                    errors.setdefault(key, []).append(f"m={m}: {failure_reason(e)}")
                seconds[key] = seconds.get(key, 0.0) + built + time.perf_counter() - started
    out: dict[int, dict[str, Outcome]] = {k: {} for k in ks}
    for k in ks:
        for schedule in ("gpipe", "1f1b"):
            key = (k, schedule)
            found = best.get(key)
            if found is None:
                found = Outcome(None, 0.0, error="; ".join(errors.get(key, []))[:300])
            found.seconds = seconds.get(key, 0.0)
            out[k][schedule] = found
    return out


def free_comm_makespan(graph: Graph, cluster: Cluster, seed: int) -> tuple[float | None, float]:
    """The best of m-ETF and m-SCT on the same devices with instant links (None if neither fits),
    and the lower bound there."""
    instant = Cluster.fully_connected(cluster.devices, 0.0, 1e18)
    best = None
    for algo in ("m-etf", "m-sct"):
        try:
            m = place_graph(graph, instant, algo, PlaceOptions(seed=seed, quiet=True)).makespan
        except PestoError:
            continue
        best = m if best is None else min(best, m)
    return best, lower_bound(graph, instant)


def cluster_summary(cluster: Cluster) -> str:
    d = cluster.devices[0]
    link = next(iter(cluster.links.values()), None)
    wire = f", links {link.latency * 1e6:g} us + {link.bandwidth / 1e9:g} GB/s" if link else ""
    return f"{len(cluster)} x {d.kind} {d.memory / 2**30:g} GiB{wire}"


def failure_reason(e: PestoError) -> str:
    """The error's reason on one line (a failed pass's own message, not just its name)."""
    cause = getattr(e, "cause", None)
    return " ".join(str(cause if isinstance(cause, PestoError) else e).split())


# ---------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small subset (the CI smoke run)")
    ap.add_argument("--models", nargs="+", metavar="NAME", help="only these models (names as in the tables)")
    ap.add_argument("--k", nargs="+", type=int, metavar="K", help="device counts (default 2 4 8; quick: 2 4)")
    ap.add_argument("--time-limit", type=float, help="seconds per ilp/auto-1b/auto solve (default: 8 for ilp, "
                    "place's default for auto-1b and auto; quick: 2)")
    ap.add_argument("--target", type=int, default=200, help="coarsen's target group count (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for the .md and .json results")
    ap.add_argument("--readme", type=Path, help="put the results table into this README between its markers")
    ap.add_argument("--gantt", type=Path, help="write a Gantt chart of auto's plan for --gantt-row here")
    ap.add_argument("--gantt-row", default="gnmt_training_layer:4", metavar="MODEL:K",
                    help="the row whose plan --gantt draws (default gnmt_training_layer:4)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only the final table")
    ap.add_argument("--llm", action="store_true", help="run the LLM zoo instead (bench/llm_zoo.py: GPT at published "
                    "sizes and layouts; its own options: python -m bench --llm --help)")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                    help="run nothing: put together the results (.json) of runs of parts of the zoo made with the "
                         "same options (e.g. one per core), as one run would have written them; --gantt then names "
                         "the chart a part wrote")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if "--llm" in given:  # a part of its own, with its own options
        from bench import llm_zoo

        return llm_zoo.main([a for a in given if a != "--llm"])
    args = parse_args(argv)
    if args.merge:
        if args.readme:
            readme_parts(args.readme)
        rows, header = merged(args.merge, "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]))
        write_results(rows, header, args)
        return 0
    ks = args.k or ([2, 4] if args.quick else [2, 4, 8])
    time_limit = args.time_limit if args.time_limit is not None else (2.0 if args.quick else 8.0)
    search_limit = args.time_limit if args.time_limit is not None else (2.0 if args.quick else None)
    models = zoo(quick=args.quick)
    if args.models:
        known = {m.name: m for m in [*zoo(quick=False), *zoo(quick=True)]}
        unknown = [n for n in args.models if n not in known]
        if unknown:
            print(f"error: unknown model(s) {', '.join(unknown)} (known: {', '.join(known)})", file=sys.stderr)
            return 2
        models = [known[n] for n in args.models]
    if args.readme:
        readme_parts(args.readme)  # fail now, not after the whole suite
    gantt_model, _, gantt_k = args.gantt_row.partition(":")
    if args.gantt and (gantt_model not in {m.name for m in models} or gantt_k not in {str(k) for k in ks}):
        print(f"error: --gantt-row {args.gantt_row} is not among the rows this run makes", file=sys.stderr)
        return 2
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    rows: list[Row] = []
    for model in models:
        with tempfile.TemporaryDirectory(prefix="pesto-starts-") as folder:
            rows.extend(_model_rows(model, ks, time_limit, search_limit, Starts(Path(folder)), args, started))
    header = {"command": command.strip(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "quick": args.quick, "time_limit": time_limit, "search_time_limit": search_limit,
              "target": args.target, "seed": args.seed, "k": ks,
              "seconds": round(time.perf_counter() - started, 1),
              "environment": {"python": platform.python_version(), "machine": platform.machine(),
                              "cpus": os.cpu_count(), "pesto_ir": metadata.version("pesto-ir")}}
    write_results(rows, header, args)
    return 0


def _model_rows(model: Model, ks: list[int], time_limit: float, search_limit: float | None, starts: Starts,
                args: argparse.Namespace, started: float) -> list[Row]:
    """One model's rows, k ascending (each k's auto starts from its plan at the k before); the
    Gantt chart of the row `--gantt-row` names."""
    base = model.build()
    pipelines = pipeline_baselines(base, model, ks, PlaceOptions(seed=args.seed, quiet=True))
    gantt_model, _, gantt_k = args.gantt_row.partition(":")
    rows = []
    for k in sorted(ks):
        row, plan, graph = run_row(model, base, k, time_limit, args.target, args.seed, pipelines[k],
                                   search_limit, starts)
        rows.append(row)
        if not args.quiet:
            print(progress_line(row, time.perf_counter() - started), flush=True)
        if args.gantt and plan is not None and (model.name, str(k)) == (gantt_model, gantt_k):
            from pesto_ir.backends.gantt import gantt_for_path

            args.gantt.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(args.gantt, gantt_for_path(plan, graph, args.gantt))
    return rows


def write_results(rows: list[Row], header: dict[str, Any], args: argparse.Namespace) -> None:
    """The table as markdown and JSON in `args.out`, and in the README when asked; printed."""
    table = markdown(rows, header)
    stem = "quick" if header["quick"] else "suite"
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / f"{stem}.md", f"# Pesto IR benchmark results\n\n`{header['command']}`, "
                 f"{header['created']}, {header['seconds']:g} s\n\n{table}")
    write_atomic(args.out / f"{stem}.json", to_json(rows, header))
    if args.readme:
        image = os.path.relpath(args.gantt, args.readme.parent) if args.gantt else None
        update_readme(args.readme, table, image, header["command"], args.gantt_row if image else "")
    print(table)


SAME_OPTIONS = ("quick", "time_limit", "search_time_limit", "target", "seed", "k")  # what parts must share


def merged(paths: list[Path], command: str) -> tuple[list[Row], dict[str, Any]]:
    """The rows of the runs in `paths` (their `.json`), in the zoo's order, and a header saying
    how they were made: refuses parts made with other options, or that share a row."""
    parts = [read_results(p) for p in paths]
    first = parts[0][1]
    for path, (_, header) in zip(paths, parts):
        differ = [key for key in SAME_OPTIONS if header.get(key) != first.get(key)]
        if differ:
            raise SystemExit(f"error: {path}: made with other options than {paths[0]} ({', '.join(differ)})")
    rows = [row for part, _ in parts for row in part]
    seen: set[tuple[str, int]] = set()
    for row in rows:
        if (row.model, row.k) in seen:
            raise SystemExit(f"error: the row {row.model} k={row.k} is in more than one part")
        seen.add((row.model, row.k))
    order: dict[str, int] = {}
    for m in [*zoo(quick=False), *zoo(quick=True)]:  # the full zoo's order first
        order.setdefault(m.name, len(order))
    rows.sort(key=lambda r: (order.get(r.model, len(order)), r.k))
    runs = " and ".join(str(h["command"]) for _, h in parts)
    return rows, {**first, "command": f"{runs}, merged by {command}",
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "seconds": round(sum(float(h["seconds"]) for _, h in parts), 1)}


def read_results(path: Path) -> tuple[list[Row], dict[str, Any]]:
    """The rows and header of a run's `.json`."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SystemExit(f"error: {path}: not a {FORMAT} file")
    rows = [Row(**{**r, "results": {a: Outcome(**o) for a, o in r["results"].items()}}) for r in doc["rows"]]
    return rows, {k: v for k, v in doc.items() if k not in ("format", "rows")}


def progress_line(row: Row, elapsed: float) -> str:
    pesto, best = row.makespan(PESTO), row.best()
    gap = row.gap()
    return (f"[{elapsed:6.0f}s] {row.model} k={row.k}: {PESTO} {ms(pesto)} ms"
            + (f", best {best[0]} {ms(best[1])} ms" if best else "")
            + (f", gap {100 * gap:.1f}%" if gap is not None else "")
            + f", plan {row.results[PESTO].seconds:.1f} s")
