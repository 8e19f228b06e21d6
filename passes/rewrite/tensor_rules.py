"""The per-opcode rules of the tensor-parallel rewrite (`tensor_shard.py`): how an op runs on
the ranks' blocks of its split operands, beside the batch-axis rules they extend.

A split value's batch is (axis, rows) with rows = t x runs: its axis is `runs` runs of t blocks
(runs = 1: t contiguous blocks), rank j holding block j of each run. The batch-axis rules keep
the rows where the axis keeps its size, and a reshape moves rows to a new axis only where they
are its major part, which keeps this structure. The rules here add what the batch has no use
for: a contraction with the rank's block of a whole operand, output channels of a convolution,
lookups in a table split along the rows they pick, and splits, slices and concatenations along
the split axis in whole runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pesto_ir.ir.attributes import Attr, to_attr
from pesto_ir.ir.graph import Op, Value
from pesto_ir.ir.opdefs import opcodes
from pesto_ir.ir.types import TensorType, Type
from pesto_ir.passes.rewrite.batch_axes import BATCH_RULES, Batch, Batched, Cut, refuse

ACROSS_REPLICAS = opcodes(run="replicas")  # the collectives of data-parallel replicas, and their slices


def _tensor_dot_general(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    """The batch rule, and one more pairing: a split contracting or batch axis of one operand reads
    the rank's block of the other, whole operand along the axis it pairs with (a contraction then
    gives partial sums, all-reduced; a batch axis, the rank's heads)."""
    (lc, rc), (lb, rb) = [[list(x) for x in pair] for pair in op.get("dimension_numbers")]
    al = axes[0][0] if axes[0] is not None else None
    ar = axes[1][0] if axes[1] is not None else None
    if al is not None and ar is None and al in lc:
        return Cut("sum", {1: rc[lc.index(al)]})
    if ar is not None and al is None and ar in rc:
        return Cut("sum", {0: lc[rc.index(ar)]})
    if al is not None and ar is None and al in lb:
        return Batched([lb.index(al)], {1: rb[lb.index(al)]})
    if ar is not None and al is None and ar in rb:
        return Batched([rb.index(ar)], {0: lb[rb.index(ar)]})
    return BATCH_RULES["dot_general"](op, axes)


