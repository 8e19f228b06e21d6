"""`pesto-compile`: load a model, run a pass pipeline, write the results.

Every user error is printed as `file:line:col: error: message` (with the source line and a
caret where there is one) and exits with status 1; nothing is written unless it is whole.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph
from pesto_ir.loader import load, write_atomic
from pesto_ir.passmanager import PassContext, PassManager, Pipeline
from pesto_ir.verifier import verify

DEFAULT_PIPELINE = "verify"


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="pesto-compile",
        description="Place and schedule a DNN graph across devices (Pesto IR).",
    )
    ap.add_argument("model", help="a .pir model or a pesto-graph/1 .json cost graph")
    ap.add_argument("-p", "--pipeline", default=DEFAULT_PIPELINE,
                    help=f"pass pipeline, e.g. 'verify,...' (default: {DEFAULT_PIPELINE})")
    ap.add_argument("-o", "--output", metavar="OUT.pir", help="write the resulting IR here ('-' for stdout)")
    ap.add_argument("--no-verify", action="store_true", help="do not verify the IR after each pass")
    ap.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    ap.add_argument("--time-passes", action="store_true", help="print how long each pass took (stderr)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress or summary output")
    return ap


def run(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    pipeline = Pipeline.parse(args.pipeline, source="<pipeline>")
    graph = load(args.model)
    verify(graph, context=f"{args.model}: the input is not valid IR")
    ctx = PassContext(quiet=args.quiet)
    manager = PassManager(pipeline, verify_each=not args.no_verify,
                          print_ir_after_all=args.print_ir_after_all, time_passes=args.time_passes,
                          out=sys.stderr)
    graph = manager.run(graph, ctx)
    write_outputs(graph, args)
    return 0


def write_outputs(graph: Graph, args: argparse.Namespace) -> None:
    """Render every requested output first, then write each atomically."""
    rendered: list[tuple[str, str]] = []
    if args.output:
        rendered.append((args.output, str(graph)))
    for path, text in rendered:
        if path == "-":
            sys.stdout.write(text)
        else:
            write_atomic(path, text)


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
