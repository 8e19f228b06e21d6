"""`python -m bench --llm`: GPT models at the sizes people train, on the clusters they were published on,
planned by Pesto IR next to the published layout built as a fixed plan on the same costs.

Each row (`bench/llm_rows.py`: Alpa's GPT weak-scaling suite on p3.16xlarge V100s, Megatron-Core's
H100 table) lowers one mixed-precision training step (`bench/llm_models.py`: bf16 compute, f32
master weights and Adam) and costs it with the roofline model of the row's devices, then:

- **Pesto**: `coarsen,place{algo=auto time-limit=T tensor-parallel=auto},expand` (`--place` to
  change the options): the search over data-parallel replicas x tensor-parallel ranks x
  micro-batches x placement, on the row's cluster, its plan fitting in the devices' memory;
- **published**: the published (DP, TP, PP) with the simulated micro-batches as a fixed plan: the
  micro-batch and tensor-parallel rewrites of the step (`passes/rewrite/replicas.py`; TP's ranks
  split as Megatron splits them, column- then row-parallel pairs, a vocabulary-parallel
  embedding and output layer, and on Megatron's rows sequence parallelism; on Alpa's rows, whose shardings Alpa's intra-op search chooses, also as the layout
  search at that degree splits them, whichever plan is faster, named in the table), PP contiguous
  stages balanced by cost on replica 0's rank-0 devices under the 1F1B schedule (one device:
  its micro-batches one after another; one micro-batch: the one device runs the step), gradient
  all-reduces bucketed; the optimizer state sharded across replicas where there are several
  (ZeRO-1, as Megatron's distributed optimizer and Alpa's reduce-scatter do; with tensor
  parallelism, each rank's blocks across the replicas holding that rank). Where the
  layout does not fit in the devices' memory it is built again with unbounded memory, and its
  step time is shown with its peak (neither system's activation recomputation nor fused
  attention is modelled: the step keeps every activation, the s x s attention scores included).

- **searched layout** (Megatron's rows with TP > 1): the published DP x TP x PP with the layout
  search's split at that TP instead of Megatron's pairs (`time_limit / 4` of counted work for
  the one degree): not a published plan, but what Pesto's own search at the published degrees
  finds, against which `auto`'s shorter search of every degree is measured.

Columns: Pesto's step time and MFU, the published layout's step time and MFU, the searched layout's
step time, the lower bound (the
step's total work, every op at its roofline cost over the whole simulated batch, spread over the
k devices: no strategy computing the same ops is faster; collectives and micro-batches only add),
plan time (wall seconds of coarsen, place and expand), the largest peak memory of any device in
Pesto's plan, and whether it fits.

MFU (model FLOPs utilisation) = model FLOPs per step / (step time x devices x peak FLOP/s of the
kind, `pesto_ir/cluster/devices.py`: dense bf16 tensor-core peak), model FLOPs per step = tokens x
(6 N + 12 L d s) (PaLM's, Chowdhery et al. 2022, appendix B: N parameters, L layers, width d,
sequence s; the second term is attention's score and value matmuls, forward and backward, causal
masking not discounted).

    python -m bench --llm                          # every row (hours on 2 cores: the big ones plan for minutes)
    python -m bench --llm --rows alpa-gpt-350M megatron-gpt-1.7B --time-limit 120
    python -m bench --llm --quick                  # tiny configs of every row, seconds (the tests run it)

Results go to `bench/results/llm.{md,json}` (`llm-quick` for `--quick`; `--out` to change the folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.llm_models import describe, lower_gpt, parameter_count
from bench.llm_rows import ROWS, Layout, LlmRow, rows
from bench.zoo_jax_models import GptConfig
from pesto_ir.cluster.devices import kind_named
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.options import PlaceOptions, time_limit_problem
from pesto_ir.passes.rewrite.tensor_shard import TensorLayout
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.bounds import fastest_costs
from pesto_ir.schedule.plan import Plan, read_plan_attrs
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import write_atomic

FORMAT = "pesto-bench-llm/1"
RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_PLACE = "algo=auto tensor-parallel=auto"
DEFAULT_TIME_LIMIT = 60.0
QUICK_TIME_LIMIT = 1.0
REASON_CHARS = 160  # a reason shown in a table cell is cut to this


# ---------------------------------------------------------------- model FLOPs and MFU

def model_flops(c: GptConfig, tied: bool = True) -> float:
    """Model FLOPs of one training step of `c` (forward and backward, no recomputation): tokens x
    (6 N + 12 L d s), N the parameters (`parameter_count`)."""
    tokens = c.batch * c.seq
    return tokens * (6 * parameter_count(c, tied) + 12 * c.layers * c.d_model * c.seq)


def mfu(flops: float, step: float | None, devices: int, peak: float) -> float | None:
    """Model FLOPs utilisation of a step of `flops` taking `step` seconds on `devices` of `peak` FLOP/s."""
    if step is None or step <= 0:
        return None
    return flops / (step * devices * peak)


# ---------------------------------------------------------------- one row

@dataclass
class Result:
    """A plan's step time and what it holds, or why there is none."""

    step: float | None = None
    mfu: float | None = None
    peak_memory: int | None = None  # bytes, the largest over the devices
    fits: bool | None = None
    seconds: float = 0.0  # wall seconds to make the plan
    strategy: str = ""
    error: str = ""


