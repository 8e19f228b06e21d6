"""`pesto-compile`: load a model, run a pass pipeline, write the results.

Every user error is printed as `file:line:col: error: message` (with the source line and a
caret where there is one) and exits with status 1; outputs are rendered first and each is
written atomically, so a failed run leaves no half-written file.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pesto_ir.backends.gantt import gantt_for_path
from pesto_ir.backends.memory_plot import memory_plot_for_path
from pesto_ir.backends.reports import render_reports, require_plan
from pesto_ir.cluster.devices import KINDS
from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.model import MAX_DEVICES, Cluster, suggestion_problem
from pesto_ir.frontends import load
from pesto_ir.ir.attributes import parse_size
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.verifier import verify
from pesto_ir.passes.place import MAX_DEFAULT_TIME_LIMIT
from pesto_ir.passes.placement.options import time_limit_problem
from pesto_ir.passes.placement.registry import ALGORITHMS, DEFAULT_ALGO
from pesto_ir.passes.placement.search.strategies import parse_degree
from pesto_ir.passmanager import PassContext, PassManager, Pipeline
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import MAX_SEED, seed_problem, write_atomic
from pesto_ir.util.version import __version__

DEFAULT_PIPELINE = "annotate-costs,coarsen,place,expand,simulate"
DEFAULT_DEVICES = 2
DEFAULT_KIND = "h100"


def _emit_python(graph: Graph) -> str:
    from pesto_ir.backends.python_emit import emit_python  # start-up: JAX

    return emit_python(graph)


EMITTERS: dict[str, Callable[[Graph], str]] = {"pir": str, "python": _emit_python}


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive whole number")
    return n


def _positive_seconds(text: str) -> float:
    """A time limit: NaN, infinity, zero or less would make a solver hang or give up at once."""
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and t > 0):
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive, finite number of seconds")
    if (why := time_limit_problem(t)) is not None:
        raise argparse.ArgumentTypeError(why)
    return t


def _seed(text: str) -> int:
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if (why := seed_problem(seed)) is not None:
        raise argparse.ArgumentTypeError(why)
    return seed


def _degree(text: str) -> str:
    """--data-parallel / --microbatches: a whole number from 1, or auto."""
    try:
        parse_degree(text, "the value")
    except PestoError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="pesto-compile",
        description="Place and schedule a DNN graph across devices (Pesto IR).",
    )
    ap.add_argument("--version", action="version", version=f"pesto-compile {__version__}")
    ap.add_argument("model", help="a .pir model or a pesto-graph/1 .json cost graph")
    ap.add_argument("-p", "--pipeline", default=DEFAULT_PIPELINE,
                    help=f"pass pipeline (default: {DEFAULT_PIPELINE})")
    ap.add_argument("-o", "--output", metavar="OUT", help="write the result here ('-' for stdout)")
    ap.add_argument("--emit", choices=sorted(EMITTERS), default="pir",
                    help="what -o writes: the IR as .pir text, or a standalone Python/JAX module of the placed graph")
    target = ap.add_argument_group("target cluster")
    target.add_argument("--cluster", metavar="FILE", help="a pesto-cluster/1 JSON file")
    target.add_argument("--devices", type=_positive_int, metavar="N",
                        help=f"N identical devices, at most {MAX_DEVICES} (default: the graph's suggested cluster, "
                             f"else {DEFAULT_DEVICES})")
    target.add_argument("--devices-per-host", type=_positive_int, metavar="P",
                        help="split the --devices into nodes of P devices each (P divides N), linked by the kind's "
                             "network between nodes, InfiniBand for GPUs (default: all on one host)")
    target.add_argument("--device-kind", default=None, metavar="K", choices=sorted(KINDS),
                        help=f"built-in device kind for --devices (default: {DEFAULT_KIND})")
    target.add_argument("--memory", type=_size, metavar="BYTES",
                        help="memory of each device, overriding the kind's: bytes, e.g. 17179869184, 80e9 or 16GiB")
    place = ap.add_argument_group("placement")
    place.add_argument("--algo", metavar="NAME",
                       help=f"placement algorithm for the place pass: {', '.join(sorted(ALGORITHMS))} "
                            f"(default: {DEFAULT_ALGO})")
    place.add_argument("--time-limit", type=_positive_seconds, metavar="S",
                       help="time limit of exact solvers, in seconds (default: 2 s + 0.1 s per op or "
                            f"coarse group placed, at most {MAX_DEFAULT_TIME_LIMIT:g} s)")
    place.add_argument("--data-parallel", type=_degree, metavar="N|auto",
                       help="data-parallel replicas (each on batch/N, gradients all-reduced); auto searches "
                            "them (default: auto for --algo auto, else 1)")
    place.add_argument("--microbatches", type=_degree, metavar="N|auto",
                       help="micro-batches per replica, pipelined by the schedule; auto searches them "
                            "(default: auto for --algo auto, else 1)")
    place.add_argument("--tensor-parallel", type=_degree, metavar="N|auto",
                       help="tensor-parallel groups of N devices: each runs every op on its block of the "
                            "parameters the planner splits (Megatron's column- and row-parallel layers, "
                            "attention by heads), partial sums all-reduced; auto also tries every N dividing "
                            "the devices up to 8 (default: 1)")
    place.add_argument("--parameters", choices=("auto", "replicated", "sharded"),
                       help="with data-parallel replicas: each holds the whole parameters (replicated), or 1/N "
                            "of them and of the optimizer state, gathering each parameter before the ops that "
                            "read it (sharded: FSDP, ZeRO-3); auto shards them where sharding the optimizer "
                            "state alone does not fit (default: auto)")
    place.add_argument("--optimizer-state", choices=("auto", "replicated", "sharded"),
                       help="with data-parallel replicas: each holds the whole optimizer state (replicated), "
                            "or 1/N of it and updates that part (sharded, ZeRO-1); auto shards it where "
                            "replicas running one batch each do not fit with the whole state, and for "
                            "one-device replicas where that is faster (default: auto)")
    place.add_argument("--start", metavar="FILE",
                       help="a pesto-plan/1 plan of this model to start from (e.g. --plan-json's for fewer "
                            "devices); the plan returned is never slower than it")
    place.add_argument("--seed", type=_seed, default=0,
                       help=f"seed for every random choice, 0 to {MAX_SEED} (default 0)")
    out = ap.add_argument_group("reports")
    out.add_argument("--plan-json", metavar="FILE", help="write the plan as pesto-plan/1 JSON")
    out.add_argument("--trace", metavar="FILE", help="write a Chrome trace (open in Perfetto)")
    out.add_argument("--gantt", metavar="FILE", help="write a Gantt chart (.png, .svg or .pdf)")
    out.add_argument("--gantt-memory", action="store_true",
                     help="add a lane of live memory per device under the --gantt chart")
    out.add_argument("--memory-plot", metavar="FILE",
                     help="write live memory per device over the step (.png, .svg or .pdf)")
    ap.add_argument("--no-verify", action="store_true", help="do not verify the IR after each pass")
    ap.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    ap.add_argument("--time-passes", action="store_true", help="print how long each pass took (stderr)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress or summary output")
    return ap


def run(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.gantt_memory and not args.gantt:
        raise PestoError("--gantt-memory adds a lane to the Gantt chart: give --gantt FILE too")
    check_output_paths(args)
    pipeline = with_place_options(Pipeline.parse(args.pipeline, source="<pipeline>"), args)
    graph = load(args.model)
    verify(graph, context=f"{args.model}: the input is not valid IR")
    if args.output and args.emit == "python":  # a cost graph has nothing to emit: say so before placing it
        from pesto_ir.backends.python_emit import check_computable  # start-up: JAX

        check_computable(graph)
    ctx = PassContext(cluster=make_cluster(args, graph), quiet=args.quiet, seed=args.seed)
    manager = PassManager(pipeline, verify_each=not args.no_verify,
                          print_ir_after_all=args.print_ir_after_all, time_passes=args.time_passes,
                          out=sys.stderr)
    graph = manager.run(graph, ctx)
    write_outputs(graph, args, ctx.cluster)
    return 0


OUTPUT_FLAGS = ("output", "plan_json", "trace", "gantt", "memory_plot")


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, outputs that would overwrite an input or each other, or that
    could only fail at the end of a long run because their folder is missing."""
    inputs = {Path(p).resolve(): p for p in (args.model, args.cluster) if p}
    seen: dict[Path | str, str] = {}
    for flag in OUTPUT_FLAGS:
        path = getattr(args, flag)
        if not path:
            continue
        option = "-o" if flag == "output" else "--" + flag.replace("_", "-")
        key: Path | str = "-" if path == "-" else Path(path).resolve()
        if key in seen:
            where = "stdout" if key == "-" else f"'{path}'"
            raise PestoError(f"{seen[key]} and {option} both write to {where}: give each output its own path")
        seen[key] = option
        if not isinstance(key, Path):  # "-": stdout
            continue
        if key in inputs:
            raise PestoError(f"{option} '{path}' would overwrite the input '{inputs[key]}'")
        if key.is_dir():
            raise PestoError(f"{option} '{path}' is a folder, not a file")
        if path.endswith(("/", os.sep)):  # a folder meant, and Path() would drop the slash and write a file
            raise PestoError(f"{option} '{path}' ends in '{path[-1]}', as a folder does: name the file to write")
        if not key.parent.is_dir():
            raise PestoError(f"{option} '{path}': folder '{key.parent}' does not exist")
        _check_writable(option, path, key)


