"""Timing a JAX call: how runs are clocked and how they become one number.

Apart from `pesto_ir.profile` (which times ops on a cluster's device kinds) so that the machine
model's own measurements (`pesto_ir.measure_collectives`) can use it without importing the cluster.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

# How the timed runs of one measurement become one number. The median is the default; the
# minimum is steadier when other processes share the machine (they only ever add time).
STATS: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "min": min}

# What a run is timed with. `wall` is the time a step takes, the default. `cpu` is the process's
# CPU time: with XLA's CPU backend held to one thread it equals the wall time of a quiet machine,
# and other processes sharing the cores do not change it (benchmarks use it; never for GPUs).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}

# XLA flags that hold its CPU backend to one thread, for the `cpu` clock. XLA reads them when the
# backend starts: set them before the first `jax.devices()`.
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def call_time(fn: Callable[..., Any], args: Sequence[Any], runs: int, warmup: int,
              stat: str = "median", clock: str = "wall") -> float:
    """Median (or `stat`) seconds of `fn(*args)` until its results are ready, after `warmup` calls."""
    import jax

    now = CLOCKS[clock]
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(runs):
        t0 = now()
        jax.block_until_ready(fn(*args))
        times.append(now() - t0)
    return STATS[stat](times)
