"""Does the same input give the same plan on a quiet and on a busy machine? (issue 42)

    python3 -m bench.determinism [--cases NAME ...] [--runs 3] [--out bench/results/determinism.md]

Each case is planned `--runs` times, each in a fresh process, and the plan JSON (`pesto-plan/1`, as
`--plan-json` writes it) of every run is compared byte for byte. The last run has one busy-loop
process per core beside it, so the planner gets about half the machine (the others have it
alone, as far as the machine is otherwise quiet). The searches run on the work clock
(`pesto_ir/util/work.py`): the plan must not depend on the load, unless the time limit's wall-clock
cap cut a run short, which its plan's notes say and the table shows (`cut`).

Cases: the suite's `auto` row of `bert_l-12_training_op` and `jax_gpt24` at k = 8
(`coarsen{target=200},place{algo=auto},expand`, place's default time limit for the coarse graph,
seed 0, as `bench/suite.py` runs them) and the LLM zoo's `alpa-gpt-6.7B` row (its `pesto_plan`:
`place{algo=auto tensor-parallel=auto}`, 120 s: the limit of the README's table).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUT = "cut the search short"
LLM_TIME_LIMIT = 120.0  # an LLM row's limit, as the README's table plans them (`python -m bench --llm --time-limit 120`)


def _suite_case(model: str, k: int) -> Callable[[], str]:
    def plan() -> str:
        from bench.suite import coarsen_place_expand
        from bench.zoo import zoo
        from pesto_ir.backends.plan_json import plan_json_text
        from pesto_ir.schedule.plan import read_plan_attrs

        entry = next(m for m in zoo() if m.name == model)
        graph, _, _ = coarsen_place_expand(entry.build(), entry.cluster(k), "auto", None, 200, 0)
        placed = read_plan_attrs(graph)
        assert placed is not None
        return plan_json_text(placed)

    return plan


def _llm_case(row_name: str) -> Callable[[], str]:
    def plan() -> str:
        from bench.llm_rows import ROWS
        from bench.llm_zoo import DEFAULT_PLACE, lowered_row, pesto_plan
        from pesto_ir.backends.plan_json import plan_json_text

        row = next(r for r in ROWS if r.name == row_name)
        cluster = row.machine.cluster(row.devices)
        graph = lowered_row(row, cluster)
        placed, _ = pesto_plan(graph, cluster, DEFAULT_PLACE, LLM_TIME_LIMIT)
        return plan_json_text(placed)

    return plan


CASES: dict[str, Callable[[], str]] = {
    "bert_l-12_training_op k=8": _suite_case("bert_l-12_training_op", 8),
    "jax_gpt24 k=8": _suite_case("jax_gpt24", 8),
    "alpa-gpt-6.7B": _llm_case("alpa-gpt-6.7B"),
}


@dataclass
class Run:
    case: str
    busy: bool
    seconds: float
    text: str | None  # the plan JSON, or None when the run failed
    error: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12] if self.text is not None else "-"

    @property
    def cut(self) -> bool:
        return self.text is not None and CUT in self.text


def _one(case: str, out: Path) -> int:
    """Plan `case` in this process and write its plan JSON to `out`."""
    out.write_text(CASES[case]())
    return 0


def _spinners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_case(case: str, busy: bool, folder: Path, index: int) -> Run:
    out = folder / f"{case.replace(' ', '_')}.{index}.json"
    spinners = _spinners(os.cpu_count() or 2) if busy else []
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "bench.determinism", "--one", case, "--plan", str(out)],
                              cwd=ROOT, capture_output=True, text=True)
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return Run(case, busy, seconds, None, (done.stderr.strip().splitlines() or ["failed"])[-1])
    return Run(case, busy, seconds, out.read_text())


def table(runs: list[Run]) -> str:
    lines = ["| case | run | machine | wall s | plan sha-256 | cut by the wall clock | same as run 1 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    first: dict[str, Run] = {}
    for r in runs:
        base = first.setdefault(r.case, r)
        number = sum(1 for x in runs[:runs.index(r) + 1] if x.case == r.case)
        same = "yes" if r.text is not None and r.text == base.text else ("-" if r is base else "**no**")
        lines.append(f"| {r.case} | {number} | {'busy' if r.busy else 'quiet'} | {r.seconds:.1f} | "
                     f"{r.digest if r.text is not None else 'failed: ' + r.error} | {'yes' if r.cut else 'no'} | "
                     f"{'-' if r is base else same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.determinism", description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES), metavar="CASE")
    ap.add_argument("--runs", type=int, default=3, help="runs per case, the last one busy (default 3)")
    ap.add_argument("--out", type=Path, help="write the table here (markdown)")
    ap.add_argument("--one", choices=sorted(CASES), help=argparse.SUPPRESS)
    ap.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return _one(args.one, args.plan)
    if args.runs < 2:
        ap.error("--runs must be at least 2: one quiet run and one busy run to compare")
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"pesto-determinism-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    runs = []
    for case in args.cases:
        for i in range(args.runs):
            run = run_case(case, busy=i == args.runs - 1, folder=folder, index=i)
            print(f"{case} run {i + 1} ({'busy' if run.busy else 'quiet'}): {run.seconds:.1f} s, "
                  f"{run.digest}{' (cut)' if run.cut else ''}{' ' + run.error if run.error else ''}", flush=True)
            runs.append(run)
    text = table(runs)
    print(text)
    if args.out:
        args.out.write_text(f"# The same plan on a quiet and a busy machine\n\n`python3 -m bench.determinism "
                            f"--runs {args.runs}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                            f"{os.cpu_count()} cores.\n\n{text}\n")
    differ = any(r.text is None or r.text != next(x for x in runs if x.case == r.case).text for r in runs)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
