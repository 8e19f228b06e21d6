"""`coarsen{target=N}`: group ops into at most N coarse nodes (Pesto §3.3, as its public code does it).

Exact placement does not scale to thousands of ops, so ops are merged into coarse nodes first:

1. Colocation groups: each group is contracted first, unless contracting it would close a cycle
   (a path leaves the group and comes back, as from a layer's forward op to its gradient); such
   a group is split back into its ops, which stay colocated through the `colocate` label
   `quotient_graph` gives every coarse node holding a part of a group spread over several nodes.
   With `colocation=whole` a group is contracted as a whole; with `colocation=connected` (the
   default) each of its connected pieces (ops joined by edges inside the group) is. Contracting
   pieces that share no edge gains no locality but glues unrelated work into one block: on the
   MSR training layer graphs, whose forward op and gradient are colocated on parallel chains,
   m-ETF on 4 devices (target 200) gets 1.74 -> 1.14 times the lower bound on
   bert24_training_layer, 1.54 -> 1.09 on gnmt_training, 1.97 -> 1.73 on inceptionv3_training
   and 1.84 -> 1.54 on resnet50_training with connected pieces; no MSR graph gets worse.
2. Rounds of edge contraction: edges sorted heaviest tensor first (edges inside one split group
   before all others), a batch of merges with no shared endpoints per round, each merge only where
   it cannot close a cycle. With longest-path levels `lev` computed at the start of the round,
   u -> v is safe when v has one predecessor, or u one successor, or lev(v) = lev(u) + 1, or
   lev(v) is below the level of every other successor of u; and, as in Pesto's code, merging
   u -> v freezes v's other predecessors at u's level for the rest of the round, which makes a
   whole batch safe together (two merges u1 -> v1, u2 -> v2 with u1 -> v2 and u2 -> v1 would
   otherwise close a cycle).

3. Twice, keeping the grouping whose critical path (of node costs) is shorter: once with the
   edges ordered as in 2., and once ordered first by how much each merge would lengthen the
   critical path (the merged node starts when both parts' inputs are ready and holds back the
   readers of its first part until its second is done). Merges that lengthen it not at all come
   first, heaviest tensor first among them; once every merge lengthens it, at most
   `LENGTHENING_SHARE` of the nodes merge per round, least first, and the levels are measured
   again. On the JAX zoo at 200 groups the coarse bound went from 1.33-1.62 to 1.19-1.32 times
   the fine one (resnet 1.46 -> 1.27, gpt 1.33 -> 1.22, lstm_seq2seq 1.57 -> 1.23; the fused
   kernels alone account for 1.07-1.12), and the one-batch plans of lstm_seq2seq (k = 4) from
   7.91 to 6.93 ms, resnet from 70.2 to 64.9 ms; the heaviest-first grouping still wins on the
   MSR inceptionv3_training_layer (1.20 against 1.40).

4. With `siblings=true`, a third time in the least-lengthening order with merges of siblings too,
   keeping of the three the grouping whose coarse graph has the lowest lower bound
   (`grouped_bound`: the bound `place` reports, transfers at joins included). Siblings are two
   nodes no path joins: two of one longest-path level, or two sinks. Edges alone cannot merge an
   optimizer update with another, only into the backward pass it hangs off, which it then holds
   back; merged with each other where they have slack, they lengthen nothing. A round merges
   edges or siblings, not both, and at most `FREE_SHARE` of the nodes while the merges are free
   by the round's levels. It lowers the JAX zoo's coarse bound (`python3 bench/coarse_bound.py`,
   its `siblings` column: resnet 1.28 -> 1.21 times the fine one, gpt 1.22 -> 1.08 at 4 devices,
   gpt24 1.30 -> 1.14 at 8, lstm_seq2seq 1.25 -> 1.17, inception 1.32 -> 1.30; no MSR training
   graph gets worse), but a lower bound is not a faster plan: `auto`'s one-batch plans
   (`bench/place_row.py ... --coarsen siblings=true`, side by side with the default, 22 s) got
   4-6% faster on gpt (k = 4, 8), gpt24 (8) and inception (8), and 3-8% slower on lstm_seq2seq
   (k = 2, 4, 8), whose expanded coarse plans lost more to the fine schedule's transfers, and 2%
   on multitower (4); `auto` picks one batch on those two. So it is not the default.

Before step 2, ops of one fused kernel (the `fusion` label `annotate-costs{fusion=xla}` writes)
are merged the same way, only along edges inside a kernel: XLA runs them as one kernel, so splitting
them across devices would write out and send what never leaves registers. The memory and class
caps apply; the node cost cap does not (a kernel is one unit of work).

Node cost and memory are summed; a node's cost may not pass a cap (relaxed when it blocks every
merge) and its memory stays under half the smallest device and small enough to pack into the
memory the graph leaves spare. Merging parts of two different split groups makes them one
colocation class, so a class's cost (at most total / (4 devices)) and memory are capped too,
which keeps forced colocation from swallowing the graph.

The fine graph stays the pipeline's graph: the pass only writes a `group` attribute ("g17") on
every op. `quotient_graph` (`passes/rewrite/coarse_graph.py`) builds the coarse graph placement algorithms solve.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, value_bytes
from pesto_ir.ir.attributes import StringAttr
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.passes.rewrite.coarse_graph import (  # noqa: F401 (group_members, quotient_graph: re-exported)
    KEY_DEVICE,
    CoarsenError,
    cost_keys,
    group_members,
    key_device,
    quotient_graph,
)
from pesto_ir.passmanager import Pass, PassContext
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.memory import footprints
from pesto_ir.util.union_find import find_root

# Measured with bench/bench_place.py --targets on the 16 MSR graphs, k = 2 and 4: m-ETF's
# geometric-mean makespan / lower bound is 1.10 / 1.14 at 200 nodes, against 1.14 / 1.16-1.17 at
# 50 and 100 and 1.11 / 1.13 at 400; the MILP (20 s, k = 4, six graphs) does best at 200 too
# (1.19, against 1.24 at 50), while 400 would double its model for little gain.
DEFAULT_TARGET = 200
NODE_CAP_FACTOR = 2.0  # a coarse node may hold up to this many times an average node's cost
CAP_RELAX = 1.5  # the node cost cap grows by this factor when it blocks every merge
DEVICES_WITHOUT_CLUSTER = 8  # device count the class cap assumes when the pass has no cluster
CLASS_SHARE = 4  # a colocation class may force together up to 1 / (this * devices) of the work
COLOCATION_MODES = ("connected", "whole")
GROWTH_TOLERANCE = 1e-9  # of the critical path: a merge that lengthens it less is free
LENGTHENING_SHARE = 0.05  # of the nodes: at most this many merges a round once every merge lengthens the path
# of the nodes: at most this many merges a round while they lengthen nothing, in the order
# `PATH_SIBLINGS` (its fused kernels' rounds too; the other orders as before, without a limit): each
# merge is free by the round's levels, not all of them together (lstm_seq2seq's coarse bound at 200
# groups is 1.17 times the fine one with 0.25, 1.20 without a limit)
FREE_SHARE = 0.25
DEFAULT_COLOCATION = "connected"
SIBLING_REACH = 3  # a node may merge with the next this many of its level (or of the sinks) by top level
EDGE, SIBLINGS = "edge", "siblings"  # what a merge joins: the two ends of an edge, or two nodes no path joins
# the orders of merges tried (the grouping with the lowest coarse bound is kept): least lengthening
# first, with siblings or edges only, and heaviest tensor first
PATH_SIBLINGS, PATH, HEAVIEST = "path+siblings", "path", "heaviest"
ORDERS = (PATH_SIBLINGS, PATH, HEAVIEST)
EDGE_ORDERS = (PATH, HEAVIEST)  # without `siblings`


@dataclass(frozen=True)
class CoarsenPass(Pass):
    """Write a `group` attribute on every op: which coarse node it belongs to."""

    name = "coarsen"
    target: int = DEFAULT_TARGET
    colocation: str = DEFAULT_COLOCATION  # contract each colocation group "whole", or its "connected" pieces
    siblings: bool = False  # also merge nodes no path joins, keeping the grouping of the lowest coarse bound

    def __post_init__(self) -> None:  # checked when the pipeline is built, before any model is loaded
        if isinstance(self.target, bool) or not isinstance(self.target, int) or self.target < 1:
            raise CoarsenError(f"target must be at least 1 (a whole number of groups), got {self.target!r}")
        if self.colocation not in COLOCATION_MODES:
            raise CoarsenError(f"colocation must be one of {', '.join(COLOCATION_MODES)}, got '{self.colocation}'")
        if not isinstance(self.siblings, bool):
            raise CoarsenError(f"siblings must be true or false, got {self.siblings!r}")

    def run(self, graph: Graph, ctx: PassContext) -> None:
        groups = coarsen_groups(graph, self.target, ctx.cluster, self.colocation, self.siblings)
        for op, g in zip(graph.ops, groups):
            op.attrs["group"] = StringAttr(g)
        ctx.progress(f"coarsen: {len(graph.ops)} ops -> {len(set(groups))} groups (target {self.target})")


# ---------------------------------------------------------------- the contraction engine

class _Contraction:
    """A DAG over fine op indices whose nodes merge; each live node is named by one member."""

    def __init__(self, n: int, edges: dict[tuple[int, int], int], cost: list[float], mem: list[int]) -> None:
        self.succ: list[dict[int, int]] = [{} for _ in range(n)]
        self.pred: list[dict[int, int]] = [{} for _ in range(n)]
        for (a, b), nbytes in edges.items():
            self.succ[a][b] = nbytes
            self.pred[b][a] = nbytes
        self.cost = list(cost)
        self.mem = list(mem)
        self.members: list[list[int]] = [[i] for i in range(n)]
        self.alive: dict[int, None] = dict.fromkeys(range(n))

    def contract(self, u: int, v: int) -> int:
        """Merge node v into u (or u into v, whichever has more edges survives); returns the survivor."""
        if len(self.succ[u]) + len(self.pred[u]) < len(self.succ[v]) + len(self.pred[v]):
            u, v = v, u
        for s, b in self.succ[v].items():
            del self.pred[s][v]
            if s != u:
                self.succ[u][s] = self.succ[u].get(s, 0) + b
                self.pred[s][u] = self.pred[s].get(u, 0) + b
        for p, b in self.pred[v].items():
            del self.succ[p][v]
            if p != u:
                self.pred[u][p] = self.pred[u].get(p, 0) + b
                self.succ[p][u] = self.succ[p].get(u, 0) + b
        self.succ[v] = {}
        self.pred[v] = {}
        self.cost[u] += self.cost[v]
        self.mem[u] += self.mem[v]
        self.members[u].extend(self.members[v])
        self.members[v] = []
        del self.alive[v]
        return u

    def levels(self) -> dict[int, int]:
        """Longest-path level of every live node (sources are 0)."""
        level: dict[int, int] = {}
        for x in self.topological():
            level[x] = max((level[p] + 1 for p in self.pred[x]), default=0)
        return level

    def path_levels(self) -> tuple[dict[int, float], dict[int, float], float]:
        """Top level (longest path of node costs before a node), bottom level (longest path from
        its start to the end, its own cost included) of every live node, and the critical path."""
        order = self.topological()
        top: dict[int, float] = {}
        for x in order:
            top[x] = max((top[p] + self.cost[p] for p in self.pred[x]), default=0.0)
        bottom: dict[int, float] = {}
        for x in reversed(order):
            bottom[x] = self.cost[x] + max((bottom[s] for s in self.succ[x]), default=0.0)
        return top, bottom, max((top[x] + bottom[x] for x in order), default=0.0)

    def topological(self) -> list[int]:
        """The live nodes in a topological order."""
        indeg = {x: len(self.pred[x]) for x in self.alive}
        stack = [x for x, d in indeg.items() if d == 0]
        order = []
        while stack:
            x = stack.pop()
            order.append(x)
            for s in self.succ[x]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    stack.append(s)
        if len(order) != len(self.alive):
            raise RuntimeError("coarsening closed a cycle (a bug in the merge rules)")
        return order

    def growth(self, u: int, v: int, top: dict[int, float], bottom: dict[int, float], path: float) -> float:
        """How much merging edge u -> v lengthens the critical path (as the levels stand): the
        merged node starts when u and v's other inputs are ready and holds back u's other readers
        until v is done too."""
        start = max([top[u], *(top[p] + self.cost[p] for p in self.pred[v] if p != u)])
        after = max([0.0, *(bottom[w] for w in self.succ[u] if w != v), *(bottom[w] for w in self.succ[v])])
        return max(0.0, start + self.cost[u] + self.cost[v] + after - path)

    def sibling_growth(self, a: int, b: int, top: dict[int, float], bottom: dict[int, float], path: float) -> float:
        """How much merging a and b, joined by no path, lengthens the critical path: the merged node
        starts when both parts' inputs are ready and holds back both parts' readers until both are done."""
        start = max(top[a], top[b])
        after = max([0.0, *(bottom[w] for w in self.succ[a]), *(bottom[w] for w in self.succ[b])])
        return max(0.0, start + self.cost[a] + self.cost[b] + after - path)

    def safe(self, u: int, v: int, level: dict[int, int]) -> bool:
        """Whether contracting edge u -> v cannot close a cycle (see the module docstring)."""
        if len(self.pred[v]) == 1 or len(self.succ[u]) == 1 or level[v] == level[u] + 1:
            return True
        return all(level[v] < level[w] for w in self.succ[u] if w != v)


class _Classes:
    """Union-find over split colocation groups, with the cost and memory each class forces together."""

    def __init__(self, weight: list[float], memory: list[int]) -> None:
        self.parent = list(range(len(weight)))
        self.weight = list(weight)
        self.memory = list(memory)

    def find(self, c: int) -> int:
        return find_root(self.parent, c)

    def union(self, a: int, b: int) -> int:
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        if a > b:
            a, b = b, a
        self.parent[b] = a
        self.weight[a] += self.weight[b]
        self.memory[a] += self.memory[b]
        return a

    def merged(self, cu: int | None, cv: int | None, free_cost: float, free_mem: int) -> tuple[float, int]:
        """(cost, memory) a class would force together after a merge; (0, 0) when none is involved.

        With one class, the other node (`free_cost`, `free_mem`) joins it.
        """
        if cu is None and cv is None:
            return 0.0, 0
        if cu is not None and cv is not None:
            a, b = self.find(cu), self.find(cv)
            if a == b:
                return 0.0, 0
            return self.weight[a] + self.weight[b], self.memory[a] + self.memory[b]
        c = self.find(cu if cu is not None else cv)  # type: ignore[arg-type]
        return self.weight[c] + free_cost, self.memory[c] + free_mem


# ---------------------------------------------------------------- coarsening

def coarsen_groups(graph: Graph, target: int, cluster: Cluster | None = None,
                   colocation: str = DEFAULT_COLOCATION, siblings: bool = False) -> list[str]:
    """Group name ("g0", "g1", ... in topological order) of every op of `graph`, in op order: of the
    groupings of `ORDERS` (with `siblings`) or of `EDGE_ORDERS`, the one with the lowest coarse
    bound (`grouped_bound`, with `siblings` and a cluster), else the shortest critical path of node
    costs."""
    n = len(graph.ops)
    if n == 0:
        return []
    index = {op.name: i for i, op in enumerate(graph.ops)}
    edges = _fine_edges(graph, index)
    cost = [_proxy_cost(op, cluster) for op in graph.ops]
    footprint = footprints(graph)  # memory caps on groups count every byte as held all step
    mem = [footprint[op.name] for op in graph.ops]
    label, split = _colocation_labels(graph, edges, colocation)
    fused = _fused_edges(graph)
    best: tuple[float, list[str]] | None = None
    for order in ORDERS if siblings else EDGE_ORDERS:
        dag = _Contraction(n, edges, cost, mem)
        for members in _members_by_label(label).values():
            head = members[0]
            for m in members[1:]:
                head = dag.contract(head, m)  # the group as a whole was checked acyclic
        class_of_op, classes = _split_classes(graph, split, cost, mem)
        _contract(dag, target, sum(cost), cluster, _node_classes(dag, class_of_op), classes, fused, order)
        groups = _name_groups(dag, n)
        score = grouped_bound(graph, cluster, groups) if siblings and cluster is not None else dag.path_levels()[2]
        if best is None or score < best[0] * (1 - 1e-9):
            best = (score, groups)
    assert best is not None
    return best[1]


def grouped_bound(graph: Graph, cluster: Cluster, groups: list[str]) -> float:
    """The lower bound (`pesto_ir.schedule.bounds`) of `graph` contracted by `groups` (a name per op): what
    no plan of the coarse graph can beat, transfers at joins included."""
    g = graph.clone()
    for op, name in zip(g.ops, groups):
        op.attrs["group"] = StringAttr(name)
    return lower_bound(quotient_graph(g, cluster)[0], cluster)


def _contract(dag: _Contraction, target: int, total: float, cluster: Cluster | None, node_class: dict[int, int],
              classes: _Classes, fused: Callable[[_Contraction, int, int], bool] | None, order: str) -> None:
    """Contract `dag` (colocation groups already contracted) toward `target` nodes under the caps:
    edges inside fused kernels first, then any edge (and, in the order `PATH_SIBLINGS`, siblings)."""
    devices = len(cluster) if cluster is not None else DEVICES_WITHOUT_CLUSTER
    caps = _Caps.initial(dag, target, total, cluster, devices)
    if fused is not None:
        _contract_rounds(dag, target, caps, node_class, classes, order, fused)
    _contract_rounds(dag, target, caps, node_class, classes, order)


def _fused_edges(graph: Graph) -> Callable[[_Contraction, int, int], bool] | None:
    """Whether an edge joins parts of one fused kernel (the `fusion` labels annotate-costs writes);
    None when no op has a label."""
    labels = [op.get("fusion") for op in graph.ops]
    if all(label is None for label in labels):
        return None

    def fused(dag: _Contraction, u: int, v: int) -> bool:
        mine = {labels[m] for m in dag.members[u]} - {None}
        return any(labels[m] in mine for m in dag.members[v])

    return fused


def _fine_edges(graph: Graph, index: dict[str, int]) -> dict[tuple[int, int], int]:
    """Bytes of every producer -> consumer pair (each value counted once per consumer op)."""
    edges: dict[tuple[int, int], int] = {}
    for p, c, v in graph.edges():
        key = (index[p.name], index[c.name])
        edges[key] = edges.get(key, 0) + value_bytes(v)
    return edges


def _proxy_cost(op: Op, cluster: Cluster | None) -> float:
    """One number for an op's cost: its mean over the cluster's devices (or over its cost keys)."""
    if cluster is not None:
        return sum(op_cost(op, d) for d in cluster.devices) / len(cluster)
    keys = cost_keys(op)
    if keys is None:
        return op_cost(op, KEY_DEVICE)
    return sum(op_cost(op, key_device(k)) for k in keys) / len(keys)


def _colocation_labels(graph: Graph, edges: dict[tuple[int, int], int],
                       mode: str) -> tuple[list[int], set[str]]:
    """Node label per op after contracting colocation groups, and the names of groups left split.

    Each group (mode "whole") or each connected piece of a group (mode "connected": ops joined by
    edges inside the group) is contracted; while the contracted graph has a cycle, the pieces on
    each cycle (strongly connected component) spanning the most of the topological order are split
    back into ops. A group in more than one node is split: its nodes are kept colocated.
    """
    group_ops: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(graph.ops):
        g = op.get("colocate")
        if g is not None:
            group_ops[str(g)].append(i)
    pieces = _group_pieces(group_ops, edges) if mode == "connected" else \
        [(g, ops) for g, ops in group_ops.items()]
    label = list(range(len(graph.ops)))
    for _, ops in pieces:
        for i in ops:
            label[i] = ops[0]
    piece_of_head = {ops[0]: (g, ops) for g, ops in pieces if len(ops) > 1}
    split = {g for g, ops in group_ops.items() if len({label[i] for i in ops}) > 1}
    while True:
        sccs = _cyclic_components(label, edges)
        if not sccs:
            return label, split
        for comp in sccs:
            spans = {h: piece_of_head[h][1][-1] - h for h in comp if h in piece_of_head}
            cut = sorted(spans.values())[(len(spans) - 1) // 2]
            for h, span in spans.items():
                if span >= cut:
                    g, ops = piece_of_head.pop(h)
                    split.add(g)
                    for i in ops:
                        label[i] = i


def _group_pieces(group_ops: dict[str, list[int]],
                  edges: dict[tuple[int, int], int]) -> list[tuple[str, list[int]]]:
    """The connected pieces of every colocation group: its ops joined by edges inside the group."""
    group_of = {i: g for g, ops in group_ops.items() for i in ops}
    parent = {i: i for i in group_of}
    for a, b in edges:
        ga = group_of.get(a)
        if ga is not None and ga == group_of.get(b):
            ra, rb = find_root(parent, a), find_root(parent, b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    pieces: dict[int, list[int]] = defaultdict(list)
    for ops in group_ops.values():
        for i in ops:
            pieces[find_root(parent, i)].append(i)
    return [(group_of[root], ops) for root, ops in sorted(pieces.items())]


def _cyclic_components(label: list[int], edges: dict[tuple[int, int], int]) -> list[list[int]]:
    """Strongly connected components with more than one node of the graph contracted by `label`."""
    adj: dict[int, dict[int, None]] = {x: {} for x in dict.fromkeys(label)}
    for a, b in edges:
        la, lb = label[a], label[b]
        if la != lb:
            adj[la][lb] = None
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    for root in adj:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(adj[root]))]
        while work:
            v, it = work[-1]
            pushed = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(adj[w])))
                    pushed = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if pushed:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _members_by_label(label: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for i, lab in enumerate(label):
        out[lab].append(i)
    return {k: v for k, v in out.items() if len(v) > 1}


def _split_classes(graph: Graph, split: set[str], cost: list[float],
                   mem: list[int]) -> tuple[dict[int, int], _Classes]:
    """Class id of every op in a split group, and the union-find of those classes."""
    ids = {g: i for i, g in enumerate(sorted(split))}
    weight = [0.0] * len(ids)
    memory = [0] * len(ids)
    of_op: dict[int, int] = {}
    for i, op in enumerate(graph.ops):
        g = op.get("colocate")
        if g is not None and str(g) in ids:
            c = ids[str(g)]
            of_op[i] = c
            weight[c] += cost[i]
            memory[c] += mem[i]
    return of_op, _Classes(weight, memory)


def _node_classes(dag: _Contraction, class_of_op: dict[int, int]) -> dict[int, int]:
    """The split class each live node holds a part of (nodes hold at most one at this point)."""
    return {x: class_of_op[x] for x in dag.alive if x in class_of_op}


@dataclass
class _Caps:
    """Limits on a merged node's cost and memory and on what a colocation class forces together."""

    cost: float
    memory: float
    class_cost: float

    @staticmethod
    def initial(dag: _Contraction, target: int, total: float, cluster: Cluster | None, devices: int) -> _Caps:
        biggest = max(dag.cost[x] for x in dag.alive)
        return _Caps(max(biggest, NODE_CAP_FACTOR * total / target), _memory_cap(dag, cluster),
                     total / (CLASS_SHARE * max(1, devices)))


