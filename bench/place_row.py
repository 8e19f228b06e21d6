"""One row of the suite for one algorithm: `coarsen{target=200},place{algo=...}` on a zoo model at
k devices with place's default time limit (or `--time-limit`), as `bench/suite.py` runs it,
printing the place pass's seconds, its limit and the plan's notes (the hybrid search's summary
last). For checking a row quickly; `--quick` takes the quick suite's models, `-v` shows progress.

    python3 bench/place_row.py jax_gpt 8 [auto | "auto data-parallel=1 microbatches=1"]
    python3 bench/place_row.py jax_lstm_seq2seq_quick 2 auto --quick --time-limit 1 -v
    python3 bench/place_row.py jax_gpt 4 "auto data-parallel=1 microbatches=1" --coarsen siblings=true
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pesto_ir  # noqa: E402
from bench.suite import default_time_limit, zoo  # noqa: E402
from pesto_ir.passmanager import PassContext, PassManager  # noqa: E402
from pesto_ir.schedule.plan import read_plan_attrs  # noqa: E402


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, not {text}")
    return value


def _devices(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of devices >= 1, not {text}")
    return value


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python3 bench/place_row.py", description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("k", type=_devices)
    ap.add_argument("algo", nargs="?", default="auto", help="place's options after algo= (default auto)")
    ap.add_argument("--time-limit", type=_seconds, help="seconds (default: place's default for the coarse graph)")
    ap.add_argument("--quick", action="store_true", help="the quick suite's models")
    ap.add_argument("--coarsen", default="", metavar="OPTIONS",
                    help="more coarsen options, e.g. 'siblings=true' (target=200 is always set)")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the passes' progress")
    args = ap.parse_args(argv)
    models = {m.name: m for m in zoo(quick=args.quick)}
    if args.model not in models:
        ap.error(f"unknown model {args.model} (known{' with --quick' if args.quick else ''}: {', '.join(models)})")
    model = models[args.model]
    if not args.algo.strip() or "time-limit" in args.algo or "seed" in args.algo:
        ap.error("algo: give the algorithm and its options (e.g. 'auto microbatches=1'); the time limit "
                 "is --time-limit, and the seed is 0")
    try:
        ctx = PassContext(cluster=model.cluster(args.k), quiet=not args.verbose, seed=0)
    except pesto_ir.PestoError as e:
        ap.error(f"k: {e}")
    try:
        coarsen = PassManager(f"coarsen{{target=200 {args.coarsen}}}".replace(" }", "}"), verify_each=False)
    except pesto_ir.PestoError as e:
        ap.error(f"--coarsen: {e}")
    try:
        PassManager(f"place{{algo={args.algo} seed=0}}", verify_each=False)  # bad options fail before the model is built
    except pesto_ir.PestoError as e:
        ap.error(f"algo: {e}")
    graph = coarsen.run(pesto_ir.parse(str(model.build())), ctx)
    groups = {op.get("group") for op in graph.ops if "group" in op.attrs}
    limit = args.time_limit or default_time_limit(len(groups) if groups else len(graph.ops))
    started = time.perf_counter()
    try:
        graph = PassManager(f"place{{algo={args.algo} time-limit={limit:g} seed=0}}", verify_each=False).run(graph, ctx)
    except pesto_ir.PestoError as e:
        print(f"{args.model} k={args.k} {args.algo}: no plan: {e}", file=sys.stderr)
        return 1
    plan = read_plan_attrs(graph)
    assert plan is not None
    print(f"{args.model} k={args.k} {args.algo}: place {time.perf_counter() - started:.2f} s (limit {limit:g} s), "
          f"makespan {plan.makespan * 1e3:.6g} ms")
    for note in plan.notes:
        print(f"  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
