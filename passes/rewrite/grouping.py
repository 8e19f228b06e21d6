"""How `coarsen` groups ops into coarse nodes (the steps and why: `passes/coarsen.py`): the rounds
of merges in each order tried, under the caps on a node's cost and memory and on what a colocation
class forces together, and the choice among the orders' groupings.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, value_bytes
from pesto_ir.ir.attributes import DictAttr, StringAttr
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.passes.rewrite.coarse_graph import KEY_DEVICE, cost_keys, key_device, quotient_graph
from pesto_ir.passes.rewrite.colocation_groups import (
    DEFAULT_COLOCATION,
    colocation_labels,
    members_by_label,
    split_classes,
)
from pesto_ir.passes.rewrite.contraction import ColocationClasses, Contraction, Levels
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.memory import footprints, live_bytes
from pesto_ir.schedule.plan import OpSlot, Plan
from pesto_ir.util.gc_pause import gc_paused

NODE_CAP_FACTOR = 2.0  # a coarse node may hold up to this many times an average node's cost
CAP_RELAX = 1.5  # the node cost cap grows by this factor when it blocks every merge
DEVICES_WITHOUT_CLUSTER = 8  # device count the class cap assumes when the pass has no cluster
CLASS_SHARE = 4  # a colocation class may force together up to 1 / (this * devices) of the work
GROWTH_TOLERANCE = 1e-9  # of the critical path: a merge that lengthens it less is free
LENGTHENING_SHARE = 0.05  # of the nodes: at most this many merges a round once every merge lengthens the path
# of the nodes: at most this many merges a round while they lengthen nothing, in the order
# `PATH_SIBLINGS` (its fused kernels' rounds too; the other orders as before, without a limit): each
# merge is free by the round's levels, not all of them together (lstm_seq2seq's coarse bound at 200
# groups is 1.17 times the fine one with 0.25, 1.20 without a limit)
FREE_SHARE = 0.25
CAP_TRIES = 3  # groupings under the memory cap, halved after each whose coarse graph does not pack
SIBLING_REACH = 3  # a node may merge with the next this many of its level (or of the sinks) by top level
EDGE, SIBLINGS = "edge", "siblings"  # what a merge joins: the two ends of an edge, or two nodes no path joins
# Twins (nodes with the same predecessors and the same successors: the readers of a learning rate
# once their own inputs merged in, an embedding's positions, a loss's towers) of a class larger than
# this merge pairwise every round, besides the round's batch (`_twin_merges`). An edge merge takes
# one of a node's readers a round, so a node read by N others took N rounds of O(edges) each; a
# class this size adds at most this many rounds, fewer than the MSR op graphs take anyway (23-69),
# and their largest class, and the bundled examples', is 4, so their groupings are unchanged.
TWIN_CLASS = 16
# the orders of merges tried (the grouping with the lowest coarse bound is kept): least lengthening
# first, with siblings or edges only, and heaviest tensor first
PATH_SIBLINGS, PATH, HEAVIEST = "path+siblings", "path", "heaviest"
ORDERS = (PATH_SIBLINGS, PATH, HEAVIEST)
EDGE_ORDERS = (PATH, HEAVIEST)  # without `siblings`


def coarsen_groups(graph: Graph, target: int, cluster: Cluster | None = None,
                   colocation: str = DEFAULT_COLOCATION, siblings: bool = False) -> list[str]:
    """Group name ("g0", "g1", ... in topological order) of every op of `graph`, in op order: of the
    groupings of `ORDERS` (with `siblings`) or of `EDGE_ORDERS`, the one with the lowest coarse
    bound (`grouped_bound`, with `siblings` and a cluster), else the shortest critical path of node
    costs; under `memory_cap`, halved while the coarse graph's own peak leaves too little spare for
    the groups built (`_packs`), `CAP_TRIES` times at most, then the all-alive cap.

    The merges allocate hundreds of thousands of small tuples and dicts and leave no cycles: with
    the collector paused, it does not rescan the graph's objects again and again (a quarter of the
    time at 50,000 ops)."""
    with gc_paused():
        return _coarsen_groups(graph, target, cluster, colocation, siblings)


def _coarsen_groups(graph: Graph, target: int, cluster: Cluster | None, colocation: str, siblings: bool) -> list[str]:
    """`coarsen_groups`, the collector paused."""
    n = len(graph.ops)
    if n == 0:
        return []
    index = {op.name: i for i, op in enumerate(graph.ops)}
    edges = _fine_edges(graph, index)
    cost = [_proxy_cost(op, cluster) for op in graph.ops]
    footprint = footprints(graph)  # a node's memory: its members' bytes, as if all held all step
    mem = [footprint[op.name] for op in graph.ops]
    label, split = colocation_labels(graph, edges, colocation)
    fused = _fused_edges(graph)
    colocated = Contraction(n, edges, cost, mem)
    for members in members_by_label(label).values():
        head = members[0]
        for m in members[1:]:
            head = colocated.contract(head, m)  # the group as a whole was checked acyclic
    class_of_op, split_totals = split_classes(graph, split, cost, mem)

    def grouping(memory: float) -> list[str]:
        best: tuple[float, list[str]] | None = None
        for order in ORDERS if siblings else EDGE_ORDERS:
            dag = colocated.copy()
            classes = ColocationClasses(split_totals.weight, split_totals.memory)
            _contract(dag, target, sum(cost), cluster, memory, _node_classes(dag, class_of_op), classes, fused, order)
            groups = _name_groups(dag, n)
            score = grouped_bound(graph, cluster, groups) if siblings and cluster is not None else dag.path_levels()[2]
            if best is None or score < best[0] * (1 - 1e-9):
                best = (score, groups)
        assert best is not None
        return best[1]

    floor = all_alive_cap(sum(mem), cluster)
    # the cap with nothing held bounds `memory_cap` (for any peak): where the floor reaches it,
    # the graph's peak, a walk over every tensor's lifetime, cannot raise the cap
    cap = floor if floor >= all_alive_cap(0.0, cluster) else max(floor, memory_cap(graph, cluster))
    for _ in range(CAP_TRIES):
        groups = grouping(cap)
        if cap <= floor or cluster is None or _packs(graph, cluster, groups, cap):
            return groups
        cap = max(floor, cap / 2)
    return grouping(floor)


def grouped_bound(graph: Graph, cluster: Cluster, groups: list[str]) -> float:
    """The lower bound (`pesto_ir.schedule.bounds`) of `graph` contracted by `groups` (a name per op): what
    no plan of the coarse graph can beat, transfers at joins included."""
    g = graph.clone()
    for op, name in zip(g.ops, groups):
        op.attrs["group"] = StringAttr(name)
    return lower_bound(quotient_graph(g, cluster)[0], cluster)


def _contract(dag: Contraction, target: int, total: float, cluster: Cluster | None, memory: float,
              node_class: dict[int, int], classes: ColocationClasses,
              fused: Callable[[Contraction, int, int], bool] | None, order: str) -> None:
    """Contract `dag` (colocation groups already contracted) toward `target` nodes under the caps
    (`memory`: `memory_cap`): edges inside fused kernels first, then any edge (and, in the order
    `PATH_SIBLINGS`, siblings)."""
    devices = len(cluster) if cluster is not None else DEVICES_WITHOUT_CLUSTER
    caps = _Caps.initial(dag, target, total, memory, devices)
    if fused is not None:
        _contract_rounds(dag, target, caps, node_class, classes, order, fused)
    _contract_rounds(dag, target, caps, node_class, classes, order)


def _fused_edges(graph: Graph) -> Callable[[Contraction, int, int], bool] | None:
    """Whether an edge joins parts of one fused kernel (the `fusion` labels annotate-costs writes);
    None when no op has a label."""
    labels = [op.get("fusion") for op in graph.ops]
    if all(label is None for label in labels):
        return None

    def fused(dag: Contraction, u: int, v: int) -> bool:
        mine = {labels[m] for m in dag.members[u]} - {None}
        return any(labels[m] in mine for m in dag.members[v])

    return fused


def _fine_edges(graph: Graph, index: dict[str, int]) -> dict[tuple[int, int], int]:
    """Bytes of every producer -> consumer pair (each value counted once per consumer op), in the
    order of `graph.edges()`."""
    edges: dict[tuple[int, int], int] = {}
    for c, op in enumerate(graph.ops):
        seen: set[int] = set()
        for v in op.operands:
            p = v.owner
            if p is None or id(v) in seen:
                continue
            seen.add(id(v))
            key = (index[p.name], c)
            edges[key] = edges.get(key, 0) + value_bytes(v)
    return edges


def _proxy_cost(op: Op, cluster: Cluster | None) -> float:
    """One number for an op's cost: its mean over the cluster's devices (or over its cost keys)."""
    if cluster is not None:
        a = op.attrs.get("cost")
        if not isinstance(a, DictAttr):  # one duration (or none) for every device: `op_cost` read once
            return sum(repeat(0.0 if a is None else float(a.value), len(cluster))) / len(cluster)
        return sum(op_cost(op, d) for d in cluster.devices) / len(cluster)
    keys = cost_keys(op)
    if keys is None:
        return op_cost(op, KEY_DEVICE)
    return sum(op_cost(op, key_device(k)) for k in keys) / len(keys)



def _node_classes(dag: Contraction, class_of_op: dict[int, int]) -> dict[int, int]:
    """The split class each live node holds a part of (nodes hold at most one at this point)."""
    return {x: class_of_op[x] for x in dag.alive if x in class_of_op}


@dataclass
class _Caps:
    """Limits on a merged node's cost and memory and on what a colocation class forces together."""

    cost: float
    memory: float
    class_cost: float

    @staticmethod
    def initial(dag: Contraction, target: int, total: float, memory: float, devices: int) -> _Caps:
        biggest = max(dag.cost[x] for x in dag.alive)
        return _Caps(max(biggest, NODE_CAP_FACTOR * total / target), memory, total / (CLASS_SHARE * max(1, devices)))


