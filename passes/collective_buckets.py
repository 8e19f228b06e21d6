"""Bucketing a placed replica's all-reduces, as XLA's all-reduce combiner and DDP's buckets do.

The rewrite gives every gradient its own `all_reduce`, and each pays the ring's latency 2(d-1)
times: ResNet-50's 268 gradients over 8 replicas spend 38 ms on latency alone. Once the ops have
devices, consecutive all-reduces on one device are merged into one op of up to `BUCKET_BYTES`.

Only an all-reduce whose result leads to no other all-reduce may wait for a later one: a gradient
that feeds the optimizer update, not a batch statistic that the forward pass reads on. Delaying
such an op to the last member's place in its device's order cannot create a cycle, because
nothing the later members depend on reads it. The plan is then re-timed by the simulator.
"""

from __future__ import annotations

from collections.abc import Callable

from pesto_ir.attributes import DurationAttr, IntAttr, StringAttr
from pesto_ir.cluster import Cluster
from pesto_ir.ir import Graph, Op
from pesto_ir.plan import Plan
from pesto_ir.simulate import order_from_priority, simulate

BUCKET_BYTES = 32 * 2**20  # like XLA's combine threshold (30 MB) and DDP's 25 MB buckets


def feeds_all_reduce(graph: Graph) -> set[str]:
    """Names of ops from which some all_reduce is reachable (through their results)."""
    reaches: set[str] = set()
    for op in reversed(graph.ops):
        if any(c.opcode == "all_reduce" or c.name in reaches for c in op.consumers()):
            reaches.add(op.name)
    return reaches


def buckets(graph: Graph, plan: Plan, limit: int = BUCKET_BYTES) -> list[list[Op]]:
    """Runs of consecutive final all-reduces per device (in plan order), each up to `limit` bytes."""
    reaches = feeds_all_reduce(graph)
    out: list[list[Op]] = []
    for device in plan.devices:
        run: list[Op] = []
        size = 0
        for name in plan.device_order(device):
            op = graph.op(name)
            if op.opcode != "all_reduce":
                continue
            if name in reaches or op.get("reduction") != "sum":
                if len(run) > 1:
                    out.append(run)
                run, size = [], 0
                continue
            nbytes = sum(v.type.nbytes for v in op.operands)
            if run and size + nbytes > limit:
                if len(run) > 1:
                    out.append(run)
                run, size = [], 0
            run.append(op)
            size += nbytes
        if len(run) > 1:
            out.append(run)
    return out


def bucket_all_reduces(graph: Graph, cluster: Cluster, plan: Plan, cost_of: Callable[[int], float],
                       limit: int = BUCKET_BYTES) -> tuple[Graph, Plan] | None:
    """Merge `graph`'s bucketable all-reduces in place and return the re-timed plan of replica 0 on
    `cluster` (its devices), or None when there is nothing to merge."""
    found = buckets(graph, plan, limit)
    if not found:
        return None
    placement = {name: slot.device for name, slot in plan.ops.items()}
    priority = {name: slot.start for name, slot in plan.ops.items()}
    for i, members in enumerate(found):
        merged = _merge(graph, members, cost_of, f"allreduce.bucket{i}")
        placement[merged.name] = placement[members[-1].name]
        priority[merged.name] = max(priority[m.name] for m in members)
        for m in members:
            del placement[m.name], priority[m.name]
    graph.ops[:] = graph.topo_order()
    order = order_from_priority(graph, placement, priority)
    timed = simulate(graph, cluster, placement, order, algorithm=plan.algorithm)
    timed.lower_bound, timed.solver = plan.lower_bound, plan.solver
    timed.notes = [*plan.notes, f"{sum(len(b) for b in found)} gradient all-reduces merged into {len(found)} "
                                f"buckets of up to {limit // 2**20} MiB"]
    return graph, timed


def _merge(graph: Graph, members: list[Op], cost_of: Callable[[int], float], hint: str) -> Op:
    operands = [v for m in members for v in m.operands]
    nbytes = sum(v.type.nbytes for v in operands)
    last = members[-1]
    name = graph.fresh_name(hint)
    merged = Op(name, "all_reduce", operands, [v.type for v in operands],
                {"reduction": StringAttr("sum"), "replicas": IntAttr(int(last.get("replicas"))),
                 "cost": DurationAttr(cost_of(nbytes))},
                [graph.fresh_name(f"{name}.{i}") for i in range(len(operands))], last.loc)
    graph.insert(graph.ops.index(last) + 1, merged)
    k = 0
    for m in members:
        for r in m.results:
            r.replace_all_uses_with(merged.results[k])
            if any(o is r for o in graph.outputs):
                graph.set_outputs([merged.results[k] if o is r else o for o in graph.outputs])
            k += 1
        graph.erase(m)
    return merged
