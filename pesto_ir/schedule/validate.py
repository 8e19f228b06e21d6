"""The one plan validator: every plan any algorithm returns goes through `check_plan`.

It checks the rules of `pesto-plan/1` (docs/contracts.md, "Validity") and returns every violation as a sentence:
each op runs once on a known device for at least its cost; ops on a device do not overlap; an op
starts after its producers (same device) or the transfer of their results (other device); a
transfer starts after its producer, carries the bytes that are read there and lasts at least
latency + bytes / bandwidth; transfers on one directed link do not overlap; colocated ops share a
device; each device's peak memory, from tensor lifetimes (`pesto_ir.schedule.memory`), fits its capacity.
A plan that passes gets its per-device peaks (`Plan.peak_memory`).

A hybrid plan (`Plan.parallelism`, d replicas) places one replica's graph on the devices of
replica 0; replica r runs the same schedule on its mirror devices. It must also have: replicas'
devices in the cluster, in disjoint groups, each mirror of the same kind and memory as its
replica-0 device; every op (and transfer) on replica 0's devices; each collective op (`all_reduce`,
and the `reduce_scatter` and `all_gather` of sharded optimizer state) over d replicas, its slot at
least its ring time (`pesto_ir.cluster.model.ring_time`) over its group (its device and their mirrors),
and one `collectives` entry with that op, kind, group, bytes and slot; no collective for any other op. Mirror devices get the peaks of their replica-0 devices. Without
parallelism an `all_reduce` must be over one replica, and no collective may be listed.
"""

from __future__ import annotations

from collections import defaultdict

from pesto_ir.cluster.model import Cluster, ring_time
from pesto_ir.cost.lookup import op_cost
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.schedule.memory import DevicePeak, GraphBytes, peak_bytes, peak_memory
from pesto_ir.schedule.plan import (
    RING_PHASES,
    Collective,
    Parallelism,
    Plan,
    Transfer,
    collective_bytes,
    collectives_for,
    mesh_axis,
)
from pesto_ir.schedule.simulate import PlanError, sends
from pesto_ir.util import work
from pesto_ir.util.gc_pause import gc_paused

__all__ = ["check_plan", "collectives_for", "validate_plan"]

REL_TOL = 1e-9
ABS_TOL = 1e-12


def _late(a: float, b: float) -> bool:
    """True when `a` is meaningfully earlier than `b` (a should be >= b)."""
    return a < b and a < b - (ABS_TOL + REL_TOL * max(abs(a), abs(b)))  # a >= b is never late


def validate_plan(graph: Graph, cluster: Cluster, plan: Plan) -> list[str]:
    return _validate(graph, cluster, plan)[0]


def _validate(graph: Graph, cluster: Cluster, plan: Plan) -> tuple[list[str], dict[str, int]]:
    problems: list[str] = []
    _check_ops(graph, cluster, plan, problems)
    _check_replicas(graph, cluster, plan, problems)
    if problems:
        return problems, {}  # timing checks need every op placed on a real device (of replica 0)
    sizes = GraphBytes(graph)  # results' bytes and readers, for the transfers and the memory
    xfers = _check_transfers(graph, cluster, plan, sizes, problems)
    _check_precedence(graph, plan, xfers, problems)
    _check_overlaps(plan, problems)
    _check_colocation(graph, plan, problems)
    _check_collectives(graph, cluster, plan, problems)
    peaks = _check_memory(graph, cluster, plan, sizes, problems)
    return problems, peaks


def check_plan(graph: Graph, cluster: Cluster, plan: Plan) -> Plan:
    """Return `plan`, with its peak memory per device, if it is valid, else raise PlanError listing
    every violation."""
    work.charge("check", len(graph.ops))
    with gc_paused():  # tables of every op, transfer and tensor that live until the check ends
        problems, peaks = _validate(graph, cluster, plan)
    if problems:
        raise PlanError(problems, context=f"the {plan.algorithm or 'given'} plan for '{graph.name}' is invalid")
    plan.peak_memory = peaks
    return plan