def _check_writable(option: str, path: str, key: Path) -> None:
    """Make and remove a file where the output will go (as `write_atomic` will): a folder that
    takes no new files fails now, not after the whole run."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{key.name}.", suffix=".tmp", dir=key.parent)
    except OSError as e:
        raise PestoError(f"{option} '{path}': cannot write in folder '{key.parent}': {e.strerror}") from None
    os.close(fd)
    os.unlink(tmp)


def with_place_options(pipeline: Pipeline, args: argparse.Namespace) -> Pipeline:
    """Apply --algo, --time-limit, --data-parallel, --microbatches, --tensor-parallel, --optimizer-state and --start to
    the pipeline's place passes (an error if it has none)."""
    changes = {k: v for k, v in (("algo", args.algo), ("time_limit", args.time_limit),
                                 ("data_parallel", args.data_parallel), ("microbatches", args.microbatches),
                                 ("optimizer_state", args.optimizer_state), ("start", args.start),
                                 ("tensor_parallel", args.tensor_parallel), ("parameters", args.parameters))
               if v is not None}
    if not changes:
        return pipeline
    if not any(p.name == "place" for p in pipeline.passes):
        flags = " and ".join(f"--{k.replace('_', '-')}" for k in changes)
        raise PestoError(f"{flags} {'needs' if len(changes) == 1 else 'need'} a place pass in the pipeline ({pipeline})")
    passes, explicit = [], []
    for p, keys in zip(pipeline.passes, pipeline.explicit):
        if p.name == "place":
            try:
                p = dataclasses.replace(p, **changes)
            except (TypeError, ValueError, PestoError) as e:
                raise PestoError(f"bad placement option: {e}") from None
            keys = tuple(dict.fromkeys(keys + tuple(k.replace("_", "-") for k in changes)))
        passes.append(p)
        explicit.append(keys)
    return Pipeline(passes, explicit)


