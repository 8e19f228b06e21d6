"""The machine model: devices and the directed links between them (`pesto-cluster/1`).

A transfer of `n` bytes from device a to device b takes `latency + n / bandwidth` of link (a, b);
transfers on one directed link run one at a time. Heterogeneous clusters are the normal case:
every device carries its own speed and memory. An all-reduce over a group of devices
(data-parallel gradients) is timed as a ring (`ring_all_reduce_time`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pesto_ir.errors import PestoError
from pesto_ir.loader import brief


@dataclass(frozen=True)
class DeviceKind:
    """Datasheet figures of one accelerator model (dense FP32/TF32-class peak as used for costs)."""

    name: str
    peak_flops: float  # FLOP/s
    mem_bandwidth: float  # bytes/s
    memory: float  # bytes
    link_bandwidth: float  # bytes/s to a peer of the same kind (NVLink, or PCIe for the CPU)
    link_latency: float  # seconds


# Public datasheet figures. peak_flops is the dense bf16/fp16 tensor-core peak for GPUs (what
# training step graphs mostly run), the CPU figure is a 2-core AVX2 host like this machine.
KINDS: dict[str, DeviceKind] = {
    "cpu": DeviceKind("cpu", 1.0e11, 2.0e10, 16 * 2**30, 1.0e10, 2e-6),
    "v100": DeviceKind("v100", 125e12, 900e9, 16 * 2**30, 150e9, 1e-5),
    "a100": DeviceKind("a100", 312e12, 2039e9, 80 * 2**30, 300e9, 1e-5),
    "h100": DeviceKind("h100", 989e12, 3350e9, 80 * 2**30, 450e9, 1e-5),
    "h200": DeviceKind("h200", 989e12, 4800e9, 141 * 2**30, 450e9, 1e-5),
}


@dataclass(frozen=True)
class Device:
    name: str
    kind: str
    peak_flops: float | None  # None: not known (a custom kind whose op costs are given)
    mem_bandwidth: float | None
    memory: float
    host: int = 0  # the process (machine) the device belongs to; links across hosts are slower

    def __post_init__(self) -> None:
        if isinstance(self.host, bool) or not isinstance(self.host, int) or self.host < 0:
            raise ClusterError(f"device {self.name}: host must be a whole number >= 0 (a process index), "
                               f"got {brief(repr(self.host))}")
        for key in ("peak_flops", "mem_bandwidth", "memory"):
            v = getattr(self, key)
            if v is None and key != "memory":
                continue  # only the roofline model needs the figures; it says so when they are missing
            if not _real(v) or not v > 0:  # NaN fails `> 0`; infinite memory means no limit
                raise ClusterError(f"device {self.name}: {key} must be a positive number, got {brief(repr(v))}")

    @staticmethod
    def of_kind(name: str, kind: str, memory: float | None = None, host: int = 0) -> Device:
        k = kind_named(kind)
        return Device(name, k.name, k.peak_flops, k.mem_bandwidth, k.memory if memory is None else memory, host)


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    latency: float  # seconds
    bandwidth: float  # bytes/s

    def __post_init__(self) -> None:
        if not _real(self.latency) or not 0 <= _float(self.latency) < math.inf:
            raise ClusterError(f"link {self.src}->{self.dst}: latency must be a finite number of seconds >= 0, "
                               f"got {brief(repr(self.latency))}")
        if not _real(self.bandwidth) or not self.bandwidth > 0:
            raise ClusterError(f"link {self.src}->{self.dst}: bandwidth must be positive (bytes per second), "
                               f"got {brief(repr(self.bandwidth))}")

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


class ClusterError(PestoError):
    pass


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _float(v: Any) -> float:
    """`v` as a float as `float()` reads it (so "1e9" too); NaN, which every check refuses, for a
    boolean or anything float() cannot read; inf for an integer too large for a float."""
    if isinstance(v, bool):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
    except OverflowError:
        return math.inf


def kind_named(kind: str) -> DeviceKind:
    if not isinstance(kind, str):
        raise ClusterError(f"a device kind is a name like 'h100', got {brief(repr(kind))}")
    k = KINDS.get(kind.lower())
    if k is None:
        raise ClusterError(f"unknown device kind '{kind}' (built in: {', '.join(KINDS)}; "
                           "describe others in a pesto-cluster/1 file)")
    return k


@dataclass
class Cluster:
    """Devices plus a link for every ordered pair of distinct devices."""

    devices: list[Device]
    links: dict[tuple[str, str], Link] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [d.name for d in self.devices]
        if not names:
            raise ClusterError("a cluster needs at least one device")
        dup = next(((n, c) for n, c in Counter(names).items() if c > 1), None)
        if dup is not None:
            raise ClusterError(f"duplicate device names: '{dup[0]}' is the name of {dup[1]} devices")
        self._by_name = {d.name: d for d in self.devices}
        for a in names:
            for b in names:
                if a != b and (a, b) not in self.links:
                    raise ClusterError(f"no link from {a} to {b}")

    # ---------------------------------------------------------------- queries
    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    def __len__(self) -> int:
        return len(self.devices)

    def device(self, name: str) -> Device:
        d = self._by_name.get(name)
        if d is None:
            raise ClusterError(f"no device named '{name}' in the cluster ({', '.join(self.names)})")
        return d

    def link(self, src: str, dst: str) -> Link:
        return self.links[(src, dst)]

    def transfer_time(self, src: str, dst: str, nbytes: float) -> float:
        """Seconds to move `nbytes` from `src` to `dst` (0 on the same device)."""
        if src == dst:
            return 0.0
        return self.links[(src, dst)].time(nbytes)

    def is_homogeneous(self) -> bool:
        first = self.devices[0]
        same_dev = all((d.kind, d.peak_flops, d.mem_bandwidth, d.memory) ==
                       (first.kind, first.peak_flops, first.mem_bandwidth, first.memory) for d in self.devices)
        ls = {(lk.latency, lk.bandwidth) for lk in self.links.values()}
        return same_dev and len(ls) <= 1

    # ---------------------------------------------------------------- builders
    @staticmethod
    def homogeneous(n: int, kind: str = "v100", memory: float | None = None,
                    latency: float | None = None, bandwidth: float | None = None, prefix: str | None = None) -> Cluster:
        """`n` devices of one built-in kind, fully connected by identical links."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise ClusterError(f"the number of devices (--devices) must be a whole number, got {brief(repr(n))}")
        if n < 1:
            raise ClusterError(f"--devices must be at least 1, got {n}")
        _check_size(n)
        k = kind_named(kind)
        prefix = prefix or ("cpu" if k.name == "cpu" else "gpu")
        devices = [Device.of_kind(f"{prefix}{i}", k.name, memory) for i in range(n)]
        return Cluster.fully_connected(devices, k.link_latency if latency is None else latency,
                                       k.link_bandwidth if bandwidth is None else bandwidth)

    @staticmethod
    def fully_connected(devices: Sequence[Device], latency: float, bandwidth: float,
                        across_hosts: tuple[float, float] | None = None) -> Cluster:
        """A link of `latency` and `bandwidth` between every two devices; between devices of
        different hosts, of `across_hosts` (latency, bandwidth) when given."""
        def link(a: Device, b: Device) -> Link:
            if across_hosts is not None and a.host != b.host:
                return Link(a.name, b.name, *across_hosts)
            return Link(a.name, b.name, latency, bandwidth)

        links = {(a.name, b.name): link(a, b) for a in devices for b in devices if a.name != b.name}
        return Cluster(list(devices), links)

    @property
    def hosts(self) -> list[int]:
        """The hosts (processes) the devices belong to, in order of first appearance."""
        return list(dict.fromkeys(d.host for d in self.devices))

    # ---------------------------------------------------------------- pesto-cluster/1
    def to_json(self) -> dict[str, Any]:
        return {
            "format": "pesto-cluster/1",
            "devices": [{"name": d.name, "kind": d.kind, "memory": d.memory,
                         **{k: getattr(d, k) for k in ("peak_flops", "mem_bandwidth") if getattr(d, k) is not None},
                         **({"host": d.host} if d.host else {})}
                        for d in self.devices],
            "links": [{"src": lk.src, "dst": lk.dst, "latency": lk.latency, "bandwidth": lk.bandwidth}
                      for lk in self.links.values()],
        }

    @staticmethod
    def from_json(data: dict[str, Any], source: str = "<cluster>") -> Cluster:
        def bad(msg: str) -> ClusterError:
            return ClusterError(f"{source}: {msg}")

        if not isinstance(data, dict) or data.get("format") != "pesto-cluster/1":
            raise bad("not a pesto-cluster/1 document (its \"format\" must be \"pesto-cluster/1\")")
        raw_devices = data.get("devices")
        if not isinstance(raw_devices, list) or not raw_devices:
            raise bad("\"devices\" must be a non-empty list")
        _check_size(len(raw_devices), source + ": ")
        devices = [_device_from_json(i, d, source) for i, d in enumerate(raw_devices)]
        index: dict[str, int] = {}
        for i, d in enumerate(devices):
            if d.name in index:
                raise bad(f"duplicate device names: devices[{index[d.name]}] and devices[{i}] are both '{d.name}'")
            index[d.name] = i
        default, raw_links = data.get("link") or {}, data.get("links") or []
        across = data.get("host_link")
        if not isinstance(default, dict):
            raise bad("\"link\" must be an object {\"latency\": seconds, \"bandwidth\": bytes per second}")
        if across is not None and not isinstance(across, dict):
            raise bad("\"host_link\" must be an object {\"latency\": seconds, \"bandwidth\": bytes per second}")
        if not isinstance(raw_links, list):
            raise bad("\"links\" must be a list of {\"src\", \"dst\", \"latency\", \"bandwidth\"} objects")
        first_kind = KINDS.get(devices[0].kind.lower())
        lat0 = _link_figure(default, "latency", first_kind.link_latency if first_kind else 1e-5, bad, "link")
        bw0 = _link_figure(default, "bandwidth", first_kind.link_bandwidth if first_kind else 1e10, bad, "link")
        lat1 = _link_figure(across, "latency", lat0, bad, "host_link") if across is not None else lat0
        bw1 = _link_figure(across, "bandwidth", bw0, bad, "host_link") if across is not None else bw0
        links: dict[tuple[str, str], Link] = {}
        for a in devices:
            for b in devices:
                if a.name != b.name:
                    links[(a.name, b.name)] = (Link(a.name, b.name, lat0, bw0) if a.host == b.host
                                               else Link(a.name, b.name, lat1, bw1))
        for i, lk in enumerate(raw_links):
            where = f"links[{i}]"
            if not isinstance(lk, dict):
                raise bad(f"{where}: a link is an object with src, dst, latency, bandwidth")
            src, dst = lk.get("src"), lk.get("dst")
            for end, name in (("src", src), ("dst", dst)):
                if not isinstance(name, str) or name not in index:
                    raise bad(f"{where}: {end} {brief(repr(name))} is not a device name (devices: {', '.join(index)})")
            if src == dst:
                raise bad(f"{where}: src and dst are both '{src}'; a link joins two different devices")
            links[(src, dst)] = Link(src, dst, _link_figure(lk, "latency", lat0, bad, where),
                                     _link_figure(lk, "bandwidth", bw0, bad, where))
        return Cluster(devices, links)

    @staticmethod
    def load(path: str | Path) -> Cluster:
        if not isinstance(path, (str, os.PathLike)):
            raise ClusterError(f"Cluster.load() takes a file path, got {type(path).__name__}")
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise ClusterError(f"{path}: cannot read cluster file: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ClusterError(f"{path}: cluster file is not UTF-8 text ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise ClusterError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
        except RecursionError:
            raise ClusterError(f"{path}: JSON nested deeper than Python can parse") from None
        except ValueError as e:  # an integer literal longer than Python converts (4300 digits)
            raise ClusterError(f"{path}: invalid JSON: {e}") from None
        return Cluster.from_json(data, str(path))

    def with_memory(self, memory: float) -> Cluster:
        """The same cluster with every device's capacity set to `memory` bytes (`inf`: no limit)."""
        if not _real(memory) or not memory > 0:
            raise ClusterError(f"memory must be a positive number of bytes, got {brief(repr(memory))}")
        devices = [dataclasses.replace(d, memory=memory) for d in self.devices]
        return Cluster(devices, dict(self.links))

    # ---------------------------------------------------------------- real JAX devices
    @staticmethod
    def from_jax_devices(devices: Sequence[Any] | None = None, kind: str | None = None,
                         measure: bool = False) -> Cluster:
        """The cluster of real JAX devices (default `jax.devices()`), in their order.

        Each device is named by platform and id (`cpu0`, `gpu3`); its figures come from the
        built-in kind (`kind`, or read off the device), its memory from the device when JAX
        reports a limit. Links get the kind's datasheet figures, or with `measure=True` figures
        fitted to timed `jax.device_put` copies (see `measure_links`).
        """
        if devices is None:
            import jax

            devices = jax.devices()
        devices = list(devices)
        if not devices:
            raise ClusterError("no JAX devices to build a cluster from")
        k = kind_named(kind) if kind is not None else kind_named(jax_device_kind(devices[0]))
        out = [Device.of_kind(f"{_platform_prefix(d)}{d.id}", k.name, _jax_memory_limit(d),
                              int(getattr(d, "process_index", 0))) for d in devices]
        latency, bandwidth = k.link_latency, k.link_bandwidth
        across = HOST_LINK if len({d.host for d in out}) > 1 else None
        if measure and len(devices) > 1:
            latency, bandwidth = measure_links(devices)
            if across is not None:
                across = measure_host_link(devices)
        return Cluster.fully_connected(out, latency, bandwidth, across)


def ring_all_reduce_time(cluster: Cluster, group: Sequence[str], nbytes: int) -> float:
    """Seconds to all-reduce `nbytes` (per device) over the devices of `group` with a ring.

    The ring is `group[i] -> group[(i + 1) % n]`. A ring all-reduce is a reduce-scatter then an
    all-gather: 2 (n - 1) steps, in each of which every device sends one chunk of `nbytes / n`
    bytes to its successor, all ring links at once; a step ends when its slowest link is done:

        2 (n - 1) * max over ring links of (latency + (nbytes / n) / bandwidth)

    It is bandwidth-optimal (each device sends 2 (n - 1) / n of the data, independent of n for
    large n), at a latency of 2 (n - 1) link latencies. One device needs no communication: 0.
    """
    if isinstance(group, str) or not isinstance(group, Sequence):
        raise ClusterError(f"an all-reduce group is a list of device names, got {brief(repr(group))}")
    names = list(group)
    if not names:
        raise ClusterError("an all-reduce group needs at least one device")
    for name in names:
        if not isinstance(name, str):
            raise ClusterError(f"an all-reduce group names devices by their names, got {brief(repr(name))}")
        cluster.device(name)  # unknown device: ClusterError naming it and the cluster's devices
    dup = next((n for n, c in Counter(names).items() if c > 1), None)
    if dup is not None:
        raise ClusterError(f"device {dup} is in the all-reduce group {names} more than once")
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
        raise ClusterError(f"an all-reduce moves a whole number of bytes >= 0, got {brief(repr(nbytes))}")
    n = len(names)
    if n == 1:
        return 0.0
    chunk = nbytes / n
    step = max(cluster.transfer_time(names[i], names[(i + 1) % n], chunk) for i in range(n))
    return 2 * (n - 1) * step


# JAX `device_kind` text -> built-in kind; the first pattern found in the lower-cased text wins.
JAX_KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    ("h200", "h200"),
    ("h100", "h100"),
    ("a100", "a100"),
    ("v100", "v100"),
)