def _check_ops(graph: Graph, cluster: Cluster, plan: Plan, problems: list[str]) -> None:
    devices = {d: cluster.device(d) for d in cluster.names}
    for op in graph.ops:
        slot = plan.ops.get(op.name)
        if slot is None:
            problems.append(f"op '{op.name}' is not in the plan")
            continue
        if slot.device not in devices:
            problems.append(f"op '{op.name}' is on unknown device '{slot.device}'")
            continue
        need = op_cost(op, devices[slot.device])
        if _late(slot.end - slot.start, need):
            problems.append(f"op '{op.name}' runs {slot.end - slot.start:.6g}s on {slot.device} "
                            f"but costs {need:.6g}s there")
        if slot.start < -ABS_TOL:
            problems.append(f"op '{op.name}' starts before time 0")
    extra = set(plan.ops) - {op.name for op in graph.ops}
    for name in sorted(extra)[:5]:
        problems.append(f"the plan names op '{name}', which is not in the graph")


def _check_replicas(graph: Graph, cluster: Cluster, plan: Plan, problems: list[str]) -> None:
    """The replicas of a hybrid plan: real, disjoint, alike device for device; ops on replica 0."""
    par = plan.parallelism
    if par is None:
        return
    names = set(cluster.names)
    owner: dict[str, int] = {}
    for r, group in enumerate(par.replicas):
        for d in group:
            if d not in names:
                problems.append(f"device {d} of replica {r} is not in the cluster")
            if d in owner:
                problems.append(f"device {d} is in replica {owner[d]} and in replica {r}; replicas must not share devices")
            owner.setdefault(d, r)
    for r, group in enumerate(par.replicas[1:], start=1):
        for d0, d in zip(par.replicas[0], group):
            if d0 not in names or d not in names:
                continue
            a, b = cluster.device(d0), cluster.device(d)
            if a.kind != b.kind:
                problems.append(f"device {d} of replica {r} is of kind {b.kind} but mirrors {d0} of replica 0, of kind {a.kind}")
            if a.memory != b.memory:
                problems.append(f"device {d} of replica {r} has {b.memory:.6g} bytes of memory but mirrors {d0} "
                                f"of replica 0, which has {a.memory:.6g}")
            if (a.peak_flops, a.mem_bandwidth) != (b.peak_flops, b.mem_bandwidth):
                problems.append(f"device {d} of replica {r} is not as fast as {d0} of replica 0, which it mirrors "
                                "(peak_flops or mem_bandwidth differ): it would not keep replica 0's schedule")
    rewritten = graph.attrs.get("microbatched")
    degrees = rewritten.value if rewritten is not None else {"data_parallel": 1, "microbatches": 1}
    if (degrees.get("data_parallel"), degrees.get("microbatches")) != (par.data_parallel, par.microbatches):
        problems.append(f"the plan says data_parallel {par.data_parallel} x {par.microbatches} micro-batches but the "
                        f"graph is the step for data_parallel {degrees.get('data_parallel')} x "
                        f"{degrees.get('microbatches')} (its microbatched attribute)")
    _check_layouts(graph, par, problems)
    home = set(par.replicas[0])
    for op in graph.ops:
        slot = plan.ops.get(op.name)
        if slot is not None and slot.device in names and slot.device not in home:
            problems.append(f"op '{op.name}' is on {slot.device}, which is not a device of replica 0 "
                            f"({', '.join(par.replicas[0])}); a hybrid plan places replica 0's graph")
    for t in plan.transfers:
        if t.to in names and t.to not in home:
            problems.append(f"transfer of '{t.src}' goes to {t.to}, which is not a device of replica 0")


