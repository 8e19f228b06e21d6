"""Lower bounds on the makespan, and memory infeasibility that is visible before solving.

`lower_bound` = max(critical path with every op on its fastest device and no transfers,
total work spread over all devices, the slowest single op). The work bound is exact for
uniformly related devices: with r_d = min over ops of cost(op, d) / fastest_cost(op), device d
does at most T / r_d of "fastest work" in time T, so T >= sum(fastest_cost) / sum(1 / r_d).
"""

from __future__ import annotations

from collections import defaultdict

from pesto_ir.cluster import Cluster
from pesto_ir.costs import op_cost, op_memory
from pesto_ir.ir import Graph


def fastest_costs(graph: Graph, cluster: Cluster) -> dict[str, float]:
    return {op.name: min(op_cost(op, d) for d in cluster.devices) for op in graph.ops}


def critical_path(graph: Graph, weight: dict[str, float]) -> float:
    finish: dict[str, float] = {}
    for op in graph.topo_order():
        start = max((finish[p.name] for p in op.producers()), default=0.0)
        finish[op.name] = start + weight[op.name]
    return max(finish.values(), default=0.0)


def lower_bound(graph: Graph, cluster: Cluster) -> float:
    fast = fastest_costs(graph, cluster)
    if not fast:
        return 0.0
    capacity = 0.0
    for d in cluster.devices:
        ratios = [op_cost(op, d) / fast[op.name] for op in graph.ops if fast[op.name] > 0]
        capacity += 1.0 / min(ratios) if ratios else 1.0
    work = sum(fast.values()) / capacity
    return max(critical_path(graph, fast), work, max(fast.values()))


def memory_shortfall(graph: Graph, cluster: Cluster) -> list[str]:
    """Reasons no placement can fit in memory, each naming devices and bytes; [] if none is obvious."""
    problems: list[str] = []
    biggest = max(cluster.devices, key=lambda d: d.memory)
    total_capacity = sum(d.memory for d in cluster.devices)
    total = sum(op_memory(op) for op in graph.ops)
    if total > total_capacity:
        problems.append(f"the graph needs {total} bytes but all {len(cluster)} devices together hold "
                        f"{int(total_capacity)} (short by {total - int(total_capacity)} bytes)")
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
