"""Tensor parallelism as an exact rewrite: the graph one rank of a tensor-parallel group runs.

A group of t alike devices runs one graph at once (SPMD), each device on its own block of some
parameters: a `TensorLayout` names the inputs split and the axis each is split along, into t
contiguous blocks (rank j holds block j). The rewrite follows each split axis through the graph by
the same per-opcode rules that follow the batch through a data-parallel replica
(`passes/rewrite/batch_axes.py`), so it is exact, not a model of one:

- an op that reads split values and keeps the split axis runs on the rank's blocks (a
  column-parallel `dot_general`, attention over the rank's heads, the optimizer update of a
  split parameter); its cost is 1/t of the whole op's;
- an op that contracts or reduces over the split axis gives partial results, combined across the
  group by an `all_reduce` (a row-parallel `dot_general`, the input gradient of a column-parallel
  one, a norm's statistics over a split feature axis);
- a whole value read where the rank's block of it is needed is sliced to it (`replica_slice`), or
  built at the block's size where it is a broadcast or an iota along another axis;
- everything else runs whole, the same on every rank.

The contraction rule is wider than the batch's: one split operand of a contraction pairs with the
rank's block of a whole one (a row-parallel layer whose weight is not split itself), which is what
makes every layout of split parameters a valid program, only a slower or larger one.

The rewritten graph lists its split inputs in the attribute `tensor_inputs` (name -> axis) and its
split outputs in `tensor_outputs` (output index -> axis), and says `tensor_parallel = t`; a
backend running the group splits the caller's parameters into blocks and puts the new ones
together by them (`backends/jax_replicas.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pesto_ir.ir.attributes import Attr, DictAttr, IntAttr, StringAttr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.types import BlobType, TensorType
from pesto_ir.ir.verifier import verify
from pesto_ir.passes.dce import dead_code_elimination
from pesto_ir.passes.rewrite.batch_axes import BATCH_RULES, Batch, Batched, Cut, MicrobatchError
from pesto_ir.passes.rewrite.rebatch import MAX_MICROBATCHES, Rewriter, _PerSample, scaled_costs
from pesto_ir.util.errors import PestoError

CollectiveCost = Callable[[str, int], float]  # (opcode, bytes) -> seconds on the group's ring


class ShardingError(PestoError):
    """A tensor-parallel layout that cannot be built, with the op or input that stops it."""


@dataclass(frozen=True, order=True)
class TensorLayout:
    """t ranks, and the inputs split across them: (input name, axis), sorted by name."""

    size: int
    splits: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 1 <= self.size <= MAX_MICROBATCHES:
            raise ShardingError(f"tensor-parallel must be a whole number from 1 to {MAX_MICROBATCHES}, "
                                f"not {self.size!r}")
        object.__setattr__(self, "splits", tuple(sorted(dict(self.splits).items())))

    @property
    def axes(self) -> dict[str, int]:
        return dict(self.splits)

    def __str__(self) -> str:
        return f"t={self.size}" + (f" ({len(self.splits)} inputs split)" if self.splits else "")


# ---------------------------------------------------------------- rules

def _tensor_dot_general(op: Op, axes: list[Batch | None]) -> Batched | Cut:
    """The batch rule, and one more pairing: a contraction over one operand's split axis reads the
    rank's block of the other, whole operand (partial sums, all-reduced)."""
    (lc, rc), _ = [[list(x) for x in pair] for pair in op.get("dimension_numbers")]
    al = axes[0][0] if axes[0] is not None else None
    ar = axes[1][0] if axes[1] is not None else None
    if al is not None and ar is None and al in lc:
        return Cut("sum", {1: rc[lc.index(al)]})
    if ar is not None and al is None and ar in rc:
        return Cut("sum", {0: lc[rc.index(ar)]})
    rule = BATCH_RULES["dot_general"]
    return rule(op, axes)


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
    rule = BATCH_RULES["conv_general_dilated"]
    return rule(op, axes)


TENSOR_RULES: dict[str, Any] = {**BATCH_RULES, "dot_general": _tensor_dot_general,
                                **{name: _tensor_conv for name, rule in BATCH_RULES.items()
                                   if rule is BATCH_RULES.get("conv_general_dilated")}}


# ---------------------------------------------------------------- the rewrite