def memory_cap(graph: Graph, cluster: Cluster | None) -> float:
    """Largest memory a coarse node may hold: min(smallest / 2, (C - P) / (k - 1)) over k devices of
    C bytes in all, the smallest holding `smallest`, where P is `sequential_peak(graph)`: what the
    lifetimes of `pesto_ir.schedule.memory` hold at the busiest moment of the ops run one after
    another in graph order (resident bytes and graph inputs all step, each output until its last
    reader has ended, workspace while its op runs). With one device, the device; without a cluster,
    no cap.

    Why groups of at most s bytes pack. Walk the coarse graph in a topological order, one group at
    a time, and put each group on a device with room for it beside what that device holds at that
    moment. The devices together then hold at most P_c, the coarse graph's own sequential peak, the
    group being placed included. A group of s bytes that fits nowhere finds less than s free on
    every device: C - (P_c - s) < k * s, that is C - P_c < (k - 1) * s. So no group of at most s
    bytes is refused while C - P_c >= (k - 1) * s; half the smallest device lets any group onto any
    device that holds little yet. Merging holds tensors longer than the fine ops do (a group's
    internal tensors while all of it runs, its outputs from its start), so P_c may pass P:
    `coarsen_groups` checks the inequality on the coarse graph it built (`_packs`) and groups again
    under a smaller cap where it fails, never below `all_alive_cap`, whose argument needs no
    lifetimes. A graph whose peak fits the devices together (P < C) gets a positive cap, where the
    all-alive sum of a training step's activations can be several times C (jax gpt24: 596 GiB
    against a peak of 99 GiB).

    What it leaves to the placers: a plan runs groups side by side, each device's busiest moment
    falls at its own time, resident bytes placed later count at a device's earlier moments too, and
    a tensor read on another device is held there as well. The placers' own lifetime checks
    (`Memory`, `schedule_within_memory`) and the exact peak of every plan decide those, as under
    the all-alive cap, which left copies out too.
    """
    if cluster is None or len(cluster) == 1:
        return all_alive_cap(0.0, cluster)  # no cap, or the one device: no peak to compute
    return all_alive_cap(sequential_peak(graph), cluster)


