"""Which ops XLA runs as one kernel: a fusion analysis of a graph, for costing fused kernels.

XLA does not run a jaxpr equation per kernel. It fuses producer into consumer: chains of
elementwise and layout ops become one loop, a reduction takes its elementwise producers in
("input fusion"), and a matmul or convolution takes an elementwise epilogue (bias, activation).
A fused kernel reads its inputs from memory once, writes only what leaves it, and launches once;
its intermediates stay in registers. Costing every equation as its own kernel (each paying its
memory traffic and a launch) over-weights cheap ops against compute.

`fusion_groups` reproduces those rules on a graph, XLA's way round: ops are visited consumers
first (reverse topological order), and a producer joins its consumers' group when

* every op that reads it is in that one group (nothing is fused twice; its result never has to
  be written out for another reader), and
* the group takes it: a fusible op (`FUSIBLE`: elementwise, layout) joins a loop or a reduction
  group, not a matmul's (no prologue fusion); a matmul or convolution joins a group of
  elementwise ops only, as its epilogue, and becomes the group's hero; a reduction, and every
  other op (scatter, sort, windows, control flow, collectives, unknown opcodes), is never fused
  into a consumer.

Which of these an op is, is its definition's fusion class (`fusion` of `pesto_ir.ir.opdefs.OpDef`).

A group has at most one hero (matmul, convolution or reduction). Every group is closed under
"all users inside but the root", so the graph of groups is acyclic: a path out of a group leaves
from its root, the last of its ops.

Ops that only materialise a cheap value (`DUPLICATED`: broadcasts, iota, constants, identities)
are recomputed by XLA inside every kernel that reads them. One that feeds a single group joins
it; one that feeds several is a group of its own that costs nothing, and each reader counts the
bytes the op itself reads (a scalar, a bias row) instead of the broadcast tensor.

`annotate-costs{fusion=xla}` costs each group as one kernel (`group_work`: FLOPs of its ops, bytes
of what enters and leaves it) and shares that time among its ops in proportion to their unfused
roofline times, so the graph's total is the fused program's, and placement still moves single ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from pesto_ir.cluster.devices import Device
from pesto_ir.cost.roofline import (
    COLLECTIVES,
    ELEMENTWISE_OPS,
    MOVEMENT_OPS,
    NO_KERNEL,
    REDUCTION_OPS,
    Work,
    bound_time,
    distinct,
    kernel_opcode,
    nested_time,
    op_family,
    op_work,
    work_time,
)
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.opdefs import opcodes
from pesto_ir.util.union_find import find_root

# The classes of the ops' definitions (`fusion` of `pesto_ir.ir.opdefs.OpDef`).
# Ops XLA fuses into a consumer's loop. Indexed reads and writes (gather, dynamic slices,
# scatter) stay kernels of their own here: their cost rules count only the part they touch.
FUSIBLE: frozenset[str] = opcodes(fusion="loop")

# Ops recomputed in every kernel that reads them, instead of being written to memory (every op
# that runs no kernel, `NO_KERNEL`, among them).
DUPLICATED: frozenset[str] = opcodes(fusion="duplicated")

# Heroes: the op a fused kernel is built around.
EPILOGUE_HEROES: frozenset[str] = opcodes(fusion="contraction")
INPUT_FUSION_HEROES: frozenset[str] = REDUCTION_OPS


@dataclass(frozen=True)
class FusionGroup:
    """One kernel: its ops in graph order, what kind of kernel, what it reads and writes."""

    ops: tuple[Op, ...]
    family: str  # an op family of `pesto_ir.cost.roofline.FAMILIES`: the hero's, else loop or movement
    inputs: tuple[Value, ...]  # distinct values read from outside the group
    outputs: tuple[Value, ...]  # values made inside and read outside (or returned, or read by no op)
    free: bool = False  # a duplicated op feeding several kernels: recomputed in each, costs nothing

    @property
    def name(self) -> str:
        return self.ops[-1].name


class _Groups:
    """Union-find over op indices, each root knowing its group's hero (an index, or None)."""

    def __init__(self, ops: list[Op]) -> None:
        self.parent = list(range(len(ops)))
        self.hero: list[int | None] = [i if _is_hero(op) else None for i, op in enumerate(ops)]
        self.only_elementwise = [kernel_opcode(op) in ELEMENTWISE_OPS or op.opcode in DUPLICATED for op in ops]
        self.open = [_fusible_at_all(op) or _is_hero(op) for op in ops]  # kernels that take producers in

    def find(self, i: int) -> int:
        return find_root(self.parent, i)

    def join(self, producer: int, group: int) -> None:
        p, g = self.find(producer), self.find(group)
        self.parent[p] = g
        if self.hero[g] is None:
            self.hero[g] = self.hero[p]
        self.only_elementwise[g] = self.only_elementwise[g] and self.only_elementwise[p]


