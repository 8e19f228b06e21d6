"""Roofline cost model: FLOPs and bytes of an op from its shapes, then time on a device.

One rule per kind of work (`WORK_KINDS`), which an opcode's definition names (`work` of its
`pesto_ir.ir.opdefs.OpDef`), gives each op's `Work`: floating-point operations and bytes moved
to and from device memory. An op's time on a device is

    max(flops / peak_flops, bytes / mem_bandwidth) / efficiency + launch overhead

The efficiency is the fraction of the datasheet roofline the op's family (`FAMILIES`: matmul,
conv, elementwise, ...) reaches on the device, 1 unless calibrated (`bench.calibrate`); the launch
overhead is the device's calibrated figure, else its kind's (`LAUNCH_OVERHEAD`;
`DEFAULT_LAUNCH_OVERHEAD` for kinds not listed); ops that run no kernel (`NO_KERNEL`) take no
time. This is the cost of an op run as a kernel of its own; `pesto_ir.cost.fusion` costs the
kernels XLA fuses ops into with the same `work_time`. Ops that hold nested graphs
(`scan`, `while`, `cond`, calls) are costed from their bodies (`NESTED_KINDS`): each body op
is timed on its own and the sum is multiplied by the trip count (`length` of `scan`; the
`trip_count` attribute of `while` when a frontend or user sets it, else 1), and `cond` takes its
most expensive branch. An opcode without a work kind gets `DEFAULT_RULE`: one FLOP per result
element and every operand and result byte moved once.

Collectives (`COLLECTIVES`: `all_reduce`, `reduce_scatter`, `all_gather`) are communication, not
computation: the roofline model does not time them. Their work is 0 FLOPs (and their operand and
result bytes), their roofline time 0; their `cost` is their ring time (`pesto_ir.cluster.model.ring_time`),
which the data-parallel rewrite and `passes/rewrite/shard_state.py` set and `annotate-costs` keeps.
`replica_slice` (a replica's block of a value every replica has) reads only what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster.devices import OP_FAMILIES, Device
from pesto_ir.ir.attributes import Attr, GraphAttr, ListAttr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.opdefs import OPDEFS, check_kinds, opcodes
from pesto_ir.ir.types import BlobType, TensorType
from pesto_ir.util.errors import PestoError

# Ops that run no kernel (constants are folded into their readers, the others are identities to the
# compiler): they take no time.
NO_KERNEL: frozenset[str] = opcodes(kernel=False)

# Ops that communicate across data-parallel replicas; timed by the link model, not by roofline.
COLLECTIVES: frozenset[str] = opcodes(collective=True)

# Seconds each op costs on top of its roofline time: kernel launch and dispatch. GPUs launch a
# kernel in a few microseconds; a CPU op inside one XLA executable is a function call.
LAUNCH_OVERHEAD: dict[str, float] = {"cpu": 1e-6}
DEFAULT_LAUNCH_OVERHEAD = 5e-6


class RooflineError(PestoError):
    pass


@dataclass(frozen=True)
class Work:
    """What an op does: floating-point operations and bytes read plus written."""

    flops: int
    bytes: int

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.bytes + other.bytes)

    def scaled(self, k: float) -> Work:
        return Work(int(round(self.flops * k)), int(round(self.bytes * k)))


WorkRule = Callable[[Op], Work]


# ---------------------------------------------------------------- shape helpers

def _elements(v: Value) -> int:
    return v.type.size if isinstance(v.type, TensorType) else 0


def distinct(values: Iterable[Value]) -> list[Value]:
    """The values once each, in first-seen order (values hash by identity)."""
    return list({id(v): v for v in values}.values())


def in_bytes(op: Op) -> int:
    """Bytes of the op's operands, each distinct value read once."""
    return sum(v.type.nbytes for v in distinct(op.operands))


def out_bytes(op: Op) -> int:
    return sum(r.type.nbytes for r in op.results)


def out_elements(op: Op) -> int:
    return sum(_elements(r) for r in op.results)


def _moved(op: Op) -> int:
    return in_bytes(op) + out_bytes(op)


def _tensor(op: Op, i: int) -> TensorType:
    t = op.operands[i].type if i < len(op.operands) else None
    if not isinstance(t, TensorType):
        raise RooflineError(f"op '{op.name}' ({op.where()}): {op.opcode} needs a tensor operand {i}")
    return t


def _attr(op: Op, key: str) -> Any:  # an attribute's plain value, as `Op.get`
    if key not in op.attrs:
        raise RooflineError(f"op '{op.name}' ({op.where()}): {op.opcode} needs attribute '{key}' to be costed")
    return op.attrs[key].value


