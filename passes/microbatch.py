"""`microbatch{microbatches=M data-parallel=D}`: one replica's training step, as M micro-batches.

With D data-parallel replicas, each replica runs the step on its shard of batch/D; with M
micro-batches it runs the shard as M slices of batch/(D·M), one after another or interleaved, as
the schedule decides. The rewrite is exact, not a model of one:

- Every op that reads per-sample data (a value with a batch axis, derived from a batch input) is
  copied once per micro-batch, on its slice (names `op.mb0`, `op.mb1`, ...; attribute
  `microbatch = i`). Copies of one op share a `colocate` group: a layer's weights stay on one device.
- An op that reads per-sample data but returns a value without a batch axis reduces over the
  batch (a gradient `dot_general`, a `reduce_sum` of the loss, a weight-gradient convolution, an
  embedding's `scatter-add`). It is linear in the samples, so its copies' partial results are
  summed (`op.acc1`, ...) and, across replicas, all-reduced (`all_reduce`, `op.allreduce`):
  the sum is the full batch's, whatever normalisation (a mean's 1/B) came before or comes after.
- Everything else (the loss' scalar arithmetic, the optimizer update) runs once, on the sums.

A batch statistic (batch norm's mean) is such a reduction too, so it is the whole batch's, exact:
the micro-batches wait for each other there. A per-sample value made from no batch input (a bias
broadcast to the batch) is built once at the micro-batch's size when it is a broadcast or an iota
along another axis, else computed whole and sliced. Batch axes follow `BATCH_RULES`, one rule per
opcode; an op with no rule that reads per-sample data is refused with its name and location.

Cost-only graphs (`blob` values, from `pesto-graph/1`) have no shapes. Their ops scale linearly
with the batch (cost, activation, output bytes divided by D·M) unless they say `per_sample =
false`; values read by such an op are summed over micro-batches at full size (they are gradients);
`param_bytes` on an op are the gradient bytes all-reduced across replicas after its last copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pesto_ir.attributes import Attr, BytesAttr, DictAttr, DurationAttr, IntAttr, StringAttr, to_attr
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph, Op, Value
from pesto_ir.passes.dce import dead_code_elimination
from pesto_ir.passmanager import Pass, PassContext
from pesto_ir.shape_rules import BINARY, COMPARE, UNARY
from pesto_ir.types import BlobType, TensorType, Type

MAX_MICROBATCHES = 1024
PLAN_KEYS = ("device", "start", "end", "group")  # a placement of the old graph means nothing for the new one


class MicrobatchError(PestoError):
    pass


# ---------------------------------------------------------------- which inputs carry the batch

@dataclass(frozen=True)
class BatchSpec:
    """The global batch size and, for each graph input that carries the batch, its batch axis."""

    size: int
    axes: dict[str, int]


def batch_spec(graph: Graph) -> BatchSpec:
    """The graph's batch inputs: its `batch_inputs` attribute (input name -> axis), or by default
    every non-param input of rank >= 1, at axis 0. All must have one size along their axis."""
    raw = graph.attrs.get("batch_inputs")
    inputs = {v.name: v for v in graph.inputs}
    if raw is not None:
        declared = raw.value
        if not isinstance(declared, dict):
            raise MicrobatchError(f"graph '{graph.name}': batch_inputs must map input names to batch axes, "
                                  f"not {raw}")
        if not declared:
            raise MicrobatchError(f"graph '{graph.name}' declares no batch input (batch_inputs = {{}}), so it has "
                                  "no batch to split into micro-batches or replicas")
        axes: dict[str, int] = {}
        for name, axis in declared.items():
            v = inputs.get(name)
            if v is None:
                raise MicrobatchError(f"graph '{graph.name}': batch_inputs names %{name}, which is not an input")
            if not isinstance(v.type, TensorType) or isinstance(axis, bool) or not isinstance(axis, int) \
                    or not 0 <= axis < v.type.rank:
                raise MicrobatchError(f"graph '{graph.name}': batch axis {axis!r} of %{name} is not an axis of "
                                      f"{v.type}")
            axes[name] = axis
    else:
        axes = {v.name: 0 for v in graph.inputs
                if not v.param and isinstance(v.type, TensorType) and v.type.rank >= 1}
        if not axes:
            raise MicrobatchError(f"graph '{graph.name}' has no batch input (no input that is not a param and has "
                                  "an axis): declare them with the graph attribute batch_inputs = {x = 0}")
    sizes = {name: inputs[name].type.shape[a] for name, a in axes.items()}  # type: ignore[union-attr]
    if len(set(sizes.values())) != 1:
        listed = ", ".join(f"%{n}: {s}" for n, s in sizes.items())
        raise MicrobatchError(f"graph '{graph.name}': the batch inputs disagree on the batch size ({listed}); "
                              "declare the batch inputs and their axes with batch_inputs")
    return BatchSpec(next(iter(sizes.values())), axes)


# ---------------------------------------------------------------- batch axis rules

Batch = tuple[int, int]  # (axis, global batch rows in that axis, the major part of its size)


@dataclass
class Batched:
    """The op keeps the batch: its results' batch axes; non-per-sample operands to slice along an
    axis (index -> axis); a fix of attributes that hold a size along the batch axis."""

    out_axes: list[int]
    split: dict[int, int] = field(default_factory=dict)
    fix: Callable[[dict[str, Attr], list[Type]], dict[str, Attr]] | None = None  # (attrs, copy types) -> attrs


@dataclass
class Cut:
    """The op sums (or maxes) over the batch: copies' results are combined; whole operands that
    carry the batch too are sliced alike (`split`, index -> axis)."""

    combine: str  # "sum", "max", "min" or "chain" (scatter-add into its own operand)
    split: dict[int, int] = field(default_factory=dict)


Rule = Callable[[Op, list["Batch | None"]], "Batched | Cut"]
BATCH_RULES: dict[str, Rule] = {}


def rule(*opcodes: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for name in opcodes:
            BATCH_RULES[name] = fn
        return fn
    return register


def _refuse(op: Op, why: str) -> MicrobatchError:
    return MicrobatchError(f"cannot micro-batch op '{op.name}' = {op.opcode} ({op.where()}): {why}")


def _shape(v: Value) -> tuple[int, ...]:
    return v.type.shape if isinstance(v.type, TensorType) else ()


def _one_axis(op: Op, axes: list[Batch | None]) -> Batch:
    found = {b[0] for b in axes if b is not None}
    if len(found) != 1:
        raise _refuse(op, f"its operands carry the batch on different axes ({sorted(found)})")
    return next(b for b in axes if b is not None)


ELEMENTWISE = (*UNARY, *BINARY, *COMPARE, "select_n", "clamp", "convert_element_type", "is_finite", "exp2",
               "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "lgamma", "digamma", "imag",
               "real", "conj", "population_count", "clz")


@rule(*ELEMENTWISE)
def _elementwise(op: Op, axes: list[Batch | None]) -> Batched:
    a = _one_axis(op, axes)[0]
    out = _shape(op.results[0])
    split = {}
    for i, (v, b) in enumerate(zip(op.operands, axes)):
        s = _shape(v)
        if b is not None or len(s) == 0 or s[a] == 1:
            continue
        if len(s) != len(out) or s[a] != out[a]:
            raise _refuse(op, f"operand %{v.name}: {v.type} does not line up with the batch axis {a}")
        split[i] = a
    return Batched([a] * len(op.results), split)


@rule("broadcast_in_dim")
def _broadcast(op: Op, axes: list[Batch | None]) -> Batched:
    return Batched([list(op.get("broadcast_dimensions"))[axes[0][0]]], fix=_fix_result_shape(op, "shape"))


@rule("reshape")
def _reshape(op: Op, axes: list[Batch | None]) -> Batched:
    (a, rows), src, out = axes[0], _shape(op.operands[0]), _shape(op.results[0])
    order = op.get("dimensions")
    if order is not None and list(order) != list(range(len(src))):
        raise _refuse(op, "it transposes before it reshapes (dimensions), which can make the batch a minor part")
    prefix = math.prod(src[:a])
    for j in range(len(out) + 1):
        if math.prod(out[:j]) == prefix and j < len(out) and out[j] % rows == 0:
            return Batched([j], fix=_fix_result_shape(op, "new_sizes"))
        if math.prod(out[:j]) > prefix:
            break
    raise _refuse(op, f"the reshape {src} -> {out} splits the batch axis {a}")


@rule("transpose")
def _transpose(op: Op, axes: list[Batch | None]) -> Batched:
    return Batched([list(op.get("permutation")).index(axes[0][0])])


@rule("squeeze")
def _squeeze(op: Op, axes: list[Batch | None]) -> Batched:
    a, dims = axes[0][0], list(op.get("dimensions"))
    if a in dims:
        raise _refuse(op, "it squeezes the batch axis")
    return Batched([a - sum(d < a for d in dims)])


@rule("expand_dims")
def _expand_dims(op: Op, axes: list[Batch | None]) -> Batched:
    a, out_rank = axes[0][0], len(_shape(op.results[0]))
    kept = [i for i in range(out_rank) if i not in {d % out_rank for d in op.get("dimensions")}]
    return Batched([kept[a]])


@rule("reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin")
def _reduce(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    a, reduced = axes[0][0], list(op.get("axes"))
    if a in reduced:
        combine = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}.get(op.opcode)
        if combine is None:
            raise _refuse(op, "it reduces over the batch axis, and its partial results cannot be combined")
        return Cut(combine)
    return Batched([a - sum(d < a for d in reduced)])


@rule("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
def _scan_axis(op: Op, axes: list[Batch | None]) -> Batched:
    a = axes[0][0]
    if op.get("axis") == a:
        raise _refuse(op, "it scans along the batch axis")
    return Batched([a])


@rule("rev")
def _rev(op: Op, axes: list[Batch | None]) -> Batched:
    if axes[0][0] in list(op.get("dimensions")):
        raise _refuse(op, "it reverses the batch axis")
    return Batched([axes[0][0]])


@rule("pad")
def _pad(op: Op, axes: list[Batch | None]) -> Batched:
    if axes[1] is not None:
        raise _refuse(op, "its padding value is per sample")
    a = axes[0][0]
    if tuple(op.get("padding_config")[a]) != (0, 0, 0):
        raise _refuse(op, "it pads the batch axis")
    return Batched([a])


@rule("concatenate")
def _concatenate(op: Op, axes: list[Batch | None]) -> Batched:
    a = _one_axis(op, axes)[0]
    if op.get("dimension") == a:
        raise _refuse(op, "it concatenates along the batch axis")
    return Batched([a], {i: a for i, b in enumerate(axes) if b is None})


@rule("stack")
def _stack(op: Op, axes: list[Batch | None]) -> Batched:
    a, new = _one_axis(op, axes)[0], op.get("axis")
    return Batched([a if a < new else a + 1], {i: a for i, b in enumerate(axes) if b is None})


@rule("unstack")
def _unstack(op: Op, axes: list[Batch | None]) -> Batched:
    a, gone = axes[0][0], op.get("axis")
    if a == gone:
        raise _refuse(op, "it unstacks along the batch axis")
    return Batched([a if a < gone else a - 1] * len(op.results))


@rule("split")
def _split(op: Op, axes: list[Batch | None]) -> Batched:
    a = axes[0][0]
    if op.get("axis") == a:
        raise _refuse(op, "it splits along the batch axis")
    return Batched([a] * len(op.results))


@rule("slice")
def _slice(op: Op, axes: list[Batch | None]) -> Batched:
    a, n = axes[0][0], _shape(op.operands[0])[axes[0][0]]
    start, limit = list(op.get("start_indices")), list(op.get("limit_indices"))
    strides = op.get("strides")
    if start[a] != 0 or limit[a] != n or (strides is not None and list(strides)[a] != 1):
        raise _refuse(op, "it slices the batch axis")

    def fix(attrs: dict[str, Attr], types: list[Type]) -> dict[str, Attr]:
        limit[a] = types[0].shape[a]  # type: ignore[attr-defined]
        return {**attrs, "limit_indices": to_attr(tuple(limit))}

    return Batched([a], fix=fix)


@rule("dot_general")
def _dot_general(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    (lc, rc), (lb, rb) = [[list(x) for x in pair] for pair in op.get("dimension_numbers")]
    al = axes[0][0] if axes[0] is not None else None
    ar = axes[1][0] if axes[1] is not None else None
    lhs_rank, rhs_rank = len(_shape(op.operands[0])), len(_shape(op.operands[1]))
    lfree = [d for d in range(lhs_rank) if d not in lc and d not in lb]
    rfree = [d for d in range(rhs_rank) if d not in rc and d not in rb]
    if al is not None and al in lc:
        if ar == rc[lc.index(al)]:
            return Cut("sum")
    elif al is not None and al in lb:
        if ar == rb[lb.index(al)]:
            return Batched([lb.index(al)])
    elif al is not None and ar is None:
        return Batched([len(lb) + lfree.index(al)])
    elif al is None and ar is not None and ar in rfree:
        return Batched([len(lb) + len(lfree) + rfree.index(ar)])
    raise _refuse(op, "its operands' batch axes do not pair up (a product across samples)")


@rule("conv_general_dilated")
def _conv(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    dn = op.get("dimension_numbers")
    lhs, rhs, out = list(dn["lhs_spec"]), list(dn["rhs_spec"]), list(dn["out_spec"])
    al = axes[0][0] if axes[0] is not None else None
    ar = axes[1][0] if axes[1] is not None else None
    if al == lhs[0] and ar is None and op.get("batch_group_count", 1) == 1:
        return Batched([out[0]])
    if al == lhs[1] and ar == rhs[1] and op.get("feature_group_count", 1) == 1:
        return Cut("sum")  # a weight gradient: the batch is the contracted feature axis
    raise _refuse(op, "its operands' batch axes do not pair up as a convolution over samples")


@rule("reduce_window_sum", "reduce_window_max", "reduce_window_min", "select_and_scatter_add")
def _window(op: Op, axes: list[Batch | None]) -> Batched:
    a = _one_axis(op, axes)[0]
    if list(op.get("window_dimensions"))[a] != 1 or list(op.get("window_strides"))[a] != 1 or \
            tuple(op.get("padding")[a]) != (0, 0):
        raise _refuse(op, "its window spans samples")
    return Batched([a], {i: a for i, b in enumerate(axes) if b is None and _shape(op.operands[i])})


def _scatter_dims(op: Op) -> list[int]:
    """The output dims of a gather that follow the indices' dims (all but the index vector)."""
    out_rank = len(_shape(op.results[0]))
    offset = set(op.get("dimension_numbers")["offset_dims"])
    return [d for d in range(out_rank) if d not in offset]