def _is_hero(op: Op) -> bool:
    return op.opcode in EPILOGUE_HEROES or kernel_opcode(op) in INPUT_FUSION_HEROES


def _takes(groups: _Groups, ops: list[Op], producer: int, group: int) -> bool:
    """Whether the group (root `group`) fuses `producer` in, by the rules of the module docstring."""
    op = ops[producer]
    hero = groups.hero[group]
    if not groups.open[group]:
        return False
    if op.opcode in DUPLICATED:
        return True
    if kernel_opcode(op) in FUSIBLE:
        return hero is None or ops[hero].opcode in INPUT_FUSION_HEROES
    if op.opcode in EPILOGUE_HEROES:
        return hero is None and groups.only_elementwise[group]
    return False


def _fusible_at_all(op: Op) -> bool:
    return not op.subgraphs() and (kernel_opcode(op) in FUSIBLE or op.opcode in DUPLICATED
                                   or op.opcode in EPILOGUE_HEROES)


def group_index(graph: Graph) -> list[int]:
    """For every op of `graph` (in order), the index of the last op of its fusion group."""
    ops = graph.ops
    index = {id(op): i for i, op in enumerate(ops)}
    outputs = {id(v) for v in graph.outputs}
    groups = _Groups(ops)
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if not _fusible_at_all(op) or any(id(r) in outputs and op.opcode not in DUPLICATED for r in op.results):
            continue
        readers = {groups.find(index[id(u)]) for r in op.results for u, _ in r.uses}
        if len(readers) == 1:
            (g,) = readers
            if _takes(groups, ops, i, g):
                groups.join(i, g)
    roots = [groups.find(i) for i in range(len(ops))]
    last: dict[int, int] = {}
    for i, r in enumerate(roots):
        last[r] = i
    return [last[r] for r in roots]


def fusion_groups(graph: Graph) -> list[FusionGroup]:
    """The kernels XLA would run for `graph`'s top-level ops, in the order of their last ops."""
    members: dict[int, list[Op]] = {}
    for op, last in zip(graph.ops, group_index(graph)):
        members.setdefault(last, []).append(op)
    outputs = {id(v) for v in graph.outputs}
    return [_group(ops, outputs) for _, ops in sorted(members.items())]


def runs_a_kernel(group: FusionGroup) -> bool:
    """Whether the group is a kernel XLA runs: not recomputed inside its readers (`free`), and not
    made of ops that run nothing (`NO_KERNEL`)."""
    return not group.free and not all(op.opcode in NO_KERNEL for op in group.ops)


def _group(ops: list[Op], graph_outputs: set[int]) -> FusionGroup:
    inside = {id(op) for op in ops}
    made = {id(r) for op in ops for r in op.results}
    inputs = distinct(v for op in ops for v in op.operands if id(v) not in made)
    outs = [r for op in ops for r in op.results  # a result no op reads is written out too (as op by op)
            if id(r) in graph_outputs or not r.uses or any(id(u) not in inside for u, _ in r.uses)]
    free = len(ops) == 1 and ops[0].opcode in DUPLICATED and not _is_returned(ops[0], graph_outputs)
    return FusionGroup(tuple(ops), _family(ops), tuple(inputs), tuple(outs), free)