# ---------------------------------------------------------------- rules

def _elementwise(op: Op) -> Work:
    """One FLOP per result element (transcendentals included), every byte once."""
    return Work(out_elements(op), _moved(op))


def _data_movement(op: Op) -> Work:
    """Layout ops (transpose, reshape, broadcast, slicing) compute nothing; they read and write."""
    return Work(0, _moved(op))


def _indexed_read(op: Op) -> Work:
    """gather / dynamic_slice read only what they return (plus the indices), not the whole operand."""
    return Work(0, 2 * out_bytes(op) + sum(v.type.nbytes for v in distinct(op.operands[1:])))


def _indexed_update(op: Op) -> Work:
    """scatter / dynamic_update_slice touch only the updated part: read and write it once."""
    rest = distinct(op.operands[1:])
    return Work(max((_elements(v) for v in rest), default=0), 2 * sum(v.type.nbytes for v in rest))


def _reduction(op: Op) -> Work:
    """One FLOP per input element."""
    return Work(sum(_elements(v) for v in distinct(op.operands)), _moved(op))


def _reduce_window(op: Op) -> Work:
    """Each result element combines one window."""
    window = math.prod(int(d) for d in _attr(op, "window_dimensions"))
    return Work(out_elements(op) * window, _moved(op))


def _select_and_scatter(op: Op) -> Work:
    """Max-pool gradient: every source element selects within one window of the operand."""
    window = math.prod(int(d) for d in _attr(op, "window_dimensions"))
    return Work(_elements(op.operands[0]) * window, _moved(op))


def dot_general_flops(op: Op) -> int:
    """2 x (batch x free dims, i.e. result elements) x (product of contracted dims): one multiply-add each."""
    lhs = _tensor(op, 0)
    (lc, _rc), _batch = _attr(op, "dimension_numbers")
    contracted: int = math.prod(lhs.shape[d] for d in lc)
    return 2 * out_elements(op) * contracted


def _dot_general(op: Op) -> Work:
    return Work(dot_general_flops(op), _moved(op))


def conv_kernel_out_dim(op: Op) -> int:
    """Which kernel dimension holds the output features: `rhs_spec[0]` of the dimension numbers.

    Accepts JAX's ConvDimensionNumbers as lowered to attributes (a [lhs, rhs, out] list, or a
    dict with `rhs_spec`); without dimension numbers the kernel is OIHW-like (dimension 0).
    """
    dn = op.get("dimension_numbers")
    if dn is None:
        return 0
    rhs_spec: Any = dn.get("rhs_spec") if isinstance(dn, dict) else dn[1]
    return int(rhs_spec[0])


def conv_flops(op: Op) -> int:
    """2 x result elements x (kernel elements per output feature).

    A kernel of shape O x (I/groups) x spatial feeds each output element from (I/groups) x
    prod(spatial) inputs, whatever the layout, strides, padding, dilation or group counts: so
    FLOPs = 2 * out_elements * kernel_elements / O.
    """
    rhs = _tensor(op, 1)
    o = rhs.shape[conv_kernel_out_dim(op)]
    per_output = rhs.size // o if o else 0
    return 2 * out_elements(op) * per_output


def _conv(op: Op) -> Work:
    return Work(conv_flops(op), _moved(op))


def _free(op: Op) -> Work:
    """Ops that produce no data worth costing (iota of a constant, sharding hints)."""
    return Work(0, out_bytes(op))


DEFAULT_RULE: WorkRule = _elementwise

WORK_KINDS: dict[str, WorkRule] = {
    "elementwise": _elementwise,
    "movement": _data_movement,
    "indexed_read": _indexed_read,
    "indexed_update": _indexed_update,
    "reduction": _reduction,
    "window": _reduce_window,
    "select_and_scatter": _select_and_scatter,
    "dot": _dot_general,
    "conv": _conv,
    "free": _free,
}
check_kinds("work", WORK_KINDS)
# Each opcode's rule, by its definition's work kind.
WORK_RULES: dict[str, WorkRule] = {d.name: WORK_KINDS[d.work] for d in OPDEFS.values() if d.work is not None}

# Classes of ops for the fusion analysis (`pesto_ir.cost.fusion`): elementwise ops; ops that only
# move data (layout, copies: no FLOPs, and of the movement family); reductions XLA fuses with their
# elementwise producers.
ELEMENTWISE_OPS: frozenset[str] = opcodes(elementwise=True)
MOVEMENT_OPS: frozenset[str] = opcodes(work="movement", family="movement")
REDUCTION_OPS: frozenset[str] = opcodes(fusion="reduction")
# Reductions whose initial value is their identity: over axes of size 1 only (as many elements in
# as out) XLA's algebraic simplifier makes them a reshape, so they run as no reduction at all (a
# bias gradient summed over a batch of 1, a mean over a size-1 head axis: 32 of the reduced GPT
# step's 81 reductions, and its trace has 46 reduction kernels).
_IDENTITY_REDUCTIONS = opcodes(identity_init=True)