@rule("gather")
def _gather(op: Op, axes: list[Batch | None]) -> Batched:
    dn = op.get("dimension_numbers")
    obd, ibd = list(dn.get("operand_batching_dims", ())), list(dn.get("start_indices_batching_dims", ()))
    ao = axes[0][0] if axes[0] is not None else None
    ai = axes[1][0] if axes[1] is not None else None
    idx_rank = len(_shape(op.operands[1]))
    split: dict[int, int] = {}
    if ao is not None and ao not in obd:
        if ai is not None:
            raise _refuse(op, "its indices carry the batch and so does its operand's slice window (a gather across "
                              "samples)")
        return _gather_window(op, ao)
    if ao is not None:
        want = ibd[obd.index(ao)]
        if ai is None:
            split[1] = want
            ai = want
        elif ai != want:
            raise _refuse(op, "its operand and indices carry the batch on axes that do not pair up")
    elif ai in ibd:
        split[0] = obd[ibd.index(ai)]
    if ai is None or ai >= idx_rank - 1:
        raise _refuse(op, "its indices do not carry the batch")
    return Batched([_scatter_dims(op)[ai]], split)


@rule("scatter-add", "scatter_add")
def _scatter_add(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    dn = op.get("dimension_numbers")
    obd, ibd = list(dn.get("operand_batching_dims", ())), list(dn.get("scatter_indices_batching_dims", ()))
    uwd = set(dn["update_window_dims"])
    upd_rank = len(_shape(op.operands[2]))
    upd_scatter = [d for d in range(upd_rank) if d not in uwd]
    ai = axes[1][0] if axes[1] is not None else None
    au = axes[2][0] if axes[2] is not None else None
    if ai is None and au is not None and au in upd_scatter:
        ai = upd_scatter.index(au)
    if ai is not None and ai in ibd:
        ao = obd[ibd.index(ai)]
        if axes[0] is not None and axes[0][0] != ao:
            raise _refuse(op, "its operand and indices carry the batch on axes that do not pair up")
        split = {i: ax for i, ax in ((0, ao), (1, ibd[ibd.index(ai)]), (2, upd_scatter[ai]))
                 if axes[i] is None}
        return Batched([ao], split)
    if axes[0] is not None or au in uwd:
        return _scatter_window(op, axes)
    if ai is None or ai >= len(_shape(op.operands[1])) - 1:
        raise _refuse(op, "its indices do not carry the batch")
    split = {i: ax for i, ax in ((1, ai), (2, upd_scatter[ai])) if axes[i] is None}
    return Cut("chain", split)  # an embedding gradient: every sample adds into the same table


def _part_window(op: Op, axis: int, indexed: Sequence[int], window: int) -> str | None:
    """Why a gather's or scatter's window does not take the operand's batch axis whole (from row 0,
    not indexed, to its end), or None when it does. Then a copy's window is its own micro-batch's
    rows; part of them, or an index into them, would pick the same rows of every micro-batch."""
    if axis in indexed:
        return f"it indexes into the batch axis {axis} (its window picks samples)"
    n = _shape(op.operands[0])[axis]
    if window != n:
        return f"its window takes {window} of the {n} samples along the batch axis {axis}, not all"
    return None


def _scatter_window_dims(op: Op) -> list[int]:
    """The operand dims a scatter's update windows lie along, in update_window_dims' order (all but
    the inserted and the batching dims)."""
    dn = op.get("dimension_numbers")
    skip = {*dn["inserted_window_dims"], *dn.get("operand_batching_dims", ())}
    return [d for d in range(len(_shape(op.operands[0]))) if d not in skip]


def _scatter_update_axis(op: Op, axis: int) -> int | None:
    """The updates' window dim laid along the operand's `axis`, or None when it has none."""
    window = _scatter_window_dims(op)
    return list(op.get("dimension_numbers")["update_window_dims"])[window.index(axis)] if axis in window else None


def _gather_window(op: Op, a: int) -> Batched:
    """`x[..., i]` of a per-sample x: the batch axis `a` is in the slice window, taken whole, so the
    result carries it on the matching offset dim; the copies' slice_sizes take their own rows."""
    dn = op.get("dimension_numbers")
    collapsed, obd = list(dn["collapsed_slice_dims"]), list(dn.get("operand_batching_dims", ()))
    sizes = list(op.get("slice_sizes"))
    why = _part_window(op, a, list(dn["start_index_map"]), sizes[a])
    if why is not None or a in collapsed:
        raise _refuse(op, why or "it gathers across samples (it collapses the batch axis)")
    window = [d for d in range(len(sizes)) if d not in collapsed and d not in obd]
    out = list(dn["offset_dims"])[window.index(a)]

    def fix(attrs: dict[str, Attr], types: list[Type]) -> dict[str, Attr]:
        rows = types[0].shape[out]  # type: ignore[attr-defined]
        return {**attrs, "slice_sizes": to_attr(tuple(rows if d == a else s for d, s in enumerate(sizes)))}

    return Batched([out], fix=fix)


def _scatter_window(op: Op, axes: list[Batch | None]) -> Batched:
    """`zeros.at[..., i].add(u)` of a per-sample u (the transpose of `x[..., i]`): the update window
    takes the operand's batch axis whole, so each copy adds its rows of u into its rows of the
    operand (a whole operand, zeros, is split alike, as are whole updates of a per-sample operand)."""
    dn = op.get("dimension_numbers")
    if axes[1] is not None:
        raise _refuse(op, "its indices carry the batch and so do its updates' windows (a scatter across samples)")
    if axes[0] is None:
        ao = _scatter_window_dims(op)[list(dn["update_window_dims"]).index(axes[2][0])]  # type: ignore[index]
    else:
        ao = axes[0][0]
    au = _scatter_update_axis(op, ao)
    if au is None:
        raise _refuse(op, "it scatters per-sample updates across samples")
    if axes[2] is not None and axes[2][0] != au:
        raise _refuse(op, "its operand and updates carry the batch on axes that do not pair up")
    why = _part_window(op, ao, list(dn["scatter_dims_to_operand_dims"]), _shape(op.operands[2])[au])
    if why is not None:
        raise _refuse(op, why)
    return Batched([ao], {i: ax for i, ax in ((0, ao), (2, au)) if axes[i] is None})


def _fix_result_shape(op: Op, key: str) -> Callable[[dict[str, Attr], list[Type]], dict[str, Attr]]:
    """The copy's `key` attribute is its result's shape, where the op's was the op's result shape."""
    old = tuple(_shape(op.results[0]))

    def fix(attrs: dict[str, Attr], types: list[Type]) -> dict[str, Attr]:
        value = attrs.get(key)
        if value is None or tuple(value.value) != old:
            return attrs
        return {**attrs, key: to_attr(tuple(types[0].shape))}  # type: ignore[attr-defined]

    return fix


# ---------------------------------------------------------------- the rewrite

@dataclass
class _PerSample:
    copies: list[Value]
    batch: Batch


class Rewriter:
    """Builds one replica's micro-batched graph from a whole-batch graph."""

    def __init__(self, src: Graph, microbatches: int, data_parallel: int,
                 all_reduce_cost: Callable[[int], float] | None) -> None:
        self.src, self.m, self.d = src, microbatches, data_parallel
        self.factor = microbatches * data_parallel
        self.all_reduce_cost = all_reduce_cost
        attrs = {k: v for k, v in src.attrs.items() if k not in ("plan", "transfers", "collectives")}
        self.out = Graph(src.name, attrs)
        self.one: dict[int, Value] = {}
        self.per: dict[int, _PerSample] = {}
        self.sliced: dict[tuple[int, int], list[Value]] = {}
        self.whole: set[str] = set()  # ops kept whole: the rewrite may leave them unread
        self.summed: dict[int, Value] = {}  # cost graphs: a per-sample value summed over micro-batches
        self.groups = {str(op.get("colocate")) for op in src.ops if op.get("colocate") is not None}

    # -- helpers
    def emit(self, src_op: Op | None, opcode: str, operands: Sequence[Value], types: Sequence[Type],
             attrs: dict[str, Attr], name: str, result_names: Sequence[str] | None = None) -> Op:
        names = list(result_names) if result_names is not None else (
            [name] if len(types) == 1 else [f"{name}#{i}" for i in range(len(types))])
        op = Op(name, opcode, operands, types, attrs, names, src_op.loc if src_op is not None else None)
        return self.out.append(op)

    def small(self, t: Type, axis: int) -> Type:
        if not isinstance(t, TensorType):
            return t
        shape = list(t.shape)
        if shape[axis] % self.factor:
            raise MicrobatchError(f"the batch axis of {t} (size {shape[axis]}) does not split into "
                                  f"{self.factor} equal parts (data-parallel {self.d} x {self.m} micro-batches)")
        shape[axis] //= self.factor
        return TensorType(t.dtype, tuple(shape))

    def value(self, v: Value) -> Value:
        found = self.one.get(id(v))
        if found is None:
            raise MicrobatchError(f"value %{v.name} is read per sample where a whole value is expected")
        return found

    # -- inputs
    def inputs(self, spec: BatchSpec) -> None:
        if spec.size % self.factor:
            raise MicrobatchError(f"the batch of {spec.size} does not split into {self.factor} equal parts "
                                  f"(data-parallel {self.d} x {self.m} micro-batches): choose sizes that divide it")
        for v in self.src.inputs:
            axis = spec.axes.get(v.name)
            if axis is None:
                self.one[id(v)] = self.out.add_input(v.name, v.type, v.param)
                continue
            shard = list(v.type.shape)  # type: ignore[union-attr]
            shard[axis] //= self.d
            new = self.out.add_input(v.name, TensorType(v.type.dtype, tuple(shard)), v.param)  # type: ignore[union-attr]
            self.one[id(v)] = new
            if self.m == 1:
                self.per[id(v)] = _PerSample([new], (axis, spec.size))
            else:
                step = spec.size // self.factor
                self.per[id(v)] = _PerSample(self._slices(None, new, axis, step), (axis, spec.size))

    def _slices(self, src_op: Op | None, whole: Value, axis: int, step: int) -> list[Value]:
        """Micro-batch i's rows [i*step, (i+1)*step) of `whole` along `axis`."""
        t = whole.type
        assert isinstance(t, TensorType)
        small = list(t.shape)
        small[axis] = step
        out = []
        for i in range(self.m):
            start, limit = [0] * t.rank, list(t.shape)
            start[axis], limit[axis] = i * step, (i + 1) * step
            op = self.emit(src_op, "slice", [whole], [TensorType(t.dtype, tuple(small))],
                           {"start_indices": to_attr(tuple(start)), "limit_indices": to_attr(tuple(limit)),
                            "strides": to_attr(None), "microbatch": IntAttr(i)},
                           self.out.fresh_name(f"{whole.name}.mb{i}"))
            out.append(op.result)
        return out

    def split(self, v: Value, axis: int) -> list[Value]:
        """Micro-batch versions of a whole value read where the batch is: a small broadcast or iota
        when it is one along another axis, else (one replica only) slices of it."""
        key = (id(v), axis)
        if key in self.sliced:
            return self.sliced[key]
        op = v.owner
        whole = self.value(v)
        small: Value | None = None
        if op is not None and len(op.results) == 1 and not any(id(x) in self.per for x in op.operands):
            if op.opcode == "broadcast_in_dim" and axis not in list(op.get("broadcast_dimensions")) or \
                    op.opcode == "iota" and op.get("dimension") != axis:
                t = self.small(v.type, axis)
                attrs = {k: a for k, a in op.attrs.items() if k not in PLAN_KEYS}
                attrs["shape"] = to_attr(tuple(t.shape))  # type: ignore[union-attr]
                attrs = _scaled_costs(attrs, self.factor)
                small = self.emit(op, op.opcode, [self.value(x) for x in op.operands], [t], attrs,
                                  self.out.fresh_name(f"{op.name}.mb")).result
        if small is None:
            if self.d > 1 and not _constant_along(v, axis):  # every replica runs this graph: replica 0's rows
                # of a value that varies along the batch would be wrong on the others
                where = f"op '{op.name}' ({op.where()})" if op is not None else f"input %{v.name}"
                raise MicrobatchError(f"cannot split %{v.name} for {self.d} data-parallel replicas: it has the batch "
                                      f"along axis {axis} but is made from no batch input ({where}), so each replica "
                                      "would need its own rows of it; declare it a batch input (batch_inputs / "
                                      "batch_argnums) or use micro-batches without replicas")
            copies = self._slices(op, whole, axis, self.small(v.type, axis).shape[axis])  # type: ignore[union-attr]
        else:
            copies = [small] * self.m
        self.sliced[key] = copies
        return copies

    # -- ops
    def op(self, op: Op) -> None:
        axes: list[Batch | None] = [self.per[id(v)].batch if id(v) in self.per else None for v in op.operands]
        attrs = {k: a for k, a in op.attrs.items() if k not in PLAN_KEYS}
        if all(b is None for b in axes):
            new = self.emit(op, op.opcode, [self.value(v) for v in op.operands], [r.type for r in op.results],
                            attrs, op.name, [r.name for r in op.results])
            if any(r.uses for r in op.results):
                self.whole.add(op.name)
            for r, n in zip(op.results, new.results):
                self.one[id(r)] = n
            return
        found = BATCH_RULES.get(op.opcode)
        if found is None:
            raise _refuse(op, "micro-batching has no rule for how it treats the batch axis")
        how = found(op, axes)
        if isinstance(how, Cut):
            self.cut(op, axes, attrs, how)
        else:
            self.batched(op, axes, attrs, how)

    def operands_for(self, op: Op, axes: list[Batch | None], i: int, split: dict[int, int]) -> list[Value]:
        out = []
        for j, (v, b) in enumerate(zip(op.operands, axes)):
            if b is not None:
                out.append(self.per[id(v)].copies[i])
            elif j in split:
                out.append(self.split(v, split[j])[i])
            else:
                out.append(self.value(v))
        return out

    def batched(self, op: Op, axes: list[Batch | None], attrs: dict[str, Attr], how: Batched) -> None:
        rows = next(b for b in axes if b is not None)[1]
        types = [self.small(r.type, a) for r, a in zip(op.results, how.out_axes)]
        if how.fix is not None:
            attrs = how.fix(attrs, types)
        copies: list[list[Value]] = [[] for _ in op.results]
        for i in range(self.m):
            new = self.emit(op, op.opcode, self.operands_for(op, axes, i, how.split), types,
                            self._copy_attrs(op, attrs, i), f"{op.name}.mb{i}",
                            [f"{r.name}.mb{i}" for r in op.results])
            for k, r in enumerate(new.results):
                copies[k].append(r)
        for r, a, cs in zip(op.results, how.out_axes, copies):
            self.per[id(r)] = _PerSample(cs, (a, rows))

    def _copy_attrs(self, op: Op, attrs: dict[str, Attr], i: int) -> dict[str, Attr]:
        out = _scaled_costs(attrs, self.factor)
        if i > 0 and "memory" in out:  # resident bytes (weights) are held once, by the first copy
            out["memory"] = BytesAttr(0)
        out["microbatch"] = IntAttr(i)
        out["colocate"] = self.group(op)
        return out

    def group(self, op: Op) -> StringAttr:
        """The colocation group of `op`'s copies: its own, else one named after it that no group
        of the source graph has."""
        if op.get("colocate") is not None:
            return StringAttr(str(op.get("colocate")))
        name = op.name
        while name in self.groups:
            name += "'"
        return StringAttr(name)

    def cut(self, op: Op, axes: list[Batch | None], attrs: dict[str, Attr], how: Cut) -> None:
        combine = how.combine
        partial: list[Op] = []
        for i in range(self.m):
            operands = self.operands_for(op, axes, i, how.split)
            if combine == "chain" and partial:
                operands[0] = partial[-1].result
            a = self._copy_attrs(op, attrs, i)
            partial.append(self.emit(op, op.opcode, operands, [r.type for r in op.results], a,
                                     op.name if self.m == 1 and self.d == 1 else f"{op.name}.mb{i}",
                                     [r.name if self.m == 1 and self.d == 1 else f"{r.name}.mb{i}"
                                      for r in op.results]))
        if combine == "chain" and self.d > 1 and not _is_zeros(op.operands[0]):
            raise _refuse(op, "it adds into a tensor that is not zeros, which an all-reduce would count once "
                              "per replica")
        group = self.group(op)
        for k, r in enumerate(op.results):
            acc = partial[0].results[k]
            if combine != "chain":
                for i in range(1, self.m):
                    acc = self.emit(op, {"sum": "add", "max": "max", "min": "min"}[combine],
                                    [acc, partial[i].results[k]], [r.type], {"colocate": group},
                                    self.out.fresh_name(f"{r.name}.acc{i}")).result
            elif self.m > 1:
                acc = partial[-1].results[k]
            if self.d > 1:
                reduction = "sum" if combine == "chain" else combine
                acc = self.all_reduce(op, [acc], reduction, f"{r.name}.allreduce")[0]
            self.one[id(r)] = acc

    def all_reduce(self, src_op: Op, values: list[Value], reduction: str, name: str) -> list[Value]:
        nbytes = sum(v.type.nbytes for v in values)
        attrs: dict[str, Any] = {"reduction": StringAttr(reduction), "replicas": IntAttr(self.d),
                                 "colocate": self.group(src_op)}
        if self.all_reduce_cost is not None:
            attrs["cost"] = DurationAttr(self.all_reduce_cost(nbytes))
        op = self.emit(src_op, "all_reduce", values, [v.type for v in values], attrs, self.out.fresh_name(name),
                       None)
        return list(op.results)

    def outputs(self) -> None:
        """The source's outputs: per-sample ones (the replica's rows, whole again) are listed in the
        graph attribute `batch_outputs` (output index -> batch axis), so that a backend running the
        replicas can put their rows together."""
        outs = []
        rows: list[tuple[str, IntAttr]] = []
        for k, v in enumerate(self.src.outputs):
            ps = self.per.get(id(v))
            if ps is not None:
                rows.append((str(k), IntAttr(ps.batch[0])))
            if ps is None:
                outs.append(self.value(v))
            elif self.m == 1:
                outs.append(ps.copies[0])
            else:
                a = ps.batch[0]
                t = ps.copies[0].type
                shape = list(t.shape)  # type: ignore[union-attr]
                shape[a] *= self.m
                outs.append(self.emit(v.owner, "concatenate", ps.copies, [TensorType(t.dtype, tuple(shape))],  # type: ignore[union-attr,arg-type]
                                      {"dimension": IntAttr(a)}, self.out.fresh_name(f"{v.name}.whole")).result)
        self.out.set_outputs(outs)
        if rows:
            self.out.attrs["batch_outputs"] = DictAttr(tuple(rows))


def _constant_along(v: Value, axis: int) -> bool:
    """Whether every row of `v` along `axis` is the same (a broadcast along it, an iota along
    another axis, elementwise maths of such values and scalars): then any replica's rows are
    replica 0's, and slicing it is exact on all of them. A scatter-add of such updates into such an
    operand, its window taking the axis whole, is one too."""
    op = v.owner
    if op is None or len(op.results) != 1:
        return False
    if op.opcode == "broadcast_in_dim":
        dims = list(op.get("broadcast_dimensions"))
        if axis not in dims:
            return True
        return _constant_along(op.operands[0], dims.index(axis))
    if op.opcode == "iota":
        return op.get("dimension") != axis
    if op.opcode == "constant":
        return False
    if op.opcode in ELEMENTWISE:
        rank = len(_shape(v))
        return all(len(_shape(x)) == 0 or (len(_shape(x)) == rank and _shape(x)[axis] == 1)
                   or _constant_along(x, axis) for x in op.operands)
    if op.opcode in ("scatter-add", "scatter_add"):  # the cotangent of x[..., i] when x's is a mean's
        au = _scatter_update_axis(op, axis)
        indexed = list(op.get("dimension_numbers")["scatter_dims_to_operand_dims"])
        return au is not None and _part_window(op, axis, indexed, _shape(op.operands[2])[au]) is None \
            and _constant_along(op.operands[0], axis) and _constant_along(op.operands[2], au)
    return False


def _is_zeros(v: Value) -> bool:
    op = v.owner
    while op is not None and op.opcode in ("broadcast_in_dim", "convert_element_type") and op.operands:
        op = op.operands[0].owner
    return op is not None and op.opcode == "constant" and op.get("value") in (0, 0.0)


def _scaled_costs(attrs: dict[str, Attr], factor: int) -> dict[str, Attr]:
    """A copy's costs: the whole op's divided by the number of slices (re-costed later by roofline
    when the graph was costed that way)."""
    out = dict(attrs)
    cost = out.get("cost")
    if isinstance(cost, DurationAttr):
        out["cost"] = DurationAttr(cost.seconds / factor)
    elif cost is not None and isinstance(cost.value, dict):
        out["cost"] = to_attr({k: DurationAttr(float(getattr(v, "value", v)) / factor)
                               for k, v in cost.value.items()})
    for key in ("flops", "bytes_accessed"):
        if key in out and isinstance(out[key].value, (int, float)):
            out[key] = to_attr(type(out[key].value)(out[key].value / factor) if isinstance(out[key].value, float)
                               else out[key].value // factor)
    for key in ("activation", "workspace"):
        if key in out:
            out[key] = BytesAttr(int(out[key].value) // factor)
    return out


# ---------------------------------------------------------------- cost-only graphs

def _per_sample(op: Op) -> bool:
    return op.get("per_sample", True) is not False


def _rebatch_costs(src: Graph, m: int, d: int, all_reduce_cost: Callable[[int], float] | None) -> Graph:
    """The linear model of a cost-only graph: per-sample ops' copies take 1/(D·M) of the time, the
    activation and the output bytes; values that a `per_sample = false` op reads are summed over
    the micro-batches at full size; `param_bytes` are all-reduced across replicas."""
    factor = m * d
    rw = Rewriter(src, m, d, all_reduce_cost)
    out = rw.out
    for v in src.inputs:
        rw.one[id(v)] = out.add_input(v.name, v.type, v.param)
    whole_size = {id(v) for op in src.ops if not _per_sample(op) for v in op.operands}
    grads: list[Value] = []
    for op in src.ops:
        attrs = {k: a for k, a in op.attrs.items() if k not in PLAN_KEYS}
        if not _per_sample(op):
            operands = [rw.one[id(v)] if id(v) in rw.one else _summed(rw, op, v) for v in op.operands]
            new = rw.emit(op, op.opcode, operands, [r.type for r in op.results], attrs, op.name,
                          [r.name for r in op.results])
            for r, n in zip(op.results, new.results):
                rw.one[id(r)] = n
            continue
        types = [r.type if id(r) in whole_size or not isinstance(r.type, BlobType)
                 else BlobType(-(-r.type.size_bytes // factor)) for r in op.results]
        copies: list[list[Value]] = [[] for _ in op.results]
        for i in range(m):
            operands = [rw.per[id(v)].copies[i] if id(v) in rw.per else rw.one[id(v)] for v in op.operands]
            new = rw.emit(op, op.opcode, operands, types, rw._copy_attrs(op, attrs, i), f"{op.name}.mb{i}",
                          [f"{r.name}.mb{i}" for r in op.results])
            for k, r in enumerate(new.results):
                copies[k].append(r)
        for r, cs in zip(op.results, copies):
            rw.per[id(r)] = _PerSample(cs, (0, 1))
        param_bytes = int(op.get("param_bytes", 0) or 0)
        if d > 1 and param_bytes:
            group = rw.group(op)
            last = [cs[-1] for cs in copies[:1]]
            grad = rw.emit(op, op.opcode, last, [BlobType(param_bytes)], {"colocate": group, "label":
                           StringAttr(f"gradient of {op.name}")}, out.fresh_name(f"{op.name}.grad")).result
            grads.extend(rw.all_reduce(op, [grad], "sum", f"{op.name}.allreduce"))
    if d > 1 and not grads:
        raise MicrobatchError(f"graph '{src.name}': data parallelism needs each node's gradient bytes, and no node "
                              "declares param_bytes (pesto-graph/1), so the all-reduce cannot be costed")
    outs = []
    for v in src.outputs:
        outs.extend(rw.per[id(v)].copies if id(v) in rw.per else [rw.one[id(v)]])
    out.set_outputs(outs + grads)
    return out


def _summed(rw: Rewriter, op: Op, v: Value) -> Value:
    """The sum over micro-batches of a per-sample value read by a `per_sample = false` op."""
    if id(v) not in rw.summed:
        copies = rw.per[id(v)].copies
        producer = v.owner
        assert producer is not None
        acc = copies[0]
        if len(copies) > 1:
            acc = rw.emit(producer, producer.opcode, copies, [v.type], {"colocate": rw.group(producer), "label":
                          StringAttr(f"sum of {v.name} over micro-batches")}, rw.out.fresh_name(f"{v.name}.acc")).result
        rw.summed[id(v)] = acc
    return rw.summed[id(v)]


# ---------------------------------------------------------------- entry points

def check_degree(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MICROBATCHES:
        raise MicrobatchError(f"{what} must be a whole number from 1 to {MAX_MICROBATCHES}, not {value!r}")
    return value


def rebatch(graph: Graph, microbatches: int, data_parallel: int = 1,
            all_reduce_cost: Callable[[int], float] | None = None) -> Graph:
    """One replica's step as `microbatches` micro-batches of batch/(data_parallel·microbatches), with
    the batch reductions summed and (data_parallel > 1) all-reduced; a new graph, verified.

    `all_reduce_cost(bytes)` gives an all-reduce's duration (from the cluster's ring); without it the
    all-reduces have no cost attribute."""
    m = check_degree(microbatches, "microbatches")
    d = check_degree(data_parallel, "data-parallel")
    if "microbatched" in graph.attrs:
        raise MicrobatchError(f"graph '{graph.name}' is already micro-batched ({graph.attrs['microbatched']})")
    if any(op.opcode == "all_reduce" for op in graph.ops):
        raise MicrobatchError(f"graph '{graph.name}' already has all-reduces: it is one replica's step")
    if m == 1 and d == 1:
        return graph
    typed = [v for op in graph.ops for v in op.results] + list(graph.inputs)
    if typed and all(isinstance(v.type, BlobType) for v in typed):
        out = _rebatch_costs(graph, m, d, all_reduce_cost)
    elif any(isinstance(v.type, BlobType) for v in typed):
        raise MicrobatchError(f"graph '{graph.name}' mixes tensors and blobs: micro-batching needs one or the other")
    else:
        rw = Rewriter(graph, m, d, all_reduce_cost)
        spec = batch_spec(graph)
        rw.inputs(spec)
        # what carries the batch, said explicitly (the default rule may not pick the same inputs of a
        # rewritten graph): backends running replicas split exactly these
        rw.out.attrs["batch_inputs"] = DictAttr(tuple((name, IntAttr(a)) for name, a in spec.axes.items()))
        for op in graph.ops:
            rw.op(op)
        rw.outputs()
        out = rw.out
        # the whole ops only per-sample ops read (a bias broadcast to the whole batch, now built at
        # the micro-batch's size) are unread now; ops the source itself left unread stay (the user's)
        dead_code_elimination(out, only=rw.whole)
    out.attrs["microbatched"] = to_attr({"data_parallel": d, "microbatches": m})
    from pesto_ir.verifier import verify

    verify(out, context=f"the micro-batched graph of '{graph.name}' is invalid (a bug in the rewrite)")
    return out


@dataclass(frozen=True)
class MicrobatchPass(Pass):
    """Rewrite the step into one replica's micro-batches (costing all-reduces on the context's
    cluster, when it has one, as `place` does with the same degrees)."""

    name = "microbatch"
    microbatches: int = 1
    data_parallel: int = 1

    def __post_init__(self) -> None:
        check_degree(self.microbatches, "microbatches")
        check_degree(self.data_parallel, "data-parallel")

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        if ctx.cluster is not None and self.data_parallel > 1:
            from pesto_ir.passes.hybrid import Strategy, replica_graph

            out = replica_graph(graph, ctx.cluster, Strategy(self.data_parallel, self.microbatches))
        else:
            out = rebatch(graph, self.microbatches, self.data_parallel)
        ctx.progress(f"microbatch: {len(graph.ops)} ops -> {len(out.ops)} "
                     f"(data-parallel {self.data_parallel} x {self.microbatches} micro-batches)")
        return out
