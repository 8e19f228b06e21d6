"""The coarse graph placement solves: one `opaque` op per `group` of a grouped graph (`quotient_graph`).

`coarsen` writes the groups; placement (`passes/place.py`) builds this graph of them, with each
group's cost summed (per device or per cost key) and its memory as a group run on one device. The
stand-in devices that read one key of a per-device cost are here too, as `coarsen` sums costs the
same way to weigh its merges.
"""

from __future__ import annotations

from collections import defaultdict

from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, op_memory, value_bytes
from pesto_ir.ir.attributes import Attr, BytesAttr, DictAttr, DurationAttr, StringAttr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.types import BlobType
from pesto_ir.schedule.memory import first_read_inputs, output_bytes, workspace_bytes
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError
from pesto_ir.util.gc_pause import gc_paused
from pesto_ir.util.union_find import find_root


class CoarsenError(PestoError):
    pass


KEY_DEVICE = Device("?", "?", 1.0, 1.0, 1.0)  # reads a cost that is one duration for every device


def key_device(key: str) -> Device:
    """A stand-in device whose name and kind are `key`, to read one entry of a per-device cost."""
    return Device(key, key, 1.0, 1.0, 1.0)


def cost_keys(op: Op) -> list[str] | None:
    """The keys of a per-device/kind cost, or None when the cost is one duration for every device."""
    a = op.attrs.get("cost")
    return [k for k, _ in a.entries] if isinstance(a, DictAttr) else None


def group_members(graph: Graph) -> dict[str, list[Op]]:
    """Ops of each `group`, in graph order; every op must have a group."""
    return _groups(graph)[0]


def _groups(graph: Graph) -> tuple[dict[str, list[Op]], dict[str, str]]:
    """`group_members`, and the group of every op by name."""
    members: dict[str, list[Op]] = {}
    group_of: dict[str, str] = {}
    missing = [op.name for op in graph.ops if "group" not in op.attrs]
    if missing:
        raise CoarsenError(f"{len(missing)} op(s) have no 'group' attribute, e.g. '{missing[0]}' "
                           "(run coarsen before building the coarse graph)")
    for op in graph.ops:
        g = str(op.attrs["group"].value)
        group_of[op.name] = g
        if g in members:
            members[g].append(op)
        else:
            members[g] = [op]
    return members, group_of


def quotient_graph(graph: Graph, cluster: Cluster | None = None) -> tuple[Graph, dict[str, list[str]]]:
    """The coarse graph of `graph`'s `group` attributes, and each group's fine op names.

    One `opaque` op per group, named after the group: cost summed (per device name when a cluster
    is given and any cost is per device, else per cost key), memory as `group_memory` says, and a `colocate` label
    on every group that holds part of a colocation group spread over several groups (groups that
    share a split colocation group share the label). Each fine value read by another group is one
    `blob[nbytes]` result of its group's op, read once by each group that needs it, so a value is
    still sent once per destination device. (The collector is paused while the coarse graph is
    built: as in `coarsen_groups`, it would rescan the fine graph's objects again and again.)
    """
    with gc_paused():
        return _quotient_graph(graph, cluster)


def _quotient_graph(graph: Graph, cluster: Cluster | None) -> tuple[Graph, dict[str, list[str]]]:
    """`quotient_graph`, the collector paused."""
    work.charge("rewrite", len(graph.ops))
    members, group_of = _groups(graph)
    links = _GroupLinks(graph, members, group_of)
    order = _group_order(members, links)
    coarse = Graph(graph.name)
    results: dict[str, Value] = {}
    labels = _colocate_labels(graph, members, group_of)
    readers = links.crossing
    inputs = first_read_inputs(graph)
    for g in order:
        ops = members[g]
        produced = [v for op in ops for v in op.results if v.name in readers]
        operands = {name: results[name] for name in links.reads[g]}
        attrs = {"cost": _summed_cost(ops, cluster), **group_memory(ops, {v.name for v in produced}, inputs)}
        if g in labels:
            attrs["colocate"] = StringAttr(labels[g])
        cop = Op(g, "opaque", operands.values(), [BlobType(value_bytes(v)) for v in produced], attrs,
                 [v.name for v in produced])
        coarse.append(cop)
        for v, r in zip(produced, cop.results):
            results[v.name] = r
    return coarse, {g: [op.name for op in members[g]] for g in order}


