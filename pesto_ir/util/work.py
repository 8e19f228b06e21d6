"""The clock the searches run on: work done, counted, not time measured.

A search that stops when the wall clock says so finds more on a quiet machine than on a busy
one, so its plan depends on the load: three runs of BERT-12 at 8 devices gave 297, 339.7 and
357 ms. Users compare runs, and every process of a multi-host job must run the same plan. So the
searches read `now()`, which moves only by the work charged to it: each simulation, plan check,
memory estimate, rewrite and list schedule charges its size times a fixed rate (`RATES`: seconds
per unit on the machine they were measured on, `bench/work_clock.py`), and CP-SAT charges its own
deterministic time. The same input then takes the same steps, and stops at the same points,
however busy the machine is.

The wall clock only caps. `capped(seconds)` (the place pass's time limit) makes the clock jump to
the end of the work it gave once the wall clock passes the limit, so every search stops where it
is; `was_cut()` then says so, and that run's plan may differ from a quiet run's. The work a pass
gives its search is a share of its time limit (`passes/place.py`), so that a machine that runs
the search at half speed still ends it within the limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# Seconds per unit of work, by kind (measured on the 2-core development machine, quiet, by
# `python3 bench/work_clock.py`, which prints them beside the figures it measures).
RATES: dict[str, float] = {
    "simulate": 1.5e-5,  # per op of a simulated schedule
    "check": 1.5e-5,  # per op of a plan's validation (precedence, transfers; memory is its own)
    "memory": 3.0e-5,  # per op of a memory estimate from lifetimes
    # per check by a list scheduler that found no room for an op (each puts a pair back to wait; on
    # megatron-gpt-7.1B at 8 devices ETF and HEFT took 5-13 us per check, its retries included; on
    # alpa-gpt-39B's replicas over 16 devices m-ETF took 19)
    "memory-check": 2.0e-5,
    "bound": 6.0e-5,  # per op of the lower bound
    "rewrite": 4.0e-5,  # per op built by a rewrite of a cost-only graph (replicas, micro-batches, coarse groups)
    # ... of a graph of arrays (a lowered JAX step): each op's shapes and batch axes are worked out
    # and its costs computed again, several times the work (measured on jax_gpt24 at k = 8)
    "rewrite-typed": 1.3e-4,
    # per op of a heuristic: its tables, its plan's timing and peak (the list schedulers over pairs,
    # m-ETF, m-SCT, ETF and HEFT, count their search as it goes, by `data-ready`)
    "list-schedule-op": 9.0e-5,
    # per input looked up when a list scheduler times a pair (each lookup, plus the producers it
    # reads): the count grows with devices as the schedulers' time does (m-SCT over 64 devices
    # looks up 19 per op and device, over 8 devices 8; per op and device, the rate would be 3x off)
    "data-ready": 5.4e-6,
    "lp-edge": 1.5e-4,  # per edge of m-SCT's favourite-children LP, built and solved by CBC
    "stages": 4.0e-5,  # per op of a pipeline's units and stages
    "cpsat-model": 1.8e-3,  # per op and device a CP-SAT model allows, built, sent and presolved
    "cpsat": 2.8,  # per CP-SAT deterministic second
    # per wall-clock second of an engine only the wall clock stops (CBC's MILP): counted as it
    # passes, so a search that runs one ends however little else it charges; such a search's
    # plans depend on the machine's speed (`AlgorithmEntry.wall_bounded`)
    "wall": 1.0,
}


@dataclass
class _Clock:
    charged: float = 0.0  # seconds of work charged since the process started
    wall_end: float = math.inf  # the cap: the `time.perf_counter()` reading past which searches stop
    work_end: float = math.inf  # ... and where the clock jumps to when the cap passes
    cut: bool = False  # the cap passed during the current `capped` block
    stop_at: float = math.inf  # the work reading where the current `stopping_at` block's steps stop


_CLOCK = _Clock()
_RECORDED: list[list[tuple[str, float, float, float]]] = []  # open `recording` blocks' charges


def charge(kind: str, units: float) -> None:
    """Count `units` of work of `kind` (a key of `RATES`)."""
    _CLOCK.charged += RATES[kind] * units
    for charges in _RECORDED:
        charges.append((kind, units, time.perf_counter(), time.process_time()))
    if _CLOCK.wall_end != math.inf and not _CLOCK.cut and time.perf_counter() > _CLOCK.wall_end:
        _CLOCK.cut = True
    if _CLOCK.cut:
        _CLOCK.charged = max(_CLOCK.charged, _CLOCK.work_end)


def rewrite_kind(typed: bool) -> str:
    """The kind of work a rewrite of a graph of arrays (`typed`) or of a cost-only graph is."""
    return "rewrite-typed" if typed else "rewrite"


def now() -> float:
    """The work clock: seconds of work charged so far (past the end of the capped block's work
    once its wall-clock cap has passed)."""
    if _CLOCK.wall_end != math.inf and not _CLOCK.cut and time.perf_counter() > _CLOCK.wall_end:
        _CLOCK.cut = True
    if _CLOCK.cut:
        _CLOCK.charged = max(_CLOCK.charged, _CLOCK.work_end)
    return _CLOCK.charged


def wall_left() -> float:
    """Wall-clock seconds until the cap (infinite outside a capped block): the limit a solver in
    another process must keep, since its work is not counted here until it answers."""
    return max(_CLOCK.wall_end - time.perf_counter(), 0.0)


@contextmanager
def stopping_at(deadline: float) -> Iterator[None]:
    """A block whose step-by-step searches (the list schedulers) stop once the work clock passes
    `deadline` (`past_stop`): the share of the work their caller gives them, read as counted work,
    so that they stop at the same step on a quiet or a busy machine. Blocks nest (the earlier
    deadline holds)."""
    saved = _CLOCK.stop_at
    _CLOCK.stop_at = min(saved, deadline)
    try:
        yield
    finally:
        _CLOCK.stop_at = saved


def past_stop() -> bool:
    """Whether the work clock has passed the current `stopping_at` block's deadline."""
    return now() > _CLOCK.stop_at