def _tensor_conv(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    """A convolution's channels: split output features give split output features (a
    column-parallel convolution), split input features partial sums, the other operand's block
    taken where it is whole; the batch rule for the rest (a weight gradient's "batch" is the
    activation's channel axis)."""
    dn = op.get("dimension_numbers")
    lhs, rhs, out = list(dn["lhs_spec"]), list(dn["rhs_spec"]), list(dn["out_spec"])
    al = axes[0][0] if axes[0] is not None else None
    ar = axes[1][0] if axes[1] is not None else None
    grouped = op.get("feature_group_count", 1) != 1 or op.get("batch_group_count", 1) != 1
    if not grouped:
        if al is None and ar == rhs[0]:
            return Batched([out[1]])
        if al == lhs[1] and ar is None:
            return Cut("sum", {1: rhs[1]})
        if al is None and ar == rhs[1]:
            return Cut("sum", {0: lhs[1]})
    return BATCH_RULES["conv_general_dilated"](op, axes)


@dataclass
class Lookup(Cut):
    """A gather from an operand split along the axis its indices pick from, the indices whole
    (Megatron's vocabulary-parallel embedding and loss): each rank looks up in its block, the
    indices of other blocks giving zeros (`block_indices`, the gather filling what falls outside),
    and the partial results are summed across the group. `size` is the whole axis's length."""

    axis: int = 0
    size: int = 0


def _block_lookup(op: Op, axes: list[Batch | None]) -> Lookup | None:
    """`Lookup` where `op`, a gather, reads its operand split in t contiguous blocks along the one
    axis its indices pick a single row of, from whole indices; else None."""
    b, dn = axes[0], op.get("dimension_numbers")
    if b is None or axes[1] is not None or list(dn["start_index_map"]) != [b[0]]:
        return None
    axis = b[0]
    if axis not in list(dn["collapsed_slice_dims"]) or list(op.get("slice_sizes"))[axis] != 1:
        return None
    return Lookup("sum", axis=axis, size=shape_of(op.operands[0])[axis])


def _tensor_gather(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    """The batch rule, or a lookup in the rank's block (`Lookup`)."""
    lookup = _block_lookup(op, axes)
    return BATCH_RULES["gather"](op, axes) if lookup is None else lookup


def _runs(op: Op, t: int, b: Batch, size: int, lengths: list[int]) -> list[int]:
    """The rows of each piece of a split axis cut into `lengths`: each must be whole runs."""
    runs = b[1] // t
    run = size // runs
    if any(n % run for n in lengths):
        raise refuse(op, f"it cuts the split axis (runs of {run}) into pieces of {lengths}, not whole runs")
    return [t * (n // run) for n in lengths]


def tensor_rules(t: int) -> dict[str, Any]:
    """The rules of a rewrite for t ranks (the split, slice and concatenation rules need t)."""

    def split(op: Op, axes: list[Batch | None]) -> Batched | Cut:
        b = axes[0]
        assert b is not None
        if op.get("axis") != b[0]:
            return BATCH_RULES["split"](op, axes)
        sizes = [int(n) for n in op.get("sizes")]
        rows = _runs(op, t, b, sum(sizes), sizes)

        def fix(attrs: dict[str, Attr], types: list[Type]) -> dict[str, Attr]:
            return {**attrs, "sizes": to_attr(tuple(n // t for n in sizes))}

        return Batched([b[0]] * len(op.results), fix=fix, rows=rows)

    def slice_(op: Op, axes: list[Batch | None]) -> Batched | Cut:
        b = axes[0]
        assert b is not None
        a = b[0]
        start, limit = list(op.get("start_indices")), list(op.get("limit_indices"))
        strides = op.get("strides")
        size = shape_of(op.operands[0])[a]
        if start[a] == 0 and limit[a] == size or strides is not None and list(strides)[a] != 1:
            return BATCH_RULES["slice"](op, axes)
        rows = _runs(op, t, b, size, [start[a], limit[a] - start[a]])[1:]

        def fix(attrs: dict[str, Attr], types: list[Type]) -> dict[str, Attr]:
            lo, hi = list(start), list(limit)
            lo[a], hi[a] = start[a] // t, limit[a] // t
            return {**attrs, "start_indices": to_attr(tuple(lo)), "limit_indices": to_attr(tuple(hi))}

        return Batched([a], fix=fix, rows=rows)

    def concatenate(op: Op, axes: list[Batch | None]) -> Batched | Cut:
        dim = op.get("dimension")
        if not any(b is not None and b[0] == dim for b in axes):
            return BATCH_RULES["concatenate"](op, axes)
        if any(b is None or b[0] != dim for b in axes):
            raise refuse(op, "it concatenates split and whole values along the split axis")
        lengths = [shape_of(v)[dim] * t // b[1] for v, b in zip(op.operands, axes) if b is not None]
        if len(set(lengths)) != 1:
            raise refuse(op, f"it concatenates values split in runs of different lengths ({lengths})")
        return Batched([dim], rows=[sum(b[1] for b in axes if b is not None)])

    def across_replicas(op: Op, axes: list[Batch | None]) -> Batched | Cut:
        """A data-parallel replicas' all-reduce of the rank's block: the block's sum."""
        if op.opcode != "all_reduce" or len(op.operands) != 1:
            raise refuse(op, "tensor parallelism runs inside data-parallel replicas' all-reduces of one value each, "
                              "not inside a sharded optimizer state's collectives")
        return Batched([axes[0][0]])  # type: ignore[index]

    return {**BATCH_RULES, **{name: across_replicas for name in ACROSS_REPLICAS},
            "dot_general": _tensor_dot_general, "gather": _tensor_gather,
            **{name: _tensor_conv for name, rule in BATCH_RULES.items()
               if rule is BATCH_RULES.get("conv_general_dilated")},
            "split": split, "slice": slice_, "concatenate": concatenate}


def shape_of(v: Value) -> tuple[int, ...]:
    return v.type.shape if isinstance(v.type, TensorType) else ()