@dataclass
class RowResult:
    name: str
    suite: str
    description: str
    devices: int
    cluster: str
    params: int
    ops: int
    published: str  # the published layout
    simulated: str  # the layout built as the fixed plan
    batch: str  # the simulated batch, against the published one
    source: str
    model_flops: float
    lower_bound: float
    layout_note: str = ""
    published_mfu: str = ""
    lower_seconds: float = 0.0
    pesto: Result = field(default_factory=Result)
    fixed: Result = field(default_factory=Result)
    searched: Result | None = None  # the published degrees with the searched layout, where not published itself


def reason(e: BaseException) -> str:
    """The first line of an error, shortened for a table cell."""
    cause = getattr(e, "cause", None)
    text = str(cause if isinstance(cause, PestoError) else e).strip().splitlines()
    first = " ".join(text[0].split()) if text else type(e).__name__
    return first if len(first) <= REASON_CHARS else first[:REASON_CHARS - 3] + "..."


def work_bound(graph: Graph, cluster: Cluster) -> float:
    """The step's total work (each op at its fastest cost) over the devices."""
    return sum(fastest_costs(graph, cluster).values()) / len(cluster)


def strategy_text(plan: Plan) -> str:
    """`d=2 t=4 m=8, 2 stages, state sharded`, or `one batch` (the devices of the replica's rank-0
    group that the plan uses are its pipeline stages)."""
    par = plan.parallelism
    used = {slot.device for slot in plan.ops.values()}
    if par is None:
        return "one batch" + (f", {len(used)} devices" if len(used) > 1 else "")
    stages = sum(1 for device in par.replicas[0] if device in used)
    return (f"d={par.data_parallel} t={par.tensor_parallel} m={par.microbatches}"
            + (f", {stages} stages" if stages > 1 else "")
            + (", params sharded" if par.parameters == "sharded" else
               ", state sharded" if par.optimizer_state == "sharded" else ""))


def _measured(plan: Plan, cluster: Cluster, flops: float, seconds: float, peak: float) -> Result:
    most = max(plan.peak_memory.values()) if plan.peak_memory else None
    capacity = min(d.memory for d in cluster.devices)
    return Result(plan.makespan, mfu(flops, plan.makespan, len(cluster), peak), most,
                  None if most is None else most <= capacity, seconds, strategy_text(plan))


def pesto_plan(graph: Graph, cluster: Cluster, place: str, time_limit: float) -> tuple[Plan, float]:
    """Pesto's plan of the costed `graph` (left as it is) and the wall seconds it took."""
    ctx = PassContext(cluster=cluster, quiet=True, seed=0)
    started = time.perf_counter()
    out = PassManager(f"coarsen,place{{{place} time-limit={time_limit:g} seed=0}},expand", verify_each=False) \
        .run(graph.clone(), ctx)
    plan = read_plan_attrs(out)
    assert plan is not None, "expand records a plan"
    return plan, time.perf_counter() - started


def tensor_layouts(graph: Graph, cluster: Cluster, tp: int, seconds_for_search: float, suite: str
                   ) -> dict[str, TensorLayout]:
    """The layouts a published TP degree is built with on `suite`'s rows, by name: those
    `PUBLISHED_LAYOUTS` names (Megatron's pairs as they are, `pairs_layout`: column- then
    row-parallel, vocabulary-parallel embedding and head; with sequence parallelism on Megatron's
    rows) and the layout search at that degree for `seconds_for_search` of counted work
    (`pesto_ir.util.work`)."""
    from pesto_ir.passes.sharding.choose import pairs_layout, tensor_layout
    from pesto_ir.util import work

    if tp == 1:
        return {"": TensorLayout(1)}
    searched = tensor_layout(graph, cluster, tp, None, fixed=True, until=work.now() + seconds_for_search).layout
    pairs = pairs_layout(graph, tp)
    named = {"Megatron's pairs": pairs, "Megatron's pairs, SP": dataclasses.replace(pairs, sequence_parallel=True),
             "searched": searched}
    return {name: named[name] for name in (*PUBLISHED_LAYOUTS[suite], "searched")}


