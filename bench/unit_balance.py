"""The least load of the busiest device over every split of weighted units over k alike devices
(P||Cmax), by CP-SAT, in a process of its own: OR-tools cannot be imported where python-mip's CBC
is loaded (both bring their own COIN-OR libraries).

    echo '{"loads": [3, 5, 2, 7], "k": 2, "seconds": 10}' | python3 -m bench.unit_balance
    # {"bound": 9, "optimal": true}
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def least_busiest(loads: Sequence[int], k: int, seconds: float) -> tuple[int, bool]:
    """CP-SAT's proven lower bound of the smallest possible largest load, and whether it is optimal."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    on = [[model.NewBoolVar(f"u{u}d{d}") for d in range(k)] for u in range(len(loads))]
    busiest = model.NewIntVar(0, sum(loads), "busiest")
    for row in on:
        model.AddExactlyOne(row)
    for d in range(k):
        model.Add(sum(w * on[u][d] for u, w in enumerate(loads)) <= busiest)
    model.Add(on[max(range(len(loads)), key=loads.__getitem__)][0] == 1)  # the devices are alike
    model.Minimize(busiest)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 1
    status = solver.Solve(model)
    return round(solver.BestObjectiveBound()), status == cp_model.OPTIMAL


def in_own_process(loads: Sequence[int], k: int, seconds: float) -> tuple[int, bool]:
    """`least_busiest` run by `python -m bench.unit_balance` in a child process."""
    request = json.dumps({"loads": list(loads), "k": k, "seconds": seconds})
    done = subprocess.run([sys.executable, "-m", "bench.unit_balance"], input=request, capture_output=True,
                          text=True, timeout=seconds + 60, cwd=Path(__file__).resolve().parents[1])
    if done.returncode != 0:
        raise RuntimeError(f"bench.unit_balance failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    answer = json.loads(done.stdout)
    return int(answer["bound"]), bool(answer["optimal"])


def main() -> int:
    request = json.loads(sys.stdin.read())
    bound, optimal = least_busiest([int(w) for w in request["loads"]], int(request["k"]), float(request["seconds"]))
    print(json.dumps({"bound": bound, "optimal": optimal}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
