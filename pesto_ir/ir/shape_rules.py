"""Shape rules: the result types an op must have, given its operands and attributes.

One rule per kind of op, by name (`SHAPE_KINDS`); an opcode's definition names its rule
(`shape` of its `pesto_ir.ir.opdefs.OpDef`). An opcode with no rule is opaque to the verifier:
its declared result types are trusted. A rule raises `ShapeError` with a sentence when the
operands or attributes cannot go together. Most rules take tensors only; `TYPE_KINDS`
(collectives such as `all_reduce`) take any value types, blobs included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pesto_ir.ir.graph import Op
from pesto_ir.ir.opdefs import check_kinds, opdef
from pesto_ir.ir.types import KEY_DATA_DTYPE, KEY_IMPLS, TensorType, Type, key_dtype


class ShapeError(ValueError):
    """The operands or attributes of an op are inconsistent."""


ShapeRule = Callable[[Op, Sequence[TensorType]], list[Type]]


def _tensors(op: Op) -> list[TensorType]:
    out = []
    for v in op.operands:
        if not isinstance(v.type, TensorType):
            raise ShapeError(f"operand %{v.name} is {v.type}, not a tensor")
        out.append(v.type)
    return out


def _need(op: Op, key: str) -> Any:
    if key not in op.attrs:
        raise ShapeError(f"missing attribute '{key}'")
    return op.attrs[key].value


def _arity(ts: Sequence[TensorType], n: int) -> None:
    if len(ts) != n:
        raise ShapeError(f"expects {n} operand(s), got {len(ts)}")


def _unary(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    _arity(ts, 1)
    return [ts[0]]


def _broadcast_shape(ts: Sequence[TensorType]) -> tuple[int, ...]:
    """Elementwise operands broadcast like numpy: rank-0 literals, and size-1 dimensions."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*(t.shape for t in ts)))
    except ValueError:
        raise ShapeError("operand shapes do not broadcast: " + ", ".join(str(t) for t in ts)) from None


