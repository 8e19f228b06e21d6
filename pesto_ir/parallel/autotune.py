"""Choose by measuring: time a step's candidate executables on the real devices, keep the fastest.

A simulated step time is a prediction. On the machine at hand a plan can lose to plain `jax.jit`:
per-segment dispatch, transfers that cost more than the cluster model says, devices that share
cores (CPU devices here). So `parallelize` (by default, wherever the devices are one process's;
`autotune=False` runs the plan as asked) builds, on the first call with a new signature, these
candidates:

- `plan`: the executable of the plan asked for (its algorithm, `data_parallel`, `microbatches`);
- `jit`: plain `jax.jit(fn)` on the first device (predicted: the one-device plan's step time);
- `data-parallel`: every device a replica of the whole step (`place{algo=single data-parallel=k}`,
  run as `jax.shard_map` over all the devices), when there are several devices and the batch
  splits over them;

runs each once (a warm-up: compiles, caches), then times `steps` rounds, each calling every
candidate once in turn, so that a load that comes and goes on a shared machine falls on all of
them alike; it keeps the fastest by each candidate's fastest step (other work on a shared
machine only ever adds time to a step, so the fastest of a few is the steadiest figure: a median of
5 steps taken while tests ran beside it once put data parallelism 7% ahead of a jax.jit that was
14% faster in the steady state), except that plain jax.jit is kept unless another candidate beats
it by more than `JIT_MARGIN` (jax.jit is the one with nothing to go wrong: no transfers, no
collectives). Every candidate runs on the caller's arguments as given and none donates them, so a
losing candidate consumes nothing; their outputs are dropped. The report lists each candidate's
simulated and measured step and their ratio: how far the cost model is off on these devices;
`verdict` says in a sentence what was chosen against what, for the plan's notes and `describe()`.

Measured times feed back through `Parallelized.calibrated_cluster()`: the `jit` candidate runs the
whole step on one device with no transfers, so its measured time calibrates the devices alone.
Its roofline time is s * A + L (A: the ops' compute- or memory-bound time, L: their launch
overheads, which no speed changes), and a measured call also pays the host's dispatch of one
executable, D (`dispatch_floor`: a trivial jitted call timed on the same device), so the devices'
peak FLOP/s and memory bandwidth are divided by s = (measured - D - L) / A (`speed_factor`). The links come from timed copies
(`measure_collectives.measured_cluster`). Plan with that cluster (`parallelize(...,
cluster=...)`) and the predictions of every candidate move toward what these devices do.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.roofline import graph_time
from pesto_ir.ir.graph import Graph
from pesto_ir.util.errors import PestoError, first_reason
from pesto_ir.util.units import human_time

DEFAULT_STEPS = 5
MAX_STEPS = 1000
# Another candidate replaces plain jax.jit only when its fastest step is shorter by more than this
# fraction: two identical jitted steps timed for 5 steps on this 2-core machine differ by up to ~5%.
JIT_MARGIN = 0.05
PREFERRED = "jit"

Runner = Callable[..., Sequence[Any]]  # flat input leaves -> flat output leaves


@dataclass
class Candidate:
    """One way to run the step: how, what the planner predicted, what it measured."""

    name: str
    describe: str
    run: Runner | None  # None: it could not be built (`why`)
    predicted: float | None = None  # simulated seconds per step
    measured: float | None = None  # wall seconds of its fastest timed step
    why: str = ""

    @property
    def ratio(self) -> float | None:
        if self.predicted is None or self.measured is None or self.predicted <= 0:
            return None
        return self.measured / self.predicted


def check_steps(steps: object) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise PestoError(f"autotune_steps must be a whole number from 1 to {MAX_STEPS}, got {steps!r}")
    return steps


def time_step(run: Runner, leaves: Sequence[Any], steps: int) -> float:
    """Median wall seconds of `run(*leaves)` to results ready, after one warm-up call."""
    import jax

    jax.block_until_ready(run(*leaves))
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        jax.block_until_ready(run(*leaves))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def choose(candidates: list[Candidate], leaves: Sequence[Any], steps: int) -> Candidate:
    """Time every candidate that was built, in interleaved rounds after one warm-up call each; the
    fastest by its fastest step (the first listed among ties), but `PREFERRED` (plain jax.jit) unless
    the fastest beats it by more than `JIT_MARGIN`. A candidate that fails to run is kept out
    with the reason."""
    import jax

    live: list[Candidate] = []
    for c in candidates:
        if c.run is None:
            continue
        try:
            jax.block_until_ready(c.run(*leaves))
            live.append(c)
        except PestoError as e:
            c.why, c.run = f"failed to run: {first_reason(e)}", None
    samples: dict[str, list[float]] = {c.name: [] for c in live}
    for _ in range(steps):
        for c in live:
            assert c.run is not None
            started = time.perf_counter()
            jax.block_until_ready(c.run(*leaves))
            samples[c.name].append(time.perf_counter() - started)
    for c in live:
        c.measured = min(samples[c.name])
    timed = [c for c in candidates if c.measured is not None]
    if not timed:
        raise PestoError("autotune: no candidate ran: " + "; ".join(f"{c.name}: {c.why}" for c in candidates))
    return preferred(timed)


def preferred(timed: list[Candidate]) -> Candidate:
    """Of measured candidates, the fastest, or `PREFERRED` when the fastest is within `JIT_MARGIN` of it."""
    fastest = min(timed, key=lambda c: c.measured)  # type: ignore[arg-type,return-value]
    jit = next((c for c in timed if c.name == PREFERRED), None)
    if jit is None or fastest is jit:
        return fastest
    assert jit.measured is not None and fastest.measured is not None
    return fastest if fastest.measured < jit.measured * (1 - JIT_MARGIN) else jit


def verdict(candidates: list[Candidate], chosen: Candidate) -> str:
    """In a sentence: the chosen candidate's measured step against each other's, or why another did not
    run (for the plan's notes and the executable's `describe()`)."""
    def step(c: Candidate) -> str:
        return f"{human_time(c.measured, 4)}/step" if c.measured is not None else f"not run: {c.why or 'not timed'}"

    others = [f"{c.name} ({c.describe}) {step(c)}" for c in candidates if c is not chosen]
    text = f"chosen by autotuning: {chosen.name} {step(chosen)}" + (" measured" if chosen.measured is not None else "")
    text += f", against {'; '.join(others)}" if others else " (the only candidate)"
    timed = [c for c in candidates if c.measured is not None]
    fastest = min(timed, key=lambda c: c.measured or 0.0) if timed else chosen
    if fastest is not chosen and chosen.measured is not None:
        text += (f"; {fastest.name} was within {JIT_MARGIN:.0%}, which timing a few steps cannot tell from noise, "
                 f"so {chosen.name} is kept")
    return text


def report(candidates: list[Candidate], chosen: Candidate | None) -> str:
    """A table: each candidate's simulated and measured step, their ratio, and which was chosen."""
    lines = ["| candidate | how | simulated | measured | measured / simulated | |",
             "|---|---|---:|---:|---:|---|"]
    for c in candidates:
        sim = human_time(c.predicted, 4) if c.predicted is not None else "—"
        got = human_time(c.measured, 4) if c.measured is not None else "—"
        ratio = f"{c.ratio:.2f}" if c.ratio is not None else "—"
        mark = "chosen" if c is chosen else c.why
        lines.append(f"| {c.name} | {c.describe} | {sim} | {got} | {ratio} | {mark} |")
    return "\n".join(lines)