def kernel_opcode(op: Op) -> str:
    """The op XLA runs `op` as: "reshape" for a reduction over axes of size 1 only
    (`_IDENTITY_REDUCTIONS`), else its own opcode. Cost rules and fusion classify by it."""
    if op.opcode in _IDENTITY_REDUCTIONS and len(op.operands) == 1 and len(op.results) == 1:
        src, out = op.operands[0].type, op.results[0].type
        if isinstance(src, TensorType) and isinstance(out, TensorType) and src.size == out.size:
            return "reshape"
    return op.opcode

# Op families: kinds of kernel whose measured speed, as a fraction of the roofline, differs
# (`bench.calibrate` fits one efficiency per family and device kind).
FAMILIES: tuple[str, ...] = OP_FAMILIES
_FAMILY_OF: dict[str, str] = {d.name: d.family for d in OPDEFS.values()}
check_kinds("family", FAMILIES)  # each op's family is a device's


def op_family(op: Op) -> str:
    """The kind of kernel an op runs: `FAMILIES`; "other" for bodies, collectives and unknown ops."""
    if op.subgraphs():
        return "other"
    family = _FAMILY_OF.get(kernel_opcode(op), "other")
    if family == "conv" and is_filter_gradient(op):
        return "conv_filter_grad"
    if family == "matmul" and is_weight_gradient(op):
        return "matmul_weight_grad"
    return family


def is_weight_gradient(op: Op) -> bool:
    """A matmul that contracts its left operand over leading dimensions rather than its last ones:
    how the gradient of a weight lowers (x^T dy contracts the batch and token dimensions, and the
    gradient of attention's keys the query dimension). XLA's CPU backend runs exactly these as Eigen
    dots, after copying operands to another layout, and every other matmul in YNNPACK fusions
    (a `jax.profiler.trace` of a GPT step); timed alone they reach about four fifths of a forward
    matmul's fraction of the roofline (`bench.calibrate`'s table)."""
    lhs = _tensor(op, 0)
    (lc, _rc), _batch = _attr(op, "dimension_numbers")
    rank, contracted = len(lhs.shape), sorted(int(d) for d in lc)
    return contracted != list(range(rank - len(contracted), rank))


def _spatial(shape: tuple[int, ...], spec: Any) -> int:
    """Elements of a convolution operand's spatial dimensions: those after the first two of `spec`."""
    return math.prod(int(shape[d]) for d in spec[2:])


def is_filter_gradient(op: Op) -> bool:
    """A convolution whose window (kernel's spatial extent) is larger than its output's spatial
    extent: how the gradient of a convolution's kernel lowers (the activations slide over the
    output gradient as the window). Libraries run these differently from forward convolutions
    (XLA's CPU backend at a third of the speed, measured by `bench/bench_costs.py`)."""
    rhs, out = _tensor(op, 1), op.results[0].type if op.results else None
    if not isinstance(out, TensorType):
        return False
    dn = op.get("dimension_numbers")
    rhs_spec: Any
    out_spec: Any
    if dn is None:  # the default layout: batch (or out features), features, then spatial dimensions
        rhs_spec, out_spec = range(len(rhs.shape)), range(len(out.shape))
    else:
        rhs_spec, out_spec = (dn.get("rhs_spec"), dn.get("out_spec")) if isinstance(dn, dict) else (dn[1], dn[2])
    return _spatial(rhs.shape, rhs_spec) > _spatial(out.shape, out_spec)


# ---------------------------------------------------------------- nested graphs

@dataclass(frozen=True)
class Nested:
    """How an op runs its nested graphs: all of them `trips` times, or (`one_of`) just one."""

    graphs: tuple[Graph, ...]
    trips: float = 1.0
    one_of: bool = False


def nested_graphs(op: Op) -> tuple[Graph, ...]:
    """Graphs held in the op's attributes, also inside lists (`cond` branches)."""

    def walk(a: Attr) -> Iterator[Graph]:
        if isinstance(a, GraphAttr):
            yield a.graph
        elif isinstance(a, ListAttr):
            for item in a.items:
                yield from walk(item)

    return tuple(g for a in op.attrs.values() for g in walk(a))


def _scan(op: Op) -> Nested:
    return Nested(nested_graphs(op), float(op.get("length", 1) or 1))


