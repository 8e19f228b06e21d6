"""The instance of `ilp`'s MILP: everything the model (`ilp_model`) needs, precomputed in model time units.

Ops are taken in topological order; a placement unit is one op or a whole colocation group
(`algo_common.colocation_units`). Times are scaled so that the upper bound `UB` (the warm start's
makespan, else `exact_common.loose_upper_bound`) is `SCALE_UB` units, which keeps CBC's absolute
tolerances far below the costs.

What keeps the model small and tight is that upper bound: every op gets a time window [earliest
start, latest finish] from critical paths and from the work of its ancestors (descendants) over the
cluster's capacity; pairs whose windows cannot overlap need no ordering binary at all, and every
big-M is the width of the two windows involved. Transfers are one per (producer, destination
device) that some placement could need; interchangeable devices (same costs, memory and links)
form classes for symmetry breaking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.passes.placement.common import unit_indices
from pesto_ir.passes.placement.exact.common import allowed_devices, device_classes, foreign_results, loose_upper_bound
from pesto_ir.schedule.memory import footprints
from pesto_ir.schedule.plan import OpSlot, Plan, Transfer
from pesto_ir.util.errors import PestoError

SCALE_UB = 1000.0  # the warm-start makespan in model time units
EPS = 1e-7  # model time units of slack in window tests (UB is 1000)


class IlpError(PestoError):
    """The ILP cannot run: an unknown or missing solver, nothing fits, or no plan in time."""


@dataclass
class Xfer:
    """A possible transfer of producer p's results to device d."""

    p: int
    d: int
    consumers: list[int]  # ops of other units that read p and may run on d
    sources: list[int]  # devices p may run on, other than d
    duration: dict[int, float]  # by source device, all results that may be sent (model units)
    results: list[tuple[float, list[int]]]  # (bytes, consumers that read it) when results differ
    release: float = 0.0  # earliest start
    deadline: float = 0.0  # latest end
    latest: float = 0.0  # latest start (or, when not sent, its producer's latest end)
    dmin: float = 0.0
    dmax: float = 0.0


@dataclass(frozen=True)
class Pair:
    """Two ops, or two transfers to device `d`, that may need ordering: whether `a` may go first,
    whether `b` may, and the big-M of each order (the width of the windows involved). Neither
    order possible means they may never share a device (a link)."""

    a: int
    b: int
    first: bool
    second: bool
    big_ab: float
    big_ba: float
    d: int = -1
    shared: tuple[int, ...] = ()  # source devices both transfers may come from


@dataclass
class Instance:
    """Everything the model needs, precomputed in model time units."""

    graph: Graph
    cluster: Cluster
    ops: list[Op]  # topological order
    index: dict[str, int]
    unit_of: list[int]
    units: list[list[int]]
    allowed: list[list[int]]  # per unit
    cost: list[list[float]]  # per op, per device
    fast: list[float]  # per op, fastest allowed cost
    producers: list[list[int]]
    consumers: list[list[int]]
    desc: list[int]  # bitset of descendants per op
    est: list[float]
    lst: list[float]
    tail: list[float]
    ub: float
    lb: float
    unit: float  # model units per second
    xfers: dict[tuple[int, int], Xfer] = field(default_factory=dict)
    op_pairs: list[Pair] = field(default_factory=list)
    link_pairs: list[Pair] = field(default_factory=list)
    classes: list[list[int]] = field(default_factory=list)
    unit_bytes: list[int] = field(default_factory=list)  # footprint of each unit (every byte held all step)

    def integers(self) -> int:
        """Binary variables the model will have: placements and the pairs of either order."""
        pairs = sum(1 for q in self.op_pairs + self.link_pairs if q.first and q.second)
        return sum(len(a) for a in self.allowed) + pairs

    @property
    def k(self) -> int:
        return len(self.cluster.devices)

    def lft(self, i: int) -> float:
        return self.ub - self.tail[i]

    @staticmethod
    def build(graph: Graph, cluster: Cluster, ub_seconds: float | None, lb_seconds: float) -> Instance:
        ops = graph.topo_order()
        index = {op.name: i for i, op in enumerate(ops)}
        devices = cluster.devices
        raw_cost = [[op_cost(op, d) for d in devices] for op in ops]
        if ub_seconds is None:
            ub_seconds = loose_upper_bound(ops, cluster, raw_cost)
        unit = SCALE_UB / ub_seconds if ub_seconds > 0 else 1.0
        unit_of, units = unit_indices(ops)
        footprint = footprints(graph)
        unit_bytes = [sum(footprint[ops[i].name] for i in members) for members in units]
        allowed = [allowed_devices(cluster, [ops[i] for i in members], unit_bytes[u], IlpError)
                   for u, members in enumerate(units)]
        cost = [[c * unit for c in row] for row in raw_cost]
        fast = [min(cost[i][d] for d in allowed[unit_of[i]]) for i in range(len(ops))]
        producers = [sorted(index[p.name] for p in op.producers()) for op in ops]
        consumers = [sorted(index[c.name] for c in op.consumers()) for op in ops]
        inst = Instance(graph, cluster, ops, index, unit_of, units, allowed, cost, fast, producers, consumers,
                        _descendants(consumers), [], [], [], ub_seconds * unit * (1 + 1e-9) + EPS,
                        lb_seconds * unit, unit)
        inst.unit_bytes = unit_bytes
        best = [min(row) for row in cost]
        inst.est, inst.tail = _windows(producers, consumers, fast, inst.desc, best, _capacity(cluster, ops))
        inst.lst = [inst.lft(i) - fast[i] for i in range(len(ops))]
        inst.xfers = _transfers(inst)
        inst.op_pairs = _op_pairs(inst)
        inst.link_pairs = _link_pairs(inst)
        inst.classes = _device_classes(inst)
        return inst


