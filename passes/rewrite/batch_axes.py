"""Which axis of each value carries the batch, for the micro-batch/replica rewrite (`passes/rewrite/rebatch.py`).

The graph's batch inputs (`batch_spec`), and one rule per batch kind (`BATCH_KINDS`, the `batch`
an opcode's definition names in `pesto_ir.ir.opdefs`) saying, from the batch axes of an op's
operands, whether the op keeps the batch (`Batched`: its results' batch axes) or reduces over it
(`Cut`: its copies' partial results are combined). `BATCH_RULES` gives each opcode its kind's
rule; the rewrite reads them all the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pesto_ir.ir.attributes import Attr, to_attr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.opdefs import OPDEFS, check_kinds, opcodes
from pesto_ir.ir.types import TensorType, Type
from pesto_ir.util.errors import PestoError


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
    sizes = {name: _shape(inputs[name])[a] for name, a in axes.items()}  # every batch input is a tensor
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
    rows: list[int] | None = None  # each result's rows, where they are not the operands' (a split axis cut up)


@dataclass
class Cut:
    """The op sums (or maxes) over the batch: copies' results are combined; whole operands that
    carry the batch too are sliced alike (`split`, index -> axis)."""

    combine: str  # "sum", "max", "min" or "chain" (scatter-add into its own operand)
    split: dict[int, int] = field(default_factory=dict)


Rule = Callable[[Op, list["Batch | None"]], "Batched | Cut"]
BATCH_KINDS: dict[str, Rule] = {}


def rule(kind: str) -> Callable[[Rule], Rule]:
    """Register the rule of a batch kind (`pesto_ir.ir.opdefs.BATCH_KINDS`)."""
    def register(fn: Rule) -> Rule:
        BATCH_KINDS[kind] = fn
        return fn
    return register


def refuse(op: Op, why: str) -> MicrobatchError:
    return MicrobatchError(f"cannot micro-batch op '{op.name}' = {op.opcode} ({op.where()}): {why}")


def _shape(v: Value) -> tuple[int, ...]:
    return v.type.shape if isinstance(v.type, TensorType) else ()


def _one_axis(op: Op, axes: list[Batch | None]) -> Batch:
    found = {b[0] for b in axes if b is not None}
    if len(found) != 1:
        raise refuse(op, f"its operands carry the batch on different axes ({sorted(found)})")
    return next(b for b in axes if b is not None)


def _first(axes: list[Batch | None]) -> Batch:
    """The batch of operand 0: a one-operand op's rule runs only when that operand carries it."""
    b = axes[0]
    assert b is not None, "a batch rule called on an op whose operand 0 carries no batch"
    return b


@rule("elementwise")
def _elementwise(op: Op, axes: list[Batch | None]) -> Batched:
    a = _one_axis(op, axes)[0]
    out = _shape(op.results[0])
    split = {}
    for i, (v, b) in enumerate(zip(op.operands, axes)):
        s = _shape(v)
        if b is not None or len(s) == 0 or s[a] == 1:
            continue
        if len(s) != len(out) or s[a] != out[a]:
            raise refuse(op, f"operand %{v.name}: {v.type} does not line up with the batch axis {a}")
        split[i] = a
    return Batched([a] * len(op.results), split)


@rule("broadcast")
def _broadcast(op: Op, axes: list[Batch | None]) -> Batched:
    return Batched([list(op.get("broadcast_dimensions"))[_first(axes)[0]]], fix=_fix_result_shape(op, "shape"))


@rule("reshape")
def _reshape(op: Op, axes: list[Batch | None]) -> Batched:
    (a, rows), src, out = _first(axes), _shape(op.operands[0]), _shape(op.results[0])
    order = op.get("dimensions")
    if order is not None and list(order) != list(range(len(src))):
        raise refuse(op, "it transposes before it reshapes (dimensions), which can make the batch a minor part")
    prefix = math.prod(src[:a])
    for j in range(len(out) + 1):
        if math.prod(out[:j]) == prefix and j < len(out) and out[j] % rows == 0:
            return Batched([j], fix=_fix_result_shape(op, "new_sizes"))
        if math.prod(out[:j]) > prefix:
            break
    raise refuse(op, f"the reshape {src} -> {out} splits the batch axis {a}")


@rule("transpose")
def _transpose(op: Op, axes: list[Batch | None]) -> Batched:
    return Batched([list(op.get("permutation")).index(_first(axes)[0])])


@rule("squeeze")
def _squeeze(op: Op, axes: list[Batch | None]) -> Batched:
    a, dims = _first(axes)[0], list(op.get("dimensions"))
    if a in dims:
        raise refuse(op, "it squeezes the batch axis")
    return Batched([a - sum(d < a for d in dims)])