def _while(op: Op) -> Nested:
    return Nested(nested_graphs(op), float(op.get("trip_count", 1) or 1))


def _cond(op: Op) -> Nested:
    return Nested(nested_graphs(op), 1.0, one_of=True)


def _call(op: Op) -> Nested:
    return Nested(nested_graphs(op))


NESTED_KINDS: dict[str, Callable[[Op], Nested]] = {
    "length": _scan,
    "trip_count": _while,
    "one_of": _cond,
}
check_kinds("nested", NESTED_KINDS)
# Each opcode's rule, by its definition's nested kind; ops with nested graphs not listed here are
# calls: their graphs run once.
NESTED_RULES: dict[str, Callable[[Op], Nested]] = {d.name: NESTED_KINDS[d.nested] for d in OPDEFS.values()
                                                    if d.nested is not None}


def _nested(op: Op) -> Nested | None:
    rule = NESTED_RULES.get(op.opcode)
    if rule is not None:
        return rule(op)
    graphs = nested_graphs(op)
    return _call(op) if graphs else None


# ---------------------------------------------------------------- work and time

def op_work(op: Op) -> Work:
    """FLOPs and bytes of one op (for ops with bodies: of everything the body runs)."""
    if op.opcode in COLLECTIVES:  # communication: no FLOPs, whatever the value types (blobs too)
        return Work(0, _moved(op))
    if any(isinstance(v.type, BlobType) for v in (*op.operands, *op.results)):
        raise RooflineError(f"op '{op.name}' ({op.where()}) computes on opaque blob values, which have no "
                            "shapes to count FLOPs from; its cost must be given (annotate-costs{model=given})")
    nested = _nested(op)
    if nested is not None:
        parts = [graph_work(g) for g in nested.graphs]
        if nested.one_of:
            return max(parts, key=lambda w: (w.flops, w.bytes), default=Work(0, 0))
        return sum(parts, Work(0, 0)).scaled(nested.trips)
    return WORK_RULES.get(kernel_opcode(op), DEFAULT_RULE)(op)


def graph_work(graph: Graph) -> Work:
    return sum((op_work(op) for op in graph.ops), Work(0, 0))


def launch_overhead(device: Device) -> float:
    """Seconds a kernel launch costs: the device's calibrated figure, else its kind's."""
    if device.launch_overhead is not None:
        return device.launch_overhead
    return LAUNCH_OVERHEAD.get(device.kind, DEFAULT_LAUNCH_OVERHEAD)


def bound_time(work: Work, device: Device) -> float:
    """Seconds of `work` at the device's datasheet peaks: compute-bound or memory-bound, no launch."""
    if device.peak_flops is None or device.mem_bandwidth is None:
        raise RooflineError(f"device {device.name} (kind {device.kind}) has no peak_flops or mem_bandwidth, which "
                            "the roofline model needs: give them in the cluster file, or give op costs per kind "
                            "(annotate-costs{model=given})")
    return max(work.flops / device.peak_flops, work.bytes / device.mem_bandwidth)


def work_time(work: Work, device: Device, family: str = "other") -> float:
    """Roofline seconds of a kernel doing `work` on `device`: the bound time over the family's
    efficiency, plus its fixed time (`kernel_overhead`)."""
    return bound_time(work, device) / device.efficiency_for(family) + kernel_overhead(device, family)


def kernel_overhead(device: Device, family: str) -> float:
    """Seconds a kernel of `family` takes on `device` whatever its size: one launch and the
    family's measured setup."""
    return launch_overhead(device) + device.setup_for(family)


def nested_time(op: Op, body_time: Callable[[Graph], float], device: Device) -> float | None:
    """Seconds of an op with bodies, each body timed by `body_time`; None for ops without bodies."""
    nested = _nested(op)
    if nested is None:
        return None
    parts = [body_time(g) for g in nested.graphs]
    body = max(parts, default=0.0) if nested.one_of else nested.trips * sum(parts)
    return body + launch_overhead(device)


def op_time(op: Op, device: Device) -> float:
    """Roofline seconds of `op` on `device` as a kernel of its own; bodies of nested graphs are
    timed op by op. Collectives are 0: their time is the ring all-reduce time, set as their `cost`
    elsewhere."""
    if op.opcode in NO_KERNEL or op.opcode in COLLECTIVES:
        return 0.0
    nested = nested_time(op, lambda g: graph_time(g, device), device)
    return nested if nested is not None else work_time(op_work(op), device, op_family(op))


def graph_time(graph: Graph, device: Device) -> float:
    return sum(op_time(op, device) for op in graph.ops)
