"""The suite's rows (`Row`: each algorithm's `Outcome` on one model at k devices), the findings on
rows where `auto` is not the fastest plan, and the reports made of them: markdown tables, the
`pesto-bench/1` JSON and the README's results (`bench/suite.py` runs the rows)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pesto_ir.passes.place import default_time_limit
from pesto_ir.util.loader import write_atomic

FORMAT = "pesto-bench/1"
BASELINES = ("single", "expert", "m-topo", "m-etf", "m-sct", "etf", "heft")
HYBRID_BASELINES = ("dp", "gpipe", "1f1b")  # pure data parallelism; pipelines with the best m <= 32
EXACT = ("ilp", "auto-1b", "auto")
ONE_BATCH = "auto-1b"  # Pesto's one-batch plan: place{algo=auto data-parallel=1 microbatches=1}
PESTO = "auto"  # the algorithm whose plan the tables call Pesto's: the hybrid search
STARTED = (ONE_BATCH, PESTO)  # each k starts from its plan at the k before (`Starts`)
ALGOS = (*BASELINES, *HYBRID_BASELINES, *EXACT)
PURE = ("single", "dp", "gpipe", "1f1b", ONE_BATCH)  # what auto must match or beat
MIX_GAIN = 0.05  # a mix "beats the pure strategies" when it is this much faster than all of them
GAP_GOAL = 0.05
OVERTIME = 0.1  # a place pass this much over its time limit is a finding
TIE = 1e-9  # relative: plans this close count as equally fast
README_BEGIN = "<!-- bench-results:begin -->"
README_END = "<!-- bench-results:end -->"
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Outcome:
    """One algorithm on one row: its plan's step time, or why it has none."""

    makespan: float | None
    seconds: float
    winner: str = ""
    error: str = ""
    strategy: str = ""  # a hybrid plan's `d=2 m=4, 2 stages`
    place_seconds: float | None = None  # the place pass alone (ilp, auto-1b, auto)
    time_limit: float | None = None  # place's time limit


@dataclass
class Row:
    model: str
    source: str
    description: str
    ops: int
    k: int
    cluster: str
    lower_bound: float
    bound: str  # the term of the lower bound that binds: "critical path", "memory-cut path", "colocated path" or "total work"
    coarse_lower_bound: float
    groups: int
    free_comm: float | None  # the best m-ETF/m-SCT plan with instant links ...
    free_comm_bound: float  # ... and the lower bound on that cluster
    results: dict[str, Outcome] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)

    def makespan(self, algo: str) -> float | None:
        return self.results[algo].makespan

    def best(self) -> tuple[str, float] | None:
        """The fastest algorithm of the row and its step time (the first listed among ties)."""
        done = [(a, o.makespan) for a, o in self.results.items() if o.makespan is not None]
        return min(done, key=lambda x: x[1]) if done else None

    def gap(self) -> float | None:
        m = self.makespan(PESTO)
        return None if m is None or self.lower_bound <= 0 else m / self.lower_bound - 1


def limits_text(header: dict[str, Any]) -> str:
    limit = header.get("search_time_limit")
    if limit is None:
        return ("T is place's default for the coarse graph (4 s + 0.2 s per group, at most 60 s: "
                f"{default_time_limit(header['target']):g} s for {header['target']} groups; the T column)")
    return f"T = {limit:g} s"


# ---------------------------------------------------------------- findings

