"""Repeated layers: find the copies of the block a model repeats, and shorten the model to a few.

A model of L identical layers traced into one graph (a Python loop over blocks, as the zoo's GPT and
most traced models are) repeats the same ops L times in each part of its step: the parameters'
casts, the forward pass, the backward pass (in reverse), the optimizer's update. Each part is a
*region*: a stretch of the graph's ops (literals aside) that is periodic, L copies of one period.
A decision tied across layers (a tensor-parallel layout ties repeated layers,
`passes/sharding/classes.py`) can then be scored on the model cut to its first k layers, a few
hundred ops instead of tens of thousands, and the whole model's cost follows linearly in k.

Copies correspond when each operand of an op reads, in every copy, one of: the same value (a mask,
the learning rate); the copy's own graph input (a parameter); the same op of its own copy or of the
copy next to it (the chain from layer to layer, which starts at a value outside the region); or the
same op of the same layer's copy in another region (the forward pass's activations, read by the
backward pass). The copies of every region are then numbered by layer, ascending or descending
(`_label`), so that `shorten` keeps the copies of layers 0..k-1: a kept op that read a dropped copy
reads the nearest kept copy instead, or, on the chain, the value the chain starts from.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass

from pesto_ir.ir.annotations import primitive_params
from pesto_ir.ir.attributes import DictAttr, ListAttr
from pesto_ir.ir.graph import DONATED, Graph, Op, Value
from pesto_ir.passes.dce import dead_code_elimination

MIN_PERIOD = 4  # ops in one copy: shorter runs (three adds in a row) are not layers
MAX_ROTATIONS = 64  # combinations of region starts tried before giving up


@dataclass(frozen=True)
class Region:
    """`copies` copies of `period` ops from `start` (indices into the graph's ops, literals aside);
    copy c is layer c, or layer L-1-c where `descending`."""

    start: int
    period: int
    copies: int
    descending: bool = False

    def layer(self, copy: int) -> int:
        return self.copies - 1 - copy if self.descending else copy

    def copy(self, layer: int) -> int:
        return self.copies - 1 - layer if self.descending else layer


@dataclass(frozen=True)
class RepeatedLayers:
    """The layers of a graph: how many, and the regions that repeat them."""

    layers: int
    regions: tuple[Region, ...]

    @property
    def ops_per_layer(self) -> int:
        return sum(r.period for r in self.regions)

    def positions(self, graph: Graph) -> dict[str, tuple[int, int, int]]:
        """Op name -> (region, layer, offset in the copy) for every op of a region; `shorten`
        keeps the names, so this places the ops of a shortened graph too."""
        seq = _sequence(graph)
        return {seq[i].name: (r, self.regions[r].layer(c), o) for i, (r, c, o) in _where(seq, self.regions).items()}


def find_repeated_layers(graph: Graph, layers: int) -> RepeatedLayers | None:
    """The regions of `graph` repeating `layers` times (the layer count its parameters show,
    `sharding.classes.layer_count`), or None where none corresponds copy to copy."""
    if layers < 3:
        return None
    seq = _sequence(graph)
    keys = _signatures(seq)
    segments = _periodic_segments(keys, layers)
    if not segments:
        return None
    choices = [range(0, slack + 1) for _, _, slack in segments]
    for shifts in itertools.islice(itertools.product(*choices), MAX_ROTATIONS):
        regions = [Region(a + s, p, layers) for (a, p, _), s in zip(segments, shifts)]
        labelled = _label(seq, regions)
        if labelled is not None:
            return RepeatedLayers(layers, tuple(labelled))
    return None


def shorten(graph: Graph, found: RepeatedLayers, keep: int) -> Graph:
    """A new graph of `graph` with only layers 0..keep-1 of every region (see the module
    docstring); the inputs and outputs only dropped copies read or give go too."""
    if not 1 <= keep < found.layers:
        raise ValueError(f"keep must be from 1 to {found.layers - 1}, not {keep}")
    seq = _sequence(graph)
    where = _where(seq, found.regions)
    dropped = {i for i, (r, c, _) in where.items() if found.regions[r].layer(c) >= keep}
    index = {id(op): i for i, op in enumerate(seq)}
    out = Graph(graph.name)
    new: dict[int, Value] = {}

    def resolve(v: Value, reader: int | None, slot: int) -> Value:
        while True:
            i = index.get(id(v.owner)) if v.owner is not None else None
            if i is None or i not in dropped:
                return new[id(v)]
            r, c, o = where[i]
            region = found.regions[r]
            if reader is not None and reader in where and where[reader][0] == r:
                rc, ro = where[reader][1], where[reader][2]
                start = 0 if c < rc else region.copies - 1  # the chain's first copy reads from outside
                v = seq[region.start + start * region.period + ro].operands[slot]
                reader = region.start + start * region.period + ro
                continue
            nearest = region.copy(min(region.layer(c), keep - 1))
            twin = seq[region.start + nearest * region.period + o]
            return new[id(twin.results[v.index])]

    kept_ops = [op for op in graph.ops if index.get(id(op)) not in dropped]
    _add_inputs(graph, out, new, {id(v) for op in kept_ops for v in op.operands})
    for op in kept_ops:
        i = index.get(id(op))
        operands = [resolve(v, i, s) for s, v in enumerate(op.operands)]
        twin = out.append(Op(op.name, op.opcode, operands, [r.type for r in op.results], op.attrs,
                             [r.name for r in op.results], op.loc))
        new.update((id(r), t) for r, t in zip(op.results, twin.results))
    out.set_outputs([new[id(v)] for v in graph.outputs if id(v) in new and
                     (v.owner is None or index.get(id(v.owner)) not in dropped)])
    kept = {v.name for v in out.inputs}
    gone = {v.name for v in graph.inputs} - kept
    for key, attr in graph.attrs.items():
        if isinstance(attr, DictAttr):
            attr = DictAttr(tuple((k, a) for k, a in attr.entries if k not in gone))
        elif key == DONATED and isinstance(attr, ListAttr):
            attr = ListAttr(tuple(a for a in attr.items if a.value not in gone))
        out.attrs[key] = attr
    dead_code_elimination(out)
    return out


def _add_inputs(graph: Graph, out: Graph, new: dict[int, Value], used: set[int]) -> None:
    """The inputs a kept op reads, and those nothing read in the first place."""
    for v in graph.inputs:
        if id(v) in used or not v.uses:
            new[id(v)] = out.add_input(v.name, v.type, v.param)


def _sequence(graph: Graph) -> list[Op]:
    """The ops a layer's copies are made of: all but literals, which traced programs share."""
    return [op for op in graph.ops if op.opcode != "constant"]


def _signatures(seq: list[Op]) -> list[int]:
    """Each op as a number: equal where opcode, primitive parameters and types are (annotations,
    a cost or a fused kernel's name among them, say nothing of what the op computes)."""
    ids: dict[object, int] = {}
    out = []
    for op in seq:
        key = (op.opcode, tuple(sorted(primitive_params(op).items())),
               tuple(r.type for r in op.results), tuple(v.type for v in op.operands))
        out.append(ids.setdefault(key, len(ids)))
    return out


def _periodic_segments(keys: list[int], layers: int) -> list[tuple[int, int, int]]:
    """(start, period, slack) of each stretch that is `layers` copies of one period, at least
    `MIN_PERIOD` long, and not overlapping one found before: its start may move by up to `slack`
    ops (a layer's last op may match the op before the first layer). The periods tried are the
    spacings of the signatures seen once per copy in each of one or more regions (the first and
    second moments' updates are alike); the periods covering most ops first."""
    positions: dict[int, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        positions[k].append(i)
    votes: Counter[int] = Counter()
    for ps in positions.values():
        if len(ps) % layers:
            continue
        for run in (ps[i:i + layers] for i in range(0, len(ps), layers)):
            gaps = {b - a for a, b in zip(run, run[1:])}
            if len(gaps) == 1 and (gap := next(iter(gaps))) >= MIN_PERIOD:
                votes[gap] += 1
    n = len(keys)
    found: list[tuple[int, int, int]] = []
    taken = [False] * n
    for period, _ in sorted(votes.items(), key=lambda kv: (-kv[0] * kv[1], kv[0])):
        i = 0
        while i + period < n:
            if keys[i] != keys[i + period]:
                i += 1
                continue
            j = i
            while j + period < n and keys[j] == keys[j + period]:
                j += 1
            length = j + period - i  # [i, j + period) is periodic
            if length // period == layers and not any(taken[i:j + period]):
                found.append((i, period, length - layers * period))
                for k in range(i, j + period):
                    taken[k] = True
            i = j
    return sorted(found)


def _where(seq: list[Op], regions: list[Region] | tuple[Region, ...]) -> dict[int, tuple[int, int, int]]:
    """Sequence index -> (region, copy, offset) for every op in a region."""
    out = {}
    for r, region in enumerate(regions):
        for c in range(region.copies):
            for o in range(region.period):
                out[region.start + c * region.period + o] = (r, c, o)
    return out


Link = tuple[int, int, int]  # (other region, direction +1/-1, offset k): copy c reads copy direction*c + k


def _label(seq: list[Op], regions: list[Region]) -> list[Region] | None:
    """The regions with their copies numbered by layer, where every operand corresponds copy to
    copy (module docstring) and one numbering makes every link between regions read the same
    layer or the one before (a backward pass reads its layer's input); else None."""
    where = _where(seq, regions)
    index = {id(op): i for i, op in enumerate(seq)}
    edges: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # both ways: region -> (other, direction, k)
    links: set[tuple[int, int, int, int]] = set()
    for r, region in enumerate(regions):
        for o in range(region.period):
            for s in range(len(seq[region.start + o].operands)):
                found = _link(seq, region, r, o, s, where, index)
                if found is False:
                    return None
                if isinstance(found, tuple):
                    other, direction, k = found
                    links.add((r, other, direction, k))
                    edges[r].append((other, direction, k))
                    edges[other].append((r, direction, k))
    descending: dict[int, bool] = {}
    for root in range(len(regions)):
        if root in descending:
            continue
        for first in (False, True):
            component = _orient(root, first, edges)
            if component is not None and all(_layer_step(regions, component, link) in (0, 1) for link in links
                                             if link[0] in component):
                descending.update(component)
                break
        else:
            return None
    return [Region(g.start, g.period, g.copies, descending[r]) for r, g in enumerate(regions)]


def _orient(root: int, first: bool, edges: dict[int, list[tuple[int, int, int]]]) -> dict[int, bool] | None:
    """Which regions of `root`'s component count their copies down, `root` counting down where
    `first`: a link of direction -1 joins regions counting opposite ways; None where they disagree."""
    descending = {root: first}
    todo = [root]
    while todo:
        r = todo.pop()
        for other, direction, _ in edges[r]:
            want = descending[r] != (direction < 0)
            if other not in descending:
                descending[other] = want
                todo.append(other)
            elif descending[other] != want:
                return None
    return descending


def _layer_step(regions: list[Region], descending: dict[int, bool], link: tuple[int, int, int, int]) -> int:
    """How many layers before its own a copy of the reading region reads, by the numbering."""
    reader, read, direction, k = link
    a = Region(0, 1, regions[reader].copies, descending[reader])
    b = Region(0, 1, regions[read].copies, descending[read])
    steps = {a.layer(c) - b.layer(direction * c + k) for c in range(a.copies) if 0 <= direction * c + k < b.copies}
    return steps.pop() if len(steps) == 1 else -1


def _link(seq: list[Op], region: Region, r: int, o: int, s: int, where: dict[int, tuple[int, int, int]],
          index: dict[int, int]) -> Link | None | bool:
    """How operand `s` of the op at offset `o` reads across the copies of region `r`: None where it
    needs no numbering (one shared value, the copy's own input, its own copy or the chain), a link
    to another region (with its first or last copies reading from outside, as a chain starts), or
    False where the copies do not correspond."""
    reads = []
    for c in range(region.copies):
        op = seq[region.start + c * region.period + o]
        if s >= len(op.operands):
            return False
        v = op.operands[s]
        i = index.get(id(v.owner)) if v.owner is not None else None
        reads.append((v, where.get(i) if i is not None else None))
    if all(v is reads[0][0] for v, _ in reads):
        return None
    if all(v.owner is None for v, _ in reads):
        return None if len({id(v) for v, _ in reads}) == len(reads) else False  # one input per copy
    inside = [(c, w[1]) for c, (_, w) in enumerate(reads) if w is not None]
    if len({(w[0], w[2], v.index) for v, w in reads if w is not None}) != 1 or len(inside) < 2:
        return False
    target = next(w[0] for _, w in reads if w is not None)
    (c0, a), (c1, b) = inside[0], inside[1]
    direction = 1 if b - a == c1 - c0 else -1 if b - a == c0 - c1 else 0
    k = a - direction * c0
    if direction == 0 or (target == r and direction != 1):
        return False
    inside_at = dict(inside)
    for c in range(region.copies):
        f = direction * c + k
        if (0 <= f < region.copies) != (c in inside_at) or (c in inside_at and inside_at[c] != f):
            return False
    return None if target == r else (target, direction, k)