def _memory_cap(dag: _Contraction, cluster: Cluster | None) -> float:
    """Largest memory a merge may build: half the smallest device, and little enough to pack.

    Nodes of at most s bytes always fit greedily when the devices' spare memory (capacity minus
    the graph's needs) is at least (devices - 1) * s: each device then wastes less than s.
    """
    if cluster is None:
        return float("inf")
    k = len(cluster)
    smallest = min(d.memory for d in cluster.devices)
    if k == 1:
        return smallest
    spare = sum(d.memory for d in cluster.devices) - sum(dag.mem[x] for x in dag.alive)
    return min(smallest / 2, max(0.0, spare) / (k - 1))


def _contract_rounds(dag: _Contraction, target: int, caps: _Caps, node_class: dict[int, int],
                     classes: _Classes, order: str,
                     only: Callable[[_Contraction, int, int], bool] | None = None) -> None:
    """Merge in safe batches, in `order`, until `target` nodes remain or none can merge. With
    `only`, merge only the edges it accepts (the node cost cap does not apply to them)."""
    while len(dag.alive) > target:
        level = dag.levels()
        batch, capped = _choose_batch(dag, level, len(dag.alive) - target, caps, node_class, classes, order, only)
        if not batch:
            if not capped or only is not None:
                return
            caps.cost *= CAP_RELAX
            continue
        for u, v, c in batch:
            node_class.pop(u, None)
            node_class.pop(v, None)
            w = dag.contract(u, v)
            if c is not None:
                node_class[w] = c


