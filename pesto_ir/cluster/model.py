"""The machine model: devices and the directed links between them (`pesto-cluster/1`).

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
import math
import numbers
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pesto_ir.cluster.figures import AllReduceFit, is_real, out_of_range
from pesto_ir.cluster.figures import ClusterError as ClusterError  # re-exported: where callers import it from
from pesto_ir.cluster.host import Machine, machine_from_json
from pesto_ir.util.loader import brief, finite

MAX_HOST = (1 << 20) - 1  # a process index; a larger one is a broken file, not a machine


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


# Op families the roofline model tells apart (`pesto_ir.cost.roofline.op_family`); a device may reach a
# different fraction of its datasheet roofline in each (`Device.efficiency`). `matmul_weight_grad`:
# matmuls that contract their left operand over leading dimensions, as a weight gradient x^T dy
# does (XLA's CPU backend relayouts them and runs them on another library); `conv_filter_grad`:
# convolutions whose window is larger than their output, as the gradient of a convolution's kernel
# is (cuDNN's "backward filter"); `window`: pooling (`reduce_window`) and the max-pool gradient
# (`select_and_scatter_add`), a loop over every window; `scatter`: read-modify-write at computed
# indices, serial loops on a CPU, atomics on a GPU.
OP_FAMILIES: tuple[str, ...] = ("matmul", "matmul_weight_grad", "conv", "conv_filter_grad", "elementwise",
                                "reduction", "window", "scatter", "movement", "other")
# A gradient family a device has no figure for takes its forward family's (files calibrated before
# the split, or with too few such kernels to time, still cost them as what they are).
PARENT_FAMILY: dict[str, str] = {"matmul_weight_grad": "matmul", "conv_filter_grad": "conv"}


def family_efficiency(figures: Mapping[str, float], family: str) -> float:
    """`family`'s figure in `figures`, else its `PARENT_FAMILY`'s, else 1.0 (not calibrated)."""
    return family_figure(figures, family, 1.0)


def family_figure(figures: Mapping[str, float], family: str, default: float) -> float:
    """`family`'s figure in `figures`, else its `PARENT_FAMILY`'s, else `default`."""
    return figures.get(family, figures.get(PARENT_FAMILY.get(family, family), default))


@dataclass(frozen=True)
class Device:
    name: str
    kind: str
    peak_flops: float | None  # None: not known (a custom kind whose op costs are given)
    mem_bandwidth: float | None
    memory: float
    host: int = 0  # the process (machine) the device belongs to; links across hosts are slower
    launch_overhead: float | None = None  # measured seconds per kernel launch; None: the kind's default
    # (op family, fraction of the roofline it reaches), sorted by family; a mapping is accepted too.
    efficiency: tuple[tuple[str, float], ...] = ()
    # (op family, seconds each of its kernels takes beyond the launch whatever its size): a library
    # kernel's fixed work (a convolution's packing and workspace), measured; sorted like `efficiency`.
    setup: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        for key in ("efficiency", "setup"):
            if isinstance(getattr(self, key), Mapping):
                object.__setattr__(self, key, tuple(getattr(self, key).items()))
        _check_calibration(f"device {self.name}", self.launch_overhead, self.efficiency, self.setup)
        # sorted pairs: hashable, and equal devices compare equal whatever order the families came in
        object.__setattr__(self, "efficiency", tuple(sorted(self.efficiency)))
        object.__setattr__(self, "setup", tuple(sorted(self.setup)))
        if isinstance(self.host, bool) or not isinstance(self.host, int) or not 0 <= self.host <= MAX_HOST:
            raise ClusterError(f"device {self.name}: host must be a whole number from 0 to {MAX_HOST} (a process index), "
                               f"got {brief(repr(self.host))}")
        for key in ("peak_flops", "mem_bandwidth", "memory"):
            v = getattr(self, key)
            if v is None and key != "memory":
                continue  # only the roofline model needs the figures; it says so when they are missing
            if not is_real(v) or not v > 0:  # NaN fails `> 0`; infinite memory means no limit
                raise ClusterError(f"device {self.name}: {key} must be a positive number, got {brief(repr(v))}")
            if (why := out_of_range(key, v)) is not None:
                raise ClusterError(f"device {self.name}: {why}")

    @staticmethod
    def of_kind(name: str, kind: str, memory: float | None = None, host: int = 0) -> Device:
        k = kind_named(kind)
        return Device(name, k.name, k.peak_flops, k.mem_bandwidth, k.memory if memory is None else memory, host)

    def efficiency_for(self, family: str) -> float:
        """The fraction of the roofline ops of `family` reach here (roofline time is divided by
        it): the family's figure, else its `PARENT_FAMILY`'s, else 1.0 (not calibrated)."""
        if family not in OP_FAMILIES:
            raise ClusterError(f"unknown op family '{family}' (op families: {', '.join(OP_FAMILIES)})")
        return family_efficiency(dict(self.efficiency), family)

    def setup_for(self, family: str) -> float:
        """Seconds each kernel of `family` takes here beyond its launch and its roofline time: the
        family's figure, else its `PARENT_FAMILY`'s, else 0 (none measured)."""
        if family not in OP_FAMILIES:
            raise ClusterError(f"unknown op family '{family}' (op families: {', '.join(OP_FAMILIES)})")
        return family_figure(dict(self.setup), family, 0.0)


def _check_calibration(who: str, launch: Any, efficiency: Any, setup: Any = ()) -> None:
    """Refuse a launch overhead that is not a finite number >= 0, efficiencies that are not
    (known op family, positive finite factor) pairs, and setups that are not (known op family,
    finite seconds >= 0) pairs."""
    if launch is not None and (not is_real(launch) or not 0 <= launch < math.inf):
        raise ClusterError(f"{who}: launch_overhead must be a finite number of seconds >= 0, "
                           f"got {brief(repr(launch))}")
    if launch is not None and (why := out_of_range("launch_overhead", launch)) is not None:
        raise ClusterError(f"{who}: {why}")
    _check_family_figures(who, "efficiency", efficiency, lambda v: 0 < v < math.inf,
                          "a positive finite factor (the fraction of the roofline reached)")
    _check_family_figures(who, "setup", setup, lambda v: 0 <= v < math.inf,
                          "a finite number of seconds >= 0")


def _check_family_figures(who: str, key: str, figures: Any, ok: Callable[[float], bool], want: str) -> None:
    if not isinstance(figures, tuple):
        raise ClusterError(f"{who}: {key} must map op families to figures, got {brief(repr(figures))}")
    seen: set[str] = set()
    for pair in figures:
        family, value = pair if isinstance(pair, tuple) and len(pair) == 2 else (pair, None)
        if family not in OP_FAMILIES:
            raise ClusterError(f"{who}: {key}: unknown op family {brief(repr(family))} "
                               f"(op families: {', '.join(OP_FAMILIES)})")
        if family in seen:
            raise ClusterError(f"{who}: {key}: op family '{family}' is given twice")
        seen.add(family)
        if not is_real(value) or not ok(value):
            raise ClusterError(f"{who}: {key} of '{family}' must be {want}, got {brief(repr(value))}")
        if (why := out_of_range(key, value)) is not None:
            raise ClusterError(f"{who}: {why.replace(key, f'{key} of {family!r}', 1)}")


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    latency: float  # seconds
    bandwidth: float  # bytes/s

    def __post_init__(self) -> None:
        if not is_real(self.latency) or not 0 <= _float(self.latency) < math.inf:
            raise ClusterError(f"link {self.src}->{self.dst}: latency must be a finite number of seconds >= 0, "
                               f"got {brief(repr(self.latency))}")
        if not is_real(self.bandwidth) or not self.bandwidth > 0:
            raise ClusterError(f"link {self.src}->{self.dst}: bandwidth must be positive (bytes per second), "
                               f"got {brief(repr(self.bandwidth))}")
        for key in ("latency", "bandwidth"):
            if (why := out_of_range(key, getattr(self, key))) is not None:
                raise ClusterError(f"link {self.src}->{self.dst}: {why}")

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth




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
                    latency: float | None = None, bandwidth: float | None = None, prefix: str | None = None) -> Cluster:
        """`n` devices of one built-in kind, fully connected by identical links."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise ClusterError(f"the number of devices must be a whole number, got {brief(repr(n))}")
        if n < 1:
            raise ClusterError(f"the number of devices must be at least 1, got {n}")
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
        """The cluster as pesto-cluster/1; calibrated figures only when set, so that files without
        them write back as they were."""
        out: dict[str, Any] = {
            "format": "pesto-cluster/1",
            "devices": [{"name": d.name, "kind": d.kind, "memory": d.memory,
                         **{k: getattr(d, k) for k in ("peak_flops", "mem_bandwidth") if getattr(d, k) is not None},
                         **({"host": d.host} if d.host else {}),
                         **({"launch_overhead": d.launch_overhead} if d.launch_overhead is not None else {}),
                         **({"efficiency": dict(d.efficiency)} if d.efficiency else {}),
                         **({"setup": dict(d.setup)} if d.setup else {})}
                        for d in self.devices],
            "links": [{"src": lk.src, "dst": lk.dst, "latency": lk.latency, "bandwidth": lk.bandwidth}
                      for lk in self.links.values()],
        }
        if self.all_reduce is not None:
            out["all_reduce"] = {"latency": self.all_reduce.latency, "bandwidth": self.all_reduce.bandwidth}
        if self.calibrated_on is not None:
            out["calibrated_on"] = dict(self.calibrated_on)
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
            assert isinstance(src, str) and isinstance(dst, str)  # checked just above
            if src == dst:
                raise bad(f"{where}: src and dst are both '{src}'; a link joins two different devices")
            links[(src, dst)] = Link(src, dst, _link_figure(lk, "latency", lat0, bad, where),
                                     _link_figure(lk, "bandwidth", bw0, bad, where))
        try:
            calibrated_on = machine_from_json(data.get("calibrated_on"))
        except ValueError as e:
            raise bad(f"calibrated_on: {e}") from None
        return Cluster(devices, links, _all_reduce_from_json(data.get("all_reduce"), bad), calibrated_on)

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
    kind = str(d.get("kind", "cpu"))  # a non-string is its string (docs/contracts.md)
    if not kind.strip():
        raise ClusterError(f"{source}: devices[{i}] ({d['name']}): \"kind\" must be a non-empty name such as "
                           f"\"h100\", not {brief(repr(kind))}")
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
        if (why := out_of_range(key, v)) is not None:
            raise ClusterError(f"{source}: devices[{i}] ({d['name']}): {why}")
        return v

    host = d.get("host", 0)
    if isinstance(host, bool) or not isinstance(host, int) or not 0 <= host <= MAX_HOST:
        raise ClusterError(f"{source}: devices[{i}] ({d['name']}): \"host\" must be a whole number from 0 to "
                           f"{MAX_HOST} (the process the device belongs to), got {brief(repr(host))}")
    launch = d.get("launch_overhead")
    who = f"{source}: devices[{i}] ({d['name']})"
    efficiency = _family_figures_from_json(d, "efficiency", "factor", who)
    setup = _family_figures_from_json(d, "setup", "seconds", who)
    launch = launch if launch is None or math.isnan(_float(launch)) else _float(launch)
    _check_calibration(who, launch, efficiency, setup)
    peak, bandwidth, memory = num("peak_flops", required=False), num("mem_bandwidth", required=False), num("memory")
    assert memory is not None  # required: num raises without it
    return Device(d["name"], kind, peak, bandwidth, memory, host, launch, efficiency, setup)


