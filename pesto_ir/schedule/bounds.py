"""Lower bounds on the makespan, and memory infeasibility that is visible before solving.

`lower_bound` = max(the transfer-aware critical path, the memory-cut path, the colocated path,
total work spread over all devices, the slowest single op). The work bound is exact for
uniformly related devices: with r_d = min over ops of cost(op, d) / fastest_cost(op), device d
does at most T / r_d of "fastest work" in time T, so T >= sum(fastest_cost) / sum(1 / r_d).

The transfer-aware critical path runs every op on its fastest device, as the plain one does, but
an op cannot have every input both from another device for free and from its own device in
parallel: each producer is either remote, and its data arrives no earlier than its finish plus the
fastest link's latency and the bytes over the fastest bandwidth, or local, and then the local
producers ran one after another on the op's device. The op starts no earlier than the best such
split allows (the local ones in order of release, which is optimal for one machine), and never
earlier than the plain bound. On JAX training steps with large activations this is what the
plain critical path misses: a residual join either waits for a transfer or for both of its
branches on one device.

Memory can forbid the critical path one device: each maximal run of its ops on one device holds
the resident bytes of their colocation units for the whole step, so where they do not all fit in
the largest device the path is cut into runs that do, and each cut edge waits for its transfer.
The memory-cut path adds the least such cuts can cost (a dynamic program over the path) to the
path's length. On the MSR training layer graphs over 16 GiB V100s it raises ResNet-50's bound by
1.1% (three runs) and Inception-V3's by 0.3%.

Colocated ops share a device, so they cannot run side by side. Where two branches from a fork
hold ops of one colocation group (TensorFlow puts a layer's weight gradient with its data
gradient, both reading the layer's weight) the join waits for both, one after the other: the
colocated path adds that wait at each join. A device runs the group's ops that are ancestors of an
op one at a time, so those released (started, by the bound) at or after t end no earlier than t
plus their costs, and the op after that plus the shortest of their paths to it; the bound takes
the best t, over the ancestors near the op (sound for any subset of them). On bert_l-12's
training op graph it is 1,544 ms where the critical path is 1,333 ms: the weight-gradient matmul
of each of its layers (17.5 ms) waits for the data-gradient one beside it.
"""

from __future__ import annotations

from collections import defaultdict, deque
from operator import itemgetter
from typing import Any

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_costs, op_memory, value_bytes
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.util import work
from pesto_ir.util.gc_pause import gc_paused


class _Dag:
    """The graph's ops in topological order and each op's distinct producers by name: what every
    path bound walks, worked out once per `lower_bound` (three bounds each sorted the graph and
    asked every op for its producers again)."""

    def __init__(self, graph: Graph) -> None:
        self.order = graph.topo_order()
        self.producers = {op.name: [p.name for p in op.producers()] for op in self.order}
        self.group = {op.name: op.get("colocate") for op in self.order}  # colocation group or None


def device_costs(graph: Graph, cluster: Cluster) -> dict[str, list[float]]:
    """Each op's cost on each device of `cluster`, in the cluster's order (`op_cost`)."""
    devices = cluster.devices
    return {op.name: op_costs(op, devices) for op in graph.ops}


def fastest_costs(graph: Graph, cluster: Cluster) -> dict[str, float]:
    return _fastest(device_costs(graph, cluster))


def _fastest(costs: dict[str, list[float]]) -> dict[str, float]:
    return {name: min(row) for name, row in costs.items()}


def critical_path(graph: Graph, weight: dict[str, float]) -> float:
    return sum(weight[n] for n in critical_path_ops(graph, weight))


def critical_path_ops(graph: Graph, weight: dict[str, float], dag: _Dag | None = None) -> list[str]:
    """The ops of a longest path by `weight`, first to last (`dag`: the graph's, where the caller
    has it)."""
    dag = _Dag(graph) if dag is None else dag
    producers = dag.producers
    finish: dict[str, float] = {}
    previous: dict[str, str | None] = {}
    for op in dag.order:
        name = op.name
        before: str | None = None
        latest = 0.0
        for p in producers[name]:  # the first of the latest producers, as max() picks it
            end = finish[p]
            if before is None or end > latest:
                before, latest = p, end
        finish[name] = latest + weight[name]
        previous[name] = before
    last: str | None = max(finish.items(), key=itemgetter(1))[0] if finish else None
    path: list[str] = []
    while last is not None:
        path.append(last)
        last = previous[last]
    return path[::-1]