@rule("expand_dims")
def _expand_dims(op: Op, axes: list[Batch | None]) -> Batched:
    a, out_rank = _first(axes)[0], len(_shape(op.results[0]))
    kept = [i for i in range(out_rank) if i not in {d % out_rank for d in op.get("dimensions")}]
    return Batched([kept[a]])


@rule("reduce")
def _reduce(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    a, reduced = _first(axes)[0], list(op.get("axes"))
    if a in reduced:
        combine = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}.get(op.opcode)
        if combine is None:
            raise refuse(op, "it reduces over the batch axis, and its partial results cannot be combined")
        return Cut(combine)
    return Batched([a - sum(d < a for d in reduced)])


@rule("cumulative")
def _scan_axis(op: Op, axes: list[Batch | None]) -> Batched:
    a = _first(axes)[0]
    if op.get("axis") == a:
        raise refuse(op, "it scans along the batch axis")
    return Batched([a])


@rule("rev")
def _rev(op: Op, axes: list[Batch | None]) -> Batched:
    if _first(axes)[0] in list(op.get("dimensions")):
        raise refuse(op, "it reverses the batch axis")
    return Batched([_first(axes)[0]])


@rule("pad")
def _pad(op: Op, axes: list[Batch | None]) -> Batched:
    if axes[1] is not None:
        raise refuse(op, "its padding value is per sample")
    a = _first(axes)[0]
    if tuple(op.get("padding_config")[a]) != (0, 0, 0):
        raise refuse(op, "it pads the batch axis")
    return Batched([a])


@rule("concatenate")
def _concatenate(op: Op, axes: list[Batch | None]) -> Batched:
    a = _one_axis(op, axes)[0]
    if op.get("dimension") == a:
        raise refuse(op, "it concatenates along the batch axis")
    return Batched([a], {i: a for i, b in enumerate(axes) if b is None})


@rule("stack")
def _stack(op: Op, axes: list[Batch | None]) -> Batched:
    a, new = _one_axis(op, axes)[0], op.get("axis")
    return Batched([a if a < new else a + 1], {i: a for i, b in enumerate(axes) if b is None})


@rule("unstack")
def _unstack(op: Op, axes: list[Batch | None]) -> Batched:
    a, gone = _first(axes)[0], op.get("axis")
    if a == gone:
        raise refuse(op, "it unstacks along the batch axis")
    return Batched([a if a < gone else a - 1] * len(op.results))


@rule("split")
def _split(op: Op, axes: list[Batch | None]) -> Batched:
    a = _first(axes)[0]
    if op.get("axis") == a:
        raise refuse(op, "it splits along the batch axis")
    return Batched([a] * len(op.results))


@rule("slice")
def _slice(op: Op, axes: list[Batch | None]) -> Batched:
    a, n = _first(axes)[0], _shape(op.operands[0])[_first(axes)[0]]
    start, limit = list(op.get("start_indices")), list(op.get("limit_indices"))
    strides = op.get("strides")
    if start[a] != 0 or limit[a] != n or (strides is not None and list(strides)[a] != 1):
        raise refuse(op, "it slices the batch axis")

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
    raise refuse(op, "its operands' batch axes do not pair up (a product across samples)")


