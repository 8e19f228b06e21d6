"""The graph `coarsen` contracts: a DAG over a graph's ops whose nodes merge, with the longest-path
levels and critical path its merge rules read, and the union-find of the colocation classes that
merges of split colocation groups force together (the rules: `passes/coarsen.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from pesto_ir.util.union_find import find_root


class Levels(NamedTuple):
    """What a round's merge rules read, by node (`Contraction.round_levels`): longest-path levels
    (sources are 0), and in the orders that keep the critical path short, top levels (longest path
    of node costs before a node), bottom levels (longest path from its start to the end, its own
    cost included), the critical path and the bottom level of each node's longest reader (-inf for
    none)."""

    level: list[int]
    top: list[float]
    bottom: list[float]
    path: float
    longest: list[float]


class Contraction:
    """A DAG over fine op indices whose nodes merge; each live node is named by one member.

    Per-node facts (`succ`, `pred`, `cost`, `mem`, `members`, and the levels below) are lists
    indexed by fine op index: a dead node's entries are empty or stale and never read."""

    def __init__(self, n: int, edges: dict[tuple[int, int], int], cost: list[float], mem: list[int]) -> None:
        self.succ: list[dict[int, int]] = [{} for _ in range(n)]
        self.pred: list[dict[int, int]] = [{} for _ in range(n)]
        succ, pred = self.succ, self.pred
        for (a, b), nbytes in edges.items():
            succ[a][b] = nbytes
            pred[b][a] = nbytes
        self.cost = list(cost)
        self.mem = list(mem)
        self.members: list[list[int]] = [[i] for i in range(n)]
        self.alive: dict[int, None] = dict.fromkeys(range(n))

    def copy(self) -> Contraction:
        """An independent copy, to contract one way while this one stays as it is."""
        out = Contraction.__new__(Contraction)
        out.succ = [d.copy() for d in self.succ]
        out.pred = [d.copy() for d in self.pred]
        out.cost = list(self.cost)
        out.mem = list(self.mem)
        out.members = [list(m) for m in self.members]
        out.alive = self.alive.copy()
        return out

    def contract(self, u: int, v: int) -> int:
        """Merge node v into u (or u into v, whichever has more edges survives); returns the survivor."""
        return self.contract_all([(u, v)])[0]

    def contract_all(self, pairs: Iterable[tuple[int, int]]) -> list[int]:
        """`contract` each pair in turn (a round's merges at once); returns the survivors."""
        succ, pred, cost, mem, members, alive = self.succ, self.pred, self.cost, self.mem, self.members, self.alive
        survivors = []
        for u, v in pairs:
            if len(succ[u]) + len(pred[u]) < len(succ[v]) + len(pred[v]):
                u, v = v, u
            succ_u, pred_u = succ[u], pred[u]
            for s, b in succ[v].items():
                pred_s = pred[s]
                del pred_s[v]
                if s != u:
                    succ_u[s] = succ_u.get(s, 0) + b
                    pred_s[u] = pred_s.get(u, 0) + b
            for p, b in pred[v].items():
                succ_p = succ[p]
                del succ_p[v]
                if p != u:
                    pred_u[p] = pred_u.get(p, 0) + b
                    succ_p[u] = succ_p.get(u, 0) + b
            succ[v] = {}
            pred[v] = {}
            cost[u] += cost[v]
            mem[u] += mem[v]
            members[u].extend(members[v])
            members[v] = []
            del alive[v]
            survivors.append(u)
        return survivors

    def path_levels(self) -> tuple[list[float], list[float], float]:
        """Top level (longest path of node costs before a node), bottom level (longest path from
        its start to the end, its own cost included) of every live node, by node, and the critical
        path."""
        levels = self.round_levels(True)
        return levels.top, levels.bottom, levels.path

    def round_levels(self, with_path: bool) -> Levels:
        """The levels a round of merges reads (`Levels`; without `with_path` only `level`), from
        one walk down a topological order and, `with_path`, one back up it.

        Each node passes its levels on to its readers (and back to its inputs) as it is reached:
        taking the largest over a node's inputs instead cost a call per node, most of a round's
        time on a graph of one-input nodes."""
        n = len(self.pred)
        pred, succ, cost = self.pred, self.succ, self.cost
        indeg = list(map(len, pred))
        order = [x for x in self.alive if not indeg[x]]
        append = order.append
        level = [0] * n
        if not with_path:
            for x in order:  # grows while read: each node is appended once its last input is
                lx = level[x] + 1
                for s in succ[x]:
                    if level[s] < lx:
                        level[s] = lx
                    d = indeg[s] - 1
                    indeg[s] = d
                    if not d:
                        append(s)
            self._check_acyclic(order)
            return Levels(level, [], [], 0.0, [])
        top = [-math.inf] * n
        for x in order:
            top[x] = 0.0  # the sources
        for x in order:
            lx, fx = level[x] + 1, top[x] + cost[x]
            for s in succ[x]:
                if level[s] < lx:
                    level[s] = lx
                if top[s] < fx:
                    top[s] = fx
                d = indeg[s] - 1
                indeg[s] = d
                if not d:
                    append(s)
        self._check_acyclic(order)
        bottom = [0.0] * n
        longest = [-math.inf] * n  # the bottom level of each node's longest reader
        path = -math.inf
        for x in reversed(order):
            bx = cost[x] + (longest[x] if succ[x] else 0.0)
            bottom[x] = bx
            if top[x] + bx > path:
                path = top[x] + bx
            for p in pred[x]:
                if longest[p] < bx:
                    longest[p] = bx
        return Levels(level, top, bottom, path if order else 0.0, longest)

    def _check_acyclic(self, order: list[int]) -> None:
        """Raise unless `order`, a walk from the sources, reached every live node (no cycle)."""
        if len(order) != len(self.alive):
            raise RuntimeError("coarsening closed a cycle (a bug in the merge rules)")

    def edge_growths(self, levels: Levels, edges: Iterable[tuple[int, int]]) -> list[float]:
        """How much merging each edge u -> v of `edges` (those of one u together) lengthens the
        critical path, as the levels stand: the merged node starts when u and v's other inputs are
        ready and holds back u's other readers until v is done too.

        Each node's two latest inputs and two longest readers are found once, so an edge costs
        O(1) however many readers its producer has: scanning u's readers for every edge u -> v
        made a node read by N others cost N^2 a round (a 1 -> 1,000 star took 38 s to coarsen)."""
        succ, pred, cost = self.succ, self.pred, self.cost
        top, bottom, path, longest = levels.top, levels.bottom, levels.path, levels.longest
        ready: dict[int, tuple[float, int, float]] = {}  # of nodes with several inputs, on demand
        out = []
        last, tu, cu, after = -1, 0.0, 0.0, (-math.inf, -1, -math.inf)
        for u, v in edges:
            if u != last:
                last, tu, cu, succ_u = u, top[u], cost[u], succ[u]
                if len(succ_u) == 1:
                    after = (longest[u], v, -math.inf)  # `_best_two` of its one reader
                else:
                    after = _best_two((bottom[w], w) for w in succ_u)
            if len(pred[v]) == 1:
                start = tu  # u is v's one input
            else:
                if v not in ready:
                    ready[v] = _best_two((top[p] + cost[p], p) for p in pred[v])
                start = max(tu, _without(ready[v], u))
            later = max(0.0, _without(after, v), longest[v])
            out.append(max(0.0, start + cu + cost[v] + later - path))
        return out

    def sibling_growth(self, a: int, b: int, top: Sequence[float], bottom: Sequence[float], path: float) -> float:
        """How much merging a and b, joined by no path, lengthens the critical path: the merged node
        starts when both parts' inputs are ready and holds back both parts' readers until both are done."""
        start = max(top[a], top[b])
        after = max([0.0, *(bottom[w] for w in self.succ[a]), *(bottom[w] for w in self.succ[b])])
        return max(0.0, start + self.cost[a] + self.cost[b] + after - path)

    def safe_rule(self, level: Sequence[int]) -> Callable[[int, int], bool]:
        """Whether contracting edge u -> v cannot close a cycle (`passes/coarsen.py`, step 2), by
        the levels of the round, as a function of (u, v). The lowest level among u's readers other
        than v comes from u's two lowest, found once per u, not by a scan of u's readers per edge."""
        lowest: dict[int, tuple[float, int, float]] = {}

        def safe(u: int, v: int) -> bool:
            if len(self.pred[v]) == 1 or len(self.succ[u]) == 1 or level[v] == level[u] + 1:
                return True
            if u not in lowest:
                lowest[u] = _best_two((-level[w], w) for w in self.succ[u])
            return level[v] < -_without(lowest[u], v)

        return safe


def _best_two(items: Iterable[tuple[float, int]]) -> tuple[float, int, float]:
    """(the largest value, its node, the largest value of the other nodes); -inf for none."""
    first, who, second = -math.inf, -1, -math.inf
    for value, x in items:
        if value > first:
            first, who, second = value, x, first
        elif value > second:
            second = value
    return first, who, second


def _without(best: tuple[float, int, float], x: int) -> float:
    """The largest value of `_best_two`'s nodes other than x."""
    return best[2] if best[1] == x else best[0]


class ColocationClasses:
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