def _family_figures_from_json(d: dict[str, Any], key: str, unit: str, who: str) -> tuple[tuple[str, Any], ...]:
    """The device's `key` object {op family: figure} as pairs, numbers read with float() as the
    other figures are ("1e-6" too); what float() cannot read stays as is, for the check to refuse."""
    figures = d.get(key) or {}  # null (or {}): none given
    if not isinstance(figures, dict):
        raise ClusterError(f"{who}: \"{key}\" must be an object {{op family: {unit}}} "
                           f"(op families: {', '.join(OP_FAMILIES)}), got {brief(repr(figures))}")
    return tuple((k, v if math.isnan(_float(v)) else _float(v)) for k, v in figures.items())


def _all_reduce_from_json(raw: Any, bad: Any) -> AllReduceFit | None:
    """The top-level `all_reduce` object, both figures required; absent or null: none."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise bad("\"all_reduce\" must be an object {\"latency\": seconds, \"bandwidth\": bytes per second}, "
                  f"got {brief(repr(raw))}")
    for key in ("latency", "bandwidth"):
        if key not in raw:
            raise bad(f"all_reduce: \"{key}\" is required (the measured all-reduce fit has both figures)")
    return AllReduceFit(_link_figure(raw, "latency", 0.0, bad, "all_reduce"),
                        _link_figure(raw, "bandwidth", 1.0, bad, "all_reduce"))


def _link_figure(obj: dict[str, Any], key: str, default: float, bad: Any, where: str) -> float:
    """`latency` (finite, >= 0) or `bandwidth` (finite, > 0) of a link object, else `default`."""
    raw = obj.get(key, default)
    v = _float(raw)
    if not math.isfinite(v) or v < 0 or (key == "bandwidth" and v == 0):
        want = "a finite number of seconds >= 0" if key == "latency" else "positive and finite (bytes per second)"
        raise bad(f"{where}: {key} must be {want}, got {brief(repr(raw))}")
    if (why := out_of_range(key, v)) is not None:
        raise bad(f"{where}: {why}")
    return v