def make_cluster(args: argparse.Namespace, graph: Graph) -> Cluster:
    """--cluster FILE, else N devices of one kind: N from --devices, the graph's suggestion, or 2; in
    nodes of --devices-per-host each."""
    if args.cluster:
        if args.devices or args.device_kind or args.devices_per_host:
            raise ClusterError("give either --cluster or --devices/--device-kind/--devices-per-host, not both")
        cluster = Cluster.load(args.cluster)
        return cluster.with_memory(args.memory) if args.memory is not None else cluster
    hint = _suggested_cluster(graph)
    n = args.devices or hint.get("devices", DEFAULT_DEVICES)
    memory = args.memory if args.memory is not None else hint.get("memory")
    per_host = args.devices_per_host
    if per_host is not None and n % per_host:
        raise ClusterError(f"--devices-per-host {per_host} does not divide the {n} devices into whole hosts")
    return Cluster.homogeneous(n, args.device_kind or DEFAULT_KIND, memory=memory, devices_per_host=per_host)


def _suggested_cluster(graph: Graph) -> dict[str, Any]:
    """The graph's `suggested_cluster` hint, checked as the JSON reader checks it
    (`suggestion_problem`): `.pir` text reaches here unchecked."""
    suggested = graph.attrs.get("suggested_cluster")
    if suggested is None:
        return {}
    hint = suggested.value
    if (why := suggestion_problem(hint)) is not None:
        raise PestoError(f"graph '{graph.name}': suggested_cluster{'' if why.startswith('must') else ':'} {why}")
    return {"devices": int(hint.get("devices", DEFAULT_DEVICES)),
            **({"memory": hint["memory"]} if "memory" in hint else {})}

def write_outputs(graph: Graph, args: argparse.Namespace, cluster: Cluster | None = None) -> None:
    """Render every requested output first, then write each atomically."""
    rendered: list[tuple[str, str | bytes]] = []
    if args.output:
        rendered.append((args.output, EMITTERS[args.emit](graph)))
    gantt = None if args.gantt_memory else args.gantt  # with a memory lane, drawn below
    rendered += render_reports(graph, plan_json=args.plan_json, trace=args.trace, gantt=gantt)
    rendered += render_memory_reports(graph, args, cluster)
    for path, data in rendered:
        if path == "-":
            sys.stdout.write(data if isinstance(data, str) else data.decode("utf-8", "replace"))
        else:
            write_atomic(path, data)


def render_memory_reports(graph: Graph, args: argparse.Namespace,
                          cluster: Cluster | None) -> list[tuple[str, bytes]]:
    """--memory-plot and the Gantt chart with its memory lane: they need the cluster's capacities,
    which the other reports do not."""
    if not args.memory_plot and not args.gantt_memory:
        return []
    plan = require_plan(graph)
    out: list[tuple[str, bytes]] = []
    if args.gantt_memory:
        out.append((args.gantt, gantt_for_path(plan, graph, args.gantt, memory=True, cluster=cluster)))
    if args.memory_plot:
        out.append((args.memory_plot, memory_plot_for_path(graph, plan, args.memory_plot, cluster)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(argv)
    except PestoError as e:
        print(e.format(), file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {e.filename or ''}: {e.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in Pesto, not in the input: say so plainly
        if os.environ.get("PESTO_TRACEBACK"):
            raise
        print(f"internal error: {type(e).__name__}: {e}\n"
              "(this is a bug in pesto-compile; rerun with PESTO_TRACEBACK=1 for details)", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