def _descendants(consumers: list[list[int]]) -> list[int]:
    """Reachability as Python-int bitsets, built in reverse topological order."""
    desc = [0] * len(consumers)
    for i in range(len(consumers) - 1, -1, -1):
        bits = 0
        for c in consumers[i]:
            bits |= desc[c] | (1 << c)
        desc[i] = bits
    return desc


def _windows(producers: list[list[int]], consumers: list[list[int]], fast: list[float], desc: list[int],
             best: list[float], capacity: float) -> tuple[list[float], list[float]]:
    """Earliest starts and tails (time any schedule needs after an op ends), each the larger of
    a longest path (fastest allowed costs, free links) and the work of all ancestors (descendants,
    at their fastest on any device) spread over the cluster's capacity: everything before an op
    must have run somewhere first."""
    n = len(fast)
    anc = [0] * n
    for i in range(n):
        for p in producers[i]:
            anc[i] |= anc[p] | (1 << p)
    est = [0.0] * n
    for i in range(n):
        path = max((est[p] + fast[p] for p in producers[i]), default=0.0)
        est[i] = max(path, _work(anc[i], best) / capacity)
    tail = [0.0] * n
    for i in range(n - 1, -1, -1):
        path = max((fast[c] + tail[c] for c in consumers[i]), default=0.0)
        tail[i] = max(path, _work(desc[i], best) / capacity)
    return est, tail


def _work(bits: int, fast: list[float]) -> float:
    total = 0.0
    while bits:
        low = bits & -bits
        total += fast[low.bit_length() - 1]
        bits ^= low
    return total


def _capacity(cluster: Cluster, ops: Sequence[Op]) -> float:
    """How many fastest-device seconds of work the cluster does per second (as `lower_bound`):
    device d runs any op at best 1/r_d as fast as its fastest device, r_d the smallest ratio."""
    capacity = 0.0
    for d in cluster.devices:
        ratios = []
        for op in ops:
            best = min(op_cost(op, e) for e in cluster.devices)
            if best > 0:
                ratios.append(op_cost(op, d) / best)
        capacity += 1.0 / min(ratios) if ratios else 1.0
    return capacity


def _transfers(inst: Instance) -> dict[tuple[int, int], Xfer]:
    """Every (producer, destination) transfer some placement could need, with its time window."""
    out: dict[tuple[int, int], Xfer] = {}
    cluster, names = inst.cluster, inst.cluster.names
    for p in range(len(inst.ops)):
        up = inst.unit_of[p]
        results = _foreign_results(inst, p)
        if not results:
            continue
        for d in range(inst.k):
            sources = [s for s in inst.allowed[up] if s != d]
            cons = sorted({c for _, users in results for c in users if d in inst.allowed[inst.unit_of[c]]})
            if not sources or not cons:
                continue
            sent = [(b, users) for b, users in results if any(c in cons for c in users)]
            total = sum(b for b, _ in sent)
            duration = {s: cluster.transfer_time(names[s], names[d], total) * inst.unit for s in sources}
            smallest = min(b for b, _ in sent)
            dmin = min(cluster.transfer_time(names[s], names[d], smallest) * inst.unit for s in sources)
            same_users = all(set(users) == set(sent[0][1]) for _, users in sent)
            x = Xfer(p, d, cons, sources, duration, [] if same_users else sent)
            x.release = inst.est[p] + inst.fast[p]
            x.deadline = max(inst.lst[c] for c in cons)
            x.latest = max(inst.lft(p), x.deadline - dmin, x.release)
            x.dmin = dmin
            x.dmax = max(duration.values())
            out[(p, d)] = x
    return out


