"""What the exact engines share: `ilp` (python-mip, `ilp_instance`/`ilp_model`/`algo_ilp`), `cpsat`
(OR-tools, `algo_cpsat`/`cpsat_model`) and their large-neighbourhood search (`lns`).

- the start: a valid given warm start, else a fallback plan (everything on the fastest device that
  holds it, else colocation units first-fit by memory) when no heuristic plan is at hand;
- answers that need no solve (nothing fits, one device, a warm start at the lower bound);
- the plan adapter (`as_algorithm`), the gap to a bound and the way times are printed;
- the model's common data: the devices a unit fits on, the results other units read, classes of
  interchangeable devices, and the upper bound of the makespan without a warm start;
- the exact timing of a solution: `earliest_schedule` keeps the solver's link order, where
  `simulate` sends first come, first served.

Algorithms may import this module and `algo_common`; neither imports an algorithm or a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, value_bytes
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.passes.placement.common import (
    colocation_units,
    interchangeable_devices,
    longest_paths,
    unplaceable_reason,
)
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.memory import footprints
from pesto_ir.schedule.plan import OpSlot, Plan, Transfer
from pesto_ir.schedule.simulate import PlanError, simulate, transfer_bytes
from pesto_ir.schedule.validate import validate_plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError

REL_GAP = 1e-6  # a plan within this fraction of the bound is optimal (no solve needed)

# What `plan.solver` records: (status, seconds, bound, gap, objective) -> the engine's dict.
SolverInfo = Callable[[str, float, "float | None", "float | None", "float | None"], dict[str, Any]]


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


def gap(makespan: float, bound: float) -> float:
    """The relative gap of `makespan` above `bound` (0 for an empty plan)."""
    return max(0.0, (makespan - bound) / makespan) if makespan > 0 else 0.0


def as_algorithm(plan: Plan, algorithm: str) -> Plan:
    """A copy of `plan` that says it came out of `algorithm` (and, in a note, from which one before)."""
    notes = list(plan.notes)
    if plan.algorithm and plan.algorithm != algorithm:
        notes.append(f"warm start from {plan.algorithm}")
    return Plan(plan.graph, algorithm, list(plan.devices),
                {n: OpSlot(s.device, s.start, s.end) for n, s in plan.ops.items()},
                [Transfer(t.src, t.src_device, t.to, t.start, t.end, t.nbytes) for t in plan.transfers],
                plan.lower_bound, dict(plan.solver) if plan.solver else None, notes)


# ---------------------------------------------------------------------------- the start

def given_warm_start(graph: Graph, cluster: Cluster, options: PlaceOptions) -> tuple[Plan | None, list[str]]:
    """`options.warm_start` when it is a valid plan of this graph (else None, with a note saying why)."""
    notes: list[str] = []
    given = options.warm_start
    if given is not None:
        problems = validate_plan(graph, cluster, given)
        if not problems:
            return given, notes
        notes.append(f"the warm start was not a valid plan of this graph ({problems[0]}); ignored it")
    return None, notes


def fallback_plan(graph: Graph, cluster: Cluster, algorithm: str | None = None) -> Plan | None:
    """Everything on the fastest device that holds it all; else colocation units first-fit in
    topological order onto the fastest device with room. None if that fails too, or if the plan,
    once timed, does not fit (the count here leaves out copies and lifetimes; the exact peak says
    no). The plan is labelled `algorithm`, or (None) with what it did."""
    by_speed = sorted(cluster.devices, key=lambda d: (sum(op_cost(op, d) for op in graph.ops),
                                                      cluster.names.index(d.name)))
    footprint = footprints(graph)
    total = sum(footprint.values())
    whole = next((d for d in by_speed if total <= d.memory), None)
    if whole is not None:
        placement = {op.name: whole.name for op in graph.ops}
        label = f"everything on {whole.name}"
    else:
        free = {d.name: d.memory for d in cluster.devices}
        placement = {}
        for members in colocation_units(graph.topo_order()):
            need = sum(footprint[op.name] for op in members)
            dev = next((d.name for d in by_speed if free[d.name] >= need), None)
            if dev is None:
                return None
            free[dev] -= need
            placement.update({op.name: dev for op in members})
        label = "first-fit by memory, fastest device first"
    order: dict[str, list[str]] = {}
    for op in graph.topo_order():
        order.setdefault(placement[op.name], []).append(op.name)
    plan = simulate(graph, cluster, placement, order, label if algorithm is None else algorithm)
    return None if validate_plan(graph, cluster, plan) else plan


def early_answer(graph: Graph, cluster: Cluster, warm: Plan | None, lb: float, algorithm: str, what: str,
                 info: SolverInfo, started: float, error: type[PestoError],
                 clock: Callable[[], float] = work.now) -> Plan | None:
    """Answers that need no solve: `error` when there is no warm start and no placement fits;
    the warm start, optimal, on one device or at the lower bound (`what` names the solve skipped;
    `started` is a reading of `clock`, the engine's: the work clock, or the wall clock of CBC's
    wall-bounded search)."""
    if warm is None:
        reason = unplaceable_reason(graph, cluster)
        if reason is not None:
            raise error(reason)
        return None
    if len(cluster) == 1 or warm.makespan <= lb * (1 + REL_GAP) + 1e-15:
        plan = as_algorithm(warm, algorithm)
        plan.solver = info("optimal", clock() - started, warm.makespan, 0.0, warm.makespan)
        if warm.algorithm and warm.algorithm != algorithm:  # the plan is the warm start's: say whose
            plan.solver["winner"] = f"{warm.algorithm}'s warm start, optimal"
        plan.lower_bound = warm.makespan
        why = "one device" if len(cluster) == 1 else "the warm start meets the lower bound"
        plan.notes.append(f"no {what} needed: {why}, so it is optimal")
        return plan
    return None


# ---------------------------------------------------------------------------- the model's data

def loose_upper_bound(ops: Sequence[Op], cluster: Cluster, cost: Sequence[Sequence[float]]) -> float:
    """An upper bound of the makespan without a warm start: every op at its worst cost, then every
    result sent to every other device over the slowest link, one thing at a time.

    Any placement that fits memory has a schedule that long: run the ops one after another in
    topological order and send each producer's results right after it ends. A producer sends to at
    most `len(cluster) - 1` other devices, at most all its results each time, so its sends take at
    most that many times (worst latency + its results' bytes / the slowest bandwidth). The last term
    (one more send of a byte over the worst link) is slack against rounding."""
    links = list(cluster.links.values())
    worst_link = max((lk.latency + 1.0 / lk.bandwidth for lk in links), default=0.0)
    slowest_bw = min((lk.bandwidth for lk in links), default=1.0)
    worst_lat = max((lk.latency for lk in links), default=0.0)
    sends = sum(worst_lat + sum(value_bytes(r) for r in op.results) / slowest_bw for op in ops if op.consumers())
    return sum(max(row) for row in cost) + sends * (len(cluster) - 1) + worst_link


def allowed_devices(cluster: Cluster, members: Sequence[Op], need: float, error: type[PestoError]) -> list[int]:
    """Indices of the devices with memory for a unit (`members`) that needs `need` bytes; `error` if none."""
    allowed = [d for d, dev in enumerate(cluster.devices) if need <= dev.memory]
    if not allowed:
        what = f"op '{members[0].name}'" if len(members) == 1 else \
            f"colocation group '{members[0].get('colocate')}' ({len(members)} ops)"
        biggest = max(dev.memory for dev in cluster.devices)
        raise error(f"{what} needs {need} bytes but the largest device holds {int(biggest)}")
    return allowed


def foreign_results(op: Op, index: Mapping[str, int], own: set[int]) -> list[tuple[int, list[int]]]:
    """(bytes, readers outside `own`, by index) for each result of `op` that another unit reads."""
    out = []
    for r in op.results:
        users = sorted({index[u.name] for u in r.users()} - own)
        if users:
            out.append((value_bytes(r), users))
    return out


def device_classes(first: dict[int, tuple[Any, ...]], link: Callable[[int, int], tuple[float, float]]) -> list[list[int]]:
    """Groups (of 2 or more) of interchangeable devices for symmetry breaking: the same signature
    `first[d]` (costs, memory, ...), the same links (`link(a, b)`: latency, bandwidth) to and from
    every other device, and one kind of link among themselves."""
    groups = interchangeable_devices(first, lambda d, f: (*link(d, f), *link(f, d)))
    inside = [{link(a, b) for a in g for b in g if a != b} for g in groups]
    return [g for g, links in zip(groups, inside) if len(g) > 1 and len(links) <= 1]


# ---------------------------------------------------------------------------- a real schedule

def earliest_schedule(graph: Graph, cluster: Cluster, placement: Mapping[str, str],
                      order: Mapping[str, Sequence[str]], link_order: Mapping[tuple[str, str], Sequence[str]],
                      algorithm: str = "") -> Plan | None:
    """The earliest schedule that keeps the device orders and the link orders (None if they deadlock).

    Unlike `simulate` it keeps the solver's link order instead of first come, first served, and,
    as the models do, lets ops and transfers that take no time at all wait for their inputs only
    (they neither wait for their device or link nor hold it).
    """
    preds: dict[Any, list[Any]] = {}
    length: dict[Any, float] = {}
    for d, names in order.items():
        busy: str | None = None
        for name in names:
            op = graph.op(name)
            length[name] = op_cost(op, cluster.device(d))
            inputs = [p.name if placement[p.name] == d else (p.name, d) for p in op.producers()]
            preds[name] = inputs + ([busy] if busy is not None and length[name] > 0 else [])
            if length[name] > 0:
                busy = name
    sends = {(op.name, dst): nbytes for op in graph.ops for dst, nbytes in sorted(transfer_bytes(op, placement).items())}
    for (src, dst), nbytes in sends.items():
        preds[(src, dst)] = [src]
        length[(src, dst)] = cluster.transfer_time(placement[src], dst, nbytes)
    for (a, b), names in link_order.items():
        busy_send: tuple[str, str] | None = None
        for name in names:
            key = (name, b)
            if key not in sends or placement[name] != a:
                continue
            if busy_send is not None and length[key] > 0:
                preds[key].append(busy_send)
            if length[key] > 0:
                busy_send = key
    finish = longest_paths(preds, length)
    if finish is None:
        return None
    slots = {op.name: OpSlot(placement[op.name], finish[op.name] - length[op.name], finish[op.name])
             for op in graph.ops}
    transfers = [Transfer(src, placement[src], dst, finish[(src, dst)] - length[(src, dst)], finish[(src, dst)], nbytes)
                 for (src, dst), nbytes in sends.items()]
    return Plan(graph.name, algorithm, list(cluster.names), slots, transfers)


def timed_both_ways(graph: Graph, cluster: Cluster, placement: Mapping[str, str], order: Mapping[str, list[str]],
                    link_order: Mapping[tuple[str, str], list[str]], algorithm: str,
                    names: tuple[str, str]) -> list[tuple[Plan, str]]:
    """An exact engine's solution as real schedules, each named by `names`: simulated (links first
    come, first served) and replayed in the solver's own link order; those that do not deadlock."""
    out: list[tuple[Plan, str]] = []
    try:
        out.append((simulate(graph, cluster, placement, order, algorithm), names[0]))
    except PlanError:
        pass
    replayed = earliest_schedule(graph, cluster, placement, order, link_order, algorithm)
    if replayed is not None:
        out.append((replayed, names[1]))
    return out