@rule("conv")
def _conv(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    dn = op.get("dimension_numbers")
    lhs, rhs, out = list(dn["lhs_spec"]), list(dn["rhs_spec"]), list(dn["out_spec"])
    al = axes[0][0] if axes[0] is not None else None
    ar = axes[1][0] if axes[1] is not None else None
    if al == lhs[0] and ar is None and op.get("batch_group_count", 1) == 1:
        return Batched([out[0]])
    if al == lhs[1] and ar == rhs[1] and op.get("feature_group_count", 1) == 1:
        return Cut("sum")  # a weight gradient: the batch is the contracted feature axis
    raise refuse(op, "its operands' batch axes do not pair up as a convolution over samples")


@rule("window")
def _window(op: Op, axes: list[Batch | None]) -> Batched:
    a = _one_axis(op, axes)[0]
    if list(op.get("window_dimensions"))[a] != 1 or list(op.get("window_strides"))[a] != 1 or \
            tuple(op.get("padding")[a]) != (0, 0):
        raise refuse(op, "its window spans samples")
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
            raise refuse(op, "its indices carry the batch and so does its operand's slice window (a gather across "
                              "samples)")
        return _gather_window(op, ao)
    if ao is not None:
        want = ibd[obd.index(ao)]
        if ai is None:
            split[1] = want
            ai = want
        elif ai != want:
            raise refuse(op, "its operand and indices carry the batch on axes that do not pair up")
    elif ai in ibd:
        split[0] = obd[ibd.index(ai)]
    if ai is None or ai >= idx_rank - 1:
        raise refuse(op, "its indices do not carry the batch")
    return Batched([_scatter_dims(op)[ai]], split)


@rule("scatter_add")
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
            raise refuse(op, "its operand and indices carry the batch on axes that do not pair up")
        split = {i: ax for i, ax in ((0, ao), (1, ibd[ibd.index(ai)]), (2, upd_scatter[ai]))
                 if axes[i] is None}
        return Batched([ao], split)
    if axes[0] is not None or au in uwd:
        return _scatter_window(op, axes)
    if ai is None or ai >= len(_shape(op.operands[1])) - 1:
        raise refuse(op, "its indices do not carry the batch")
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
        raise refuse(op, why or "it gathers across samples (it collapses the batch axis)")
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
        raise refuse(op, "its indices carry the batch and so do its updates' windows (a scatter across samples)")
    if axes[0] is None:
        ao = _scatter_window_dims(op)[list(dn["update_window_dims"]).index(axes[2][0])]  # type: ignore[index]
    else:
        ao = axes[0][0]
    au = _scatter_update_axis(op, ao)
    if au is None:
        raise refuse(op, "it scatters per-sample updates across samples")
    if axes[2] is not None and axes[2][0] != au:
        raise refuse(op, "its operand and updates carry the batch on axes that do not pair up")
    why = _part_window(op, ao, list(dn["scatter_dims_to_operand_dims"]), _shape(op.operands[2])[au])
    if why is not None:
        raise refuse(op, why)
    return Batched([ao], {i: ax for i, ax in ((0, ao), (2, au)) if axes[i] is None})


check_kinds("batch", BATCH_KINDS)
# Each opcode's rule, by its definition's batch kind.
BATCH_RULES: dict[str, Rule] = {d.name: BATCH_KINDS[d.batch] for d in OPDEFS.values() if d.batch is not None}
# Ops of the elementwise batch kind: each result row is the operands' rows at its index.
ELEMENTWISE: frozenset[str] = opcodes(batch="elementwise")


def _fix_result_shape(op: Op, key: str) -> Callable[[dict[str, Attr], list[Type]], dict[str, Attr]]:
    """The copy's `key` attribute is its result's shape, where the op's was the op's result shape."""
    old = tuple(_shape(op.results[0]))

    def fix(attrs: dict[str, Attr], types: list[Type]) -> dict[str, Attr]:
        value = attrs.get(key)
        if value is None or tuple(value.value) != old:
            return attrs
        return {**attrs, key: to_attr(tuple(types[0].shape))}  # type: ignore[attr-defined]

    return fix


def constant_along(v: Value, axis: int) -> bool:
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
        return constant_along(op.operands[0], dims.index(axis))
    if op.opcode == "iota":
        return bool(op.get("dimension") != axis)
    if op.opcode == "constant":
        return False
    if op.opcode in ELEMENTWISE:
        rank = len(_shape(v))
        return all(len(_shape(x)) == 0 or (len(_shape(x)) == rank and _shape(x)[axis] == 1)
                   or constant_along(x, axis) for x in op.operands)
    if op.opcode in ("scatter-add", "scatter_add"):  # the cotangent of x[..., i] when x's is a mean's
        au = _scatter_update_axis(op, axis)
        indexed = list(op.get("dimension_numbers")["scatter_dims_to_operand_dims"])
        return au is not None and _part_window(op, axis, indexed, _shape(op.operands[2])[au]) is None \
            and constant_along(op.operands[0], axis) and constant_along(op.operands[2], au)
    return False


def per_sample_values(graph: Graph) -> set[int]:
    """The ids of `graph`'s values that carry the batch: the values the micro-batch rewrite copies
    per micro-batch, found by the same rules without building anything (the results of an op that
    sums over the batch, `Cut`, are whole). Raises `MicrobatchError` where the rewrite would."""
    spec = batch_spec(graph)
    batch: dict[int, Batch] = {id(v): (a, spec.size) for v in graph.inputs
                               if (a := spec.axes.get(v.name)) is not None}
    for op in graph.ops:
        axes = [batch.get(id(v)) for v in op.operands]
        if all(b is None for b in axes):
            continue
        found = BATCH_RULES.get(op.opcode)
        if found is None:
            raise refuse(op, "micro-batching has no rule for how it treats the batch axis")
        how = found(op, axes)
        if isinstance(how, Batched):
            rows = next(b for b in axes if b is not None)[1]
            for k, (r, a) in enumerate(zip(op.results, how.out_axes)):
                batch[id(r)] = (a, rows if how.rows is None else how.rows[k])
    return set(batch)



def sample_names(graph: Graph) -> frozenset[str]:
    """The names of `graph`'s per-sample values (`per_sample_values`): what a rewrite that keeps
    names (`tensor_shard`) lets a rewritten graph's values be matched by."""
    by_id = per_sample_values(graph)
    return frozenset({v.name for v in graph.inputs if id(v) in by_id}
                     | {r.name for op in graph.ops for r in op.results if id(r) in by_id})