def _check_layouts(graph: Graph, par: Parallelism, problems: list[str]) -> None:
    """A plan's tensor-parallel degree and layouts are its graph's: the rank graph's
    `tensor_parallel` and its split inputs (`tensor_inputs`), each split along its spec's axis."""
    degree = graph.attrs.get("tensor_parallel")
    t = int(degree.value) if degree is not None else 1
    if t != par.tensor_parallel:
        problems.append(f"the plan says tensor_parallel {par.tensor_parallel} but the graph is a rank's step for "
                        f"tensor_parallel {t} (its tensor_parallel attribute)")
    raw = graph.attrs.get("tensor_inputs")
    split = {k: int(a) for k, a in raw.value.items()} if raw is not None and isinstance(raw.value, dict) else {}
    specs = dict(par.layouts)
    for name in sorted(set(split) | set(specs)):
        spec = specs.get(name)
        axes = [i for i, a in enumerate(spec or ()) if a is not None]
        if name not in split or spec is None or axes != [split[name]]:
            want = f"split along axis {split[name]}" if name in split else "whole"
            problems.append(f"the plan's layout of input %{name} is {list(spec) if spec is not None else 'whole'} "
                            f"but the graph holds it {want}")
    raw = graph.attrs.get("tensor_input_runs")
    runs = {k: int(r) for k, r in raw.value.items()} if raw is not None and isinstance(raw.value, dict) else {}
    if runs != dict(par.interleave):
        problems.append(f"the plan interleaves {dict(par.interleave) or 'no input'} but the graph splits "
                        f"{runs or 'no input'} in runs")
    raw = graph.attrs.get("sequence_parallel")
    if par.sequence_parallel != (raw is not None and bool(raw.value)):
        says = "is" if par.sequence_parallel else "is not"
        problems.append(f"the plan {says} sequence-parallel but the graph {'is not' if par.sequence_parallel else 'is'}"
                        " (its sequence_parallel attribute)")


def _check_collectives(graph: Graph, cluster: Cluster, plan: Plan, problems: list[str]) -> None:
    """Each collective op (all-reduce, reduce-scatter, all-gather) spans the plan's replicas, lasts
    its ring time and has its collectives entry."""
    par = plan.parallelism
    listed: dict[str, list[Collective]] = defaultdict(list)
    for c in plan.collectives:
        listed[c.op].append(c)
    ops = {op.name: op for op in graph.ops} if listed else {}
    for name in sorted(listed):
        if name not in ops:
            problems.append(f"the plan lists a collective for op '{name}', which is not in the graph")
        elif ops[name].opcode not in RING_PHASES:
            problems.append(f"the plan lists a collective for op '{name}', which is a {ops[name].opcode}, "
                            "not a collective")
        elif par is None:
            problems.append(f"the plan lists a collective for op '{name}' but has no data_parallel (parallelism)")
        elif len(listed[name]) > 1:
            problems.append(f"the plan lists {len(listed[name])} collectives for op '{name}'; a collective op has one")
    if par is not None:
        _check_sharded_state(graph, par, problems)
    for op in graph.ops:
        if op.opcode not in RING_PHASES:
            continue
        replicas = op.get("replicas")
        if par is None:  # one replica's plan on its own devices (as `place` makes it before naming the
            continue     # replicas): the op's cost attribute stands for its ring, checked with the other ops
        if replicas != _size(par, op):
            verb = "all-reduces" if op.opcode == "all_reduce" else f"is {_a(op.opcode)}"
            problems.append(f"op '{op.name}' {verb} across {replicas} replicas but the plan has "
                            f"{_mirrors(par)}")
        slot = plan.ops[op.name]
        group = par.group(slot.device, mesh_axis(op))
        nbytes = collective_bytes(op)
        need = ring_time(cluster, group, nbytes, RING_PHASES[op.opcode])
        if _late(slot.end - slot.start, need):
            problems.append(f"op '{op.name}' runs {slot.end - slot.start:.6g}s on {slot.device} but its ring "
                            f"{op.opcode.replace('_', '-')} of {nbytes} bytes over {', '.join(group)} takes {need:.6g}s")
        found = listed.get(op.name)
        if not found:
            problems.append(f"op '{op.name}' is {_a(op.opcode)} but the plan lists no collective for it")
            continue
        c = found[0]
        if c.kind != op.opcode:
            problems.append(f"the collective of op '{op.name}' is {_a(c.kind)}, not {_a(op.opcode)}")
        if list(c.devices) != group:
            problems.append(f"the collective of op '{op.name}' spans {', '.join(c.devices)} but the op's group "
                            f"is {', '.join(group)}")
        if c.nbytes != nbytes:
            problems.append(f"the collective of op '{op.name}' carries {c.nbytes} bytes; its value is {nbytes}")
        if _late(c.start, slot.start) or _late(slot.start, c.start) or _late(c.end, slot.end) or _late(slot.end, c.end):
            problems.append(f"the collective of op '{op.name}' runs {c.start:.6g}s .. {c.end:.6g}s but the op's "
                            f"slot is {slot.start:.6g}s .. {slot.end:.6g}s")