def dispatch_floor(device: Any, steps: int = 20) -> float:
    """Median wall seconds of a trivial jitted call on `device`, to its result ready: what every
    executable call costs the host however small its kernels."""
    import jax
    import jax.numpy as jnp

    x = jax.device_put(jnp.zeros((), jnp.float32), device)
    return time_step(jax.jit(lambda a: a + 1), [x], steps)


def speed_factor(graph: Graph, device: Device, measured: float) -> float:
    """The s for which `graph`'s roofline time on `device` with peak FLOP/s and memory bandwidth
    divided by s equals `measured` seconds (less the dispatch floor): (measured - L) / A, from the
    times at s = 1 and s = 2."""
    at_1 = graph_time(graph, device)
    slower = dataclasses.replace(device, peak_flops=device.peak_flops / 2,  # type: ignore[operator]
                                 mem_bandwidth=device.mem_bandwidth / 2)  # type: ignore[operator]
    work = graph_time(graph, slower) - at_1  # A
    launches = at_1 - work  # L
    if not measured > launches or work <= 0:
        raise PestoError(f"the measured step ({human_time(measured, 4)}) is not longer than the modelled launch "
                         f"overheads alone ({human_time(launches, 4)}): the launch overhead of kind "
                         f"{device.kind}, not the devices' speed, is what the cost model gets wrong here")
    return (measured - launches) / work


def with_speed(cluster: Cluster, factor: float) -> Cluster:
    """`cluster` with every device's peak FLOP/s and memory bandwidth divided by `factor`."""
    devices = [dataclasses.replace(d, peak_flops=d.peak_flops / factor if d.peak_flops else d.peak_flops,
                                   mem_bandwidth=d.mem_bandwidth / factor if d.mem_bandwidth else d.mem_bandwidth)
               for d in cluster.devices]
    return dataclasses.replace(cluster, devices=devices, links=dict(cluster.links))


__all__ = ["Candidate", "DEFAULT_STEPS", "JIT_MARGIN", "check_steps", "choose", "preferred", "report",
           "speed_factor", "time_step", "verdict", "with_speed", "dispatch_floor"]