def fixed_plan(graph: Graph, cluster: Cluster, layout: Layout, tensor: TensorLayout) -> Plan:
    """The fixed plan of `layout` (see the module's docstring), its ranks split by `tensor`
    (`tensor_layouts`); the validator's PlanError where it does not fit in memory, a PestoError
    where the planner cannot build it."""
    from pesto_ir.passes.place import place_graph
    from pesto_ir.passes.placement.pipeline.schedules import pipeline_plan
    from pesto_ir.passes.rewrite.replicas import Strategy, bucketed, placed_devices, replica_graph, sub_cluster

    if layout.devices != len(cluster):
        raise PestoError(f"{layout} needs {layout.devices} devices, the cluster has {len(cluster)}")
    state = "sharded" if layout.dp > 1 else "replicated"
    strategy = Strategy(layout.dp, layout.microbatches, state, tensor=tensor)
    replica = replica_graph(graph, cluster, strategy)
    sub = sub_cluster(cluster, placed_devices(cluster, strategy))
    options = PlaceOptions(quiet=True)
    if layout.microbatches == 1 and len(sub) == 1:
        plan = place_graph(replica, sub, "single", options)
    else:
        plan = pipeline_plan(replica, sub, "1f1b", options)
    return bucketed(replica, cluster, plan, strategy)[1]


PUBLISHED_LAYOUTS = {"alpa": ("Megatron's pairs", "searched"), "megatron": ("Megatron's pairs, SP",)}
# which of `tensor_layouts` stand for the published split: Megatron's is its pairs with sequence
# parallelism (Megatron-Core's `--sequence-parallel`, which its tensor-parallel recipes turn on);
# Alpa's is its intra-op search's, stood for by the layout search at that degree or the pairs
# (Alpa has no sequence parallelism of its own), whichever is faster


def _fixed(graph: Graph, row: LlmRow, cluster: Cluster, flops: float, peak: float, layout_seconds: float
           ) -> tuple[Result, Result | None]:
    """The published layout's plan, the fastest of its tensor-parallel layouts (`tensor_layouts`,
    those `PUBLISHED_LAYOUTS` names for the row's suite) that fit, else of those that do not (named
    in `Result.strategy`); and the searched layout's where it is not one of those (else None)."""
    started = time.perf_counter()
    try:
        layouts = tensor_layouts(graph, cluster, row.simulated.tp, layout_seconds, row.suite)
    except PestoError as e:
        return Result(seconds=time.perf_counter() - started, error=reason(e)), None
    built, searched = [], None
    for name, tensor in layouts.items():
        published = not name or name in PUBLISHED_LAYOUTS[row.suite]
        result = _fixed_with(graph, row, cluster, flops, peak, tensor)
        result.strategy = name
        if published:
            built.append(result)
        else:
            searched = result
    best = min(built, key=lambda r: (r.step is None, bool(r.error), r.step or 0.0))
    best.seconds = time.perf_counter() - started
    return best, searched


def _fixed_with(graph: Graph, row: LlmRow, cluster: Cluster, flops: float, peak: float, tensor: TensorLayout) -> Result:
    """The published layout's plan with its ranks split by `tensor`; with unbounded memory where
    it does not fit (its peak shows by how much)."""
    from pesto_ir.schedule.simulate import PlanError

    started = time.perf_counter()
    try:
        plan = fixed_plan(graph, cluster, row.simulated, tensor)
    except PlanError as e:
        if "memory" not in str(e):
            return Result(seconds=time.perf_counter() - started, error=reason(e))
        unbounded = row.machine.cluster(row.devices, memory=math.inf)
        try:
            plan = fixed_plan(graph, unbounded, row.simulated, tensor)
        except PestoError as e2:
            return Result(seconds=time.perf_counter() - started, error=reason(e2))
        out = _measured(plan, cluster, flops, time.perf_counter() - started, peak)
        capacity = min(d.memory for d in cluster.devices)
        out.error = f"does not fit: peak {gib(out.peak_memory)} GiB > {gib(int(capacity))} GiB"
        return out
    except PestoError as e:
        return Result(seconds=time.perf_counter() - started, error=reason(e))
    except Exception as e:  # noqa: BLE001 - a planner bug: the row says so
        return Result(seconds=time.perf_counter() - started, error=f"internal error: {type(e).__name__}: {reason(e)}")
    return _measured(plan, cluster, flops, time.perf_counter() - started, peak)


