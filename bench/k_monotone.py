"""Issue 17's first check at any time limit: `auto` (one batch, and the hybrid search) against the
classic list schedulers, and against itself at fewer devices, on the MSR graphs.

For each model, k ascending, it runs `coarsen{target=200},place{algo=A time-limit=T start=...},expand`
for A = `auto data-parallel=1 microbatches=1` (`auto-1b`) and `auto`, each starting from its own
plan at the k before (as the suite does), and the fine-graph baselines `etf`, `heft`, `m-etf`,
`m-sct` and `single`. It prints one row per model and k, and every pair where `auto-1b` or `auto`
is slower than a baseline or than itself at a smaller k (none is the goal).

    python3 bench/k_monotone.py --time-limit 8                  # the 16 MSR graphs, k = 2, 4, 8
    python3 bench/k_monotone.py --time-limit 8 --models gnmt_training_layer --k 2,4
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pesto_ir  # noqa: E402
from bench.suite import Starts, coarsen_place_expand  # noqa: E402
from bench.zoo import Model, zoo  # noqa: E402
from pesto_ir.passes.place import place_graph  # noqa: E402
from pesto_ir.passes.placement.options import PlaceOptions  # noqa: E402
from pesto_ir.schedule.plan import read_plan_attrs  # noqa: E402

BASELINES = ("single", "m-etf", "m-sct", "etf", "heft")
SEARCHES = {"auto-1b": "auto data-parallel=1 microbatches=1", "auto": "auto"}


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be a number of seconds from 0 to 3600, not {text}")
    return value


def _ks(text: str) -> list[int]:
    try:
        ks = sorted({int(k) for k in text.split(",")})
    except ValueError:
        ks = []
    if not ks or any(not 1 <= k <= 64 for k in ks):
        raise argparse.ArgumentTypeError(f"must be device counts from 1 to 64 separated by commas, not {text}")
    return ks


def model_rows(model: Model, ks: list[int], limit: float, folder: Path) -> list[dict[str, float | None]]:
    """Every k of one model: the baselines' and the searches' step times (None: no plan)."""
    text = str(model.build())
    starts = Starts(folder)
    rows = []
    for k in ks:
        cluster = model.cluster(k)
        fine = pesto_ir.parse(text)
        row: dict[str, float | None] = {"k": k}
        for algo in BASELINES:
            try:
                row[algo] = place_graph(fine, cluster, algo, PlaceOptions(quiet=True)).makespan
            except pesto_ir.PestoError:
                row[algo] = None
        for name, engine in SEARCHES.items():
            start = starts.before(name, k)
            if start is not None:
                engine += f" start={start}"
            try:
                graph, _, _ = coarsen_place_expand(pesto_ir.parse(text), cluster, engine, limit, 200, 0)
            except pesto_ir.PestoError:
                row[name] = None
                continue
            plan = read_plan_attrs(graph)
            assert plan is not None
            row[name] = plan.makespan
            starts.keep(name, k, plan)
        rows.append(row)
    return rows


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.6g}"


def violations(name: str, rows: list[dict[str, float | None]]) -> list[str]:
    out = []
    for i, row in enumerate(rows):
        for search in SEARCHES:
            mine = row[search]
            if mine is None:
                continue
            for other in BASELINES:
                theirs = row[other]
                if theirs is not None and mine > theirs * (1 + 1e-9):
                    out.append(f"{name} k={row['k']}: {search} {mine * 1e3:.6g} ms > {other} {theirs * 1e3:.6g} ms")
            for before in rows[:i]:
                theirs = before[search]
                if theirs is not None and mine > theirs * (1 + 1e-12):
                    out.append(f"{name} k={row['k']}: {search} {mine * 1e3:.6g} ms > its {theirs * 1e3:.6g} ms "
                               f"at k={before['k']}")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python3 bench/k_monotone.py", description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=_seconds, default=8.0, help="seconds per search (default 8)")
    ap.add_argument("--k", type=_ks, default=[2, 4, 8], help="device counts, e.g. 2,4,8 (the default)")
    ap.add_argument("--models", nargs="+", help="MSR graphs (default: all 16)")
    args = ap.parse_args(argv)
    msr = {m.name: m for m in zoo() if m.source == "msr"}
    if not msr:
        ap.error("the MSR graphs are not here (graphs/msr)")
    unknown = [n for n in args.models or [] if n not in msr]
    if unknown:
        ap.error(f"unknown MSR graph(s) {', '.join(unknown)} (known: {', '.join(msr)})")
    names = args.models or list(msr)
    started = time.perf_counter()
    print(f"| model | k | {' | '.join(BASELINES)} | auto-1b | auto |")
    print("|---|---:|" + "---:|" * (len(BASELINES) + 2))
    found: list[str] = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="pesto-k-") as folder:
            rows = model_rows(msr[name], args.k, args.time_limit, Path(folder))
        for row in rows:
            cells = " | ".join(_ms(row[a]) for a in (*BASELINES, *SEARCHES))
            print(f"| {name} | {row['k']} | {cells} |", flush=True)
        found += violations(name, rows)
    print(f"\nT = {args.time_limit:g} s per search, {time.perf_counter() - started:.0f} s in all; "
          f"{len(found)} pair(s) where auto-1b or auto is slower than a baseline or than itself at fewer devices"
          + (":" if found else "."))
    for line in found:
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