def all_alive_cap(held: float, cluster: Cluster | None) -> float:
    """The cap when every byte counts as held all step (`held`: the graph's footprints summed):
    min(smallest / 2, (C - held) / (k - 1)). Nodes of at most s bytes always fit greedily when the
    devices' spare memory C - held is at least (k - 1) * s: each device then wastes less than s.
    Often 0 on training steps, whose activations do not all live at once. `memory_cap` is this
    formula with the lifetime peak as what is held."""
    if cluster is None:
        return float("inf")
    k = len(cluster)
    smallest = min(d.memory for d in cluster.devices)
    if k == 1:
        return smallest
    spare = sum(d.memory for d in cluster.devices) - held
    return min(smallest / 2, max(0.0, spare) / (k - 1))


def _packs(graph: Graph, cluster: Cluster, groups: list[str], cap: float) -> bool:
    """Whether the coarse graph of `groups` leaves room for its groups (`memory_cap`'s argument):
    C - P_c >= (k - 1) * s, with s its largest group's footprint, or the cap where that footprint is
    larger (a single op or colocation group, contracted before any cap applies: every plan holds it
    whole)."""
    g = graph.clone()
    for op, name in zip(g.ops, groups):
        op.attrs["group"] = StringAttr(name)
    coarse = quotient_graph(g, cluster)[0]
    largest = min(cap, max(footprints(coarse).values(), default=0))
    spare = sum(d.memory for d in cluster.devices) - sequential_peak(coarse)
    return spare >= (len(cluster) - 1) * largest


