"""Do two trees give the same plans? Write the plan of every deterministic placement algorithm on the
MSR graphs and the bundled examples, then compare two such folders byte for byte.

    python -m bench.same_plans write OUT_DIR [--k 4]      # in the tree to check
    python -m bench.same_plans compare BEFORE_DIR AFTER_DIR

A refactor that must change no plan writes a folder before and after (e.g. from a `git archive`
of each commit, run with `PYTHONPATH` set to it) and compares them. Each plan is `pesto-compile`'s
`--plan-json` of the default pipeline with `--algo NAME` on k devices of the default kind, beside
its exit status (an algorithm that gives no plan, out of memory say, exits 1 and writes none). The time-bounded engines (`ilp`, `cpsat`, `auto`, ...) are left out: their plans depend on
how much work fits in the time limit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pesto_ir.cli import main as compile_main

ROOT = Path(__file__).resolve().parent.parent
DETERMINISTIC = ("m-topo", "m-etf", "m-sct", "etf", "heft", "single", "expert", "random")


def models() -> list[Path]:
    return sorted((ROOT / "graphs" / "msr").glob("*.json")) + sorted((ROOT / "examples").glob("*.pir"))


def write(out: Path, k: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for model in models():
        for algo in DETERMINISTIC:
            name = f"{model.stem}.{algo}"
            plan = out / f"{name}.json"
            plan.unlink(missing_ok=True)
            status = compile_main([str(model), "--devices", str(k), "--algo", algo, "-q",
                                   "--plan-json", str(plan), "-o", "/dev/null"])
            (out / f"{name}.status").write_text(f"{status}\n")
            print(f"{model.name} {algo}: exit {status}", file=sys.stderr)
    return 0


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    differ = [n for n in names if not (before / n).is_file() or not (after / n).is_file()
              or (before / n).read_bytes() != (after / n).read_bytes()]
    for n in differ:
        print(f"differs: {n}")
    print(f"{len(names) - len(differ)} of {len(names)} files identical")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.same_plans", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write every deterministic algorithm's plan of every model")
    w.add_argument("out", type=Path)
    w.add_argument("--k", type=int, default=4, choices=range(1, 65), metavar="K", help="devices (default 4)")
    c = sub.add_parser("compare", help="compare two folders written by `write`")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.command == "write":
        return write(args.out, args.k)
    return compare(args.before, args.after)


if __name__ == "__main__":
    raise SystemExit(main())