def transfer_aware_path(graph: Graph, cluster: Cluster, fast: dict[str, float], dag: _Dag | None = None) -> float:
    """The longest path when each op's producers are either remote (and pay a transfer) or local
    (and share its device); see the module docstring."""
    links = list(cluster.links.values())
    latency = min((lk.latency for lk in links), default=0.0)
    bandwidth = max((lk.bandwidth for lk in links), default=0.0)
    dag = _Dag(graph) if dag is None else dag
    producers = dag.producers
    finish: dict[str, float] = {}
    for op in dag.order:
        if not producers[op.name]:  # it starts at 0 (the best split of no inputs is 0 too)
            finish[op.name] = 0.0 + fast[op.name]
            continue
        inputs = _producer_inputs(op, dag.group, finish, fast, latency, bandwidth)
        start = max([finish[p] for p, _, _, _ in inputs])
        finish[op.name] = max(start, _best_split(inputs)) + fast[op.name]
    return max(finish.values(), default=0.0)


def _producer_inputs(op: Op, groups: dict[str, Any], finish: dict[str, float], fast: dict[str, float],
                     latency: float, bandwidth: float) -> list[tuple[str, float, float, float]]:
    """(producer, earliest start, cost, earliest arrival if remote; inf when it must be local);
    `groups`: each op's colocation group or None."""
    nbytes: dict[str, int] = {}
    for v in dict.fromkeys(op.operands):
        owner = v.owner
        if owner is not None:
            name = owner.name
            nbytes[name] = nbytes.get(name, 0) + value_bytes(v)
    group = groups[op.name]
    inf = float("inf")
    out = []
    for name, n in nbytes.items():
        local = bandwidth <= 0 or (group is not None and groups[name] == group)
        end = finish[name]
        arrival = inf if local else end + latency + n / bandwidth
        out.append((name, end - fast[name], fast[name], arrival))
    return out