SEQUENTIAL = "sequential"  # the one device of `sequential_peak`'s plan


def sequential_peak(graph: Graph) -> int:
    """Bytes `graph` holds at its busiest moment run on one device, one op after another in graph
    order (a topological order), by the lifetimes of `pesto_ir.schedule.memory`."""
    slots = {op.name: OpSlot(SEQUENTIAL, float(i), float(i + 1)) for i, op in enumerate(graph.ops)}
    held = live_bytes(graph, Plan(graph.name, SEQUENTIAL, [SEQUENTIAL], slots))[SEQUENTIAL]
    return max((live for _, live in held), default=0)


def _contract_rounds(dag: Contraction, target: int, caps: _Caps, node_class: dict[int, int],
                     classes: ColocationClasses, order: str,
                     only: Callable[[Contraction, int, int], bool] | None = None) -> None:
    """Merge in safe batches, in `order`, until `target` nodes remain or none can merge. With
    `only`, merge only the edges it accepts (the node cost cap does not apply to them)."""
    while len(dag.alive) > target:
        levels = dag.round_levels(order != HEAVIEST)
        batch, capped = _choose_batch(dag, levels, len(dag.alive) - target, caps, node_class, classes, order, only)
        if only is None:
            batch += _twin_merges(dag, len(dag.alive) - target - len(batch), caps, node_class, classes,
                                  {x for u, v, _ in batch for x in (u, v)})
        if not batch:
            if not capped or only is not None:
                return
            caps.cost *= CAP_RELAX
            continue
        survivors = dag.contract_all([(u, v) for u, v, _ in batch])
        for (u, v, c), w in zip(batch, survivors):
            node_class.pop(u, None)
            node_class.pop(v, None)
            if c is not None:
                node_class[w] = c


def _join_classes(dag: Contraction, u: int, v: int, node_class: dict[int, int], classes: ColocationClasses) -> int | None:
    """Record that u and v merge: the class they end up in, its totals updated (None if neither has one).

    Done when a merge joins the batch, so the caps see every earlier merge of the same round.
    """
    cu, cv = node_class.get(u), node_class.get(v)
    if cu is not None and cv is not None:
        return classes.union(cu, cv)
    if cu is None and cv is None:
        return None
    c, free = (classes.find(cu), v) if cu is not None else (classes.find(cv), u)  # type: ignore[arg-type]
    classes.weight[c] += dag.cost[free]
    classes.memory[c] += dag.mem[free]
    return c


_Candidate = tuple[bool, float, int, int, int, int, str]  # (not in one class, growth, -bytes, level, u, v, kind)


