"""CBC's log, read live: while CBC solves, its log (written to file descriptor 1) goes through a pipe
and each new incumbent and raised bound is reported as a progress line (`CbcLog`); `parse_cbc_line`
knows both of CBC's log formats. `status_name` names python-mip's solve status as plans record it.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pesto_ir.util.native_stdout import flush_c_stdio

HEARTBEAT = 10.0  # seconds between progress lines when nothing changes


class CbcLog:
    """While CBC solves, route its log (written to file descriptor 1) through a pipe and report
    each new incumbent, a raised bound at most once a second, and both every HEARTBEAT seconds.
    python-mip's own progress callback crashes the bundled CBC (CbcBnBOutput::onStrongStats) and
    its incumbent callback is a no-op, so the log is the one live view of the search."""

    def __init__(self, report: Callable[[str], None], unit: float) -> None:
        self.report = report
        self.unit = unit
        self.best = math.inf
        self.bound = -math.inf
        self.last = 0.0
        self.shown_bound = -math.inf
        self.started = time.perf_counter()

    def start(self) -> bool:
        """Point fd 1 at the pipe; False (and nothing changed) where fd 1 cannot be redirected."""
        sys.stdout.flush()
        try:
            read, write = os.pipe()
            self.saved = os.dup(1)
        except OSError:
            return False
        os.dup2(write, 1)
        os.close(write)
        self.thread = threading.Thread(target=self._read, args=(read,), daemon=True)
        self.thread.start()
        return True

    def stop(self) -> None:
        flush_c_stdio()
        os.dup2(self.saved, 1)  # closes the pipe's last write end: the reader sees EOF
        os.close(self.saved)
        self.thread.join(timeout=5)

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                self.see(*parse_cbc_line(line))

    def see(self, incumbent: float | None, bound: float | None) -> None:
        now = time.perf_counter() - self.started
        improved = incumbent is not None and incumbent < self.best - 1e-9
        if incumbent is not None and improved:
            self.best = incumbent
        if bound is not None and bound > self.bound:
            self.bound = bound
        raised = bound is not None and bound > self.shown_bound + 1e-6 * abs(bound) and now - self.last >= 1.0
        if improved or raised or now - self.last >= HEARTBEAT:
            self.shown_bound = self.bound
            self.last = now
            inc = f"{self.best / self.unit * 1e3:.4f} ms" if math.isfinite(self.best) else "none"
            low = f"{self.bound / self.unit * 1e3:.4f} ms" if math.isfinite(self.bound) else "none"
            self.report(f"ilp: {now:6.1f}s  incumbent {inc}  bound {low}")


_NUMBER = r"([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
_INCUMBENT = re.compile(rf"(?:Integer solution of|MIPStart provided solution with cost|BestSol:)\s*{_NUMBER}")
_CLASSIC_BEST = re.compile(rf"{_NUMBER} best solution")
_BOUND = re.compile(rf"(?:best possible|Bound:)\s*{_NUMBER}")
_NODE_ROW = re.compile(rf"^\s*\d+\s+\d+\s+\d+\s+{_NUMBER}\s.*?\s{_NUMBER}\s+{_NUMBER}%\s+{_NUMBER}\s*$")
_HEURISTIC_ROW = re.compile(rf"^\s*\S+\s+solution\s+{_NUMBER}\s+{_NUMBER}\s*$")


def parse_cbc_line(line: str) -> tuple[float | None, float | None]:
    """(incumbent, bound) that one line of CBC's log states, in model units; None where silent.
    Knows the classic messages (Cbc0012I, Cbc0010I) and the tables of the newer log format."""
    line = line.replace("\u2605", " ")  # the star marking a heuristic's new best
    row = _NODE_ROW.match(line)
    if row:
        return float(row.group(1)), float(row.group(2))
    row = _HEURISTIC_ROW.match(line)
    if row:
        return float(row.group(1)), None
    inc, low = _INCUMBENT.search(line) or _CLASSIC_BEST.search(line), _BOUND.search(line)
    return (float(inc.group(1)) if inc else None), (float(low.group(1)) if low else None)


def status_name(status: Any) -> str:
    names = {"OPTIMAL": "optimal", "FEASIBLE": "feasible", "NO_SOLUTION_FOUND": "no-solution",
             "INFEASIBLE": "infeasible", "INT_INFEASIBLE": "infeasible", "UNBOUNDED": "unbounded"}
    name: str = status.name  # a python-mip OptimizationStatus (mip ships no types)
    return names.get(name, name.lower().replace("_", "-"))