def _best_split(inputs: list[tuple[str, float, float, float]]) -> float:
    """The earliest start over every split: producers arriving by T are remote, the rest run in
    order of release on the op's device."""
    inf = float("inf")
    if len(inputs) == 1:  # most ops: the same as below, without sorting lists of one
        _, release, cost, arrival = inputs[0]
        local = (release if release > 0.0 else 0.0) + cost  # max(0.0, release) + cost
        return min(max(t, local if arrival > t else 0.0) for t in ([0.0] if arrival == inf else sorted({0.0, arrival})))
    times = sorted({0.0, *(a for *_, a in inputs if a != inf)})
    ordered = sorted([(release, cost, arrival) for _, release, cost, arrival in inputs])
    if len(times) <= _SPLITS_SCANNED:
        return min(max(t, _local_end(ordered, t)) for t in times)
    # max(t, done(t)): t rises and done(t) falls, so the least is where they cross: binary search
    # for the first t with t >= done(t), in O(N log N) where a scan of every t took N^2 (a node
    # fed by N others)
    done: dict[int, float] = {}  # index of t -> _local_end at t, each worked out once

    def done_at(i: int) -> float:
        if i not in done:
            done[i] = _local_end(ordered, times[i])
        return done[i]

    lo, hi = 0, len(times) - 1
    if times[hi] < done_at(hi):
        return done_at(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if times[mid] >= done_at(mid):
            hi = mid
        else:
            lo = mid + 1
    return min(times[lo], done_at(lo - 1)) if lo > 0 else times[lo]


def _local_end(ordered: list[tuple[float, float, float]], t: float) -> float:
    """When the producers that do not arrive by `t` (release, cost, arrival; by release) end, run
    one after another on the op's device: it only falls as t grows (fewer of them)."""
    end = 0.0
    for release, cost, arrival in ordered:
        if arrival > t:
            end = (release if release > end else end) + cost  # max(end, release) + cost
    return end


_SPLITS_SCANNED = 8  # _best_split: up to this many split times, each is tried


def memory_cut_path(graph: Graph, cluster: Cluster, fast: dict[str, float], dag: _Dag | None = None) -> float:
    """The critical path (fastest costs) with the least its transfers must cost when memory splits
    it across devices; see the module docstring."""
    dag = _Dag(graph) if dag is None else dag
    path = critical_path_ops(graph, fast, dag)
    length = sum(fast[n] for n in path)
    unit: dict[str, tuple[str, str]] = {}
    resident: dict[tuple[str, str], int] = defaultdict(int)
    groups = dag.group
    for op in graph.ops:
        group = groups[op.name]
        unit[op.name] = u = ("colocate", str(group)) if group is not None else ("op", op.name)
        resident[u] += op_memory(op)
    capacity = max(d.memory for d in cluster.devices)
    if sum(resident[u] for u in {unit[n] for n in path}) <= capacity:
        return length  # the whole path fits on one device
    links = list(cluster.links.values())
    if not links:
        return length
    latency = min(lk.latency for lk in links)
    bandwidth = max(lk.bandwidth for lk in links)
    cut = [latency + _edge_bytes(graph.op(a), b) / bandwidth for a, b in zip(path, path[1:])]
    cost = _least_cut(path, cut, unit, resident, capacity)
    return length + cost if cost is not None else length


def colocated_path(graph: Graph, fast: dict[str, float], dag: _Dag | None = None) -> float:
    """The critical path (fastest costs, transfers free) where ops that must share a device wait
    for each other; see the module docstring. An op's finish bound is the largest of its start
    bound (its producers' finish bounds) plus its cost and, for each colocation group, over the
    group's ancestors u of the op (the op too) taken from the latest start bound down: that start
    bound, plus the costs of those ops, plus the least path from one of them to the op's end. Only
    ancestors within `_COLOCATION_WINDOW` of the op's end by that path are kept (fewer ops still
    give a bound), at most `_COLOCATION_KEPT` per group, none shorter than `_COLOCATION_LEAST`:
    the waits that matter are those of long siblings near their join."""
    if not fast:
        return 0.0
    window = _COLOCATION_WINDOW * max(fast.values())
    least = _COLOCATION_LEAST * max(fast.values())
    dag = _Dag(graph) if dag is None else dag
    finish: dict[str, float] = {}
    # per op: per colocation group, ancestor (or the op) -> (its start bound, its cost, path to the
    # op's end less the offset), and the offset; an op with one producer shares the producer's table
    near: dict[str, tuple[dict[str, dict[str, tuple[float, float, float]]], float]] = {}
    for op in dag.order:
        cost = fast[op.name]
        producers = dag.producers[op.name]
        start = finish[producers[0]] if len(producers) == 1 else max((finish[p] for p in producers), default=0.0)
        own = dag.group[op.name] if cost >= least else None  # a short op's wait is not worth tracking
        end = start + cost
        if not producers and own is None:  # nothing to wait for, no group to join
            finish[op.name] = end
            near[op.name] = ({}, 0.0)
            continue
        if len(producers) == 1:  # every path grows by this op's cost: no new wait but the op's own
            table, offset = near[producers[0]]
            offset += cost
            if own is not None:
                table = dict(table)
                mine = {u: e for u, e in table.get(str(own), {}).items() if e[2] + offset <= window}
                mine[op.name] = (start, cost, -offset)
                table[str(own)] = mine = _latest(mine)
                end = max(end, _serialized([(r, c, path + offset) for r, c, path in mine.values()]))
            near[op.name] = (table, offset)
            finish[op.name] = end
            continue
        groups: dict[str, dict[str, tuple[float, float, float]]] = {}
        joined: set[str] = set()  # groups with entries from two producers (or the op's own): new waits
        for p in producers:
            table, offset = near[p]
            for g, entries in table.items():
                if g in groups:
                    joined.add(g)
                mine = groups.setdefault(g, {})
                for u, (release, c, path) in entries.items():
                    path += offset + cost
                    if path <= window and (u not in mine or mine[u][2] < path):
                        mine[u] = (release, c, path)
        if own is not None:
            groups.setdefault(str(own), {})[op.name] = (start, cost, 0.0)
            joined.add(str(own))
        for g in joined:  # elsewhere every entry's path grew by this op's cost: nothing new
            groups[g] = entries = _latest(groups[g])
            if len(entries) > 1:
                end = max(end, _serialized(list(entries.values())))
        finish[op.name] = end
        near[op.name] = ({g: e for g, e in groups.items() if e}, 0.0)
    return max(finish.values())


_COLOCATION_WINDOW = 1.0  # colocated_path: how far back, in the largest op's cost ...
_COLOCATION_KEPT = 4  # ... how many ops of one group an op keeps ...
_COLOCATION_LEAST = 0.02  # ... and the shortest op kept, in the largest op's cost


def _latest(entries: dict[str, tuple[float, float, float]]) -> dict[str, tuple[float, float, float]]:
    """The `_COLOCATION_KEPT` entries released last: those the serialized sum starts from."""
    if len(entries) <= _COLOCATION_KEPT:
        return entries
    return dict(sorted(entries.items(), key=lambda e: -e[1][0])[:_COLOCATION_KEPT])


def _serialized(entries: list[tuple[float, float, float]]) -> float:
    """The latest any one device can finish `entries` (start bound, cost, least path on to the
    op's end) and then the op: over the entries from the latest start bound down, that bound, plus
    their costs run one after another, plus the least of their paths."""
    best, total, least = 0.0, 0.0, float("inf")
    for release, cost, path in sorted(entries, reverse=True):
        total += cost
        least = min(least, path)
        best = max(best, release + total + least)
    return best


def _edge_bytes(producer: Op, consumer: str) -> int:
    """The bytes of `producer`'s results that op `consumer` reads."""
    return sum(value_bytes(r) for r in producer.results if any(u.name == consumer for u in r.users()))


def _least_cut(path: list[str], cut: list[float], unit: dict[str, tuple[str, str]],
               resident: dict[tuple[str, str], int], capacity: float) -> float | None:
    """The least total of `cut[i]` (the edge from path[i] to path[i + 1]) over the ways to cut
    `path` into runs whose units' resident bytes each fit in `capacity`; None if one unit does not.
    A run is feasible if every shorter run inside it is, so the feasible starts of runs ending at
    j form a window that only moves right: dynamic programming with a sliding-window minimum."""
    best = [0.0] + [float("inf")] * len(path)  # best[j]: path[:j] cut into feasible runs, cuts paid
    window: deque[int] = deque()  # starts i of the current window, best[i] increasing
    count: dict[tuple[str, str], int] = defaultdict(int)
    held, lo = 0, 0
    for j in range(1, len(path) + 1):
        u = unit[path[j - 1]]
        if count[u] == 0:
            held += resident[u]
        count[u] += 1
        while window and best[window[-1]] >= best[j - 1]:
            window.pop()
        window.append(j - 1)
        while held > capacity and lo < j:
            v = unit[path[lo]]
            count[v] -= 1
            if count[v] == 0:
                held -= resident[v]
            lo += 1
            while window and window[0] < lo:
                window.popleft()
        if not window:
            return None  # path[j - 1]'s unit alone does not fit
        best[j] = best[window[0]] + (cut[j - 1] if j < len(path) else 0.0)
    return best[-1]


def work_bound(graph: Graph, cluster: Cluster, fast: dict[str, float] | None = None) -> float:
    """The total work over the devices' speeds (fastest costs, `fast` where the caller has them):
    a bound of any plan of the graph's work, with any data-parallel or micro-batch split of it."""
    if fast is None:
        costs = device_costs(graph, cluster)
        return _work_bound(costs, _fastest(costs), len(cluster.devices))
    working = {op.name: op_costs(op, cluster.devices) for op in graph.ops if fast[op.name] > 0}
    return _work_bound(working, fast, len(cluster.devices))


def _work_bound(costs: dict[str, list[float]], fast: dict[str, float], devices: int) -> float:
    """`work_bound` from the ops' costs on each of the cluster's `devices` (`device_costs`; those
    of ops of no fastest cost are not read)."""
    if not fast:
        return 0.0
    working = [(row, fast[name]) for name, row in costs.items() if fast[name] > 0]
    capacity = 0.0
    for d in range(devices):
        ratios = [row[d] / f for row, f in working]
        capacity += 1.0 / min(ratios) if ratios else 1.0
    return sum(fast.values()) / capacity


def lower_bound(graph: Graph, cluster: Cluster) -> float:
    work.charge("bound", len(graph.ops))
    with gc_paused():  # tables of every op that live until the bound is found
        return _lower_bound(graph, cluster)


def _lower_bound(graph: Graph, cluster: Cluster) -> float:
    costs = device_costs(graph, cluster)
    fast = _fastest(costs)
    if not fast:
        return 0.0
    spread = _work_bound(costs, fast, len(cluster.devices))
    dag = _Dag(graph)
    return max(transfer_aware_path(graph, cluster, fast, dag), spread, max(fast.values()),
               memory_cut_path(graph, cluster, fast, dag), colocated_path(graph, fast, dag))


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