def lowered_row(row: LlmRow, cluster: Cluster) -> Graph:
    """The row's training step, lowered and costed on `cluster` (the row's devices)."""
    graph = lower_gpt(row.model, "bf16", row.name.replace("-", "_").replace(".", "_"), row.tied, row.remat)
    return PassManager("annotate-costs{model=roofline}", verify_each=False).run(
        graph, PassContext(cluster=cluster, quiet=True))


def run_row(row: LlmRow, place: str = DEFAULT_PLACE, time_limit: float = DEFAULT_TIME_LIMIT,
            log: Any = None) -> RowResult:
    """Lower and cost the row's step, plan it with Pesto and build its published layout."""
    def say(text: str) -> None:
        if log is not None:
            print(f"  {row.name}: {text}", file=log, flush=True)

    cluster = row.machine.cluster(row.devices)
    kind = kind_named(row.machine.kind)
    started = time.perf_counter()
    graph = lowered_row(row, cluster)
    lowered = time.perf_counter() - started
    flops = model_flops(row.model, row.tied)
    out = RowResult(row.name, row.suite, describe(row.model, "bf16", row.tied, row.remat), row.devices, row.machine.name,
                    parameter_count(row.model, row.tied), len(graph.ops), str(row.published), str(row.simulated),
                    row.batch_note(), row.source, flops, work_bound(graph, cluster), row.layout_note,
                    row.published_mfu, lowered)
    say(f"{len(graph.ops)} ops lowered and costed in {lowered:.1f} s; planning (time limit {time_limit:g} s)")
    try:
        plan, seconds = pesto_plan(graph, cluster, place, time_limit)
        out.pesto = _measured(plan, cluster, flops, seconds, kind.peak_flops)
    except PestoError as e:
        out.pesto = Result(seconds=time.perf_counter() - started - lowered, error=reason(e))
    except Exception as e:  # noqa: BLE001 - a planner bug: the row says so, the other rows still run
        if log is not None:
            traceback.print_exc(file=log)
        out.pesto = Result(seconds=time.perf_counter() - started - lowered,
                           error=f"internal error: {type(e).__name__}: {reason(e)}")
    say(f"Pesto: {ms(out.pesto.step)} ms ({out.pesto.strategy or out.pesto.error}) in {out.pesto.seconds:.1f} s; "
        f"building the published layout {row.simulated}")
    out.fixed, out.searched = _fixed(graph, row, cluster, flops, kind.peak_flops, time_limit / 4)
    say(f"published: {ms(out.fixed.step)} ms{' (' + out.fixed.error + ')' if out.fixed.error else ''} "
        f"in {out.fixed.seconds:.1f} s" + (f"; searched layout: {_step_cell(out.searched)}" if out.searched else ""))
    return out


# ---------------------------------------------------------------- reports

COLUMNS = ("model", "devices", "published layout", "simulated batch", "Pesto step ms", "Pesto MFU",
           "Pesto strategy", "published step ms", "published MFU (sim.)", "published MFU (paper)",
           "searched layout ms", "LB ms", "plan s", "peak GiB", "fits")


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.4g}"


def percent(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**30:.3g}"


def _step_cell(f: Result, named: bool = True) -> str:
    """A fixed plan's step time, with its layout's name where `named`, or why it does not fit or
    was not built."""
    layout = f" ({f.strategy})" if f.strategy and named else ""
    return ms(f.step) + layout if f.step is not None and not f.error else \
        f"{ms(f.step)} ({f.error})" if f.step is not None else f"not built: {f.error}"


def cells(r: RowResult) -> list[str]:
    p, f = r.pesto, r.fixed
    pesto_step = ms(p.step) if p.step is not None else f"no plan: {p.error}"
    searched = "—" if r.searched is None else _step_cell(r.searched, named=False)
    fits = "—" if p.fits is None else "yes" if p.fits else "no"
    return [r.name, str(r.devices), r.published, r.batch.split(" (")[0].replace("simulated global batch ", "").replace("global batch ", ""),
            pesto_step, percent(p.mfu), p.strategy or "—", _step_cell(f), percent(f.mfu), r.published_mfu or "—",
            searched, ms(r.lower_bound), f"{p.seconds:.1f}", gib(p.peak_memory), fits]


