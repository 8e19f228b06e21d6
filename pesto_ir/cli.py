"""`pesto-compile`: load a model, run a pass pipeline, write the results.

Every user error is printed as `file:line:col: error: message` (with the source line and a
caret where there is one) and exits with status 1; file arguments and outputs are checked before
any work, outputs are rendered first and written together, whole or not at all, so a failed or
interrupted run leaves no file behind. SIGTERM is taken as Ctrl-C is: the search keeps its best
plan, anything else stops cleanly.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from pesto_ir.backends.gantt import gantt_for_path
from pesto_ir.backends.memory_plot import memory_plot_for_path
from pesto_ir.backends.reports import render_reports, require_plan
from pesto_ir.cluster.devices import KINDS, kind_key
from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.model import MAX_DEVICES, Cluster, suggestion_problem
from pesto_ir.frontends import load
from pesto_ir.frontends.jax_script import script_path
from pesto_ir.ir.attributes import parse_size
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.verifier import verify
from pesto_ir.passes.place import MAX_DEFAULT_TIME_LIMIT
from pesto_ir.passes.placement.label import answer_line
from pesto_ir.passes.placement.options import time_limit_problem
from pesto_ir.passes.placement.registry import ALGORITHMS, DEFAULT_ALGO
from pesto_ir.passes.placement.search.strategies import parse_degree
from pesto_ir.passmanager import PassContext, PassManager, Pipeline
from pesto_ir.schedule.plan import read_plan_attrs
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import MAX_SEED, AtomicWrites, check_source_file, check_writable, seed_problem
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
    ap.add_argument("model", help="a .pir model, a pesto-graph/1 .json cost graph, or a JAX step as "
                                  "model.py:make_step (make_step() returns the step function and example arguments)")
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
    target.add_argument("--device-kind", default=None, metavar="K", choices=sorted(KINDS), type=kind_key,
                        help=f"built-in device kind for --devices (default: the graph's suggested kind, with its "
                             f"links, else {DEFAULT_KIND})")
    target.add_argument("--memory", type=_size, metavar="BYTES",
                        help="memory of each device, overriding the kind's: bytes, e.g. 17179869184, 80e9 or 16GiB")
    place = ap.add_argument_group("placement")
    place.add_argument("--algo", metavar="NAME",
                       help=f"placement algorithm for the place pass: {', '.join(sorted(ALGORITHMS))} "
                            f"(default: {DEFAULT_ALGO})")
    place.add_argument("--time-limit", type=_positive_seconds, metavar="S",
                       help="time limit of exact solvers, in seconds (default: 4 s + 0.2 s per op or "
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
    check_input_paths(args)
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
    if (plan := read_plan_attrs(graph)) is not None:  # the one answer, last: step time, bound, strategy
        ctx.progress(answer_line(plan))
    return 0


def check_input_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, file arguments that name no text file to read: missing, a folder,
    a FIFO or a device (a FIFO nobody writes hung the run, /dev/zero filled the memory), a symbolic
    link loop, or larger than such an input may be. The readers check again as they read; the
    start plan is read only by the place pass, after the passes before it."""
    check_source_file(script_path(args.model))
    if args.cluster:
        Cluster.check_file(args.cluster)
    if args.start:
        check_source_file(args.start)


OUTPUT_FLAGS = ("output", "plan_json", "trace", "gantt", "memory_plot")