def _edge_candidates(dag: Contraction, levels: Levels, node_class: dict[int, int], classes: ColocationClasses,
                     keep_path: bool, only: Callable[[Contraction, int, int], bool] | None) -> list[_Candidate]:
    """Every edge (accepted by `only`) as a merge candidate, its sort key first: edges inside one
    colocation class, then least lengthening of the critical path (`keep_path`), heaviest tensor,
    lowest level."""
    succ, level, find = dag.succ, levels.level, classes.find
    edges = [(u, v) for u in dag.alive for v in succ[u]]
    if only is not None:
        edges = [(u, v) for u, v in edges if only(dag, u, v)]
    growths = dag.edge_growths(levels, edges) if keep_path else repeat(0.0)
    if not node_class:  # no colocation class: every edge is outside one
        return [(True, g, -succ[u][v], level[u], u, v, EDGE) for (u, v), g in zip(edges, growths)]
    return [((cu := node_class.get(u)) is None or (cv := node_class.get(v)) is None or find(cu) != find(cv),
             g, -succ[u][v], level[u], u, v, EDGE) for (u, v), g in zip(edges, growths)]


def _choose_batch(dag: Contraction, levels: Levels, budget: int, caps: _Caps,
                  node_class: dict[int, int], classes: ColocationClasses, order: str,
                  only: Callable[[Contraction, int, int], bool] | None = None,
                  ) -> tuple[list[tuple[int, int, int | None]], bool]:
    """Merges to make this round (edges, or in the order `PATH_SIBLINGS` siblings: no shared
    endpoints, safe together, accepted by `only`); and whether the cost cap blocked any."""
    level, top, bottom, path = levels.level, levels.top, levels.bottom, levels.path
    cands = _edge_candidates(dag, levels, node_class, classes, order != HEAVIEST, only)
    if order == PATH_SIBLINGS and only is None:
        for a, b in _sibling_pairs(dag, level, top):
            same = a in node_class and b in node_class and classes.find(node_class[a]) == classes.find(node_class[b])
            cands.append((not same, dag.sibling_growth(a, b, top, bottom, path), 0, level[a], a, b, SIBLINGS))
    cands.sort()
    safe = dag.safe_rule(level)
    pred = dag.pred
    marked: set[int] = set()
    batch: list[tuple[int, int, int | None]] = []
    capped = False
    slack = GROWTH_TOLERANCE * path
    limit = min(budget, max(1, int(len(dag.alive) * FREE_SHARE))) if order == PATH_SIBLINGS else budget
    kind = ""
    for _, growth, _, _, u, v, what in cands:
        if growth > slack:
            if batch:
                break  # the levels moved: measure again before lengthening the path
            limit = min(budget, max(1, int(len(dag.alive) * LENGTHENING_SHARE)))
            slack = math.inf
        if u in marked or v in marked or (kind and what != kind):
            continue  # a batch merges edges or siblings, not both: each kind is safe by its own rule
        if what == EDGE and not safe(u, v):
            continue
        blocked = _blocked_by(dag, u, v, caps, node_class, classes)
        if blocked == "cost" and only is not None:
            blocked = ""  # a fused kernel is one unit of work: the node cost cap does not split it
        if blocked:
            capped = capped or blocked == "cost"
            continue
        batch.append((u, v, _join_classes(dag, u, v, node_class, classes)))
        kind = what
        marked.add(u)
        marked.add(v)
        if what == EDGE:
            lu = level[u]
            marked.update(p for p in pred[v] if level[p] == lu)
        if len(batch) == limit:
            break
    return batch, capped