def _join_classes(dag: _Contraction, u: int, v: int, node_class: dict[int, int], classes: _Classes) -> int | None:
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


def _choose_batch(dag: _Contraction, level: dict[int, int], budget: int, caps: _Caps,
                  node_class: dict[int, int], classes: _Classes, order: str,
                  only: Callable[[_Contraction, int, int], bool] | None = None,
                  ) -> tuple[list[tuple[int, int, int | None]], bool]:
    """Merges to make this round (edges, or in the order `PATH_SIBLINGS` siblings: no shared
    endpoints, safe together, accepted by `only`); and whether the cost cap blocked any."""
    cands = []
    keep_path = order != HEAVIEST
    top, bottom, path = dag.path_levels() if keep_path else ({}, {}, 0.0)
    for u in dag.alive:
        cu = node_class.get(u)
        for v, nbytes in dag.succ[u].items():
            if only is not None and not only(dag, u, v):
                continue
            cv = node_class.get(v)
            same = cu is not None and cv is not None and classes.find(cu) == classes.find(cv)
            growth = dag.growth(u, v, top, bottom, path) if keep_path else 0.0
            cands.append((not same, growth, -nbytes, level[u], u, v, EDGE))
    if order == PATH_SIBLINGS and only is None:
        for a, b in _sibling_pairs(dag, level, top):
            same = a in node_class and b in node_class and classes.find(node_class[a]) == classes.find(node_class[b])
            cands.append((not same, dag.sibling_growth(a, b, top, bottom, path), 0, level[a], a, b, SIBLINGS))
    cands.sort()
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
            slack = float("inf")
        if u in marked or v in marked or (kind and what != kind):
            continue  # a batch merges edges or siblings, not both: each kind is safe by its own rule
        if what == EDGE and not dag.safe(u, v, level):
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
            marked.update(p for p in dag.pred[v] if level[p] == lu)
        if len(batch) == limit:
            break
    return batch, capped


def _sibling_pairs(dag: _Contraction, level: dict[int, int], top: dict[int, float]) -> list[tuple[int, int]]:
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


def _blocked_by(dag: _Contraction, u: int, v: int, caps: _Caps, node_class: dict[int, int],
                classes: _Classes) -> str:
    """Which cap forbids merging u and v: "" (none), "cost" (only the relaxable node cost cap) or "hard"."""
    if dag.mem[u] + dag.mem[v] > caps.memory:
        return "hard"
    cu, cv = node_class.get(u), node_class.get(v)
    free = v if cu is not None else u
    cost, mem = classes.merged(cu, cv, dag.cost[free], dag.mem[free])
    if cost > caps.class_cost or mem > caps.memory:
        return "hard"
    return "cost" if dag.cost[u] + dag.cost[v] > caps.cost else ""


def _name_groups(dag: _Contraction, n: int) -> list[str]:
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