def mark_cut() -> None:
    """Record that the wall clock stopped a piece of work before its counted share was done (a
    solver in another process, capped by `wall_left`)."""
    if _CLOCK.wall_end != math.inf:
        _CLOCK.cut = True


def was_cut() -> bool:
    """Whether the wall-clock cap of the current `capped` block has passed."""
    now()
    return _CLOCK.cut


@contextmanager
def recording() -> Iterator[list[tuple[str, float, float, float]]]:
    """Every charge made in the block, as (kind, units, `time.perf_counter()` and
    `time.process_time()` readings): what `bench/work_clock.py` measures `RATES` from."""
    charges: list[tuple[str, float, float, float]] = []
    _RECORDED.append(charges)
    try:
        yield charges
    finally:
        _RECORDED.remove(charges)


@dataclass(frozen=True)
class Capped:
    """A capped block: `work` seconds of work for its search, `wall` seconds of wall clock at most."""

    work: float
    wall: float
    started: float  # the work clock's reading at the start

    def spent(self) -> float:
        """Seconds of work done in the block so far."""
        return now() - self.started


@contextmanager
def capped(work_seconds: float, wall_seconds: float) -> Iterator[Capped]:
    """A block whose searches get `work_seconds` of work and stop when `wall_seconds` of wall
    clock have passed, whichever comes first; blocks nest (the inner cap is the earlier)."""
    saved = _Clock(_CLOCK.charged, _CLOCK.wall_end, _CLOCK.work_end, _CLOCK.cut, _CLOCK.stop_at)
    block = Capped(work_seconds, wall_seconds, now())
    _CLOCK.wall_end = min(saved.wall_end, time.perf_counter() + wall_seconds)
    _CLOCK.work_end = block.started + work_seconds if _CLOCK.wall_end < saved.wall_end else saved.work_end
    try:
        yield block
    finally:
        _CLOCK.wall_end, _CLOCK.work_end = saved.wall_end, saved.work_end
        _CLOCK.cut = saved.cut