def markdown(results: list[RowResult], header: dict[str, Any]) -> str:
    lines = [f"Simulated step times (roofline costs of the row's devices) of one mixed-precision training step "
             f"(bf16 compute, f32 master weights and Adam). Pesto: `coarsen,place{{{header['place']} "
             f"time-limit={header['time_limit']:g}}},expand`; published: the published DP x TP x PP as a fixed "
             "plan (1F1B over contiguous stages) with the simulated micro-batches; searched layout (Megatron's "
             "rows): the same degrees with the layout search's split at that TP in place of Megatron's pairs. MFU = tokens x (6 N + 12 L d s) "
             "/ (step x devices x peak bf16 FLOP/s). LB: the step's total work over the devices. plan s: "
             "Pesto's coarsen, place and expand; peak GiB: the largest device peak of Pesto's plan.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells(r)) + " |" for r in results]
    lines += ["", "Rows:", ""]
    for r in results:
        extra = f" {r.layout_note}." if r.layout_note else ""
        lines.append(f"- **{r.name}**: {r.description}; {r.params / 1e9:.3g}B parameters, {r.ops} ops, "
                     f"{r.model_flops / 1e12:.4g} TFLOP per step; {r.cluster}, {r.devices} devices; published "
                     f"{r.published}, built {r.simulated}; {r.batch}.{extra} Source: {r.source}.")
    return "\n".join(lines) + "\n"


def to_json(results: list[RowResult], header: dict[str, Any]) -> str:
    return json.dumps({"format": FORMAT, **header, "rows": [asdict(r) for r in results]}, indent=1) + "\n"


# ---------------------------------------------------------------- main

def _seconds(text: str) -> float:
    """A per-row time limit, checked as place checks its own."""
    try:
        value: object = float(text)
    except ValueError:
        value = text
    why = time_limit_problem(value)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return float(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench --llm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny configs of every row (d 64, a few layers, "
                    "degrees at most 2): seconds")
    ap.add_argument("--rows", nargs="+", metavar="NAME", help="only these rows (names as in the table; "
                    "with --quick, without the -quick suffix)")
    ap.add_argument("--time-limit", type=_seconds, help=f"Pesto's place time limit per row in seconds (default "
                    f"{DEFAULT_TIME_LIMIT:g}; quick: {QUICK_TIME_LIMIT:g})")
    ap.add_argument("--place", default=DEFAULT_PLACE, help=f"Pesto's place options (default '{DEFAULT_PLACE}')")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for the .md and .json results")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only the final table")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "time-limit" in args.place or "seed" in args.place:
        print("error: --place takes place's options without time-limit and seed (--time-limit sets the limit)",
              file=sys.stderr)
        return 2
    todo = rows(args.quick)
    if args.rows:
        known = {r.name for r in ROWS}
        unknown = [n for n in args.rows if n not in known]
        if unknown:
            print(f"error: unknown row(s) {', '.join(unknown)} (rows: {', '.join(sorted(known))})", file=sys.stderr)
            return 2
        todo = [r for r in todo if r.name.removesuffix("-quick") in args.rows]
    limit = args.time_limit or (QUICK_TIME_LIMIT if args.quick else DEFAULT_TIME_LIMIT)
    command = "python -m bench --llm " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    results = []
    for row in todo:
        result = run_row(row, args.place, limit, None if args.quiet else sys.stderr)
        results.append(result)
        if not args.quiet:
            print(f"[{time.perf_counter() - started:6.0f}s] " + " | ".join(cells(result)), flush=True)
    header = {"command": command.strip(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "quick": args.quick, "place": args.place, "time_limit": limit,
              "seconds": round(time.perf_counter() - started, 1),
              "environment": {"python": platform.python_version(), "machine": platform.machine(),
                              "cpus": os.cpu_count()}}
    table = markdown(results, header)
    stem = "llm-quick" if args.quick else "llm"
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / f"{stem}.md", f"# Pesto IR LLM zoo\n\n`{header['command']}`, {header['created']}, "
                 f"{header['seconds']:g} s\n\n{table}")
    write_atomic(args.out / f"{stem}.json", to_json(results, header))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