def group_memory(ops: list[Op], produced: set[str], inputs: dict[str, int]) -> dict[str, Attr]:
    """`memory`, `activation` and `workspace` of a group that runs `ops` in order on one device.

    Resident: its ops' `memory` and the graph inputs they read first (the coarse graph has no
    inputs). Activation: the outputs other groups read, held like any op's output: the coarse op's
    results, each freed after its own last reader (as the fine tensors are), or, where some op has
    an `activation` attribute (its results only size edges), one `activation`, freed when the last
    of them is. Workspace: the most its internal tensors hold at once while it runs, each freed
    after its last reader inside.
    """
    position = {op.name: i for i, op in enumerate(ops)}
    resident, activation, internal, last_read = 0, 0, [0] * len(ops), list(range(len(ops)))
    any_activation = False
    for i, op in enumerate(ops):
        resident += op_memory(op) + inputs.get(op.name, 0)
        if "activation" in op.attrs:
            any_activation = True
            if any([r.name in produced for r in op.results]):
                activation += output_bytes(op)
            else:
                internal[i] = output_bytes(op)
        else:
            for r in op.results:
                if r.name in produced:
                    activation += r.type.nbytes
                else:
                    internal[i] += r.type.nbytes
        for v in op.operands:
            owner = v.owner
            if owner is not None:
                j = position.get(owner.name)
                if j is not None and last_read[j] < i:
                    last_read[j] = i
    peak, live = 0, 0
    frees: dict[int, int] = {}
    for i, op in enumerate(ops):
        live += internal[i]
        peak = max(peak, live + workspace_bytes(op))
        frees[last_read[i]] = frees.get(last_read[i], 0) + internal[i]
        live -= frees.pop(i, 0)
    out: dict[str, Attr] = {"memory": BytesAttr(resident)}
    if any_activation:
        out["activation"] = BytesAttr(activation)
    if peak:
        out["workspace"] = BytesAttr(peak)
    return out


class _GroupLinks:
    """What the fine edges between groups give the coarse graph, from one pass over them: the
    names of the fine values another group reads (`crossing`), those each group reads from others
    (`reads`, in the order its ops first read them), and each group's readers and count of writers."""

    def __init__(self, graph: Graph, members: dict[str, list[Op]], group_of: dict[str, str]) -> None:
        self.crossing: set[str] = set()
        self.reads: dict[str, dict[str, None]] = {g: {} for g in members}
        self.succ: dict[str, set[str]] = {g: set() for g in members}
        self.indeg = dict.fromkeys(members, 0)
        for op in graph.ops:
            b = group_of[op.name]
            reads = self.reads[b]
            for v in op.operands:
                p = v.owner
                if p is None:
                    continue
                a = group_of[p.name]
                if a != b:
                    self.crossing.add(v.name)
                    reads[v.name] = None
                    readers = self.succ[a]
                    if b not in readers:
                        readers.add(b)
                        self.indeg[b] += 1


def _group_order(members: dict[str, list[Op]], links: _GroupLinks) -> list[str]:
    """Groups in a topological order of the quotient (stable by first op); a cycle is an error."""
    import heapq

    succ, indeg = links.succ, dict(links.indeg)
    first = {g: i for i, g in enumerate(members)}
    ready = [(first[g], g) for g, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        _, g = heapq.heappop(ready)
        out.append(g)
        for s in succ[g]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (first[s], s))
    if len(out) != len(members):
        stuck = sorted((g for g, d in indeg.items() if d > 0), key=first.__getitem__)
        raise CoarsenError(f"the groups form a cycle through {len(stuck)} group(s), e.g. "
                           + ", ".join(f"'{g}'" for g in stuck[:5]))
    return out


def _colocate_labels(graph: Graph, members: dict[str, list[Op]], group_of: dict[str, str]) -> dict[str, str]:
    """`colocate` label of every group holding part of a colocation group spread over several groups."""
    spans: dict[str, list[str]] = defaultdict(list)
    for op in graph.ops:
        c = op.get("colocate")
        if c is not None and group_of[op.name] not in spans[str(c)]:
            spans[str(c)].append(group_of[op.name])
    parent = {g: g for g in members}
    name: dict[str, str] = {}
    for c in sorted(spans):
        gs = spans[c]
        if len(gs) < 2:
            continue
        root = find_root(parent, gs[0])
        name.setdefault(root, c)
        for g in gs[1:]:
            r = find_root(parent, g)
            if r != root:
                parent[r] = root
                name[root] = min(name[root], name.get(r, c))
    return {g: name[find_root(parent, g)] for g in members if find_root(parent, g) in name}


def _summed_cost(ops: list[Op], cluster: Cluster | None) -> DurationAttr | DictAttr:
    """The group's cost: one duration, or per device name (with a cluster) or per cost key."""
    keyed = [op for op in ops if isinstance(op.attrs.get("cost"), DictAttr)]
    if not keyed:  # `op_cost` of a cost that is one duration for every device (or none)
        return DurationAttr(sum(0.0 if (a := op.attrs.get("cost")) is None else float(a.value) for op in ops))
    if cluster is not None:
        return DictAttr(tuple((d.name, DurationAttr(sum(op_cost(op, d) for op in ops))) for d in cluster.devices))
    keys = list(dict.fromkeys(k for op in keyed for k in cost_keys(op) or ()))
    for op in keyed:
        lacking = [k for k in keys if k not in (cost_keys(op) or ())]
        if lacking:
            raise CoarsenError(f"op '{op.name}' has no cost for {lacking[0]!r} while others in its group do; "
                               "summing such costs needs the cluster (give the pass a cluster)")
    return DictAttr(tuple((k, DurationAttr(sum(op_cost(op, key_device(k)) for op in ops))) for k in keys))
