"""The machine model: a cluster of devices (`devices.py`) and the directed links between them
(`pesto-cluster/1`).

A transfer of `n` bytes from device a to device b takes `latency + n / bandwidth` of link (a, b);
transfers on one directed link run one at a time. Heterogeneous clusters are the normal case:
every device carries its own speed and memory. An all-reduce over a group of devices
(data-parallel gradients) is timed as a ring (`ring_all_reduce_time`).

Calibrated figures are optional: per device a kernel launch overhead and the fraction of the
datasheet roofline each op family reaches (`bench/calibrate.py` measures them), per cluster a
fitted per-step cost of the runtime's own all-reduce (`AllReduceFit`).
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pesto_ir.cluster.devices import KINDS, Device, Link, kind_named
from pesto_ir.cluster.figures import AllReduceFit, ClusterError, is_real, out_of_range
from pesto_ir.cluster.host import Machine, machine_from_json
from pesto_ir.cluster.json_fields import all_reduce_from_json, device_from_json, link_figure
from pesto_ir.util.gc_pause import gc_paused
from pesto_ir.util.loader import CLUSTER_LIMIT, UnreadableFile, brief, check_text_file, finite, read_text_file


def suggestion_problem(hint: Any) -> str | None:
    """Why a graph's `suggested_cluster` hint (from JSON or `.pir` text) is unusable, or None:
    an object whose `devices`, when given, is a whole number >= 1 and whose `memory`, when given,
    a positive finite number of bytes."""
    if not isinstance(hint, Mapping):
        return f"must be an object like {{devices: 4, memory: 8e10}}, got {brief(repr(hint))}"
    devices, memory = finite(hint.get("devices", 1)), finite(hint.get("memory", 1))
    if devices is None or devices < 1 or devices != int(devices):
        return f"devices must be a whole number >= 1, got {brief(repr(hint['devices']))}"
    if memory is None or memory <= 0:
        return f"memory must be a positive number of bytes, got {brief(repr(hint['memory']))}"
    return None


@dataclass
class Cluster:
    """Devices plus a link for every ordered pair of distinct devices."""

    devices: list[Device]
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    all_reduce: AllReduceFit | None = None  # measured all-reduce within one host (`ring_all_reduce_time`)
    calibrated_on: Machine | None = None  # the machine the calibrated figures were measured on (`pesto_ir.cluster.host`)

    def __post_init__(self) -> None:
        if self.all_reduce is not None and not isinstance(self.all_reduce, AllReduceFit):
            raise ClusterError(f"a cluster's all_reduce is an AllReduceFit or None, got {brief(repr(self.all_reduce))}")
        try:  # checked as a file's is, and kept as a read-only copy: derived clusters share it
            fields = machine_from_json(dict(self.calibrated_on) if isinstance(self.calibrated_on, Mapping)
                                       else self.calibrated_on)
        except ValueError as e:
            raise ClusterError(f"a cluster's calibrated_on {e}") from None
        self.calibrated_on = MappingProxyType(fields) if fields is not None else None
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

        def figures(d: Device) -> tuple[Any, ...]:
            return d.kind, d.peak_flops, d.mem_bandwidth, d.memory, d.launch_overhead, d.efficiency, d.setup

        same_dev = all(figures(d) == figures(first) for d in self.devices)
        ls = {(lk.latency, lk.bandwidth) for lk in self.links.values()}
        return same_dev and len(ls) <= 1

    # ---------------------------------------------------------------- builders
    @staticmethod
    def homogeneous(n: int, kind: str = "v100", memory: float | None = None,
                    latency: float | None = None, bandwidth: float | None = None, prefix: str | None = None,
                    devices_per_host: int | None = None, host_link: tuple[float, float] | None = None) -> Cluster:
        """`n` devices of one built-in kind, fully connected by identical links.

        With `devices_per_host` p, the devices are n / p nodes (hosts 0, 1, ...) of p devices each,
        device i on host i // p, as a multi-node training cluster is: links within a node are the
        kind's (NVLink for GPUs, or `latency` and `bandwidth`), links across nodes `host_link`
        (latency s, bandwidth B/s), by default the kind's network between nodes (`NODE_LINKS`).
        Devices keep one numbering across nodes (`gpu0` .. `gpu{n-1}`), so plans name them as for
        one node."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise ClusterError(f"the number of devices must be a whole number, got {brief(repr(n))}")
        if n < 1:
            raise ClusterError(f"the number of devices must be at least 1, got {n}")
        _check_size(n)
        per_host = _check_per_host(n, devices_per_host, host_link)
        k = kind_named(kind)
        prefix = prefix or ("cpu" if k.name == "cpu" else "gpu")
        devices = [Device.of_kind(f"{prefix}{i}", k.name, memory, i // per_host) for i in range(n)]
        across = None if devices_per_host is None else host_link if host_link is not None else NODE_LINKS[k.name]
        return Cluster.fully_connected(devices, k.link_latency if latency is None else latency,
                                       k.link_bandwidth if bandwidth is None else bandwidth,
                                       None if across is None else (across[0], across[1]))

    @staticmethod
    def fully_connected(devices: Sequence[Device], latency: float, bandwidth: float,
                        across_hosts: tuple[float, float] | None = None) -> Cluster:
        """A link of `latency` and `bandwidth` between every two devices; between devices of
        different hosts, of `across_hosts` (latency, bandwidth) when given."""
        devices = list(devices)
        return Cluster(devices, _pair_links(devices, (latency, bandwidth), across_hosts))

    @property
    def hosts(self) -> list[int]:
        """The hosts (processes) the devices belong to, in order of first appearance."""
        return list(dict.fromkeys(d.host for d in self.devices))

    # ---------------------------------------------------------------- pesto-cluster/1
    def to_json(self) -> dict[str, Any]:
        """The cluster as pesto-cluster/1; calibrated figures only when set, so that files without
        them write back as they were. Links are written as `link` and `host_link` (see
        `_links_to_json`), so that 512 devices take 70 KB, not 20 MB of pairs."""
        out: dict[str, Any] = {
            "format": "pesto-cluster/1",
            "devices": [{"name": d.name, "kind": d.kind, "memory": d.memory,
                         **{k: getattr(d, k) for k in ("peak_flops", "mem_bandwidth") if getattr(d, k) is not None},
                         **({"host": d.host} if d.host else {}),
                         **({"launch_overhead": d.launch_overhead} if d.launch_overhead is not None else {}),
                         **({"efficiency": dict(d.efficiency)} if d.efficiency else {}),
                         **({"setup": dict(d.setup)} if d.setup else {})}
                        for d in self.devices],
            **self._links_to_json(),
        }
        if self.all_reduce is not None:
            out["all_reduce"] = {"latency": self.all_reduce.latency, "bandwidth": self.all_reduce.bandwidth}
        if self.calibrated_on is not None:
            out["calibrated_on"] = dict(self.calibrated_on)
        return out

    def _links_to_json(self) -> dict[str, Any]:
        """`link`: the figures most pairs within a host have (or, with one device per host, most
        pairs); `host_link`: those most pairs across hosts have, when they differ; `links`: each
        pair whose figures differ from the one of these it would get. `from_json` builds every pair
        back as it was."""
        host = {d.name: d.host for d in self.devices}
        # (across hosts?, latency, bandwidth) of every pair; None for a pair naming no device
        counts = Counter((host[a] != host[b], lk.latency, lk.bandwidth) if a in host and b in host else None
                         for (a, b), lk in self.links.items())
        ranked = [key for key, _ in counts.most_common() if key is not None]
        within = next((key[1:] for key in ranked if not key[0]), None)
        across = next((key[1:] for key in ranked if key[0]), None)
        link = within or across
        if link is None:
            return {}  # one device: no pairs
        default = (link, across or link)
        out: dict[str, Any] = {"link": {"latency": link[0], "bandwidth": link[1]}}
        if across is not None and across != link:
            out["host_link"] = {"latency": across[0], "bandwidth": across[1]}
        if len(counts) > (within is not None) + (across is not None):  # some pairs differ from their default
            out["links"] = [{"src": a, "dst": b, "latency": lk.latency, "bandwidth": lk.bandwidth}
                            for (a, b), lk in self.links.items()
                            if a not in host or b not in host
                            or (lk.latency, lk.bandwidth) != default[host[a] != host[b]]]
        return out

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
        devices = [device_from_json(i, d, source) for i, d in enumerate(raw_devices)]
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
        first_kind = KINDS.get(devices[0].kind)  # a Device's kind is its `kind_key`
        lat0 = link_figure(default, "latency", first_kind.link_latency if first_kind else 1e-5, bad, "link")
        bw0 = link_figure(default, "bandwidth", first_kind.link_bandwidth if first_kind else 1e10, bad, "link")
        lat1 = link_figure(across, "latency", lat0, bad, "host_link") if across is not None else lat0
        bw1 = link_figure(across, "bandwidth", bw0, bad, "host_link") if across is not None else bw0
        links = _pair_links(devices, (lat0, bw0), (lat1, bw1))
        for i, lk in enumerate(raw_links):
            where = f"links[{i}]"
            if not isinstance(lk, dict):
                raise bad(f"{where}: a link is an object with src, dst, latency, bandwidth")
            src, dst = lk.get("src"), lk.get("dst")
            for end, name in (("src", src), ("dst", dst)):
                if not isinstance(name, str) or name not in index:
                    raise bad(f"{where}: {end} {brief(repr(name))} is not a device name (devices: {', '.join(index)})")
            assert isinstance(src, str) and isinstance(dst, str)  # checked just above
            if src == dst:
                raise bad(f"{where}: src and dst are both '{src}'; a link joins two different devices")
            links[(src, dst)] = Link(src, dst, link_figure(lk, "latency", lat0, bad, where),
                                     link_figure(lk, "bandwidth", bw0, bad, where))
        try:
            calibrated_on = machine_from_json(data.get("calibrated_on"))
        except ValueError as e:
            raise bad(f"calibrated_on: {e}") from None
        return Cluster(devices, links, all_reduce_from_json(data.get("all_reduce"), bad), calibrated_on)

    @staticmethod
    def load(path: str | Path) -> Cluster:
        if not isinstance(path, (str, os.PathLike)):
            raise ClusterError(f"Cluster.load() takes a file path, got {type(path).__name__}")
        try:
            data = json.loads(read_text_file(path, CLUSTER_LIMIT, "cluster file"))
        except UnreadableFile as e:
            raise ClusterError(f"{path}: {e}") from None
        except json.JSONDecodeError as e:
            raise ClusterError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
        except RecursionError:
            raise ClusterError(f"{path}: JSON nested deeper than Python can parse") from None
        except ValueError as e:  # an integer literal longer than Python converts (4300 digits)
            raise ClusterError(f"{path}: invalid JSON: {e}") from None
        return Cluster.from_json(data, str(path))

    @staticmethod
    def check_file(path: str | Path) -> None:
        """Refuse now what `load` would refuse before reading a byte (`check_text_file`): a command
        checks its file arguments before any work."""
        try:
            check_text_file(path, CLUSTER_LIMIT, "cluster file")
        except UnreadableFile as e:
            raise ClusterError(f"{path}: {e}") from None

    def with_memory(self, memory: float) -> Cluster:
        """The same cluster with every device's capacity set to `memory` bytes (`inf`: no limit)."""
        if not is_real(memory) or not memory > 0:
            raise ClusterError(f"memory must be a positive number of bytes, got {brief(repr(memory))}")
        if (why := out_of_range("memory", memory)) is not None:
            raise ClusterError(why)
        return dataclasses.replace(self, devices=[dataclasses.replace(d, memory=memory) for d in self.devices],
                                   links=dict(self.links))

    # ---------------------------------------------------------------- real JAX devices
    @staticmethod
    def from_jax_devices(devices: Sequence[Any] | None = None, kind: str | None = None) -> Cluster:
        """The cluster of real JAX devices (default `jax.devices()`), in their order.

        Each device is named by platform and id (`cpu0`, `gpu3`); its figures come from the
        built-in kind (`kind`, or read off the device), its memory from the device when JAX
        reports a limit, its links from the kind's datasheet. Figures fitted to timed copies and
        all-reduces instead: `pesto_ir.jaxrt.measure_collectives.measured_cluster`.
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
        across = HOST_LINK if len({d.host for d in out}) > 1 else None
        return Cluster.fully_connected(out, k.link_latency, k.link_bandwidth, across)


def ring_all_reduce_time(cluster: Cluster, group: Sequence[str], nbytes: int) -> float:
    """Seconds to all-reduce `nbytes` (per device) over the devices of `group` with a ring
    (`ring_time` with both of its phases)."""
    return ring_time(cluster, group, nbytes, phases=2)


def ring_time(cluster: Cluster, group: Sequence[str], nbytes: int, phases: int) -> float:
    """Seconds for `phases` ring phases over the devices of `group`, on `nbytes` per device: 2 for
    an all-reduce, 1 for a reduce-scatter or an all-gather (`nbytes` the whole value, not a block).

    The ring is `group[i] -> group[(i + 1) % n]`. A ring all-reduce is a reduce-scatter then an
    all-gather: 2 (n - 1) steps, in each of which every device sends one chunk of `nbytes / n`
    bytes to its successor, all ring links at once; a step ends when its slowest link is done:

        phases (n - 1) * max over ring links of (latency + (nbytes / n) / bandwidth)

    It is bandwidth-optimal (each device sends 2 (n - 1) / n of the data, independent of n for
    large n), at a latency of 2 (n - 1) link latencies. One device needs no communication: 0.

    With a measured fit (`cluster.all_reduce`) and every device of the group on one host, a step
    costs `fit.latency + (nbytes / n) / fit.bandwidth` instead: the all-reduce then runs through
    the runtime's own collective (XLA's, NCCL's), whose per-step cost is not that of a
    point-to-point copy (`jax.device_put`) the links are fitted to.
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
    fit = cluster.all_reduce
    if fit is not None and len({cluster.device(name).host for name in names}) == 1:
        return phases * (n - 1) * (fit.latency + chunk / fit.bandwidth)
    step = max(cluster.transfer_time(names[i], names[(i + 1) % n], chunk) for i in range(n))
    return phases * (n - 1) * step


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
    platform: str = device.platform
    return {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu"}.get(platform, platform)


def _jax_memory_limit(device: Any) -> float | None:
    """The device's memory in bytes when JAX knows it (GPUs do, host devices do not)."""
    try:
        stats = device.memory_stats()
    except Exception:  # backends without memory statistics raise various errors
        return None
    limit = (stats or {}).get("bytes_limit")
    return float(limit) if limit else None


# (latency s, bandwidth B/s) between devices of different hosts when not measured: a 100 Gb/s
# network (Ethernet or InfiniBand HDR class), slower than any link within a host.
HOST_LINK: tuple[float, float] = (2e-5, 12.5e9)

# (latency s, bandwidth B/s) between two devices of different nodes of `Cluster.homogeneous(...,
# devices_per_host=p)` when not given, per built-in kind: the InfiniBand of NVIDIA's DGX node of
# that generation, where each GPU has its own network port (DGX-1V: four 100 Gb/s EDR ports for 8
# GPUs, so 50 Gb/s each). A link is one pair's: 8 GPUs sending to 8 others at once each get it.
NODE_LINKS: dict[str, tuple[float, float]] = {
    "cpu": HOST_LINK,
    "v100": (2e-5, 6.25e9),  # DGX-1V: 4 x 100 Gb/s EDR for 8 GPUs
    "a100": (2e-5, 25e9),  # DGX A100: 8 x 200 Gb/s HDR (ConnectX-6), one per GPU
    "h100": (2e-5, 50e9),  # DGX H100: 8 x 400 Gb/s NDR (ConnectX-7), one per GPU
    "h200": (2e-5, 50e9),  # DGX H200: the same network as the DGX H100
}


def _check_per_host(n: int, per_host: int | None, host_link: Any) -> int:
    """The devices per host of `Cluster.homogeneous` (n when not given): a whole number that
    divides n; `host_link` only with it, a (latency, bandwidth) pair (its figures are checked as
    every link's are)."""
    if per_host is None:
        if host_link is not None:
            raise ClusterError("host_link is the link between hosts: give devices_per_host too")
        return n
    if isinstance(per_host, bool) or not isinstance(per_host, int):
        raise ClusterError(f"the devices per host must be a whole number, got {brief(repr(per_host))}")
    if per_host < 1:
        raise ClusterError(f"the devices per host must be at least 1, got {per_host}")
    if n % per_host:
        raise ClusterError(f"{n} devices do not make whole hosts of {per_host} devices: "
                           "the devices per host must divide the number of devices")
    if host_link is not None and (isinstance(host_link, (str, bytes)) or not isinstance(host_link, Sequence)
                                  or len(host_link) != 2):
        raise ClusterError("host_link is a pair (latency in seconds, bandwidth in bytes per second), "
                           f"got {brief(repr(host_link))}")
    return per_host


def _pair_links(devices: Sequence[Device], within: tuple[float, float],
               across: tuple[float, float] | None) -> dict[tuple[str, str], Link]:
    """A link for every ordered pair of distinct devices: `within` (latency, bandwidth) between
    devices of one host, `across` (default `within`) between hosts.

    Each of the two figures is checked once, by a `Link` made for the first pair that takes it
    (its error names that pair); the other links are copies of it under their own names, made
    without the checks and with the garbage collector paused: 512 devices have 261,632 links,
    which took 0.6 s to build one checked `Link` at a time."""
    devices = list(devices)
    figures = (within, across if across is not None else within)
    by_host: dict[int, list[Device]] = {}
    for d in devices:
        by_host.setdefault(d.host, []).append(d)
    if len(devices) > 1:  # figures given are checked even when no pair takes them (one device per host)
        one_host = next((ds[:2] for ds in by_host.values() if len(ds) > 1), devices[:2])
        Link(one_host[0].name, one_host[1].name, *figures[0])
        hosts = [ds[0] for ds in by_host.values()][:2]
        two_hosts = hosts if len(hosts) == 2 else devices[:2]
        Link(two_hosts[0].name, two_hosts[1].name, *figures[1])
    links: dict[tuple[str, str], Link] = {}
    new = object.__new__
    with gc_paused():
        for a in devices:
            src, host = a.name, a.host
            for b in devices:
                if b.name != src:
                    latency, bandwidth = figures[b.host != host]
                    lk = new(Link)
                    lk.__dict__.update(src=src, dst=b.name, latency=latency, bandwidth=bandwidth)  # frozen: no setattr
                    links[(src, b.name)] = lk
    return links


MAX_DEVICES = 512  # 1024 devices take 1.5 s just to build their million links (512: 0.3 s), 6 s before `_pair_links`


def _check_size(n: int, where: str = "") -> None:
    """Refuse clusters too big to plan: every pair of devices has a link, and every op is tried on
    every device, so planning grows with n squared."""
    if n > MAX_DEVICES:
        raise ClusterError(f"{where}a cluster of {n} devices is more than Pesto plans ({MAX_DEVICES}): it models "
                           "a link between every pair of devices and tries every op on every device")