def findings(row: Row) -> list[str]:
    """Why `auto` is not the fastest plan of the row, or more than 5% above the lower bound."""
    pesto, best, gap = row.makespan(PESTO), row.best(), row.gap()
    if pesto is None:
        return [f"{PESTO} found no plan: {row.results[PESTO].error}"]
    out: list[str] = []
    took, limit = row.results[PESTO].place_seconds, row.results[PESTO].time_limit
    if took is not None and limit is not None and took > limit * (1 + OVERTIME):
        out.append(f"{PESTO}'s place took {took:.1f} s, over its {limit:g} s time limit")
    assert best is not None
    if pesto > best[1] * (1 + TIE):
        out.append(f"{best[0]} is {100 * (pesto / best[1] - 1):.1f}% faster than {PESTO}")
    if row.results[PESTO].strategy:  # a hybrid plan: the one-batch lower bound does not bound it
        return out
    if gap is None or gap <= GAP_GOAL:
        return out
    lb = row.lower_bound
    out.append(f"{PESTO} is {100 * gap:.1f}% above the lower bound (its {row.bound} term)")
    if row.free_comm is not None:
        free = row.free_comm / row.free_comm_bound - 1
        links = pesto / row.free_comm - 1
        if free <= GAP_GOAL:
            out.append(f"with instant links m-ETF/m-SCT come within {100 * free:.1f}% of that cluster's bound, "
                       f"and the real links add {100 * links:.1f}%: the gap is the cost of transfers")
        elif links > 0:
            out.append(f"with instant links m-ETF/m-SCT stay {100 * free:.1f}% above that cluster's bound (the "
                       f"bound's looseness or the heuristics'), and the real links add {100 * links:.1f}%")
        else:
            out.append(f"with instant links m-ETF/m-SCT do no better ({100 * free:.1f}% above that cluster's bound): "
                       "no plan found shows the bound can be reached")
    if row.coarse_lower_bound > lb * (1 + 0.02):
        out.append(f"coarsening to {row.groups} groups raises the bound by {100 * (row.coarse_lower_bound / lb - 1):.1f}%")
    single = row.makespan("single")
    if single is not None and pesto > single / (1 + GAP_GOAL):
        out.append(f"one device is within 5% of {PESTO} ({single / pesto:.3f}x): the parallelism does not pay "
                   "for its transfers")
    winner = row.results[PESTO].winner
    if winner and winner not in ("cpsat", "cpsat-lns", "auto") and not winner.endswith("refinement"):
        out.append(f"neither the exact engines nor refinement found anything better than the {winner} plan "
                   "in the time limit")
    return out


# ---------------------------------------------------------------- reports

def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.4g}"


