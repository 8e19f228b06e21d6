"""The micro-batch/replica rewrite (`rebatch`): one replica's training step, as M micro-batches.

The `microbatch` pass (`passes/microbatch.py`) and the hybrid search (`passes/rewrite/replicas.py`) run it.

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
along another axis, else computed whole and sliced. Batch axes follow `BATCH_RULES`
(`passes/rewrite/batch_axes.py`), one rule per opcode; an op with no rule that reads per-sample data is
refused with its name and location.

Cost-only graphs (`blob` values, from `pesto-graph/1`) have no shapes. Their ops scale linearly
with the batch (cost, activation, output bytes divided by D·M) unless they say `per_sample =
false`; values read by such an op are summed over micro-batches at full size (they are gradients);
`param_bytes` on an op are the gradient bytes all-reduced across replicas after its last copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pesto_ir.ir.attributes import Attr, BytesAttr, DictAttr, DurationAttr, IntAttr, StringAttr, to_attr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.types import BlobType, TensorType, Type
from pesto_ir.ir.verifier import verify
from pesto_ir.passes.dce import dead_code_elimination
from pesto_ir.passes.rewrite.batch_axes import (
    BATCH_RULES,
    Batch,
    Batched,
    BatchSpec,
    Cut,
    MicrobatchError,
    batch_spec,
    constant_along,
    refuse,
)

MAX_MICROBATCHES = 1024
PLAN_KEYS = ("device", "start", "end", "group")  # a placement of the old graph means nothing for the new one


# ---------------------------------------------------------------- the rewrite

@dataclass
class _PerSample:
    copies: list[Value]
    batch: Batch


class Rewriter:
    """Builds one replica's micro-batched graph from a whole-batch graph.

    The tensor-parallel rewrite (`passes/sharding/tensor_rewrite.py`) is this rewrite along a
    parameter's axis instead of the batch: it overrides the hooks `copy_name`, `copy_attrs`,
    `whole_rows` and `all_reduce`, the rules and the attribute the split outputs are listed in."""

    OUTPUT_AXES = "batch_outputs"  # the graph attribute listing split outputs (index -> axis)

    def __init__(self, src: Graph, microbatches: int, data_parallel: int,
                 all_reduce_cost: Callable[[int], float] | None) -> None:
        self.src, self.m, self.d = src, microbatches, data_parallel
        self.factor = microbatches * data_parallel
        self.all_reduce_cost = all_reduce_cost
        attrs = {k: v for k, v in src.attrs.items() if k not in ("plan", "transfers", "collectives")}
        self.out = Graph(src.name, attrs)
        self.one: dict[int, Value] = {}
        self.per: dict[int, _PerSample] = {}
        self.sliced: dict[tuple[int, ...], list[Value]] = {}
        self.whole: set[str] = set()  # ops kept whole: the rewrite may leave them unread
        self.summed: dict[int, Value] = {}  # cost graphs: a per-sample value summed over micro-batches
        self.groups = {str(op.get("colocate")) for op in src.ops if op.get("colocate") is not None}
        self.rules: dict[str, Any] = BATCH_RULES

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
            t = _as_tensor(v.type)
            shard = list(t.shape)
            shard[axis] //= self.d
            new = self.out.add_input(v.name, TensorType(t.dtype, tuple(shard)), v.param)
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
        key = self.slice_key(v, axis)
        if key in self.sliced:
            return self.sliced[key]
        op = v.owner
        whole = self.value(v)
        small: Value | None = None
        if op is not None and len(op.results) == 1 and not any(id(x) in self.per for x in op.operands):
            if op.opcode == "broadcast_in_dim" and axis not in list(op.get("broadcast_dimensions")) or \
                    op.opcode == "iota" and op.get("dimension") != axis:
                t = _as_tensor(self.small(v.type, axis))
                attrs = {k: a for k, a in op.attrs.items() if k not in PLAN_KEYS}
                attrs["shape"] = to_attr(tuple(t.shape))
                attrs = scaled_costs(attrs, self.factor)
                small = self.emit(op, op.opcode, [self.value(x) for x in op.operands], [t], attrs,
                                  self.out.fresh_name(f"{op.name}.mb")).result
        copies = self.whole_rows(v, axis, whole) if small is None else [small] * self.m
        self.sliced[key] = copies
        return copies

    def slice_key(self, v: Value, axis: int) -> tuple[int, ...]:
        """What identifies the copies' rows of a whole value `v` along `axis`, made once."""
        return (id(v), axis)

    def whole_rows(self, v: Value, axis: int, whole: Value) -> list[Value]:
        """The copies' rows of a whole value `v` (rewritten: `whole`) that varies along `axis`."""
        op = v.owner
        if self.d > 1 and not constant_along(v, axis):  # every replica runs this graph: replica 0's rows
            # of a value that varies along the batch would be wrong on the others
            where = f"op '{op.name}' ({op.where()})" if op is not None else f"input %{v.name}"
            raise MicrobatchError(f"cannot split %{v.name} for {self.d} data-parallel replicas: it has the batch "
                                  f"along axis {axis} but is made from no batch input ({where}), so each replica "
                                  "would need its own rows of it; declare it a batch input (batch_inputs / "
                                  "batch_argnums) or use micro-batches without replicas")
        return self._slices(op, whole, axis, _as_tensor(self.small(v.type, axis)).shape[axis])

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
        found = self.rules.get(op.opcode)
        if found is None:
            raise refuse(op, "micro-batching has no rule for how it treats the batch axis")
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
                            self.copy_attrs(op, attrs, i), self.copy_name(op.name, i),
                            [self.copy_name(r.name, i) for r in op.results])
            for k, r in enumerate(new.results):
                copies[k].append(r)
        for k, (r, a, cs) in enumerate(zip(op.results, how.out_axes, copies)):
            self.per[id(r)] = _PerSample(cs, (a, rows if how.rows is None else how.rows[k]))

    def copy_name(self, name: str, i: int) -> str:
        """The name of micro-batch i's copy of an op or value."""
        return f"{name}.mb{i}"

    def copy_attrs(self, op: Op, attrs: dict[str, Attr], i: int) -> dict[str, Attr]:
        out = scaled_costs(attrs, self.factor)
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
            a = self.copy_attrs(op, attrs, i)
            whole = self.m == 1 and self.d == 1
            partial.append(self.emit(op, op.opcode, operands, [r.type for r in op.results], a,
                                     op.name if whole else self.copy_name(op.name, i),
                                     [r.name if whole else self.copy_name(r.name, i) for r in op.results]))
        if combine == "chain" and self.d > 1 and not _is_zeros(op.operands[0]):
            raise refuse(op, "it adds into a tensor that is not zeros, which an all-reduce would count once "
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
                t = _as_tensor(ps.copies[0].type)
                shape = list(t.shape)
                shape[a] *= self.m
                outs.append(self.emit(v.owner, "concatenate", ps.copies, [TensorType(t.dtype, tuple(shape))],
                                      {"dimension": IntAttr(a)}, self.out.fresh_name(f"{v.name}.whole")).result)
        self.out.set_outputs(outs)
        if rows:
            self.out.attrs[self.OUTPUT_AXES] = DictAttr(tuple(rows))


def _as_tensor(t: Type) -> TensorType:
    """`t`, the type of a value that carries the batch on an axis: a tensor."""
    assert isinstance(t, TensorType), f"a value with a batch axis has type {t}, not a tensor type"
    return t


def _is_zeros(v: Value) -> bool:
    op = v.owner
    while op is not None and op.opcode in ("broadcast_in_dim", "convert_element_type") and op.operands:
        op = op.operands[0].owner
    return op is not None and op.opcode == "constant" and op.get("value") in (0, 0.0)


def scaled_costs(attrs: dict[str, Attr], factor: int) -> dict[str, Attr]:
    """A copy's costs: the whole op's divided by the number of slices (re-costed later by roofline
    when the graph was costed that way)."""
    out = dict(attrs)
    cost = out.get("cost")
    if isinstance(cost, DurationAttr):
        out["cost"] = DurationAttr(cost.seconds / factor)
    elif cost is not None and isinstance(cost.value, dict):
        out["cost"] = to_attr({k: DurationAttr(float(v.value if isinstance(v, Attr) else v) / factor)
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
            new = rw.emit(op, op.opcode, operands, types, rw.copy_attrs(op, attrs, i), f"{op.name}.mb{i}",
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
    verify(out, context=f"the micro-batched graph of '{graph.name}' is invalid (a bug in the rewrite)")
    return out
