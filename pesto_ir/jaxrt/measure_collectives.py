"""Measuring what moves data between devices: copies (links) and the runtime's all-reduce.

The cluster model (`pesto_ir.cluster.model`) times a transfer as `latency + bytes / bandwidth` of its
link and an all-reduce over n devices as 2 (n - 1) ring steps. The figures come from datasheets
unless measured here, on the real JAX devices: links from timed `jax.device_put` copies
(`measure_links`, `measure_host_link`), the all-reduce from timed `jax.lax.psum`s under
`jax.shard_map` (`measure_all_reduce`), the collective data-parallel gradients go through.
Fits are kept in the disk cache (`pesto_ir.util.diskcache`), since they only change with the machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pesto_ir.cluster.figures import AllReduceFit, ClusterError
from pesto_ir.cluster.host import machine_key, machine_of
from pesto_ir.cluster.model import Cluster
from pesto_ir.distributed import shared_text
from pesto_ir.jaxrt.timing import call_time
from pesto_ir.util.diskcache import cache_get, cache_put

# Transfer sizes `measure_links` times: 4 KiB to 16 MiB, enough to separate latency from bandwidth.
LINK_PROBE_SIZES: tuple[int, ...] = tuple(4096 * 4**i for i in range(7))


def measure_host_link(devices: Sequence[Any], sizes: Sequence[int] = LINK_PROBE_SIZES,
                      repeats: int = 5) -> tuple[float, float]:
    """(latency s, bandwidth B/s) of copies between devices of two processes, fitted to round
    trips between the first device of the first two processes (half a round trip is one copy).
    A collective: every process calls it, and every process gets process 0's fit (its timings
    are of whole round trips; the others' include waiting for process 0's sends)."""
    import json
    import time

    import jax
    import numpy as np

    from pesto_ir.jaxrt.cross_process import copy, is_local  # start-up: JAX

    first: dict[int, Any] = {}
    for d in devices:
        first.setdefault(d.process_index, d)
    if len(first) < 2:
        raise ClusterError("measuring links between hosts needs devices of two processes")
    a, b = (first[p] for p in sorted(first)[:2])
    points = []
    for n in sizes:
        spec = jax.ShapeDtypeStruct((n // 4,), np.float32)
        x = jax.device_put(np.ones(n // 4, np.float32), a) if is_local(a) else None
        times = []
        for _ in range(repeats + 1):  # the first round trip sets up the transfer: not counted
            started = time.perf_counter()
            there = copy(x, a, b, spec)
            back = copy(there, b, a, spec)
            if back is not None:
                back.block_until_ready()
            times.append((time.perf_counter() - started) / 2)
        points.append((float(n), float(np.median(times[1:]))))
    latency, bandwidth = json.loads(shared_text("host-link", lambda: json.dumps(fit_link(points))))
    return float(latency), float(bandwidth)


def measure_links(devices: Sequence[Any], sizes: Sequence[int] = LINK_PROBE_SIZES, repeats: int = 5,
                  cache: bool = True) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) fitted to `jax.device_put` copies between devices.

    Copies of each size go both ways between the first two devices; the median time of each is
    fitted by least squares to `latency + bytes / bandwidth`. The fit is cached on disk per
    machine (`pesto_ir.cluster.host.machine_key`) and device count, since it only changes with them.
    """
    if len(devices) < 2:
        raise ClusterError("measuring links needs at least two devices")
    import jax

    own = [d for d in devices if getattr(d, "process_index", 0) == jax.process_index()]  # devices of other
    a, b = own[:2] if len(own) >= 2 else devices[:2]  # processes are not this process's to time
    key = f"links-v3/{machine_key(a)}/{len(devices)}/{tuple(sizes)}"
    hit = cache_get("links", key) if cache else None
    if hit is not None:
        return float(hit[0]), float(hit[1])
    points = [(n, _time_device_put(src, dst, n, repeats)) for n in sizes for src, dst in ((a, b), (b, a))]
    latency, bandwidth = fit_link(points)
    if cache:
        cache_put("links", key, [latency, bandwidth])
    return latency, bandwidth


