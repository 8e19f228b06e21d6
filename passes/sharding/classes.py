"""Parameter classes: the inputs a tensor-parallel layout splits together, tied across layers.

A parameter and its optimizer state meet in elementwise ops of one shape (Adam's moments, the
update): split one along an axis and the others must follow, or the update reads a whole value
where a block is needed and slices it (`replica_slice`) instead of holding only the block. They form
a *family*: the inputs joined by such ops (union-find over values through same-shape
elementwise ops). Families of repeated layers (the same shapes, read by the same ops) form one
*class*, which a layout splits alike: a 100-layer model is one layer's decisions, as Alpa,
ColossalAI and PyTorch's autoparallel tie repeated layers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from pesto_ir.ir.graph import Graph, Value
from pesto_ir.ir.types import TensorType
from pesto_ir.passes.rewrite.batch_axes import ELEMENTWISE
from pesto_ir.util.union_find import find_root


@dataclass(frozen=True)
class ParamClass:
    """Families of inputs that a layout splits alike, the axes each may be split along, and the
    bytes they hold (what splitting them saves per rank)."""

    families: tuple[tuple[str, ...], ...]
    shape: tuple[int, ...]
    nbytes: int

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for f in self.families for n in f)

    def axes(self, t: int) -> list[int]:
        """The axes every member splits along into t equal blocks of at least one row."""
        return [a for a, n in enumerate(self.shape) if n % t == 0 and n >= t]


def families(graph: Graph) -> list[tuple[str, ...]]:
    """The inputs (rank >= 1), grouped by the same-shape elementwise ops joining them; in input
    order. Batch inputs are families too: split along the sequence, they make the activations
    between the tensor-parallel layers sequence-parallel (Megatron-SP), gathered before each
    column-parallel layer and reduce-scattered after each row-parallel one."""
    parent: dict[int, int] = {}

    def root(v: Value) -> int:
        parent.setdefault(id(v), id(v))
        return find_root(parent, id(v))

    for op in graph.ops:
        if op.opcode not in ELEMENTWISE:
            continue
        for r in op.results:
            for x in op.operands:
                if x.type == r.type or (_shape(x) == _shape(r) and _shape(r)):
                    a, b = root(x), root(r)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
    grouped: dict[int, list[str]] = defaultdict(list)
    for v in graph.inputs:
        if isinstance(v.type, TensorType) and v.type.rank >= 1:
            grouped[root(v)].append(v.name)
    return [tuple(names) for names in grouped.values()]


def parameter_classes(graph: Graph) -> list[ParamClass]:
    """The graph's parameter classes, largest first (ties by first name): families with one
    shape and the same readers (opcode and operand position of each use of each member) are one."""
    inputs = {v.name: v for v in graph.inputs}
    tied: dict[tuple[object, ...], list[tuple[str, ...]]] = defaultdict(list)
    for family in families(graph):
        shapes = {_shape(inputs[n]) for n in family}
        if len(shapes) != 1:
            continue  # members of several shapes (a broadcast in between): split none of them
        key = (next(iter(shapes)), tuple(_readers(inputs[n]) for n in family))
        tied[key].append(family)
    out = []
    for (shape, _), fams in tied.items():
        nbytes = sum(inputs[n].type.nbytes for f in fams for n in f)
        out.append(ParamClass(tuple(fams), shape, nbytes))  # type: ignore[arg-type]
    return sorted(out, key=lambda c: (-c.nbytes, c.names[0]))


def _readers(v: Value) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((op.opcode, i) for op in v.users() for i, x in enumerate(op.operands) if x is v))


def _shape(v: Value) -> tuple[int, ...]:
    return v.type.shape if isinstance(v.type, TensorType) else ()


def layer_count(classes: list[ParamClass]) -> int:
    """How many layers the model repeats: the number of families most classes tie (a layer's
    weights are one class each, while its vectors of one shape may tie into one class of several
    per layer); 1 where no class ties families."""
    counts = Counter(len(c.families) for c in classes if len(c.families) > 1)
    return max(counts, key=lambda n: (counts[n], n)) if counts else 1
