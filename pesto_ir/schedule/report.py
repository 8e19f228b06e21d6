"""What a plan amounts to: makespan against the lower bound, how busy each device and link is,
and how much memory each device holds. The `simulate` pass prints it; the CLI can too.

A device's memory is its peak over the step, from tensor lifetimes (`pesto_ir.schedule.memory`), and when
the peak is first reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.schedule.memory import peak_bytes
from pesto_ir.schedule.plan import Plan
from pesto_ir.util.units import human_bytes, human_time


@dataclass(frozen=True)
class DeviceUse:
    name: str
    kind: str
    ops: int
    busy: float  # seconds running ops
    utilisation: float  # busy / makespan
    memory: int  # bytes held at the peak (tensor lifetimes)
    capacity: float | None  # bytes, when the cluster is known
    peak_time: float = 0.0  # seconds into the step when the peak is first reached


@dataclass(frozen=True)
class LinkUse:
    src: str
    dst: str
    transfers: int
    nbytes: int
    busy: float  # seconds carrying transfers


@dataclass(frozen=True)
class Summary:
    graph: str
    algorithm: str
    makespan: float
    lower_bound: float | None
    devices: list[DeviceUse]
    links: list[LinkUse]
    hybrid: str = ""  # replicas and all-reduces of a hybrid plan (`hybrid_line`)

    def to_json(self) -> dict[str, Any]:
        return {
            "graph": self.graph, "algorithm": self.algorithm, "makespan": self.makespan,
            "lower_bound": self.lower_bound,
            "devices": [vars(d) for d in self.devices],
            "links": [vars(lk) for lk in self.links],
            **({"hybrid": self.hybrid} if self.hybrid else {}),
        }


def device_busy(plan: Plan) -> dict[str, float]:
    """Seconds each device of the plan spends running ops."""
    busy = {d: 0.0 for d in plan.devices}
    for slot in plan.ops.values():
        busy[slot.device] = busy.get(slot.device, 0.0) + (slot.end - slot.start)
    return busy


def utilisation(plan: Plan) -> dict[str, float]:
    """Busy time over makespan per device (0 for an empty plan)."""
    return _shares(device_busy(plan), plan.makespan)


def _shares(busy: dict[str, float], span: float) -> dict[str, float]:
    """Busy times over the makespan `span` (0 for an empty plan)."""
    return {d: (b / span if span > 0 else 0.0) for d, b in busy.items()}


def link_busy(plan: Plan) -> dict[tuple[str, str], float]:
    """Seconds each directed link that carries anything is busy."""
    busy: dict[tuple[str, str], float] = {}
    for t in plan.transfers:
        key = (t.src_device, t.to)
        busy[key] = busy.get(key, 0.0) + (t.end - t.start)
    return busy


def peak_memory(graph: Graph, plan: Plan) -> dict[str, int]:
    """Bytes each device holds at its peak over the step (tensor lifetimes, `pesto_ir.schedule.memory`)."""
    return {d: nbytes for d, (nbytes, _) in peak_bytes(graph, plan).items()}


def summarize(graph: Graph, plan: Plan, cluster: Cluster | None = None) -> Summary:
    busy, peaks, span = device_busy(plan), peak_bytes(graph, plan), plan.makespan
    util = _shares(busy, span)  # `utilisation`, without working out the busy times again
    if plan.parallelism is not None:  # the mirrors run replica 0's schedule: its devices stand for them
        home = set(plan.parallelism.replicas[0])
        busy = {d: b for d, b in busy.items() if d in home}
    counts: dict[str, int] = {}
    for slot in plan.ops.values():
        counts[slot.device] = counts.get(slot.device, 0) + 1
    known = {d.name: d for d in cluster.devices} if cluster is not None else {}
    devices = [DeviceUse(d, known[d].kind if d in known else "", counts.get(d, 0), busy[d], util[d],
                         peaks[d][0] if d in peaks else 0, known[d].memory if d in known else None,
                         peaks[d][1] if d in peaks else 0.0) for d in busy]
    links: dict[tuple[str, str], list[float]] = {}
    for t in plan.transfers:
        entry = links.setdefault((t.src_device, t.to), [0, 0, 0.0])
        entry[0] += 1
        entry[1] += t.nbytes
        entry[2] += t.end - t.start
    link_uses = [LinkUse(s, d, int(n), int(b), float(busy_s)) for (s, d), (n, b, busy_s) in sorted(links.items())]
    return Summary(plan.graph, plan.algorithm, span, plan.lower_bound, devices, link_uses,
                   hybrid_line(plan))


def hybrid_line(plan: Plan) -> str:
    """What a hybrid plan runs beyond replica 0's devices: its replicas and its all-reduces."""
    par = plan.parallelism
    if par is None:
        return ""
    replicas = " | ".join(",".join(g) for g in par.replicas)
    kinds = {c.kind: 0 for c in plan.collectives}
    moved = dict(kinds)
    for c in plan.collectives:
        kinds[c.kind] += 1
        moved[c.kind] += c.nbytes
    collectives = ", ".join(f"{n} {kind.replace('_', '-')}{'s' if n != 1 else ''} of {human_bytes(moved[kind])}"
                            for kind, n in kinds.items())
    state = "; parameters and optimizer state sharded across the replicas (FSDP)" if par.parameters == "sharded" \
        else "; optimizer state sharded across the replicas" if par.optimizer_state == "sharded" else ""
    if par.tensor_parallel > 1:
        return (f"tensor-parallel {par.tensor_parallel} x {par.microbatches} micro-batches, {len(par.layouts)} "
                f"input(s) split; ranks {replicas} (each runs the schedule below on its blocks); "
                f"{collectives or 'no collectives'} in all")
    return (f"data-parallel {par.data_parallel} x {par.microbatches} micro-batches{state}; replicas {replicas} (each "
            f"runs the schedule below); {collectives or 'no collectives'} in all")


# ---------------------------------------------------------------- text

def format_summary(s: Summary) -> str:
    """A short table: the headline, one line per device, one per busy link."""
    head = f"plan for '{s.graph}'" + (f" ({s.algorithm})" if s.algorithm else "")
    head += f": makespan {human_time(s.makespan)}"
    if s.lower_bound is not None:
        ratio = f", {s.makespan / s.lower_bound:.3f}x" if s.lower_bound > 0 else ""
        head += f", lower bound {human_time(s.lower_bound)}{ratio}"
    lines = [head] + ([f"  {s.hybrid}"] if s.hybrid else [])
    for d in s.devices:
        cap = f" / {human_bytes(d.capacity)}" if d.capacity is not None else ""
        kind = f" ({d.kind})" if d.kind else ""
        lines.append(f"  {d.name}{kind}: {d.ops} ops, busy {human_time(d.busy)} ({100 * d.utilisation:.1f}%), "
                     f"peak memory {human_bytes(d.memory)}{cap} at {human_time(d.peak_time)}")
    for lk in s.links:
        lines.append(f"  link {lk.src} -> {lk.dst}: {lk.transfers} transfers, {human_bytes(lk.nbytes)}, "
                     f"busy {human_time(lk.busy)}")
    return "\n".join(lines)
