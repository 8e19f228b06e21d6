"""Bucketing a placed replica's collectives, as XLA's all-reduce combiner and DDP's buckets do.

The rewrite gives every gradient its own `all_reduce` (or, with sharded optimizer state, its own
`reduce_scatter`, and every new parameter its own `all_gather`), and each pays the ring's latency
(d-1) times a phase: ResNet-50's 268 gradients over 8 replicas spend 38 ms on latency alone. Once
the ops have devices, the collectives of one kind on one device are merged, in their order there,
into ops of up to `BUCKET_BYTES` (a reduce-scatter's or all-gather's operands keep their own axes);
one as large alone is left as it is, and does not split the small ones around it (an LSTM's 16 KiB
bias gradients between its 32 MiB weight gradients).

Only a collective whose result leads to no other collective of its kind may wait for a later one:
a gradient that feeds the optimizer update, not a batch statistic that the forward pass reads on.
Delaying such an op to the last member's place in its device's order cannot create a cycle,
because nothing the later members depend on reads it. The plan is then re-timed by the simulator.
"""

from __future__ import annotations

from collections.abc import Callable

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.attributes import Attr, DurationAttr, IntAttr, ListAttr, StringAttr
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.schedule.plan import RING_PHASES, Plan, collective_bytes
from pesto_ir.schedule.simulate import order_from_priority, simulate

BUCKET_BYTES = 32 * 2**20  # like XLA's combine threshold (30 MB) and DDP's 25 MB buckets


def feeds_all_reduce(graph: Graph, kind: str = "all_reduce") -> set[str]:
    """Names of ops from which some collective op of `kind` is reachable (through their results)."""
    reaches: set[str] = set()
    for op in reversed(graph.ops):
        if any(c.opcode == kind or c.name in reaches for c in op.consumers()):
            reaches.add(op.name)
    return reaches


def buckets(graph: Graph, plan: Plan, limit: int = BUCKET_BYTES) -> list[list[Op]]:
    """Runs of consecutive final collectives of one kind per device (in plan order), each up to
    `limit` bytes; reductions other than sums stay apart."""
    out: list[list[Op]] = []
    for kind in RING_PHASES:
        if not any(op.opcode == kind for op in graph.ops):
            continue
        reaches = feeds_all_reduce(graph, kind)
        for device in plan.devices:
            out.extend(_runs(graph, plan.device_order(device), kind, reaches, limit))
    return out


def mergeable(op: Op, reaches: set[str]) -> bool:
    """Whether collective `op` may wait for a later one of its kind in a bucket: it sums across the
    data-parallel replicas (a tensor-parallel group's collectives, `across = "tensor"`, sum over
    other devices and sit on the layers' critical path), and no other collective of its kind is
    reachable from it (`reaches`, from `feeds_all_reduce`)."""
    return op.name not in reaches and op.get("reduction", "sum") == "sum" and op.get("across") != "tensor"


def _runs(graph: Graph, order: list[str], kind: str, reaches: set[str], limit: int) -> list[list[Op]]:
    out: list[list[Op]] = []
    run: list[Op] = []
    size = 0
    for name in order:
        op = graph.op(name)
        if op.opcode != kind:
            continue
        if not mergeable(op, reaches):
            if len(run) > 1:
                out.append(run)
            run, size = [], 0
            continue
        nbytes = collective_bytes(op)
        if nbytes >= limit:  # a bucket of its own: it neither joins nor ends the run around it
            continue
        if run and size + nbytes > limit:
            if len(run) > 1:
                out.append(run)
            run, size = [], 0
        run.append(op)
        size += nbytes
    if len(run) > 1:
        out.append(run)
    return out


def bucket_all_reduces(graph: Graph, cluster: Cluster, plan: Plan, cost_of: Callable[[str, int], float],
                       limit: int = BUCKET_BYTES) -> tuple[Graph, Plan] | None:
    """Merge `graph`'s bucketable collectives in place and return the re-timed plan of replica 0 on
    `cluster` (its devices), or None when there is nothing to merge. `cost_of(opcode, bytes)` is a
    collective's duration."""
    found = buckets(graph, plan, limit)
    if not found:
        return None
    placement = {name: slot.device for name, slot in plan.ops.items()}
    priority = {name: slot.start for name, slot in plan.ops.items()}
    for i, members in enumerate(found):
        hint = "allreduce" if members[0].opcode == "all_reduce" else members[0].opcode.replace("_", "")
        merged = merge_bucket(graph, members, cost_of, graph.fresh_name(f"{hint}.bucket{i}"))
        placement[merged.name] = placement[members[-1].name]
        priority[merged.name] = max(priority[m.name] for m in members)
        for m in members:
            del placement[m.name], priority[m.name]
    graph.ops[:] = graph.topo_order()
    order = order_from_priority(graph, placement, priority)
    timed = simulate(graph, cluster, placement, order, algorithm=plan.algorithm)
    timed.lower_bound, timed.solver = plan.lower_bound, plan.solver
    counts = {kind: [0, 0] for kind in RING_PHASES}
    for members in found:
        counts[members[0].opcode][0] += len(members)
        counts[members[0].opcode][1] += 1
    merged_kinds = "; ".join(f"{n} {kind.replace('_', '-')}s merged into {b} buckets"
                             for kind, (n, b) in counts.items() if b)
    timed.notes = [*plan.notes, f"{merged_kinds} (of up to {limit // 2**20} MiB)"]
    return graph, timed


def merge_bucket(graph: Graph, members: list[Op], cost_of: Callable[[str, int], float], name: str) -> Op:
    """Replace `members` (collectives of one kind, none leading to another) by one op `name` over
    all their operands, after the last of them; it names them in its `members` attribute, which a
    plan file keeps (`Plan.buckets`), so that the bucket can be made again (`passes/placement/search/start_plan.py`)."""
    kind = members[0].opcode
    operands = [v for m in members for v in m.operands]
    last = members[-1]
    attrs: dict[str, Attr] = {"replicas": IntAttr(int(last.get("replicas"))),
                              "members": ListAttr(tuple(StringAttr(m.name) for m in members))}
    if kind != "all_gather":
        attrs["reduction"] = StringAttr("sum")
    if kind != "all_reduce":
        attrs["axes"] = ListAttr(tuple(IntAttr(int(a)) for m in members for a in m.get("axes")))
    results = [r.type for m in members for r in m.results]
    merged = Op(name, kind, operands, results, attrs,
                [graph.fresh_name(f"{name}.{i}") for i in range(len(operands))], last.loc)
    merged.attrs["cost"] = DurationAttr(cost_of(kind, collective_bytes(merged)))
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
