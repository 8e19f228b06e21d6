"""Lower bounds on the makespan, and memory infeasibility that is visible before solving.

`lower_bound` = max(the transfer-aware critical path, total work spread over all devices, the
slowest single op). The work bound is exact for uniformly related devices: with r_d = min over
ops of cost(op, d) / fastest_cost(op), device d does at most T / r_d of "fastest work" in time T,
so T >= sum(fastest_cost) / sum(1 / r_d).

The transfer-aware critical path runs every op on its fastest device, as the plain one does, but
an op cannot have every input both from another device for free and from its own device in
parallel: each producer is either remote, and its data arrives no earlier than its finish plus the
fastest link's latency and the bytes over the fastest bandwidth, or local, and then the local
producers ran one after another on the op's device. The op starts no earlier than the best such
split allows (the local ones in order of release, which is optimal for one machine), and never
earlier than the plain bound. On JAX training steps with large activations this is what the
plain critical path misses: a residual join either waits for a transfer or for both of its
branches on one device.
"""

from __future__ import annotations

from collections import defaultdict

from pesto_ir.cluster import Cluster
from pesto_ir.costs import op_cost, op_memory, value_bytes
from pesto_ir.ir import Graph, Op


def fastest_costs(graph: Graph, cluster: Cluster) -> dict[str, float]:
    return {op.name: min(op_cost(op, d) for d in cluster.devices) for op in graph.ops}


def critical_path(graph: Graph, weight: dict[str, float]) -> float:
    finish: dict[str, float] = {}
    for op in graph.topo_order():
        start = max((finish[p.name] for p in op.producers()), default=0.0)
        finish[op.name] = start + weight[op.name]
    return max(finish.values(), default=0.0)


def transfer_aware_path(graph: Graph, cluster: Cluster, fast: dict[str, float]) -> float:
    """The longest path when each op's producers are either remote (and pay a transfer) or local
    (and share its device); see the module docstring."""
    links = list(cluster.links.values())
    latency = min((lk.latency for lk in links), default=0.0)
    bandwidth = max((lk.bandwidth for lk in links), default=0.0)
    finish: dict[str, float] = {}
    for op in graph.topo_order():
        inputs = _producer_inputs(op, finish, fast, latency, bandwidth)
        start = max((finish[p] for p, *_ in inputs), default=0.0)
        finish[op.name] = max(start, _best_split(inputs)) + fast[op.name]
    return max(finish.values(), default=0.0)


def _producer_inputs(op: Op, finish: dict[str, float], fast: dict[str, float], latency: float,
                     bandwidth: float) -> list[tuple[str, float, float, float]]:
    """(producer, earliest start, cost, earliest arrival if remote; inf when it must be local)."""
    nbytes: dict[str, int] = defaultdict(int)
    producer: dict[str, Op] = {}
    for v in dict.fromkeys(op.operands):
        if v.owner is not None:
            nbytes[v.owner.name] += value_bytes(v)
            producer[v.owner.name] = v.owner
    group = op.get("colocate")
    out = []
    for name, n in nbytes.items():
        local = bandwidth <= 0 or (group is not None and producer[name].get("colocate") == group)
        arrival = float("inf") if local else finish[name] + latency + n / bandwidth
        out.append((name, finish[name] - fast[name], fast[name], arrival))
    return out


def _best_split(inputs: list[tuple[str, float, float, float]]) -> float:
    """The earliest start over every split: producers arriving by T are remote, the rest run in
    order of release on the op's device."""
    best = float("inf")
    for t in sorted({0.0, *(a for *_, a in inputs if a != float("inf"))}):
        local = sorted((release, cost) for _, release, cost, arrival in inputs if arrival > t)
        done = 0.0
        for release, cost in local:
            done = max(done, release) + cost
        best = min(best, max(t, done))
    return best


def lower_bound(graph: Graph, cluster: Cluster) -> float:
    fast = fastest_costs(graph, cluster)
    if not fast:
        return 0.0
    capacity = 0.0
    for d in cluster.devices:
        ratios = [op_cost(op, d) / fast[op.name] for op in graph.ops if fast[op.name] > 0]
        capacity += 1.0 / min(ratios) if ratios else 1.0
    work = sum(fast.values()) / capacity
    return max(transfer_aware_path(graph, cluster, fast), work, max(fast.values()))


def memory_shortfall(graph: Graph, cluster: Cluster) -> list[str]:
    """Reasons no placement can fit in memory, each naming devices and bytes; [] if none is obvious.

    Only what is held for the whole step counts here (ops' resident `memory` and the graph inputs,
    each at least once): activations come and go, and the plan's peak is checked when it is timed.
    """
    problems: list[str] = []
    biggest = max(cluster.devices, key=lambda d: d.memory)
    total_capacity = sum(d.memory for d in cluster.devices)
    total = sum(op_memory(op) for op in graph.ops) + sum(v.type.nbytes for v in graph.inputs if v.uses)
    if total > total_capacity:
        problems.append(f"the graph holds {total} bytes for the whole step (resident memory and inputs) but all "
                        f"{len(cluster)} devices together hold {int(total_capacity)} "
                        f"(short by {total - int(total_capacity)} bytes)")
    groups: dict[str, int] = defaultdict(int)
    for op in graph.ops:
        g = op.get("colocate")
        need = op_memory(op)
        if g is None and need > biggest.memory:
            problems.append(f"op '{op.name}' needs {need} bytes but the largest device, {biggest.name}, "
                            f"holds {int(biggest.memory)} (short by {need - int(biggest.memory)} bytes)")
        if g is not None:
            groups[str(g)] += need
    for g, need in groups.items():
        if need > biggest.memory:
            problems.append(f"colocation group '{g}' needs {need} bytes on one device but the largest, "
                            f"{biggest.name}, holds {int(biggest.memory)} (short by {need - int(biggest.memory)} bytes)")
    return problems
