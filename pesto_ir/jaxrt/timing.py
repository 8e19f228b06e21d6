"""Timing a JAX call: how runs are clocked and how they become one number.

Apart from `pesto_ir.jaxrt.profile` (which times ops on a cluster's device kinds) so that the machine
model's own measurements (`pesto_ir.jaxrt.measure_collectives`) can use it without importing the cluster.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

# How the timed runs of one measurement become one number. The median is the default; the
# minimum is steadier when other processes share the machine (they only ever add time).
STATS: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "min": min}

# What a run is timed with. `wall` is the time a step takes, the default. `cpu` is the process's
# CPU time: with XLA's CPU backend held to one core (`hold_xla_to_one_core`) it equals the wall
# time of a quiet machine, and other processes sharing the cores add little to it (benchmarks use
# it; never for GPUs).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}

# XLA flags that keep Eigen's kernels on the calling thread. Alone they do not hold XLA's CPU
# backend to one thread: its thunk executor and YNNPACK fusions still run on a pool of one thread
# per core (measured on 2 cores, jax 0.10: the CNN step of bench/bench_costs.py took 74-92 ms of
# wall time and 92-147 ms of CPU time, the pool's spinning included). `hold_xla_to_one_core`
# also pins the process to one core.
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false"


def hold_xla_to_one_core() -> None:
    """Run XLA's CPU backend on one core, for the `cpu` clock: its flags and the process pinned to
    the last core it may use (threads XLA starts later inherit the pin). Call before the first
    `jax.devices()`."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_XLA).strip()
    if hasattr(os, "sched_setaffinity"):  # Linux; elsewhere the flags alone
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})


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
