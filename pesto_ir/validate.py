"""The one plan validator: every plan any algorithm returns goes through `check_plan`.

It checks the rules of `pesto-plan/1` (DESIGN.md) and returns every violation as a sentence:
each op runs once on a known device for at least its cost; ops on a device do not overlap; an op
starts after its producers (same device) or the transfer of their results (other device); a
transfer starts after its producer, carries the bytes that are read there and lasts at least
latency + bytes / bandwidth; transfers on one directed link do not overlap; colocated ops share a
device; each device's peak memory, from tensor lifetimes (`pesto_ir.memory`), fits its capacity.
A plan that passes gets its per-device peaks (`Plan.peak_memory`).
"""

from __future__ import annotations

from collections import defaultdict

from pesto_ir.cluster import Cluster
from pesto_ir.costs import op_cost
from pesto_ir.ir import Graph
from pesto_ir.memory import DevicePeak, peak_memory
from pesto_ir.plan import Plan, Transfer
from pesto_ir.simulate import PlanError, transfer_bytes

REL_TOL = 1e-9
ABS_TOL = 1e-12


def _late(a: float, b: float) -> bool:
    """True when `a` is meaningfully earlier than `b` (a should be >= b)."""
    return a < b - (ABS_TOL + REL_TOL * max(abs(a), abs(b)))


def validate_plan(graph: Graph, cluster: Cluster, plan: Plan) -> list[str]:
    return _validate(graph, cluster, plan)[0]


def _validate(graph: Graph, cluster: Cluster, plan: Plan) -> tuple[list[str], dict[str, DevicePeak]]:
    problems: list[str] = []
    _check_ops(graph, cluster, plan, problems)
    if problems:
        return problems, {}  # timing checks need every op placed on a real device
    xfers = _check_transfers(graph, cluster, plan, problems)
    _check_precedence(graph, plan, xfers, problems)
    _check_overlaps(plan, problems)
    _check_colocation(graph, plan, problems)
    peaks = _check_memory(graph, cluster, plan, problems)
    return problems, peaks


def check_plan(graph: Graph, cluster: Cluster, plan: Plan) -> Plan:
    """Return `plan`, with its peak memory per device, if it is valid, else raise PlanError listing
    every violation."""
    problems, peaks = _validate(graph, cluster, plan)
    if problems:
        raise PlanError(problems, context=f"the {plan.algorithm or 'given'} plan for '{graph.name}' is invalid")
    plan.peak_memory = {d: p.nbytes for d, p in peaks.items()}
    return plan


def _check_ops(graph: Graph, cluster: Cluster, plan: Plan, problems: list[str]) -> None:
    names = set(cluster.names)
    for op in graph.ops:
        slot = plan.ops.get(op.name)
        if slot is None:
            problems.append(f"op '{op.name}' is not in the plan")
            continue
        if slot.device not in names:
            problems.append(f"op '{op.name}' is on unknown device '{slot.device}'")
            continue
        need = op_cost(op, cluster.device(slot.device))
        if _late(slot.end - slot.start, need):
            problems.append(f"op '{op.name}' runs {slot.end - slot.start:.6g}s on {slot.device} "
                            f"but costs {need:.6g}s there")
        if slot.start < -ABS_TOL:
            problems.append(f"op '{op.name}' starts before time 0")
    extra = set(plan.ops) - {op.name for op in graph.ops}
    for name in sorted(extra)[:5]:
        problems.append(f"the plan names op '{name}', which is not in the graph")


