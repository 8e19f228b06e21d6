"""The graph `coarsen` contracts: a DAG over a graph's ops whose nodes merge, with the longest-path
levels and critical path its merge rules read, and the union-find of the colocation classes that
merges of split colocation groups force together (the rules: `passes/coarsen.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from pesto_ir.util.union_find import find_root


class Contraction:
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

    def edge_growth(self, top: dict[int, float], bottom: dict[int, float], path: float) -> Callable[[int, int], float]:
        """How much merging edge u -> v lengthens the critical path (as the levels stand), as a
        function of (u, v): the merged node starts when u and v's other inputs are ready and holds
        back u's other readers until v is done too.

        Each node's two latest inputs and two longest readers are found once, so an edge costs
        O(1) however many readers its producer has: scanning u's readers for every edge u -> v
        made a node read by N others cost N^2 a round (a 1 -> 1,000 star took 38 s to coarsen)."""
        ready = {x: _best_two((top[p] + self.cost[p], p) for p in self.pred[x]) for x in self.alive}
        after = {x: _best_two((bottom[w], w) for w in self.succ[x]) for x in self.alive}
        cost = self.cost

        def growth(u: int, v: int) -> float:
            start = max(top[u], _without(ready[v], u))
            later = max(0.0, _without(after[u], v), after[v][0])
            return max(0.0, start + cost[u] + cost[v] + later - path)

        return growth

    def sibling_growth(self, a: int, b: int, top: dict[int, float], bottom: dict[int, float], path: float) -> float:
        """How much merging a and b, joined by no path, lengthens the critical path: the merged node
        starts when both parts' inputs are ready and holds back both parts' readers until both are done."""
        start = max(top[a], top[b])
        after = max([0.0, *(bottom[w] for w in self.succ[a]), *(bottom[w] for w in self.succ[b])])
        return max(0.0, start + self.cost[a] + self.cost[b] + after - path)

    def safe_rule(self, level: dict[int, int]) -> Callable[[int, int], bool]:
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