def seconds(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def markdown(rows: list[Row], header: dict[str, Any]) -> str:
    algos = list(ALGOS)
    lines = [f"Step time in ms (simulated) of each algorithm's plan; **bold** is the fastest of the row. "
             f"`ilp`, `auto-1b` and `auto` run `coarsen{{target={header['target']}}},place{{time-limit=T}},"
             f"expand` with T = {header['time_limit']:g} s for `ilp`, and for `auto-1b` and `auto` "
             f"{limits_text(header)}; the baselines run on the fine graph. Gap is (auto / lower bound - 1); place s is "
             f"the time auto's place pass took (plan s adds coarsen and expand). — means the algorithm found no plan (memory). "
             "The lower bound (LB) is the largest of the critical path on the fastest devices, counting a "
             "transfer only where a join cannot avoid one, the plain critical path with the transfers it must make where "
             "its ops' resident memory does not fit on one device, the critical path where colocated ops wait "
             "for each other, and the total work spread over the devices: a bound "
             "for one-batch plans, which data-parallel replicas and micro-batches can beat (their batch is "
             "split, so is the critical path). `dp`: every device a replica (d = k), gradients all-reduced in "
             "buckets; `gpipe`, `1f1b`: k contiguous stages balanced by cost, the fixed schedule, the best "
             "micro-batch count up to 32; `auto-1b`: Pesto's one-batch plan (`data-parallel=1 microbatches=1`); "
             "`auto`: the search over replicas x micro-batches x placement (the strategy it chose is in the "
             "last column). `auto-1b` and `auto` at each k start from their own plans at the k before "
             "(`place{start=FILE}`: a plan on fewer devices is a plan on more), so more devices never give a "
             "slower plan; T and place s are the later search's alone.",
             "",
             "| model | ops | k | LB | " + " | ".join(algos) + " | gap | T | place s | plan s | auto's strategy |",
             "|---|---:|---:|---:|" + "---:|" * len(algos) + "---:|---:|---:|---:|---|"]
    for r in rows:
        best = r.best()
        cells = []
        for a in algos:
            m = r.makespan(a)
            tied = best is not None and m is not None and m <= best[1] * (1 + TIE)
            cells.append(f"**{ms(m)}**" if tied else ms(m))
        gap, pesto = r.gap(), r.results[PESTO]
        lines.append(f"| {r.model} | {r.ops} | {r.k} | {ms(r.lower_bound)} | " + " | ".join(cells)
                     + f" | {'—' if gap is None else f'{100 * gap:.1f}%'} | {seconds(pesto.time_limit, '.0f')} | "
                     f"{seconds(pesto.place_seconds)} | {pesto.seconds:.1f} | {pesto.strategy or 'one batch'} |")
    timed = [r.results[PESTO] for r in rows if r.results[PESTO].place_seconds is not None]
    within = sum(1 for o in timed if o.place_seconds <= o.time_limit * (1 + OVERTIME))  # type: ignore[operator]
    lines += ["", summary_markdown(rows), "", pure_markdown(rows), "",
              f"auto's place pass stayed within its time limit (+{100 * OVERTIME:g}%) on {within} of {len(timed)} rows.",
              "", findings_markdown(rows)]
    return "\n".join(lines) + "\n"


def summary_markdown(rows: list[Row]) -> str:
    algos = list(ALGOS)
    ks = sorted({r.k for r in rows})
    lines = ["Geometric mean of step time / lower bound over the rows where every algorithm found a plan, and "
             "how often auto's plan is the fastest (ties count):", "",
             "| k | rows | " + " | ".join(algos) + " | auto fastest |",
             "|---:|---:|" + "---:|" * len(algos) + "---:|"]
    for k in ks:
        at_k = [r for r in rows if r.k == k]
        full = [r for r in at_k if all(r.makespan(a) is not None for a in algos)]
        means = [geomean([r.makespan(a) / r.lower_bound for r in full if r.lower_bound > 0]) for a in algos]
        fastest = sum(1 for r in at_k if (b := r.best()) and r.makespan(PESTO) is not None
                      and r.makespan(PESTO) <= b[1] * (1 + TIE))
        lines.append(f"| {k} | {len(full)} | " + " | ".join(f"{m:.3f}" for m in means) + f" | {fastest}/{len(at_k)} |")
    return "\n".join(lines)


def best_pure(row: Row) -> tuple[str, float] | None:
    """The fastest of the pure strategies (one device, data parallelism, a fixed pipeline, Pesto's
    one-batch plan) on the row."""
    done = [(a, m) for a in PURE if (m := row.makespan(a)) is not None]
    return min(done, key=lambda x: x[1]) if done else None


def pure_markdown(rows: list[Row]) -> str:
    """auto against the best pure strategy, row by row, and the mixes that beat them all."""
    behind = [r for r in rows if (p := best_pure(r)) and (a := r.makespan(PESTO)) is not None and a > p[1] * (1 + TIE)]
    missing = [r for r in rows if r.makespan(PESTO) is None and best_pure(r) is not None]
    lines = [f"auto against the best pure strategy ({', '.join(PURE)}): at least as fast on "
             f"{len(rows) - len(behind) - len(missing)} of {len(rows)} rows"
             + (": behind on " + ", ".join(f"{r.model} k={r.k}" for r in behind + missing) if behind or missing else
                ".")]
    mixes = []
    for r in rows:
        p, a = best_pure(r), r.makespan(PESTO)
        if a is not None and (p is None or a < p[1] / (1 + MIX_GAIN)):
            vs = f"{p[0]} {ms(p[1])} ms" if p else "no pure strategy fits"
            mixes.append(f"- **{r.model}, k={r.k}**: {ms(a)} ms with {r.results[PESTO].strategy or 'one batch'} "
                         f"({r.results[PESTO].winner}); best pure: {vs}")
    if mixes:
        lines += ["", f"Rows where auto's plan beats every pure strategy by more than {100 * MIX_GAIN:g}%:", "", *mixes]
    return "\n".join(lines)


def findings_markdown(rows: list[Row]) -> str:
    flagged = [r for r in rows if r.findings]
    if not flagged:
        return "Every row: auto's plan is the fastest and within 5% of the lower bound."
    lines = [f"Rows where auto is not the fastest or is more than {100 * GAP_GOAL:g}% above the lower bound "
             f"({len(flagged)} of {len(rows)}):", ""]
    for r in flagged:
        lines.append(f"- **{r.model}, k={r.k}**: " + "; ".join(r.findings) + ".")
    return "\n".join(lines)


def to_json(rows: list[Row], header: dict[str, Any]) -> str:
    return json.dumps({"format": FORMAT, **header, "rows": [asdict(r) for r in rows]}, indent=1) + "\n"


def readme_parts(path: Path) -> tuple[str, str]:
    """The README's text before its results markers and after them (both must be there)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise SystemExit(f"error: {path}: {e.strerror} (--readme names the file whose results to replace)") from None
    if README_BEGIN not in text or README_END not in text:
        raise SystemExit(f"{path}: no '{README_BEGIN}' ... '{README_END}' markers to put the results between")
    head, rest = text.split(README_BEGIN, 1)
    return head, rest.split(README_END, 1)[1]


def update_readme(path: Path, table: str, image: str | None, command: str, row: str = "") -> None:
    """Replace the text between the README's results markers (`row`, "MODEL:K", names the Gantt chart's plan)."""
    head, tail = readme_parts(path)
    model, _, k = row.partition(":")
    caption = f"\n*auto's plan of {model} on {k} devices: one row per device and per link.*\n" if row else ""
    picture = f"\n![Gantt chart of auto's plan]({image})\n{caption}" if image else ""
    body = f"\nGenerated by `{command}`.\n\n{table}{picture}\n"
    write_atomic(path, head + README_BEGIN + body + README_END + tail)