def _check_transfers(graph: Graph, cluster: Cluster, plan: Plan,
                     problems: list[str]) -> dict[tuple[str, str], Transfer]:
    placement = {n: s.device for n, s in plan.ops.items()}
    by_key: dict[tuple[str, str], Transfer] = {}
    for t in plan.transfers:
        key = (t.src, t.to)
        if key in by_key:
            problems.append(f"op '{t.src}' is sent to {t.to} twice (a tensor is sent once per device)")
        by_key[key] = t
        slot = plan.ops.get(t.src)
        if slot is None:
            problems.append(f"a transfer names op '{t.src}', which is not in the plan")
            continue
        if t.src_device != slot.device or t.to == slot.device or t.to not in cluster.names:
            problems.append(f"transfer of '{t.src}' goes {t.src_device} -> {t.to} but the op is on {slot.device}")
            continue
        if _late(t.start, slot.end):
            problems.append(f"transfer of '{t.src}' to {t.to} starts at {t.start:.6g}s, before the op ends ({slot.end:.6g}s)")
        need = cluster.transfer_time(t.src_device, t.to, t.nbytes)
        if _late(t.end - t.start, need):
            problems.append(f"transfer of '{t.src}' to {t.to} lasts {t.end - t.start:.6g}s, less than its link needs ({need:.6g}s)")
    for op in graph.ops:
        for dst, nbytes in transfer_bytes(op, placement).items():
            t = by_key.get((op.name, dst))
            if t is not None and t.nbytes < nbytes:
                problems.append(f"transfer of '{op.name}' to {dst} carries {t.nbytes} bytes; ops there read {nbytes}")
    return by_key


def _check_precedence(graph: Graph, plan: Plan, xfers: dict[tuple[str, str], Transfer],
                      problems: list[str]) -> None:
    for op in graph.ops:
        slot = plan.ops[op.name]
        for p in op.producers():
            ps = plan.ops[p.name]
            if ps.device == slot.device:
                if _late(slot.start, ps.end):
                    problems.append(f"op '{op.name}' starts at {slot.start:.6g}s before its producer '{p.name}' ends ({ps.end:.6g}s)")
                continue
            t = xfers.get((p.name, slot.device))
            if t is None:
                problems.append(f"op '{op.name}' on {slot.device} reads '{p.name}' from {ps.device} but no transfer brings it")
            elif _late(slot.start, t.end):
                problems.append(f"op '{op.name}' starts at {slot.start:.6g}s before the transfer of '{p.name}' arrives ({t.end:.6g}s)")


def _check_overlaps(plan: Plan, problems: list[str]) -> None:
    per_device: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for name, s in plan.ops.items():
        if s.end > s.start:
            per_device[s.device].append((s.start, s.end, name))
    for device, spans in per_device.items():
        _overlaps(sorted(spans), f"on {device}", "op", problems)
    per_link: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
    for t in plan.transfers:
        if t.end > t.start:
            per_link[(t.src_device, t.to)].append((t.start, t.end, t.src))
    for (a, b), spans in per_link.items():
        _overlaps(sorted(spans), f"on link {a} -> {b}", "transfer of", problems)


def _overlaps(spans: list[tuple[float, float, str]], where: str, what: str, problems: list[str]) -> None:
    for (_s0, e0, n0), (s1, _e1, n1) in zip(spans, spans[1:]):
        if _late(s1, e0):
            problems.append(f"{what} '{n0}' and {what} '{n1}' overlap {where} ({s1:.6g}s < {e0:.6g}s)")


def _check_colocation(graph: Graph, plan: Plan, problems: list[str]) -> None:
    groups: dict[str, set[str]] = defaultdict(set)
    for op in graph.ops:
        g = op.get("colocate")
        if g is not None:
            groups[str(g)].add(plan.ops[op.name].device)
    for g, devices in groups.items():
        if len(devices) > 1:
            problems.append(f"colocation group '{g}' is split over {', '.join(sorted(devices))}")


def _check_memory(graph: Graph, cluster: Cluster, plan: Plan, problems: list[str]) -> dict[str, DevicePeak]:
    peaks = peak_memory(graph, plan)
    for d in cluster.devices:
        peak = peaks.get(d.name)
        if peak is not None and peak.nbytes > d.memory:
            problems.append(f"out of memory: {peak.describe(d.memory)}")
    return peaks