def fit_link(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares `t = latency + n / bandwidth` over (bytes, seconds) points.

    Errors are relative (each row is divided by its time): with absolute errors the largest copies
    would decide everything and the latency of small copies would be lost.
    """
    import numpy as np

    n = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    w = 1.0 / np.maximum(t, 1e-12)
    a = np.stack([n, np.ones_like(n)], axis=1) * w[:, None]
    (slope, intercept), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    if not slope > 0:
        raise ClusterError(f"link measurement gave no usable bandwidth (time per byte {slope:.3g} s); "
                           "describe the links in a pesto-cluster/1 file instead")
    return max(float(intercept), 0.0), float(1.0 / slope)


def _time_device_put(src: Any, dst: Any, nbytes: int, repeats: int) -> float:
    """Median seconds to copy an `nbytes` array already on `src` to `dst` (after one warm-up)."""
    import statistics
    import time

    import jax
    import numpy as np

    x = jax.device_put(np.ones(nbytes // 4, dtype=np.float32), src)
    x.block_until_ready()
    jax.device_put(x, dst).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.device_put(x, dst).block_until_ready()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------- all-reduce

# Bytes per device `measure_all_reduce` reduces: 4 KiB to 4 MiB, latency- to bandwidth-bound.
ALL_REDUCE_PROBE_SIZES: tuple[int, ...] = (4096, 65536, 1 << 20, 4 << 20)


def all_reduce_group_sizes(n: int) -> list[int]:
    """Group sizes timed over `n` devices: 2, 4, 8, ... below n, and n itself."""
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n] if n >= 2 else []


def measure_all_reduce(devices: Sequence[Any], sizes: Sequence[int] = ALL_REDUCE_PROBE_SIZES,
                       repeats: int = 7, cache: bool = True) -> AllReduceFit | None:
    """The all-reduce fit (`fit_all_reduce`) of timed `psum`s over the first 2, 4, ... and all of
    this process's devices in `devices`; None when it has fewer than two (nothing to reduce over).

    Each point is the fastest of `repeats` calls (other work on the machine only ever adds time),
    less the fastest of the same `shard_map` without the `psum`: dispatching one executable to n
    devices, which a training step pays once, not per all-reduce. Cached on disk per machine
    (`pesto_ir.cluster.host.machine_key`) and device count.
    """
    import jax

    own = [d for d in devices if getattr(d, "process_index", 0) == jax.process_index()]
    if len(own) < 2:
        return None
    groups = all_reduce_group_sizes(len(own))
    key = f"all-reduce-v2/{machine_key(own[0])}/{len(own)}/{tuple(sizes)}/{repeats}"
    hit = cache_get("all-reduce", key) if cache else None
    if hit is not None:
        return AllReduceFit(float(hit[0]), float(hit[1]))
    points = []
    for n in groups:
        floor = _time_psum(own[:n], 4 * n, repeats, reduce=False)
        points += [(n, nbytes, max(_time_psum(own[:n], nbytes, repeats) - floor, 0.0)) for nbytes in sizes]
    fit = fit_all_reduce(points)
    if cache:
        cache_put("all-reduce", key, [fit.latency, fit.bandwidth])
    return fit


def fit_all_reduce(points: Sequence[tuple[int, float, float]]) -> AllReduceFit:
    """Least-squares `t = 2 (n - 1) latency + 2 (n - 1) / n * bytes / bandwidth` over
    (devices n, bytes per device, seconds) points: the ring model's per-step figures.

    Errors are relative, as in `fit_link`. Points of 0 s (not above the dispatch floor the
    measurement subtracts) say only that the time was too small to see, and are left out. A
    negative latency is refitted as 0 (the points say the latency is too small to see).
    """
    import numpy as np

    if not points:
        raise ClusterError("fitting the all-reduce needs measured points, got none")
    n = np.array([p[0] for p in points], dtype=float)
    nbytes = np.array([p[1] for p in points], dtype=float)
    t = np.array([p[2] for p in points], dtype=float)
    if not (np.all(np.isfinite(t)) and np.all(t >= 0) and np.all(n >= 2) and np.all(nbytes >= 0)):
        raise ClusterError("all-reduce points must be (devices >= 2, bytes >= 0, seconds finite and >= 0)")
    seen = t > 0
    if np.count_nonzero(seen) < 2:
        raise ClusterError("all-reduce measurement gave fewer than two times above the dispatch floor; "
                           "describe the all-reduce in a pesto-cluster/1 file instead")
    n, nbytes, t = n[seen], nbytes[seen], t[seen]
    steps = 2 * (n - 1)
    w = 1.0 / t
    a = np.stack([steps, steps / n * nbytes], axis=1) * w[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    if latency < 0:
        latency, (per_byte,) = 0.0, np.linalg.lstsq(a[:, 1:], t * w, rcond=None)[0]
    if not (per_byte > 0 and np.isfinite(per_byte)):
        raise ClusterError(f"all-reduce measurement gave no usable bandwidth (time per byte {per_byte:.3g} s); "
                           "describe the all-reduce in a pesto-cluster/1 file instead")
    return AllReduceFit(float(latency), float(1.0 / per_byte))


def _time_psum(devices: Sequence[Any], nbytes: int, repeats: int, reduce: bool = True) -> float:
    """The fastest of `repeats` timed calls of a jitted `shard_map` whose every device holds `nbytes` of float32 and,
    with `reduce`, sums them over all devices with `psum` (without: returns them as they are)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(list(devices)), ("replicas",))
    spec = PartitionSpec("replicas")
    body = (lambda a: jax.lax.psum(a, "replicas")) if reduce else (lambda a: a)
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
    x = jax.device_put(np.ones((len(devices), max(nbytes // 4, 1)), np.float32), NamedSharding(mesh, spec))
    return call_time(fn, [x], repeats, warmup=2, stat="min")


def measured_cluster(devices: Sequence[Any] | None = None, kind: str | None = None,
                     cache: bool = True) -> Cluster:
    """The cluster of real JAX devices (`Cluster.from_jax_devices`) with its links fitted to timed
    `jax.device_put` copies (`measure_links`, and `measure_host_link` between processes) and an
    all-reduce fit of timed `psum`s (`measure_all_reduce`); both fits are kept in the disk cache
    unless `cache=False`. One device has nothing to measure: its cluster is the datasheet's."""
    if devices is None:
        import jax

        devices = jax.devices()
    devices = list(devices)
    cluster = Cluster.from_jax_devices(devices, kind)
    if len(devices) < 2:
        return cluster
    latency, bandwidth = measure_links(devices, cache=cache)
    across = measure_host_link(devices) if len(cluster.hosts) > 1 else None
    measured = Cluster.fully_connected(cluster.devices, latency, bandwidth, across)
    return dataclasses.replace(measured, all_reduce=measure_all_reduce(devices, cache=cache),
                               calibrated_on=machine_of(devices[0]))  # the fits describe this machine