def _check_sharded_state(graph: Graph, par: Parallelism, problems: list[str]) -> None:
    """A plan says its optimizer state is sharded exactly when its graph holds it in blocks
    (`sharded_inputs`), and every replica slice is over the plan's replicas."""
    sharded = "sharded_inputs" in graph.attrs
    if (par.optimizer_state == "sharded") != sharded:
        problems.append(f"the plan's optimizer state is {par.optimizer_state} but the graph holds it "
                        f"{'in blocks (sharded_inputs)' if sharded else 'whole (no sharded_inputs)'}")
    fully = "sharded_parameters" in graph.attrs
    if (par.parameters == "sharded") != fully:
        problems.append(f"the plan's parameters are {par.parameters} but the graph holds them "
                        f"{'in blocks (sharded_parameters)' if fully else 'whole (no sharded_parameters)'}")
    for op in graph.ops:
        if op.opcode in ("replica_slice", "block_indices") and op.get("replicas") != _size(par, op):
            problems.append(f"op '{op.name}' slices for {op.get('replicas')} replicas but the plan has "
                            f"{_mirrors(par)}")


def _size(par: Parallelism, op: Op) -> int:
    """How many devices the collective (or slice) `op` spans: its mesh axis's size."""
    return par.tensor_parallel if mesh_axis(op) == "tensor" else par.data_parallel


def _mirrors(par: Parallelism) -> str:
    ranks = f" x tensor_parallel {par.tensor_parallel}" if par.tensor_parallel > 1 else ""
    return f"data_parallel {par.data_parallel}{ranks}"


def _a(opcode: str) -> str:
    return f"{'an' if opcode[0] in 'aeiou' else 'a'} {opcode}"


def _check_transfers(graph: Graph, cluster: Cluster, plan: Plan, sizes: GraphBytes,
                     problems: list[str]) -> dict[tuple[str, str], Transfer]:
    placement = {n: s.device for n, s in plan.ops.items()}
    names = set(cluster.names)  # `Cluster.names` lists them anew at each call
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
        if t.src_device != slot.device or t.to == slot.device or t.to not in names:
            problems.append(f"transfer of '{t.src}' goes {t.src_device} -> {t.to} but the op is on {slot.device}")
            continue
        if _late(t.start, slot.end):
            problems.append(f"transfer of '{t.src}' to {t.to} starts at {t.start:.6g}s, before the op ends ({slot.end:.6g}s)")
        need = cluster.transfer_time(t.src_device, t.to, t.nbytes)
        if _late(t.end - t.start, need):
            problems.append(f"transfer of '{t.src}' to {t.to} lasts {t.end - t.start:.6g}s, less than its link needs ({need:.6g}s)")
    for name, _, _, _, results in sizes.ops:  # `transfer_bytes` of each op
        for dst, nbytes in sends([(n, readers) for _, n, _, readers in results], placement[name], placement).items():
            sent = by_key.get((name, dst))
            if sent is not None and sent.nbytes < nbytes:
                problems.append(f"transfer of '{name}' to {dst} carries {sent.nbytes} bytes; ops there read {nbytes}")
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


def _check_memory(graph: Graph, cluster: Cluster, plan: Plan, sizes: GraphBytes,
                  problems: list[str]) -> dict[str, int]:
    """Each device's peak (bytes) fits its capacity; a replica's mirror device holds what its
    replica-0 device holds (same schedule, same memory, checked by `_check_replicas`). What is
    alive at a peak is named only for a device that does not fit."""
    peaks = {d: nbytes for d, (nbytes, _) in peak_bytes(graph, plan, sizes).items()}
    described: dict[str, DevicePeak] = {}
    for d in cluster.devices:
        nbytes = peaks.get(d.name)
        if nbytes is not None and nbytes > d.memory:
            described = described or peak_memory(graph, plan)
            problems.append(f"out of memory: {described[d.name].describe(d.memory)}")
    par = plan.parallelism
    if par is not None:
        for group in par.replicas[1:]:
            for d0, mirror in zip(par.replicas[0], group):
                peaks[mirror] = peaks.get(d0, 0)
    return peaks