def _binary(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    _arity(ts, 2)
    out_dtype = op.get("out_dtype")  # `mul` may widen (i8 x i8 -> i32); then dtypes may differ
    if out_dtype is None and ts[0].dtype != ts[1].dtype:
        raise ShapeError(f"operand dtypes differ: {ts[0]} and {ts[1]}")
    return [TensorType(out_dtype or ts[0].dtype, _broadcast_shape(ts))]


def _pow(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """`pow(x, y)`: y has x's dtype or is an integer; the result has x's dtype."""
    _arity(ts, 2)
    if ts[1].dtype != ts[0].dtype and ts[1].dtype[0] not in "iu":
        raise ShapeError(f"exponent {ts[1]} is neither {ts[0].dtype} nor an integer")
    return [TensorType(ts[0].dtype, _broadcast_shape(ts))]


_REAL_OF_COMPLEX = {"c64": "f32", "c128": "f64"}


def _abs(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """|z| of a complex tensor is real."""
    _arity(ts, 1)
    return [TensorType(_REAL_OF_COMPLEX.get(ts[0].dtype, ts[0].dtype), ts[0].shape)]


def _compare(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    _arity(ts, 2)
    return [TensorType("bool", _broadcast_shape(ts))]


def _select_n(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    if len(ts) < 2:
        raise ShapeError("expects a predicate and at least one case")
    cases = ts[1:]
    if len({t.dtype for t in cases}) != 1:
        raise ShapeError("cases have different dtypes")
    return [TensorType(cases[0].dtype, _broadcast_shape(ts))]


def _convert(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    _arity(ts, 1)
    return [TensorType(_need(op, "new_dtype"), ts[0].shape)]


def _dot_general(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    _arity(ts, 2)
    lhs, rhs = ts
    try:
        (lc, rc), (lb, rb) = _need(op, "dimension_numbers")
    except (TypeError, ValueError):
        raise ShapeError("dimension_numbers must be [[lhs_contract, rhs_contract], [lhs_batch, rhs_batch]]") from None
    for dims, t, side in ((lc, lhs, "lhs"), (lb, lhs, "lhs"), (rc, rhs, "rhs"), (rb, rhs, "rhs")):
        if any(not 0 <= d < t.rank for d in dims):
            raise ShapeError(f"dimension out of range for {side} {t}")
    if len(lc) != len(rc) or any(lhs.shape[a] != rhs.shape[b] for a, b in zip(lc, rc)):
        raise ShapeError(f"contracting dimensions of {lhs} and {rhs} do not match")
    if len(lb) != len(rb) or any(lhs.shape[a] != rhs.shape[b] for a, b in zip(lb, rb)):
        raise ShapeError(f"batch dimensions of {lhs} and {rhs} do not match")
    batch = tuple(lhs.shape[d] for d in lb)
    lfree = tuple(s for i, s in enumerate(lhs.shape) if i not in lc and i not in lb)
    rfree = tuple(s for i, s in enumerate(rhs.shape) if i not in rc and i not in rb)
    dtype = op.get("preferred_element_type") or lhs.dtype
    return [TensorType(dtype, batch + lfree + rfree)]


def _reduce(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    _arity(ts, 1)
    axes = tuple(_need(op, "axes"))
    if any(not 0 <= a < ts[0].rank for a in axes):
        raise ShapeError(f"axes {list(axes)} out of range for {ts[0]}")
    return [TensorType(ts[0].dtype, tuple(s for i, s in enumerate(ts[0].shape) if i not in axes))]


def _argreduce(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    (t,) = _reduce(op, ts)
    assert isinstance(t, TensorType)
    return [TensorType(_need(op, "index_dtype"), t.shape)]


def _transpose(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    _arity(ts, 1)
    perm = tuple(_need(op, "permutation"))
    if sorted(perm) != list(range(ts[0].rank)):
        raise ShapeError(f"permutation {list(perm)} does not fit {ts[0]}")
    return [TensorType(ts[0].dtype, tuple(ts[0].shape[p] for p in perm))]


def _reshape(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    if not ts:
        raise ShapeError("expects an operand")
    new = tuple(_need(op, "new_sizes"))
    out = TensorType(ts[0].dtype, new)
    if out.size != ts[0].size:
        raise ShapeError(f"cannot reshape {ts[0]} ({ts[0].size} elements) to {list(new)}")
    return [out]


def _broadcast_in_dim(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    if not ts:
        raise ShapeError("expects an operand")
    shape = tuple(_need(op, "shape"))
    dims = tuple(_need(op, "broadcast_dimensions"))
    t = ts[0]
    if len(dims) != t.rank or any(not 0 <= d < len(shape) for d in dims):
        raise ShapeError(f"broadcast_dimensions {list(dims)} do not fit {t} -> {list(shape)}")
    if any(t.shape[i] not in (1, shape[d]) for i, d in enumerate(dims)):
        raise ShapeError(f"cannot broadcast {t} to {list(shape)}")
    return [TensorType(t.dtype, shape)]


def _squeeze(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    _arity(ts, 1)
    dims = {d % max(ts[0].rank, 1) for d in _need(op, "dimensions")}
    if any(ts[0].shape[d] != 1 for d in dims):
        raise ShapeError(f"can only squeeze size-1 dimensions of {ts[0]}")
    return [TensorType(ts[0].dtype, tuple(s for i, s in enumerate(ts[0].shape) if i not in dims))]


def _concatenate(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    if not ts:
        raise ShapeError("expects operands")
    d = _need(op, "dimension")
    first = ts[0]
    for t in ts[1:]:
        if t.rank != first.rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d):
            raise ShapeError(f"cannot concatenate {first} and {t} along {d}")
    shape = list(first.shape)
    shape[d] = sum(t.shape[d] for t in ts)
    return [TensorType(first.dtype, tuple(shape))]


def _slice(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    _arity(ts, 1)
    start, limit = _need(op, "start_indices"), _need(op, "limit_indices")
    strides = op.get("strides") or (1,) * len(start)
    t = ts[0]
    if not len(start) == len(limit) == len(strides) == t.rank:
        raise ShapeError(f"slice indices do not match the rank of {t}")
    if any(not 0 <= s <= lim <= n for s, lim, n in zip(start, limit, t.shape)):
        raise ShapeError(f"slice out of bounds for {t}")
    if any(st < 1 for st in strides):
        raise ShapeError(f"slice strides must be at least 1, not {list(strides)}")
    return [TensorType(t.dtype, tuple((lim - s + st - 1) // st for s, lim, st in zip(start, limit, strides)))]


# ---------------------------------------------------------------- typed PRNG keys

def _key_operand(op: Op, t: TensorType) -> str:
    """The implementation of a key operand; a ShapeError when it holds numbers."""
    if t.key_impl is None:
        raise ShapeError(f"operand {t} is not an array of PRNG keys (key<impl>[...])")
    return t.key_impl


def _impl_attr(op: Op) -> str:
    impl = _need(op, "impl")
    if not isinstance(impl, str) or impl not in KEY_IMPLS:
        raise ShapeError(f"impl must name a PRNG implementation ({', '.join(KEY_IMPLS)}), not {op.attrs['impl']}")
    return impl


def _shape_attr(op: Op) -> tuple[int, ...]:
    shape = _need(op, "shape")
    if not isinstance(shape, tuple) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise ShapeError(f"shape must be a list of sizes, not {op.attrs['shape']}")
    return shape


def _random_seed(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """`random_seed(seeds) {impl}`: one key per integer seed."""
    _arity(ts, 1)
    if ts[0].dtype[0] not in "iu":
        raise ShapeError(f"seeds {ts[0]} are not integers")
    return [TensorType(key_dtype(_impl_attr(op)), ts[0].shape)]


def _random_split(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """`random_split(keys) {shape}`: each key split into `shape` new keys, appended to its shape."""
    _arity(ts, 1)
    _key_operand(op, ts[0])
    return [TensorType(ts[0].dtype, ts[0].shape + _shape_attr(op))]


def _random_fold_in(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """`random_fold_in(keys, msgs)`: keys and u32 messages broadcast together."""
    _arity(ts, 2)
    _key_operand(op, ts[0])
    if ts[1].dtype != KEY_DATA_DTYPE:
        raise ShapeError(f"messages {ts[1]} are not {KEY_DATA_DTYPE}")
    return [TensorType(ts[0].dtype, _broadcast_shape(ts))]


def _random_bits(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """`random_bits(keys) {bit_width, shape}`: `shape` unsigned words of `bit_width` bits per key."""
    _arity(ts, 1)
    _key_operand(op, ts[0])
    width = _need(op, "bit_width")
    if width not in (8, 16, 32, 64):
        raise ShapeError(f"bit_width must be 8, 16, 32 or 64, not {op.attrs['bit_width']}")
    return [TensorType(f"u{width}", ts[0].shape + _shape_attr(op))]


def _random_wrap(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """`random_wrap(data) {impl}`: u32 key data whose trailing dimensions are one key's, as keys."""
    _arity(ts, 1)
    impl = _impl_attr(op)
    key_shape = KEY_IMPLS[impl]
    t = ts[0]
    if t.dtype != KEY_DATA_DTYPE or t.rank < len(key_shape) or t.shape[t.rank - len(key_shape):] != key_shape:
        raise ShapeError(f"key data {t} does not end in one {impl} key ({KEY_DATA_DTYPE}{list(key_shape)})")
    return [TensorType(key_dtype(impl), t.shape[:t.rank - len(key_shape)])]


def _random_unwrap(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """`random_unwrap(keys)`: the u32 data of each key, its shape appended."""
    _arity(ts, 1)
    impl = _key_operand(op, ts[0])
    return [TensorType(KEY_DATA_DTYPE, ts[0].shape + KEY_IMPLS[impl])]


REDUCTIONS = ("sum", "max", "min")


def _all_reduce(op: Op) -> list[Type]:
    """`all_reduce {reduction, replicas}`: combines each operand elementwise across `replicas`
    data-parallel replicas; a bucket of several operands is allowed, and each result has its
    operand's type (tensor or blob)."""
    if not op.operands:
        raise ShapeError("expects at least one operand (the values to reduce across replicas)")
    if len(op.results) != len(op.operands):
        raise ShapeError(f"has {len(op.operands)} operand(s) but {len(op.results)} result(s); it returns one "
                         "result per operand, of the operand's type")
    reduction = _need(op, "reduction")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ShapeError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, not {op.attrs['reduction']}")
    _replicas(op)
    return [v.type for v in op.operands]


def _replicas(op: Op) -> int:
    replicas = _need(op, "replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ShapeError(f"replicas must be a whole number >= 1, not {op.attrs['replicas']}")
    return replicas


def _axis(value: Any, t: TensorType, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(t.shape):
        raise ShapeError(f"{what} must be an axis of {t}, not {value!r}")
    return value


def _blocks(t: TensorType, axis: int, replicas: int, gather: bool) -> TensorType:
    """`t` split into `replicas` blocks along `axis` (one block), or (`gather`) put together."""
    shape = list(t.shape)
    if gather:
        shape[axis] *= replicas
    elif shape[axis] % replicas:
        raise ShapeError(f"axis {axis} of {t} does not split into {replicas} equal blocks")
    else:
        shape[axis] //= replicas
    return TensorType(t.dtype, tuple(shape))


def _sharded_bucket(op: Op, ts: Sequence[TensorType], gather: bool) -> list[Type]:
    """`reduce_scatter {reduction, replicas, axes}` (each replica keeps its block of each operand's
    sum across the replicas, replica r the r-th along that operand's axis) and `all_gather
    {replicas, axes}` (the replicas' blocks put together): one operand, or a bucket of several with
    an axis each, each result of its operand's type split or put together."""
    if not ts:
        raise ShapeError("expects at least one operand")
    if not gather:
        reduction = _need(op, "reduction")
        if not isinstance(reduction, str) or reduction not in REDUCTIONS:
            raise ShapeError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, not {op.attrs['reduction']}")
    replicas = _replicas(op)
    axes = _need(op, "axes")
    if not isinstance(axes, (list, tuple)) or len(axes) != len(ts):
        raise ShapeError(f"axes must list one axis per operand ({len(ts)}), not {op.attrs['axes']}")
    return [_blocks(t, _axis(a, t, "each of axes"), replicas, gather) for t, a in zip(ts, axes)]


def _replica_slice(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """`replica_slice {replicas, axis}`: each replica's own block of a value every replica has;
    with `runs = r`, the axis is r equal runs and the replica's block is its block of each."""
    _arity(ts, 1)
    runs = op.get("runs", 1)
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ShapeError(f"runs must be a whole number >= 1, not {op.attrs['runs']}")
    axis = _axis(_need(op, "axis"), ts[0], "axis")
    _blocks(ts[0], axis, _replicas(op) * runs, gather=False)  # every run splits into equal blocks
    return [_blocks(ts[0], axis, _replicas(op), gather=False)]


def _block_indices(op: Op, ts: Sequence[TensorType]) -> list[Type]:
    """`block_indices {replicas, size}`: integer indices into an axis of `size`, made indices into
    the replica's block of it (`size / replicas` long): the same type."""
    _arity(ts, 1)
    if not ts[0].dtype.startswith(("i", "u")):
        raise ShapeError(f"indexes with {ts[0]}, not integers")
    size, replicas = _need(op, "size"), _replicas(op)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or size % replicas:
        raise ShapeError(f"size must be a whole number >= 1 that {replicas} replicas divide, not {op.attrs['size']}")
    return [ts[0]]


# The rules by name, as op definitions (`pesto_ir.ir.opdefs`) name them in their `shape` field.
SHAPE_KINDS: dict[str, ShapeRule] = {
    "unary": _unary,
    "abs": _abs,
    "binary": _binary,
    "pow": _pow,
    "compare": _compare,
    "select_n": _select_n,
    "convert": _convert,
    "dot_general": _dot_general,
    "reduce": _reduce,
    "argreduce": _argreduce,
    "transpose": _transpose,
    "reshape": _reshape,
    "broadcast_in_dim": _broadcast_in_dim,
    "squeeze": _squeeze,
    "concatenate": _concatenate,
    "slice": _slice,
    "random_seed": _random_seed,
    "random_split": _random_split,
    "random_fold_in": _random_fold_in,
    "random_bits": _random_bits,
    "random_wrap": _random_wrap,
    "random_unwrap": _random_unwrap,
    # over data-parallel replicas, sharding a value along an axis (sharded optimizer state)
    "reduce_scatter": lambda op, ts: _sharded_bucket(op, ts, gather=False),
    "all_gather": lambda op, ts: _sharded_bucket(op, ts, gather=True),
    "replica_slice": _replica_slice,
    "block_indices": _block_indices,
}
# Rules over any value types (not just tensors): they get the op alone.
TYPE_KINDS: dict[str, Callable[[Op], list[Type]]] = {
    "all_reduce": _all_reduce,
}
check_kinds("shape", (*SHAPE_KINDS, *TYPE_KINDS))


def infer_result_types(op: Op) -> list[Type] | None:
    """The result types `op` must have, or None when its opcode has no rule."""
    kind = opdef(op.opcode).shape
    if kind is None:
        return None
    type_rule = TYPE_KINDS.get(kind)
    if type_rule is not None:
        return type_rule(op)
    return SHAPE_KINDS[kind](op, _tensors(op))