class TensorRewriter(Rewriter):
    """Builds one tensor-parallel rank's graph (`tensor_shard`)."""

    OUTPUT_AXES = "tensor_outputs"

    def __init__(self, src: Graph, size: int, cost: CollectiveCost | None) -> None:
        super().__init__(src, 1, size, None if cost is None else (lambda nbytes: cost("all_reduce", nbytes)))
        self.cost = cost
        self.rules = TENSOR_RULES

    def split_inputs(self, layout: TensorLayout) -> None:
        inputs = {v.name: v for v in self.src.inputs}
        for name, axis in layout.splits:
            v = inputs.get(name)
            if v is None:
                raise ShardingError(f"graph '{self.src.name}': the layout splits %{name}, which is not an input")
            t = v.type
            if not isinstance(t, TensorType) or not 0 <= axis < t.rank:
                raise ShardingError(f"graph '{self.src.name}': axis {axis} of %{name} is not an axis of {t}")
            if t.shape[axis] % self.d:
                raise ShardingError(f"graph '{self.src.name}': axis {axis} of %{name} ({t}) does not split into "
                                    f"{self.d} equal blocks")
        for v in self.src.inputs:
            split = layout.axes.get(v.name)
            if split is None:
                self.one[id(v)] = self.out.add_input(v.name, v.type, v.param)
                continue
            new = self.out.add_input(v.name, self.small(v.type, split), v.param)
            self.per[id(v)] = _PerSample([new], (split, self.d))

    def copy_name(self, name: str, i: int) -> str:
        return name  # one copy per op: the rank's op keeps the source's name

    def copy_attrs(self, op: Op, attrs: dict[str, Attr], i: int) -> dict[str, Attr]:
        return scaled_costs(attrs, self.d)  # the op's micro-batch and colocation are the source's

    def whole_rows(self, v: Value, axis: int, whole: Value) -> list[Value]:
        t = whole.type
        assert isinstance(t, TensorType)
        block = self.small(t, axis)
        attrs: dict[str, Attr] = {"replicas": IntAttr(self.d), "axis": IntAttr(axis)}
        if v.owner is not None and v.owner.get("colocate") is not None:
            attrs["colocate"] = StringAttr(str(v.owner.get("colocate")))
        op = self.emit(v.owner, "replica_slice", [whole], [block], attrs, self.out.fresh_name(f"{v.name}.block"))
        return [op.result]

    def all_reduce(self, src_op: Op, values: list[Value], reduction: str, name: str) -> list[Value]:
        made = super().all_reduce(src_op, values, reduction, name)
        owner = made[0].owner
        assert owner is not None
        if src_op.get("colocate") is None:  # a rank's op is not a micro-batch copy: no group of its own
            owner.attrs.pop("colocate", None)
        else:
            owner.attrs["colocate"] = StringAttr(str(src_op.get("colocate")))
        return made


def tensor_shard(graph: Graph, layout: TensorLayout, cost: CollectiveCost | None = None) -> Graph:
    """One rank's graph of `graph` split by `layout` across its t ranks; a new graph, verified.

    `cost(opcode, bytes)` gives a collective's duration on the group; without it the collectives
    have no cost attribute (nor have the block slices: a roofline costing prices them). A layout of one rank returns the graph itself."""
    if layout.size == 1:
        return graph
    if "tensor_parallel" in graph.attrs:
        raise ShardingError(f"graph '{graph.name}' is already one tensor-parallel rank's graph")
    degrees = graph.attrs.get("microbatched")
    if degrees is not None and int(degrees.value.get("data_parallel", 1)) > 1:
        raise ShardingError(f"graph '{graph.name}': tensor parallelism inside data-parallel replicas is not built "
                            "yet; use data-parallel 1 with tensor-parallel > 1")
    if any(isinstance(v.type, BlobType) for op in graph.ops for v in op.results):
        raise ShardingError(f"graph '{graph.name}' is a cost graph (no tensor shapes): tensor parallelism splits "
                            "tensors along their axes, so it needs a graph with shapes (.pir or a JAX function)")
    rw = TensorRewriter(graph, layout.size, cost)
    try:
        rw.split_inputs(layout)
        for op in graph.ops:
            rw.op(op)
        rw.outputs()
    except MicrobatchError as e:
        raise ShardingError(f"tensor-parallel {layout.size}: " + str(e).replace("cannot micro-batch", "cannot split")
                            .replace("the batch", "the split").replace("batch axis", "split axis")) from None
    out = rw.out
    dead_code_elimination(out, only=rw.whole)
    out.attrs["tensor_parallel"] = IntAttr(layout.size)
    out.attrs["tensor_inputs"] = DictAttr(tuple((name, IntAttr(a)) for name, a in layout.splits))
    verify(out, context=f"the tensor-parallel graph of '{graph.name}' is invalid (a bug in the rewrite)")
    return out


def split_axes(graph: Graph, key: str) -> Mapping[str, int]:
    """A graph attribute mapping names (or output indices) to split axes, or {} without one."""
    raw = graph.attrs.get(key)
    return {k: int(a) for k, a in raw.value.items()} if raw is not None and isinstance(raw.value, dict) else {}


def partition_specs(graph: Graph) -> tuple[tuple[str, tuple[str | None, ...]], ...]:
    """A rank graph's split inputs as partition specs over the mesh axis "tensor" (one entry per
    axis, as `jax.sharding.PartitionSpec` has them), for the plan's `layouts`."""
    ranks = {v.name: v.type.rank for v in graph.inputs if isinstance(v.type, TensorType)}
    return tuple((name, tuple("tensor" if i == axis else None for i in range(ranks[name])))
                 for name, axis in sorted(split_axes(graph, "tensor_inputs").items()))