def jax_device_kind(device: Any) -> str:
    """The built-in kind of a JAX device: `cpu` for host devices, else matched on `device_kind`."""
    if device.platform == "cpu":
        return "cpu"
    text = str(device.device_kind).lower()
    for pattern, kind in JAX_KIND_PATTERNS:
        if pattern in text:
            return kind
    raise ClusterError(f"JAX device {device} ('{device.device_kind}') is not a built-in kind "
                       f"({', '.join(KINDS)}); pass a kind or describe it in a pesto-cluster/1 file")


def _platform_prefix(device: Any) -> str:
    return {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu"}.get(device.platform, device.platform)


def _jax_memory_limit(device: Any) -> float | None:
    """The device's memory in bytes when JAX knows it (GPUs do, host devices do not)."""
    try:
        stats = device.memory_stats()
    except Exception:  # backends without memory statistics raise various errors
        return None
    limit = (stats or {}).get("bytes_limit")
    return float(limit) if limit else None


# Transfer sizes `measure_links` times: 4 KiB to 16 MiB, enough to separate latency from bandwidth.
LINK_PROBE_SIZES: tuple[int, ...] = tuple(4096 * 4**i for i in range(7))
# (latency s, bandwidth B/s) between devices of different hosts when not measured: a 100 Gb/s
# network (Ethernet or InfiniBand HDR class), slower than any link within a host.
HOST_LINK: tuple[float, float] = (2e-5, 12.5e9)


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

    from pesto_ir.backends.cross_process import copy, is_local
    from pesto_ir.distributed import shared_text

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
    platform, device kind and device count, since it only changes with the machine.
    """
    from pesto_ir.diskcache import cache_get, cache_put

    if len(devices) < 2:
        raise ClusterError("measuring links needs at least two devices")
    import jax

    own = [d for d in devices if getattr(d, "process_index", 0) == jax.process_index()]  # devices of other
    a, b = own[:2] if len(own) >= 2 else devices[:2]  # processes are not this process's to time
    key = f"links-v2/{a.platform}/{a.device_kind}/{len(devices)}/{tuple(sizes)}"
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


MAX_DEVICES = 512  # 1024 devices already take 6 s just to build their million links


def _check_size(n: int, where: str = "") -> None:
    """Refuse clusters too big to plan: every pair of devices has a link, and every op is tried on
    every device, so planning grows with n squared."""
    if n > MAX_DEVICES:
        raise ClusterError(f"{where}a cluster of {n} devices is more than Pesto plans ({MAX_DEVICES}): it models "
                           "a link between every pair of devices and tries every op on every device")


def _device_from_json(i: int, d: Any, source: str) -> Device:
    """One entry of a pesto-cluster/1 "devices" list; built-in kinds fill in missing figures."""
    if not isinstance(d, dict) or not isinstance(d.get("name"), str):
        raise ClusterError(f"{source}: devices[{i}] needs a string \"name\"")
    kind = str(d.get("kind", "cpu"))
    base = KINDS.get(kind.lower())

    def num(key: str, required: bool = True) -> float | None:
        v = d.get(key, getattr(base, key) if base is not None else None)
        if v is None and not required:
            return None  # a custom kind: the roofline model will ask for it, given costs do not
        if v is None:
            raise ClusterError(f"{source}: devices[{i}] ({d['name']}): kind '{kind}' is not built in, "
                               f"so \"{key}\" is required")
        v = _float(v)
        if not math.isfinite(v) or v <= 0:
            raise ClusterError(f"{source}: devices[{i}] ({d['name']}): \"{key}\" must be a positive number")
        return v

    host = d.get("host", 0)
    if isinstance(host, bool) or not isinstance(host, int) or host < 0:
        raise ClusterError(f"{source}: devices[{i}] ({d['name']}): \"host\" must be a whole number >= 0 "
                           f"(the process the device belongs to), got {brief(repr(host))}")
    return Device(d["name"], kind, num("peak_flops", required=False), num("mem_bandwidth", required=False),
                  num("memory"), host)


def _link_figure(obj: dict[str, Any], key: str, default: float, bad: Any, where: str) -> float:
    """`latency` (finite, >= 0) or `bandwidth` (finite, > 0) of a link object, else `default`."""
    raw = obj.get(key, default)
    v = _float(raw)
    if not math.isfinite(v) or v < 0 or (key == "bandwidth" and v == 0):
        want = "a finite number of seconds >= 0" if key == "latency" else "positive and finite (bytes per second)"
        raise bad(f"{where}: {key} must be {want}, got {brief(repr(raw))}")
    return v
