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
split outputs in `tensor_outputs` (output index -> axis), those split in several runs in
`tensor_input_runs` and `tensor_output_runs`, and says `tensor_parallel = t`; a
backend running the group splits the caller's parameters into blocks and puts the new ones
together by them (`backends/jax_replicas.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pesto_ir.ir.attributes import Attr, BoolAttr, DictAttr, DurationAttr, IntAttr, ListAttr, StringAttr, to_attr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.types import BlobType, TensorType
from pesto_ir.ir.verifier import verify
from pesto_ir.passes.dce import dead_code_elimination
from pesto_ir.passes.placement.common import is_backward
from pesto_ir.passes.rewrite.batch_axes import ELEMENTWISE, Batch, Cut, MicrobatchError, refuse
from pesto_ir.passes.rewrite.rebatch import MAX_MICROBATCHES, PLAN_KEYS, Rewriter, _is_zeros, _PerSample, scaled_costs
from pesto_ir.passes.rewrite.tensor_rules import ACROSS_REPLICAS, Lookup, shape_of, tensor_rules
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError

CollectiveCost = Callable[[str, int], float]  # (opcode, bytes) -> seconds on the group's ring


class ShardingError(PestoError):
    """A tensor-parallel layout that cannot be built, with the op or input that stops it."""


@dataclass(frozen=True, order=True)
class TensorLayout:
    """t ranks, and the inputs split across them: (input name, axis), sorted by name. An input in
    `interleave` (name, runs) is split as `runs` runs of t blocks: its axis is `runs` equal parts
    (a fused projection's q, k and v) and rank j holds block j of each, so that each part is split
    alike (Megatron keeps fused QKV weights so, by heads). With `sequence_parallel`, partial sums
    of activations are reduce-scattered along the sequence, not all-reduced (Megatron-SP,
    `TensorRewriter.sequence_axis`)."""

    size: int
    splits: tuple[tuple[str, int], ...] = ()
    interleave: tuple[tuple[str, int], ...] = ()
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 1 <= self.size <= MAX_MICROBATCHES:
            raise ShardingError(f"tensor-parallel must be a whole number from 1 to {MAX_MICROBATCHES}, "
                                f"not {self.size!r}")
        object.__setattr__(self, "splits", tuple(sorted(dict(self.splits).items())))
        runs = {n: r for n, r in dict(self.interleave).items() if r != 1}
        bad = next((n for n, r in runs.items() if n not in self.axes or isinstance(r, bool) or not isinstance(r, int)
                    or r < 1), None)
        if bad is not None:
            raise ShardingError(f"interleave of %{bad} must be a whole number >= 1 of an input the layout splits")
        object.__setattr__(self, "interleave", tuple(sorted(runs.items())))
        if not isinstance(self.sequence_parallel, bool):
            raise ShardingError(f"sequence_parallel must be true or false, not {self.sequence_parallel!r}")

    @property
    def axes(self) -> dict[str, int]:
        return dict(self.splits)

    def runs(self, name: str) -> int:
        return dict(self.interleave).get(name, 1)

    def __str__(self) -> str:
        return (f"t={self.size}" + (f" ({len(self.splits)} inputs split)" if self.splits else "")
                + (", sequence-parallel" if self.sequence_parallel else ""))


# ---------------------------------------------------------------- the rewrite

class TensorRewriter(Rewriter):
    """Builds one tensor-parallel rank's graph (`tensor_shard`)."""

    OUTPUT_AXES = "tensor_outputs"

    def __init__(self, src: Graph, size: int, cost: CollectiveCost | None,
                 replica_cost: CollectiveCost | None = None, scatter: dict[int, int] | None = None,
                 sequence: int | None = None) -> None:
        super().__init__(src, 1, size, None if cost is None else (lambda nbytes: cost("all_reduce", nbytes)))
        self.cost, self.replica_cost = cost, replica_cost
        self.scatter = scatter or {}  # id(source value) -> axis: its partial sums reduce-scattered
        self.sequence = sequence  # sequence-parallel: the sequence's length (`sequence_axis`)
        self.reduced: dict[int, int] = {}  # id(an all-reduce's result) -> id(the source value it is)
        self.rules = tensor_rules(size)
        self.runs = 1  # the runs of the op being rewritten's split operands (`op`)
        self.lookups: dict[int, tuple[int, int]] = {}  # id(a `Lookup`'s indices) -> (axis, size) it picks from
        self.gathers: dict[tuple[int, bool], Value] = {}  # (id(split value), backward) -> its gather

    def op(self, op: Op) -> None:
        lookup = self.lookups.get(id(op.operands[1])) if len(op.operands) == 3 else None
        if lookup is not None and _scatters_rows_into_zeros(op, lookup[0]):
            split = [v for v in op.operands if id(v) in self.per]
            if not split:
                self.block_scatter(op, *lookup)
                return
            updates = op.operands[2]
            if split == [updates] and self.per[id(updates)].batch[1] == self.d:  # sequence-parallel updates
                self.gathered_then_split(op, [updates], split, then=lambda: self.block_scatter(op, *lookup))
                return
        try:
            self.attempt(op, self.split_op)
        except MicrobatchError:
            if not self.regathered(op):
                raise

    def attempt(self, op: Op, how: Callable[[Op], None]) -> None:
        """`how(op)`, or nothing at all when it is refused: the ops it made before the refusal (a
        block slice of an operand, say) are taken out again, so that another way can make them."""
        made = len(self.out.ops)
        try:
            how(op)
        except MicrobatchError:
            for dropped in reversed(self.out.ops[made:]):
                self.out.erase(dropped)
            self.sliced = {k: vs for k, vs in self.sliced.items()
                           if all(v.owner is None or v.owner.graph is not None for v in vs)}
            raise

    def split_op(self, op: Op) -> None:
        """`op` on blocks, by the rules (refused where they do not run it so)."""
        rows = {self.per[id(v)].batch[1] for v in op.operands if id(v) in self.per}
        if len(rows) > 1 and op.opcode != "concatenate":
            raise refuse(op, f"its operands are split in different runs ({sorted(r // self.d for r in rows)} runs "
                              f"of {self.d} blocks)")
        self.runs = next(iter(rows)) // self.d if rows else 1
        super().op(op)

    def regathered(self, op: Op) -> bool:
        """`op` where no rule runs it on its blocks (operands split along axes that do not pair up:
        a sequence-split activation meeting a column-split weight): operands split in one run
        gathered whole across the group (`all_gather`, GSPMD's resharding), then the op on the
        rest's blocks, or whole when nothing else is split. Under sequence parallelism one operand
        is gathered where that is enough, the smallest first (the activation, not the weight,
        where the sequence is shorter than four times the width: Megatron-SP's gather); else, and
        without it, all of them (the layouts the search scores without it were found so; with the
        smaller-first rule for every layout, the 13B GPT's `auto` found no plan). False where
        nothing can be gathered (runs of blocks, which no gather puts back in order)."""
        split = [v for v in op.operands if id(v) in self.per]
        single = list({id(v): v for v in split if self.per[id(v)].batch[1] == self.d}.values())
        if not single:
            return False
        if len(split) > 1 and self.sequence is not None:
            for v in sorted(single, key=lambda v: v.type.nbytes):
                if self.gathered_then_split(op, [v], split):
                    return True
        return self.gathered_then_split(op, single, split)

    def gathered_then_split(self, op: Op, gathered: list[Value], split: list[Value],
                            then: Callable[[], None] | None = None) -> bool:
        """`op` with the values `gathered` whole and the rest of `split` on blocks by the rules
        (or made by `then`: the gradient of a lookup, into the rank's rows); False, and nothing
        made, where the rules refuse the rest. A gather is made before its first reader and
        shared by its later readers; under sequence parallelism by those of the same pass only: the
        backward pass gathers again rather than hold a whole copy from the forward pass (as
        Megatron-SP does)."""
        backward = self.sequence is not None and is_backward(op)
        held = {id(v): self.per.pop(id(v)) for v in gathered}  # seen whole by this op only
        made = [(id(v), backward) for v in gathered if (id(v), backward) not in self.gathers]
        for v in gathered:
            if (id(v), backward) not in self.gathers:
                self.gathers[(id(v), backward)] = self.gather(op, v, held[id(v)])
            self.one[id(v)] = self.gathers[(id(v), backward)]
        try:
            if then is not None:
                then()
                return True
            if any(id(v) in self.per for v in split):
                try:
                    self.attempt(op, self.split_op)
                except MicrobatchError:
                    for key in made:
                        owner = self.gathers.pop(key).owner
                        assert owner is not None
                        self.out.erase(owner)
                    return False
                return True
            attrs = {k: a for k, a in op.attrs.items() if k not in PLAN_KEYS}
            new = self.emit(op, op.opcode, [self.value(v) for v in op.operands], [r.type for r in op.results],
                            attrs, op.name, [r.name for r in op.results])
            for r, n in zip(op.results, new.results):
                self.one[id(r)] = n
            return True
        finally:
            self.per.update(held)
            for v in gathered:
                del self.one[id(v)]

    def cut(self, op: Op, axes: list[Batch | None], attrs: dict[str, Attr], how: Cut) -> None:
        """The rank's partial results, combined across the group: all-reduced, or reduce-scattered
        into blocks along an axis where everything reads them in blocks (`scatter`)."""
        if how.combine == "chain" and not _is_zeros(op.operands[0]):
            raise refuse(op, "it adds into a tensor that is not zeros, which an all-reduce would count once per rank")
        operands = self.operands_for(op, axes, 0, how.split)
        if isinstance(how, Lookup):
            operands[1] = self.block_indices(op, op.operands[1], how.size)
            self.lookups[id(op.operands[1])] = (how.axis, how.size)
            attrs = {**attrs, **_outside_blocks_ignored(op)}
        part = self.emit(op, op.opcode, operands, [r.type for r in op.results],
                         self.copy_attrs(op, attrs, 0), op.name, [r.name for r in op.results])
        reduction = "sum" if how.combine == "chain" else how.combine
        for r, acc in zip(op.results, part.results):
            axis = self.scatter.get(id(r), self.sequence_axis(r)) if reduction == "sum" else None
            if axis is None:
                whole = self.all_reduce(op, [acc], reduction, f"{r.name}.allreduce")[0]
                self.reduced[id(whole)] = id(r)
                self.one[id(r)] = whole
                continue
            attrs = {"reduction": StringAttr("sum"), "replicas": IntAttr(self.d), "axes": ListAttr((IntAttr(axis),)),
                     "across": StringAttr("tensor")}
            if self.cost is not None:
                attrs["cost"] = DurationAttr(self.cost("reduce_scatter", acc.type.nbytes))
            made = self.emit(op, "reduce_scatter", [acc], [self.small(acc.type, axis)], attrs,
                             self.out.fresh_name(f"{r.name}.scatter"))
            self.per[id(r)] = _PerSample([made.result], (axis, self.d))

    def sequence_axis(self, v: Value) -> int | None:
        """Sequence parallelism (Megatron-SP): the axis a partial sum `v` is reduce-scattered along
        where it is an activation, `[batch, sequence, ...features]` (rank 3 or more, axis 1 the
        sequence), so that what reads it up to the next layer that splits its parameters (the
        residual stream, norms, biases, the loss) works on the rank's positions; that layer
        gathers it again. None for everything else (a weight's or a norm's statistics' partial
        sums are all-reduced), and without sequence parallelism."""
        shape = shape_of(v)
        if self.sequence is None or len(shape) < 3 or shape[1] != self.sequence:
            return None
        return 1

    def block_scatter(self, op: Op, axis: int, size: int) -> None:
        """`op`, the gradient of a `Lookup` (updates added into zeros at the rows its indices pick),
        on the rank's block of the zeros, the other blocks' rows dropped: its result split."""
        self.runs = 1
        zeros = self.split(op.operands[0], axis)[0]
        indices = self.block_indices(op, op.operands[1], size)
        attrs = {**{k: a for k, a in op.attrs.items() if k not in PLAN_KEYS}, **_outside_blocks_ignored(op)}
        made = self.emit(op, op.opcode, [zeros, indices, self.value(op.operands[2])], [self.small(op.result.type, axis)],
                         self.copy_attrs(op, attrs, 0), op.name, [op.result.name])
        self.per[id(op.result)] = _PerSample([made.result], (axis, self.d))

    def block_indices(self, op: Op, v: Value, size: int) -> Value:
        """Whole indices `v` into an axis of `size`, as indices into the rank's block of it (made
        once per value and size, before `op`)."""
        key = (id(v), -size)
        if key not in self.sliced:
            self.sliced[key] = [_emit_block_indices(self.out, self.value(v), size, self.d, op.loc)]
        return self.sliced[key][0]

    def gather(self, op: Op, v: Value, split: _PerSample) -> Value:
        """`v` whole again: an all-gather of its blocks, made before `op`, in its scope, colocation
        group and micro-batch (the pipeline's slot): a gather for the backward pass is part of it, where pipelines and
        schedules look for it, so it runs when its reader does, not as soon as its block is made."""
        block, axis = split.copies[0], split.batch[0]
        attrs: dict[str, Attr] = {"replicas": IntAttr(self.d), "axes": ListAttr((IntAttr(axis),)),
                                  "across": StringAttr("tensor")}
        for key in ("scope", "colocate", "microbatch"):
            if op.get(key) is not None:
                attrs[key] = op.attrs[key]
        if self.cost is not None:
            attrs["cost"] = DurationAttr(self.cost("all_gather", v.type.nbytes))
        made = self.emit(op, "all_gather", [block], [v.type], attrs, self.out.fresh_name(f"{v.name}.gather"))
        return made.result

    def slice_key(self, v: Value, axis: int) -> tuple[int, ...]:
        return (id(v), axis, self.runs)

    def split_inputs(self, layout: TensorLayout) -> None:
        inputs = {v.name: v for v in self.src.inputs}
        for name, axis in layout.splits:
            v = inputs.get(name)
            if v is None:
                raise ShardingError(f"graph '{self.src.name}': the layout splits %{name}, which is not an input")
            t = v.type
            if not isinstance(t, TensorType) or not 0 <= axis < t.rank:
                raise ShardingError(f"graph '{self.src.name}': axis {axis} of %{name} is not an axis of {t}")
            runs = layout.runs(name)
            if t.shape[axis] % (runs * self.d):
                blocks = f"{runs} runs of {self.d} equal blocks" if runs > 1 else f"{self.d} equal blocks"
                raise ShardingError(f"graph '{self.src.name}': axis {axis} of %{name} ({t}) does not split into "
                                    + blocks)
        for v in self.src.inputs:
            split = layout.axes.get(v.name)
            if split is None:
                self.one[id(v)] = self.out.add_input(v.name, v.type, v.param)
                continue
            runs = layout.runs(v.name)
            new = self.out.add_input(v.name, self.small(v.type, split), v.param)
            self.per[id(v)] = _PerSample([new], (split, self.d * runs))

    def copy_name(self, name: str, i: int) -> str:
        return name  # one copy per op: the rank's op keeps the source's name

    def copy_attrs(self, op: Op, attrs: dict[str, Attr], i: int) -> dict[str, Attr]:
        out = scaled_costs(attrs, self.d)  # the op's micro-batch and colocation are the source's
        if op.opcode in ACROSS_REPLICAS and self.replica_cost is not None:  # the replicas' ring, on the block
            out["cost"] = DurationAttr(self.replica_cost(op.opcode, sum(v.type.nbytes for v in op.operands) // self.d))
        return out

    def whole_rows(self, v: Value, axis: int, whole: Value) -> list[Value]:
        t = whole.type
        assert isinstance(t, TensorType)
        block = self.small(t, axis)
        attrs: dict[str, Attr] = {"replicas": IntAttr(self.d), "axis": IntAttr(axis), "across": StringAttr("tensor")}
        if self.runs > 1:
            attrs["runs"] = IntAttr(self.runs)
        if v.owner is not None and v.owner.get("colocate") is not None:
            attrs["colocate"] = StringAttr(str(v.owner.get("colocate")))
        op = self.emit(v.owner, "replica_slice", [whole], [block], attrs, self.out.fresh_name(f"{v.name}.block"))
        return [op.result]

    def all_reduce(self, src_op: Op, values: list[Value], reduction: str, name: str) -> list[Value]:
        made = super().all_reduce(src_op, values, reduction, name)
        owner = made[0].owner
        assert owner is not None
        owner.attrs["across"] = StringAttr("tensor")
        if src_op.get("colocate") is None:  # a rank's op is not a micro-batch copy: no group of its own
            owner.attrs.pop("colocate", None)
        else:
            owner.attrs["colocate"] = StringAttr(str(src_op.get("colocate")))
        return made


def tensor_shard(graph: Graph, layout: TensorLayout, cost: CollectiveCost | None = None,
                 replica_cost: CollectiveCost | None = None) -> Graph:
    """One rank's graph of `graph` split by `layout` across its t ranks; a new graph, verified.

    `cost(opcode, bytes)` gives a collective's duration on the group; without it the collectives
    have no cost attribute (nor have the block slices: a roofline costing prices them).
    `replica_cost` re-costs a replica graph's all-reduces across data-parallel replicas, which now
    reduce the rank's blocks. A layout of one rank returns the graph itself."""
    if layout.size == 1:
        return graph
    if "tensor_parallel" in graph.attrs:
        raise ShardingError(f"graph '{graph.name}' is already one tensor-parallel rank's graph")
    if "sharded_inputs" in graph.attrs:
        raise ShardingError(f"graph '{graph.name}' shards its optimizer state across data-parallel replicas "
                            "already: split the whole step's graph across ranks first, then shard each rank's state "
                            "(`passes/rewrite/replicas.py`, `replica_graph`)")
    if any(isinstance(v.type, BlobType) for op in graph.ops for v in op.results):
        raise ShardingError(f"graph '{graph.name}' is a cost graph (no tensor shapes): tensor parallelism splits "
                            "tensors along their axes, so it needs a graph with shapes (.pir or a JAX function)")
    rw = _rewritten(graph, layout, cost, replica_cost, {})
    # partial sums read only in blocks after all (a sequence-parallel region after a row-parallel
    # layer): rewrite again, reduce-scattering them, so that what reads them works on blocks too
    blocks = {rw.reduced[id(op.result)]: int(u.get("axis")) for op in rw.out.ops
              if op.opcode == "all_reduce" and id(op.result) in rw.reduced for u in op.result.users()
              if _is_block_slice(u)}
    if blocks:
        rw = _rewritten(graph, layout, cost, replica_cost, blocks)
    out = rw.out
    out.attrs["tensor_parallel"] = IntAttr(layout.size)
    if layout.sequence_parallel:
        out.attrs["sequence_parallel"] = BoolAttr(True)
    out.attrs["tensor_inputs"] = DictAttr(tuple((name, IntAttr(a)) for name, a in layout.splits))
    if layout.interleave:
        out.attrs["tensor_input_runs"] = DictAttr(tuple((n, IntAttr(r)) for n, r in layout.interleave))
    runs = [(str(k), IntAttr(rw.per[id(v)].batch[1] // layout.size)) for k, v in enumerate(graph.outputs)
            if id(v) in rw.per and rw.per[id(v)].batch[1] > layout.size]
    if runs:
        out.attrs["tensor_output_runs"] = DictAttr(tuple(runs))
    verify(out, context=f"the tensor-parallel graph of '{graph.name}' is invalid (a bug in the rewrite)")
    return out


def _rewritten(graph: Graph, layout: TensorLayout, cost: CollectiveCost | None, replica_cost: CollectiveCost | None,
               scatter: dict[int, int]) -> TensorRewriter:
    """The rewrite of `graph` by `layout` (dead whole ops dropped, block slices hoisted), the
    partial sums in `scatter` reduce-scattered along their axis."""
    work.charge(work.rewrite_kind(typed=True), len(graph.ops))  # cost graphs have no shapes to split
    rw = TensorRewriter(graph, layout.size, cost, replica_cost, scatter,
                        sequence_length(graph, layout.size) if layout.sequence_parallel else None)
    try:
        rw.split_inputs(layout)
        for op in graph.ops:
            rw.op(op)
        rw.outputs()
    except MicrobatchError as e:
        raise ShardingError(f"tensor-parallel {layout.size}: " + str(e).replace("cannot micro-batch", "cannot split")
                            .replace("the batch", "the split").replace("batch axis", "split axis")) from None
    dead_code_elimination(rw.out, only=rw.whole)
    _hoist_slices(rw.out, layout.size)
    return rw


def sequence_length(graph: Graph, t: int) -> int:
    """The length of the sequence a sequence-parallel rewrite of `graph` over t ranks splits: axis
    1 of its batch inputs (those not parameters, of rank 2 or more: tokens `[batch, sequence]`),
    which must agree and divide into t blocks."""
    lengths = {v.type.shape[1] for v in graph.inputs
               if not v.param and isinstance(v.type, TensorType) and v.type.rank >= 2}
    if len(lengths) != 1:
        found = f"their lengths are {sorted(lengths)}" if lengths else "it has none"
        raise ShardingError(f"graph '{graph.name}': sequence parallelism splits activations along the sequence, axis "
                            f"1 of the batch inputs (inputs not parameters, [batch, sequence, ...]), but {found}")
    n = next(iter(lengths))
    if n % t:
        raise ShardingError(f"graph '{graph.name}': sequence parallelism over {t} ranks: the sequence ({n}) does not "
                            f"split into {t} equal blocks")
    return n


def _hoist_slices(graph: Graph, t: int) -> None:
    """A block slice of a value that only it reads, made by an elementwise op or a broadcast, is
    that op on its operands' blocks: slices move up towards the all-reduces that made the values
    (so that those become reduce-scatters, `tensor_shard`'s second pass), and the ops run on 1/t
    of the data (a row-parallel layer's bias added on the rank's positions, as Megatron's sequence
    parallelism does)."""
    outputs = {id(v) for v in graph.outputs}
    work = [op for op in graph.ops if _is_block_slice(op)]
    while work:
        sliced = work.pop()
        src = sliced.operands[0].owner
        if sliced.graph is None or src is None or len(src.results) != 1 or len(src.result.users()) != 1 \
                or id(src.result) in outputs:
            continue
        axis, shape = int(sliced.get("axis")), shape_of(src.result)
        if src.subgraphs() and not _scatters_rows_into_zeros(src, axis):  # (a scatter's update function)
            continue
        if src.opcode in ELEMENTWISE and all(shape_of(x) in (shape, ()) for x in src.operands):
            made = [_block_slice(graph, sliced, x, axis) if shape_of(x) else x for x in src.operands]
            attrs = dict(src.attrs)
        elif src.opcode == "broadcast_in_dim" and list(src.get("broadcast_dimensions")).count(axis) == 0:
            made, attrs = list(src.operands), {**src.attrs, "shape": to_attr(shape_of(sliced.result))}
        elif _scatters_rows_into_zeros(src, axis):  # the lookup's gradient, on the rank's block
            zeros, indices, updates = src.operands
            local = _emit_block_indices(graph, indices, shape[axis], t, sliced.loc, before=sliced)
            made = [_block_slice(graph, sliced, zeros, axis), local, updates]
            attrs = {**src.attrs, **_outside_blocks_ignored(src)}
        else:
            continue
        attrs = scaled_costs({k: a for k, a in attrs.items() if k not in PLAN_KEYS}, t)
        name = graph.fresh_name(f"{src.name}.block")
        moved = Op(name, src.opcode, made, [sliced.result.type], attrs, [name], src.loc)
        graph.insert(graph.ops.index(sliced), moved)
        sliced.result.replace_all_uses_with(moved.result)
        graph.erase(sliced)
        graph.erase(src)
        work.extend(x.owner for x in made if x.owner is not None and _is_block_slice(x.owner))


def _scatters_rows_into_zeros(op: Op, axis: int) -> bool:
    """`op` adds updates into zeros at single rows along `axis`, picked by its indices alone: the
    gradient of a `Lookup`, whose block along `axis` the rank can make from its own rows."""
    if op.opcode not in ("scatter-add", "scatter_add") or not _is_zeros(op.operands[0]):
        return False
    dn = op.get("dimension_numbers")
    return list(dn["scatter_dims_to_operand_dims"]) == [axis] and axis in list(dn["inserted_window_dims"]) \
        and axis not in list(dn.get("operand_batching_dims", ()))


def _outside_blocks_ignored(op: Op) -> dict[str, Attr]:
    """The attributes that make a gather fill, or a scatter drop, the indices outside the block it
    reads or writes: zeros, which the sum across the group adds nothing with."""
    out: dict[str, Attr] = {"mode": StringAttr("FILL_OR_DROP")}
    if op.opcode == "gather":
        dtype = op.results[0].type.dtype if isinstance(op.results[0].type, TensorType) else "f32"
        out["fill_value"] = to_attr(0 if dtype.startswith(("i", "u")) else 0.0)
    return out


def _emit_block_indices(graph: Graph, indices: Value, size: int, t: int, loc: Any, before: Op | None = None) -> Value:
    """A `block_indices` op over the group's t ranks, appended to `graph` (or put before `before`)."""
    attrs: dict[str, Attr] = {"replicas": IntAttr(t), "size": IntAttr(size), "across": StringAttr("tensor")}
    name = graph.fresh_name(f"{indices.name}.local")
    made = Op(name, "block_indices", [indices], [indices.type], attrs, [name], loc)
    if before is None:
        graph.append(made)
    else:
        graph.insert(graph.ops.index(before), made)
    return made.result


def _is_block_slice(op: Op) -> bool:
    return op.opcode == "replica_slice" and op.get("across") == "tensor" and int(op.get("runs", 1)) == 1


def _block_slice(graph: Graph, like: Op, x: Value, axis: int) -> Value:
    """A block slice of `x` along `axis`, as `like` slices, made before `like`."""
    t = shape_of(x)
    shape = tuple(n // int(like.get("replicas")) if i == axis else n for i, n in enumerate(t))
    assert isinstance(x.type, TensorType)
    name = graph.fresh_name(f"{x.name}.block")
    made = Op(name, "replica_slice", [x], [TensorType(x.type.dtype, shape)], dict(like.attrs), [name], like.loc)
    graph.insert(graph.ops.index(like), made)
    return made.result