def _op_pairs(inst: Instance) -> list[Pair]:
    """Op pairs with no path between them that may share a device and whose windows overlap."""
    out: list[Pair] = []
    n = len(inst.ops)
    timeless = {i for i in range(n) if not any(inst.cost[i])}  # zero-length ops block no device
    for i in range(n):
        if i in timeless:
            continue
        ui = inst.unit_of[i]
        for j in range(i + 1, n):
            uj = inst.unit_of[j]
            if inst.desc[i] >> j & 1 or j in timeless or (ui != uj and not set(inst.allowed[ui]) & set(inst.allowed[uj])):
                continue
            ij = inst.est[i] + inst.fast[i] <= inst.lst[j] + EPS
            ji = inst.est[j] + inst.fast[j] <= inst.lst[i] + EPS
            if not ij and not ji and ui == uj:
                ij = ji = True  # cannot happen below a true UB; stay exact rather than clever
            big_ij, big_ji = inst.lft(i) - inst.est[j], inst.lft(j) - inst.est[i]
            if (ij and big_ij <= 0) or (ji and big_ji <= 0):
                continue  # the windows alone put one after the other
            out.append(Pair(i, j, ij, ji, big_ij, big_ji))
    return out


def _link_pairs(inst: Instance) -> list[Pair]:
    """Transfer pairs to one device that may come from one device, with overlapping windows."""
    by_dest: dict[int, list[Xfer]] = {}
    for t in inst.xfers.values():
        by_dest.setdefault(t.d, []).append(t)
    out: list[Pair] = []
    for d, ts in by_dest.items():
        for k, tp in enumerate(ts):
            for tq in ts[k + 1:]:
                shared = tuple(sorted(set(tp.sources) & set(tq.sources)))
                if not shared:
                    continue
                big_pq = tp.latest + tp.dmax - tq.release
                big_qp = tq.latest + tq.dmax - tp.release
                pq = tp.release + tp.dmin + tq.dmin <= tq.deadline + EPS
                qp = tq.release + tq.dmin + tp.dmin <= tp.deadline + EPS
                if (pq and big_pq <= 0) or (qp and big_qp <= 0):
                    continue  # the windows alone put one after the other
                out.append(Pair(tp.p, tq.p, pq, qp, big_pq, big_qp, d, shared))
    return out


def _foreign_results(inst: Instance, p: int) -> list[tuple[float, list[int]]]:
    """(bytes, readers in other units) for each result of op p that some other unit reads."""
    own = set(inst.units[inst.unit_of[p]])
    return [(float(nbytes), users) for nbytes, users in foreign_results(inst.ops[p], inst.index, own)]


def _device_classes(inst: Instance) -> list[list[int]]:
    """Groups (of 2 or more) of interchangeable devices: same op costs, memory and links."""
    cluster, names = inst.cluster, inst.cluster.names
    first = {d: (tuple(row[d] for row in inst.cost), dev.memory, tuple(d in a for a in inst.allowed))
             for d, dev in enumerate(cluster.devices)}

    def link(a: int, b: int) -> tuple[float, float]:
        lk = cluster.link(names[a], names[b])
        return lk.latency, lk.bandwidth

    return device_classes(first, link)


def relabel_for_symmetry(inst: Instance, plan: Plan) -> Plan:
    """`plan` with interchangeable devices renamed in order of first use, as symmetry breaking wants."""
    names = inst.cluster.names
    rename = {n: n for n in names}
    for cls in inst.classes:
        first_use: list[int] = []
        for members in inst.units:
            d = names.index(plan.ops[inst.ops[members[0]].name].device)
            if d in cls and d not in first_use:
                first_use.append(d)
        first_use += [d for d in cls if d not in first_use]
        for new, old in zip(cls, first_use):
            rename[names[old]] = names[new]
    ops = {n: OpSlot(rename[s.device], s.start, s.end) for n, s in plan.ops.items()}
    transfers = [Transfer(t.src, rename[t.src_device], rename[t.to], t.start, t.end, t.nbytes)
                 for t in plan.transfers]
    return replace(plan, ops=ops, transfers=transfers)