def _is_returned(op: Op, graph_outputs: set[int]) -> bool:
    return any(id(r) in graph_outputs for r in op.results)


def _family(ops: list[Op]) -> str:
    """The hero's family; else a loop of elementwise work, or pure data movement."""
    for op in ops:
        if _is_hero(op):
            return op_family(op)
    if len(ops) == 1:
        return op_family(ops[0])
    if all(kernel_opcode(op) in MOVEMENT_OPS or op.opcode in DUPLICATED for op in ops):
        return "movement"
    return "elementwise"


def _nbytes(v: Value) -> int:
    return v.type.nbytes


def group_work(group: FusionGroup) -> Work:
    """FLOPs of the group's ops; bytes of what it reads from memory and writes back, once each."""
    if group.free:
        return Work(0, 0)
    flops = sum(op_work(op).flops for op in group.ops)
    moved = sum(_read(v, group) for v in group.inputs) + sum(_nbytes(v) for v in group.outputs)
    return Work(flops, moved)


def kernel_bytes(group: FusionGroup) -> dict[str, int]:
    """Bytes each op of the kernel moves to or from memory: each input of the kernel charged to its
    first reader in the group, each output to the op that makes it. They add up to `group_work`'s."""
    if group.free:
        return {op.name: 0 for op in group.ops}
    out = {op.name: 0 for op in group.ops}
    inputs = {id(v): v for v in group.inputs}
    outputs = {id(v) for v in group.outputs}
    for op in group.ops:
        for v in op.operands:
            if id(v) in inputs:
                out[op.name] += _read(inputs.pop(id(v)), group)
        out[op.name] += sum(_nbytes(r) for r in op.results if id(r) in outputs)
    return out


def _read(v: Value, group: FusionGroup) -> int:
    """A duplicated op outside the group feeds several kernels, each recomputing it from its operands."""
    owner = v.owner
    if owner is not None and owner.opcode in DUPLICATED:
        return sum(_nbytes(u) for u in distinct(owner.operands))
    return _nbytes(v)



# ---------------------------------------------------------------- time

def group_time(group: FusionGroup, device: Device) -> float:
    """Roofline seconds of the group as one kernel; an op with bodies has its bodies fused too."""
    if group.free:
        return 0.0
    if len(group.ops) == 1:
        op = group.ops[0]
        if op.opcode in NO_KERNEL or op.opcode in COLLECTIVES:
            return 0.0
        nested = nested_time(op, lambda g: fused_graph_time(g, device), device)
        if nested is not None:
            return nested
    return work_time(group_work(group), device, group.family)


def fused_graph_time(graph: Graph, device: Device) -> float:
    """Roofline seconds of `graph` run as the kernels XLA would fuse it into."""
    return sum(group_time(g, device) for g in fusion_groups(graph))


def shared_out(group: FusionGroup, seconds: float, device: Device) -> dict[str, float]:
    """A group's `seconds` shared among its ops in proportion to their unfused roofline times
    (evenly when the device has no roofline figures or the ops do no work)."""
    weights = [_weight(op, device) for op in group.ops]
    total = sum(weights)
    if total <= 0:
        return {op.name: seconds / len(group.ops) for op in group.ops}
    return {op.name: seconds * w / total for op, w in zip(group.ops, weights)}


def _weight(op: Op, device: Device) -> float:
    if device.peak_flops is None or device.mem_bandwidth is None or op.subgraphs():
        return 0.0
    if op.opcode in NO_KERNEL or op.opcode in COLLECTIVES:
        return 0.0
    return bound_time(op_work(op), device)
