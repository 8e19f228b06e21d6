"""Colocation groups before `coarsen` merges anything (`passes/coarsen.py`, step 1): each group, or
each connected piece of one, contracted unless that would close a cycle; the groups left split,
and the classes their parts force together.
"""

from __future__ import annotations

from collections import defaultdict

from pesto_ir.ir.graph import Graph
from pesto_ir.passes.rewrite.contraction import ColocationClasses
from pesto_ir.util.union_find import find_root

COLOCATION_MODES = ("connected", "whole")
DEFAULT_COLOCATION = "connected"


def colocation_labels(graph: Graph, edges: dict[tuple[int, int], int],
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


def members_by_label(label: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for i, lab in enumerate(label):
        out[lab].append(i)
    return {k: v for k, v in out.items() if len(v) > 1}


def split_classes(graph: Graph, split: set[str], cost: list[float],
                  mem: list[int]) -> tuple[dict[int, int], ColocationClasses]:
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
    return of_op, ColocationClasses(weight, memory)