def _twin_merges(dag: Contraction, budget: int, caps: _Caps, node_class: dict[int, int],
                 classes: ColocationClasses, taken: set[int]) -> list[tuple[int, int, int | None]]:
    """Pairs of twins to merge this round besides the batch (whose nodes, `taken`, stay out), up
    to `budget`: in each class of more than `TWIN_CLASS` twins, cheapest with next cheapest, until
    the class is down to `TWIN_CLASS` or half its size, under the caps.

    Twins are joined by no path (a path from one to the other would end in a predecessor of the
    second, which is one of the first: a cycle), and they stay twins whatever the batch merges
    around them, so merging them keeps the graph acyclic beside any batch. Merged among
    themselves they keep their parallelism; merged one by one into the node they share they would
    run in sequence, and take a round each (`TWIN_CLASS`)."""
    if budget <= 0 or len(dag.alive) <= TWIN_CLASS:
        return []
    merges: list[tuple[int, int, int | None]] = []
    cost = dag.cost
    for twins in _twin_classes(dag, taken):
        wanted = min(len(twins) // 2, len(twins) - TWIN_CLASS)
        twins.sort(key=lambda x: (cost[x], x))
        made = 0
        waiting = -1
        for x in twins:
            if made == wanted or len(merges) == budget:
                break
            if waiting < 0:
                waiting = x
            elif _blocked_by(dag, waiting, x, caps, node_class, classes):
                waiting = x  # the cheaper one merges with nothing this round: the next is dearer still
            else:
                merges.append((waiting, x, _join_classes(dag, waiting, x, node_class, classes)))
                made += 1
                waiting = -1
    return merges


def _twin_classes(dag: Contraction, taken: set[int]) -> list[list[int]]:
    """The classes of more than `TWIN_CLASS` live nodes outside `taken` with the same predecessors
    and successors, each in node order, the classes in the order of their first nodes.

    A twin of x is a reader of each of x's inputs and a writer of each of its readers, so x is
    passed over, without building its key, where one of them has too few for a large class."""
    succ, pred = dag.succ, dag.pred
    by_neighbours: dict[tuple[object, object], list[int]] = defaultdict(list)
    for x in dag.alive:
        if x in taken:
            continue
        inputs, readers = pred[x], succ[x]
        some_input = some_reader = None  # a set's key: None if empty, its one node, or the set
        if inputs:
            some_input = next(iter(inputs))
            if len(succ[some_input]) <= TWIN_CLASS:
                continue
        if readers:
            some_reader = next(iter(readers))
            if len(pred[some_reader]) <= TWIN_CLASS:
                continue
        by_neighbours[(some_input if len(inputs) < 2 else frozenset(inputs),
                       some_reader if len(readers) < 2 else frozenset(readers))].append(x)
    return [twins for twins in by_neighbours.values() if len(twins) > TWIN_CLASS]


def _sibling_pairs(dag: Contraction, level: list[int], top: list[float]) -> list[tuple[int, int]]:
    """Pairs of nodes no path joins, that may merge (Pesto's rules merge only along edges): nodes of
    one longest-path level (every edge climbs a level, so merging any number of such pairs keeps
    the levels a proof of acyclicity), and sinks (no path leaves one). Neighbours in order of
    their top level, so that work ready at about the same time merges."""
    by_level: dict[int, list[int]] = defaultdict(list)
    for x in dag.alive:
        by_level[level[x]].append(x)
    sinks = [x for x in dag.alive if not dag.succ[x]]
    pairs: set[tuple[int, int]] = set()
    for nodes in [*by_level.values(), sinks]:
        nodes.sort(key=lambda x: (top[x], x))
        for gap in range(1, SIBLING_REACH + 1):
            pairs.update((min(a, b), max(a, b)) for a, b in zip(nodes, nodes[gap:]))
    return sorted(pairs)


def _blocked_by(dag: Contraction, u: int, v: int, caps: _Caps, node_class: dict[int, int],
                classes: ColocationClasses) -> str:
    """Which cap forbids merging u and v: "" (none), "cost" (only the relaxable node cost cap) or "hard"."""
    if dag.mem[u] + dag.mem[v] > caps.memory:
        return "hard"
    cu, cv = node_class.get(u), node_class.get(v)
    free = v if cu is not None else u
    cost, mem = classes.merged(cu, cv, dag.cost[free], dag.mem[free])
    if cost > caps.class_cost or mem > caps.memory:
        return "hard"
    return "cost" if dag.cost[u] + dag.cost[v] > caps.cost else ""


def _name_groups(dag: Contraction, n: int) -> list[str]:
    """Name live nodes g0, g1, ... in a topological order of the contracted graph (stable by op index)."""
    import heapq

    indeg = {x: len(dag.pred[x]) for x in dag.alive}
    first = {x: min(dag.members[x]) for x in dag.alive}
    ready = [(first[x], x) for x, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    names = [""] * n
    count = 0
    while ready:
        _, x = heapq.heappop(ready)
        name = f"g{count}"
        count += 1
        for m in dag.members[x]:
            names[m] = name
        for s in dag.succ[x]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (first[s], s))
    if count != len(dag.alive):
        raise RuntimeError("coarsening closed a cycle (a bug in the merge rules)")
    return names