def _option(flag: str) -> str:
    """The option as it is spelt on the command line: `-o`, `--plan-json`."""
    return "-o" if flag == "output" else "--" + flag.replace("_", "-")


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, outputs that would overwrite an input or each other, or that
    could only fail at the end of a long run: stdout closed, or a path that names no file to write."""
    inputs = {Path(os.path.realpath(p)): p for p in (script_path(args.model), args.cluster) if p}
    seen: dict[Path | str, str] = {}
    for flag in OUTPUT_FLAGS:
        path = getattr(args, flag)
        if not path:
            continue
        option = _option(flag)
        key: Path | str = "-" if path == "-" else Path(os.path.realpath(path))
        if key in seen:
            where = "stdout" if key == "-" else f"'{path}'"
            raise PestoError(f"{seen[key]} and {option} both write to {where}: give each output its own path")
        seen[key] = option
        if not isinstance(key, Path):  # "-": stdout
            _check_stdout(option)
            continue
        if key in inputs:
            raise PestoError(f"{option} '{path}' would overwrite the input '{inputs[key]}'")
        _check_output_file(option, path, key)


def _check_stdout(option: str) -> None:
    """`option -` needs a stdout: a command started with it closed has none."""
    if sys.stdout is None:
        raise PestoError(f"{option} - writes to stdout, which is closed")


def _check_output_file(option: str, path: str, key: Path) -> None:
    """One output path (`key`, its real path), as far as it can be checked before the run: not a
    symbolic link loop or a folder, in a folder that exists and takes new files."""
    named = f"{option} '{path}'"
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PestoError(f"{named} is a symbolic link loop") from None
    if key.is_dir():
        raise PestoError(f"{named} is a folder, not a file")
    if path.endswith(("/", os.sep)):  # a folder meant, and Path() would drop the slash and write a file
        raise PestoError(f"{named} ends in '{path[-1]}', as a folder does: name the file to write")
    folder = key.parent
    if not folder.is_dir():
        found = next(p for p in (folder, *folder.parents) if p.exists())  # the root does
        if not found.is_dir():
            raise PestoError(f"{named}: '{found}' is a file, not a folder")
        if os.path.islink(path):
            raise PestoError(f"{named} is a symbolic link to '{os.readlink(path)}', in folder '{folder}', "
                             "which does not exist")
        raise PestoError(f"{named}: folder '{folder}' does not exist")
    try:
        check_writable(path)
    except OSError as e:
        raise PestoError(f"{named}: cannot write in folder '{folder}': {e.strerror}") from None


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
    kind = args.device_kind or hint.get("kind") or DEFAULT_KIND
    # the suggested links go with the suggested kind (the MSR graphs: V100s, 10 us + 50 GB/s)
    links = hint.get("links", {}) if kind_key(kind) == hint.get("kind") else {}
    return Cluster.homogeneous(n, kind, memory=memory, devices_per_host=per_host, **links)


def _suggested_cluster(graph: Graph) -> dict[str, Any]:
    """The graph's `suggested_cluster` hint, checked as the JSON reader checks it
    (`suggestion_problem`): `.pir` text reaches here unchecked."""
    suggested = graph.attrs.get("suggested_cluster")
    if suggested is None:
        return {}
    hint = suggested.value
    if (why := suggestion_problem(hint)) is not None:
        raise PestoError(f"graph '{graph.name}': suggested_cluster{'' if why.startswith('must') else ':'} {why}")
    out: dict[str, Any] = {"devices": int(hint.get("devices", DEFAULT_DEVICES)),
                           **({"memory": hint["memory"]} if "memory" in hint else {})}
    kind = hint.get("kind")
    if kind is not None:  # the kind its costs were measured on, and its links
        if not isinstance(kind, str) or kind_key(kind) not in KINDS:
            raise PestoError(f"graph '{graph.name}': suggested_cluster: kind must be a built-in device kind "
                             f"({', '.join(KINDS)}), got {kind!r}"[:300])
        out["kind"] = kind_key(kind)
        links = {key: hint[key] for key in ("latency", "bandwidth") if key in hint}
        for key, value in links.items():
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            if number is None or not math.isfinite(number) or number < 0 or (key == "bandwidth" and number == 0):
                raise PestoError(f"graph '{graph.name}': suggested_cluster: {key} must be a "
                                 f"{'positive' if key == 'bandwidth' else 'non-negative'} number, got {value!r}"[:300])
        out["links"] = {key: float(value) for key, value in links.items()}
    return out

def write_outputs(graph: Graph, args: argparse.Namespace, cluster: Cluster | None = None) -> None:
    """Render every requested output first, then write them whole or not at all: the files are
    staged beside their paths, stdout gets its output, and only then are the files put in place,
    so that a full or closed stdout, a failed write or an interrupt leaves no file behind."""
    rendered: list[tuple[str, str | bytes]] = []
    if args.output:
        rendered.append((args.output, EMITTERS[args.emit](graph)))
    gantt = None if args.gantt_memory else args.gantt  # with a memory lane, drawn below
    rendered += render_reports(graph, plan_json=args.plan_json, trace=args.trace, gantt=gantt)
    rendered += render_memory_reports(graph, args, cluster)
    with AtomicWrites() as files:
        for path, data in rendered:
            if path != "-":
                files.stage(path, data)
        for path, data in rendered:
            if path == "-":
                write_stdout(next(_option(f) for f in OUTPUT_FLAGS if getattr(args, f) == "-"), data)
        files.commit()


def write_stdout(option: str, data: str | bytes) -> None:
    """`option`'s output on stdout, flushed now: a closed or full stdout is an error naming the
    option, not a traceback, nor a second failure when Python flushes stdout at exit."""
    _check_stdout(option)
    try:
        sys.stdout.write(data if isinstance(data, str) else data.decode("utf-8", "replace"))
        sys.stdout.flush()
    except OSError as e:
        _drop_stdout()
        why = "it is closed (broken pipe)" if e.errno == errno.EPIPE else e.strerror
        raise PestoError(f"{option} -: cannot write to stdout: {why}") from None


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what it failed to take stays in its buffer, and flushing that
    again at exit would fail again."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (a test's capture)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


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
    with sigterm_as_ctrl_c() as terminated:
        try:
            return run(argv)
        except PestoError as e:
            print(e.format(), file=sys.stderr)
            return 1
        except OSError as e:
            print(f"error: {f'{e.filename}: ' if e.filename else ''}{e.strerror}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("terminated (SIGTERM)" if terminated else "interrupted", file=sys.stderr)
            return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
        except Exception as e:  # a bug in Pesto, not in the input: say so plainly
            if os.environ.get("PESTO_TRACEBACK"):
                raise
            print(f"internal error: {type(e).__name__}: {e}\n"
                  "(this is a bug in pesto-compile; rerun with PESTO_TRACEBACK=1 for details)", file=sys.stderr)
            return 70


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[list[int]]:
    """While the block runs, SIGTERM is taken as Ctrl-C is, as a KeyboardInterrupt: the search
    keeps its best plan and the run goes on with it (the place pass), anything else stops, and
    the temporary files of outputs are removed on the way out. Yields the list of SIGTERMs
    received, for the exit status. Outside the main thread, where Python sets no handler,
    SIGTERM keeps its default."""
    received: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield received
        return
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
