"""The one-batch plans of a suite run against the lower bound as the current code computes it.

The suite's table records each row's lower bound when it ran. When the bound gets tighter, the
plans stay what they were, so this recomputes the bound (`pesto_ir.schedule.bounds.lower_bound`, on the
fine graph and the row's cluster, as the suite does) for the rows of a `suite.json` and prints, per
row, the recorded and the current bound, the term that binds now, and `auto-1b` (Pesto's one-batch
plan) over each; then the geometric means per k, over the MSR graphs and over every row.

    python3 bench/bound_gap.py                                   # bench/results/suite.json
    python3 bench/bound_gap.py /tmp/benchA/suite.json --models bert_l-12_training_op
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pesto_ir  # noqa: E402
from bench.suite import _binding_term  # noqa: E402
from bench.suite_report import geomean  # noqa: E402
from bench.zoo import zoo  # noqa: E402
from pesto_ir.schedule.bounds import lower_bound  # noqa: E402

ONE_BATCH = "auto-1b"


def rows_with_bounds(rows: list[dict[str, Any]], models: set[str] | None) -> list[dict[str, Any]]:
    """Each row with a one-batch plan, with `now` (the current bound) and `term` (what binds)."""
    by_name = {m.name: m for m in zoo()}
    graphs: dict[str, pesto_ir.Graph] = {}
    out = []
    for row in rows:
        name = row["model"]
        plan = row["results"].get(ONE_BATCH, {}).get("makespan")
        if not plan or (models and name not in models) or name not in by_name:
            continue
        if name not in graphs:
            graphs[name] = pesto_ir.parse(str(by_name[name].build()))
        graph = graphs[name]
        cluster = by_name[name].cluster(row["k"])
        now = lower_bound(graph, cluster)
        out.append({**row, "now": now, "term": _binding_term(graph, cluster, now), "plan": plan})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python3 bench/bound_gap.py", description=__doc__.splitlines()[0])
    ap.add_argument("suite", nargs="?", default="bench/results/suite.json", type=Path)
    ap.add_argument("--models", nargs="+", help="only these models")
    args = ap.parse_args(argv)
    try:
        rows = json.loads(args.suite.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        ap.error(f"{args.suite}: not a suite.json ({e})")
    found = rows_with_bounds(rows, set(args.models) if args.models else None)
    if not found:
        ap.error("no row with a one-batch plan (auto-1b) among the models asked for")
    print(f"| model | k | LB then (ms) | LB now (ms) | binds now | {ONE_BATCH} / LB then | {ONE_BATCH} / LB now |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for r in found:
        print(f"| {r['model']} | {r['k']} | {r['lower_bound'] * 1e3:.4g} | {r['now'] * 1e3:.4g} | {r['term']} | "
              f"{r['plan'] / r['lower_bound']:.3f} | {r['plan'] / r['now']:.3f} |")
    print()
    for k in sorted({r["k"] for r in found}):
        for label, subset in (("MSR graphs", [r for r in found if r["k"] == k and r["source"] == "msr"]),
                              ("every row", [r for r in found if r["k"] == k])):
            if subset:
                then = geomean([r["plan"] / r["lower_bound"] for r in subset])
                now = geomean([r["plan"] / r["now"] for r in subset])
                print(f"k={k} {label} ({len(subset)} rows): geometric mean {ONE_BATCH} / LB {then:.4f} then, "
                      f"{now:.4f} now")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
