"""Sharded optimizer state (ZeRO-1): each data-parallel replica keeps and updates 1/d of it.

In a replica graph (`passes/rewrite/rebatch.py`, d > 1) every replica holds the whole optimizer state and
runs the whole update. This rewrite makes a state input (a `param` input from which only
elementwise ops of its own shape compute, up to the outputs: Adam's moments, momentum) one
replica's block along an axis that splits into d, and the update it feeds (`_Region`: the
elementwise ops of that shape reached from the state, with the scalars they read) compute on
blocks. What the region reads from outside is taken block-wise: a gradient all-reduce that only the
region reads becomes a `reduce_scatter` (half of the all-reduce's ring: its reduce-scatter phase),
through transposes between them; any other value (the parameter, a gradient reshaped after its
all-reduce) a `replica_slice`. A region that an op outside reads from is no update and is left
alone. The new parameters (`_new_parameters`) go out whole, through an `all_gather`; new state
stays sharded.

The graph records its sharded inputs and outputs (`sharded_inputs`: input name -> axis,
`sharded_outputs`: output index -> axis); the JAX backend splits the caller's whole state into the
replicas' blocks and puts sharded outputs back together along them, as it does batch rows, so the
caller sees the same arrays as without sharding. Update ops of micro-batch copies (`microbatch`) are
per-sample work, never state updates: a region that reaches one is left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pesto_ir.cost.roofline import ELEMENTWISE_OPS
from pesto_ir.ir.attributes import Attr, DictAttr, DurationAttr, IntAttr, ListAttr, StringAttr, to_attr
from pesto_ir.ir.graph import Graph, Op, Value, infer_state_map
from pesto_ir.ir.types import TensorType
from pesto_ir.passes.rewrite.rebatch import scaled_costs

CollectiveCost = Callable[[str, int], float]  # (collective opcode, bytes of the whole value) -> seconds


@dataclass
class _Region:
    """The update ops of one group of state inputs, and the axis each value is split along."""

    replicas: int = 2
    states: list[Value] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    axis: dict[int, int] = field(default_factory=dict)  # id(value) -> its axis of blocks

    def has(self, op: Op) -> bool:
        return any(o is op for o in self.ops)

    def produced(self, v: Value) -> bool:
        return v.owner is not None and self.has(v.owner)


@dataclass
class Sharded:
    """What `shard_optimizer_state` did: the state inputs it split (name -> axis), and the ones it
    left whole with the reason."""

    inputs: dict[str, int] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.inputs)


def shard_optimizer_state(graph: Graph, replicas: int, cost: CollectiveCost | None = None) -> Sharded:
    """Rewrite `graph` (one replica's, of `replicas` > 1 data-parallel replicas) in place so that each
    replica holds and updates 1/replicas of the optimizer state; what was split and what was not."""
    done = Sharded()
    if replicas < 2 or "sharded_inputs" in graph.attrs:
        return done
    candidates = optimizer_state_inputs(graph)
    next_of = {id(graph.outputs[k]): graph.inputs[i] for k, i in infer_state_map(graph).items()}
    claimed: set[int] = set()
    outputs: dict[int, int] = {}
    blocks: dict[tuple[int, int], Value] = {}
    for seed in candidates:
        if id(seed) in claimed:
            continue
        region, why = _grow(seed, candidates, replicas)
        claimed.update(id(s) for s in (region.states if region is not None else [seed]))
        if region is None:
            done.kept[seed.name] = why
            continue
        _rewrite(graph, region, replicas, cost, outputs, blocks, next_of)
        done.inputs.update({s.name: region.axis[id(s)] for s in region.states})
    if done.changed:
        graph.attrs["sharded_inputs"] = DictAttr(tuple((n, IntAttr(a)) for n, a in done.inputs.items()))
        if outputs:
            graph.attrs["sharded_outputs"] = DictAttr(tuple((str(k), IntAttr(a)) for k, a in sorted(outputs.items())))
    return done


def has_optimizer_state(graph: Graph) -> bool:
    """Whether `graph` has inputs this rewrite would take for optimizer state."""
    return bool(optimizer_state_inputs(graph))


# ---------------------------------------------------------------- finding the regions

def optimizer_state_inputs(graph: Graph) -> list[Value]:
    """`param` inputs that are not batch inputs, are tensors of rank >= 1, and whose values reach
    only elementwise ops of their own shape and the outputs: optimizer state, which only the update
    reads. A parameter feeds the forward pass (an elementwise op on a batch-norm scale leads to its
    broadcast), so it is not state."""
    batch = graph.attrs.get("batch_inputs")
    rows = set(batch.value) if batch is not None and isinstance(batch.value, dict) else set()
    out = []
    for v in graph.inputs:
        if not v.param or v.name in rows or not isinstance(v.type, TensorType) or not v.type.shape:
            continue
        if v.users() and _only_updated(v, v.type.shape):
            out.append(v)
    return out


def _only_updated(v: Value, shape: tuple[int, ...]) -> bool:
    """Whether everything computed from `v` is computed by elementwise ops of `shape` (or is an output)."""
    seen: set[int] = set()
    frontier = [v]
    while frontier:
        x = frontier.pop()
        for op in x.users():
            if id(op) in seen:
                continue
            if not _elementwise_on(op, shape):
                return False
            seen.add(id(op))
            frontier.extend(op.results)
    return True


def _elementwise_on(op: Op, shape: tuple[int, ...]) -> bool:
    """An elementwise op whose results have `shape` and whose operands have it or are scalars."""
    if op.opcode not in ELEMENTWISE_OPS or op.subgraphs() or op.get("microbatch") is not None:
        return False
    return all(isinstance(r.type, TensorType) and r.type.shape == shape for r in op.results) and all(
        isinstance(v.type, TensorType) and v.type.shape in (shape, ()) for v in op.operands)


def _grow(seed: Value, candidates: list[Value], d: int) -> tuple[_Region | None, str]:
    """The region of `seed`: every elementwise op of its shape reached forward from it (and the
    other state inputs those read), then upstream producers that only the region reads."""
    assert isinstance(seed.type, TensorType)
    shape = seed.type.shape
    axis = next((a for a, n in enumerate(shape) if n % d == 0), None)
    if axis is None:
        return None, f"no axis of {seed.type} splits into {d} replicas"
    region = _Region(replicas=d, states=[seed])
    is_candidate = {id(v) for v in candidates}
    frontier = [seed]
    while frontier:
        _take_readers(region, frontier, shape, is_candidate)
        for v in [*region.states, *(r for op in region.ops for r in op.results)]:
            region.axis.setdefault(id(v), axis)  # producers' results have theirs
        frontier = _take_producers(region, shape, is_candidate)
    clash = _clash(region)
    if clash:
        return None, clash
    region.ops.sort(key=lambda op: op.graph.ops.index(op) if op.graph is not None else 0)
    return region, ""


def _clash(region: _Region) -> str:
    """Why the region cannot be split consistently, or is not an update of its own (an op outside it
    reads what it computes), or ''."""
    for op in region.ops:
        for r in op.results:
            outside = next((u for u in r.users() if not region.has(u)), None)
            if outside is not None:
                return (f"op '{outside.name}' ({outside.opcode}), outside the update, reads %{r.name}, which the "
                        "update computes, whole")
    _boundary(region)
    d_of = {id(v): v for op in region.ops for v in (*op.operands, *op.results)}
    for op in region.ops:
        for v in op.operands:
            if _rank(v) == 0:
                continue
            want = _axis_of_operand(region, op)
            if region.axis.get(id(v), want) != want:
                return f"%{v.name} would be split along two axes (op '{op.name}')"
    for key, a in region.axis.items():
        found = d_of.get(key)
        if found is not None and isinstance(found.type, TensorType) and found.type.shape[a] % region.replicas:
            return f"axis {a} of %{found.name} ({found.type}) does not split into {region.replicas} replicas"
    return ""


def _take_readers(region: _Region, frontier: list[Value], shape: tuple[int, ...], is_candidate: set[int]) -> None:
    """Add every elementwise op of `shape` that reads the region's values, from `frontier` on, and
    the other state inputs those read."""
    while frontier:
        v = frontier.pop()
        for op in v.users():
            if region.has(op) or not _elementwise_on(op, shape):
                continue  # an op outside reads the block: it gets the whole value (`_rewrite`)
            region.ops.append(op)
            frontier.extend(op.results)
            for x in op.operands:
                if x.owner is None and id(x) in is_candidate and not any(x is s for s in region.states):
                    region.states.append(x)
                    frontier.append(x)


def _take_producers(region: _Region, shape: tuple[int, ...], is_candidate: set[int]) -> list[Value]:
    """Add to the region the producers of the whole values it reads that only it reads:
    elementwise ops and broadcasts of scalars (computed on blocks then), and ops that only move the
    block's axis (`_moves_layout`: transposes, reshapes and sums over axes of size 1), so that the
    block is taken nearer the all-reduce (and the updates of several state inputs of one parameter
    are one region). The state inputs they read that the region did not have, to take their
    readers from."""
    joined: list[Value] = []
    changed = True
    while changed:
        changed = False
        for x in _boundary(region):
            op = x.owner
            if op is None or op.get("microbatch") is not None or op.subgraphs():
                continue
            if not all(region.has(u) for r in op.results for u in r.users()):
                continue
            a = region.axis[id(x)]
            if _moves_layout(op) and not _is_output(x):
                region.axis[id(op.operands[0])] = _axis_of_operand(region, op)
            elif op.opcode == "broadcast_in_dim" and _rank(op.operands[0]) == 0:
                pass
            elif _elementwise_on(op, shape):
                for v in op.operands:
                    if v.owner is None and id(v) in is_candidate and not any(v is s for s in region.states):
                        region.states.append(v)
                        joined.append(v)
                    if _rank(v) > 0:
                        region.axis[id(v)] = a
            else:
                continue
            region.ops.append(op)
            changed = True
            break
    return joined


def _boundary(region: _Region) -> list[Value]:
    """Whole values the region's ops read from outside it (not scalars, not state inputs), each
    with its axis in `region.axis`."""
    out: dict[int, Value] = {}
    states = {id(s) for s in region.states}
    for op in region.ops:
        for v in op.operands:
            if _rank(v) == 0 or region.produced(v) or id(v) in states:
                continue
            if id(v) not in region.axis:
                region.axis[id(v)] = _axis_of_operand(region, op)
            out[id(v)] = v
    return list(out.values())


def _axis_of_operand(region: _Region, op: Op) -> int:
    """The axis of a whole operand of a region op: the op's result axis (elementwise ops keep the
    shape); a transpose's result axis through its permutation; a reshape's or size-1 reduction's
    (`_moves_layout`) through the axes of size 1 it inserts or drops."""
    a = region.axis[id(op.results[0])]
    if op.opcode == "transpose":
        return [int(p) for p in op.get("permutation")][a]
    if op.opcode in ("reshape", "reduce_sum"):
        src, dst = _shape(op.operands[0]), _shape(op.results[0])
        big_src = [i for i, n in enumerate(src) if n != 1]
        big_dst = [i for i, n in enumerate(dst) if n != 1]
        return big_src[big_dst.index(a)] if a in big_dst else a
    return a


def _moves_layout(op: Op) -> bool:
    """A producer that only moves the block's axis: a transpose, a reshape that inserts or drops
    axes of size 1, a sum over axes of size 1 (what JAX leaves between a bias gradient's
    all-reduce and its update)."""
    if len(op.operands) != 1 or len(op.results) != 1 or op.subgraphs():
        return False
    if op.opcode == "transpose":
        return True
    src, dst = _shape(op.operands[0]), _shape(op.results[0])
    same = [n for n in src if n != 1] == [n for n in dst if n != 1]
    if op.opcode == "reshape":
        return same and op.get("dimensions") is None
    return op.opcode == "reduce_sum" and same and all(src[int(i)] == 1 for i in op.get("axes", ()))


def _shape(v: Value) -> tuple[int, ...]:
    return v.type.shape if isinstance(v.type, TensorType) else ()


def _rank(v: Value) -> int:
    return len(v.type.shape) if isinstance(v.type, TensorType) else 0


def _is_output(v: Value) -> bool:
    g = v.owner.graph if v.owner is not None else None
    return g is not None and any(o is v for o in g.outputs)


# ---------------------------------------------------------------- rewriting

def _block(t: TensorType, axis: int, d: int) -> TensorType:
    shape = list(t.shape)
    shape[axis] //= d
    return TensorType(t.dtype, tuple(shape))


def _rewrite(graph: Graph, region: _Region, d: int, cost: CollectiveCost | None, outputs: dict[int, int],
             blocks: dict[tuple[int, int], Value], next_of: dict[int, Value]) -> None:
    """Split the region's states, ops and boundary values into blocks (`blocks`: the slices made so
    far, by value and axis, which regions share); gather the new parameters."""
    whole_reads = _boundary(region)
    whole_out = _new_parameters(region, whole_reads, next_of)
    for s in region.states:
        assert isinstance(s.type, TensorType)
        s.type = _block(s.type, region.axis[id(s)], d)
    for x in whole_reads:
        _take_block(graph, region, x, d, cost, blocks)
    for op in region.ops:
        for r in op.results:
            assert isinstance(r.type, TensorType)
            r.type = _block(r.type, region.axis[id(r)], d)
        if op.opcode == "broadcast_in_dim":
            assert isinstance(op.result.type, TensorType)
            op.attrs["shape"] = to_attr(list(op.result.type.shape))
        if op.opcode == "reshape":
            assert isinstance(op.result.type, TensorType)
            op.attrs["new_sizes"] = to_attr(list(op.result.type.shape))
        op.attrs.update(scaled_costs(op.attrs, d))  # a 1/d block's (annotate-costs re-costs roofline graphs)
    for v in [*region.states, *(r for op in region.ops for r in op.results)]:
        _output(graph, region, v, d, cost, whole_out, outputs)


def _new_parameters(region: _Region, whole_reads: list[Value], next_of: dict[int, Value]) -> set[int]:
    """Region values that are new parameters, which go out whole: outputs that are the next value
    of a `param` input the region reads whole (`infer_state_map`'s pairing of a training step's
    outputs with its inputs); an output paired with no input, when it is computed from such a
    parameter. Outputs paired with a state input (new moments, even computed from the parameter,
    as with weight decay) keep their blocks."""
    params = {id(x) for x in whole_reads if x.owner is None and x.param}
    computed = set(params)
    for op in region.ops:  # in graph order
        if any(id(v) in computed for v in op.operands):
            computed.update(id(r) for r in op.results)
    out = set()
    for op in region.ops:
        for r in op.results:
            paired = next_of.get(id(r))
            if (paired is not None and id(paired) in params) or (paired is None and id(r) in computed):
                out.add(id(r))
    return out


def _take_block(graph: Graph, region: _Region, x: Value, d: int, cost: CollectiveCost | None,
                blocks: dict[tuple[int, int], Value]) -> None:
    """The region reads a block of `x`: a reduce-scatter in place of the sum all-reduce that made
    it when only the region reads it, else a `replica_slice` after it (one per value and axis)."""
    a = region.axis[id(x)]
    op = x.owner
    readers = [u for u in x.users() if region.has(u)]
    assert isinstance(x.type, TensorType)
    block = _block(x.type, a, d)
    if op is not None and op.opcode == "all_reduce" and len(op.operands) == 1 and op.get("reduction") == "sum" \
            and len(readers) == len(x.users()) and not _is_output(x):
        _scatter_instead(graph, op, block, a, cost)
        return
    sliced = blocks.get((id(x), a))
    if sliced is None:
        name = graph.fresh_name(f"{x.name}.block")
        attrs: dict[str, Attr] = {"replicas": IntAttr(d), "axis": IntAttr(a)}
        if x.owner is not None and x.owner.get("colocate") is not None:
            attrs["colocate"] = StringAttr(str(x.owner.get("colocate")))
        made = Op(name, "replica_slice", [x], [block], attrs, [name], x.owner.loc if x.owner is not None else None)
        graph.insert(graph.ops.index(x.owner) + 1 if x.owner is not None else _first_reader(graph, readers), made)
        sliced = blocks[(id(x), a)] = made.result
    elif x.owner is None and sliced.owner is not None and graph.ops.index(sliced.owner) > _first_reader(graph, readers):
        graph.ops.remove(sliced.owner)  # a slice of an input, made for a later region: before this one's readers
        graph.ops.insert(_first_reader(graph, readers), sliced.owner)
    for u in readers:
        for i, v in enumerate(u.operands):
            if v is x:
                u.set_operand(i, sliced)


def _scatter_instead(graph: Graph, op: Op, block: TensorType, axis: int, cost: CollectiveCost | None) -> None:
    """Replace the all-reduce `op` by a reduce-scatter of its operand along `axis`."""
    attrs = {k: v for k, v in op.attrs.items() if k != "cost"}
    attrs["axes"] = ListAttr((IntAttr(axis),))
    if cost is not None:
        attrs["cost"] = DurationAttr(cost("reduce_scatter", op.result.type.nbytes))
    name = graph.fresh_name(op.name.replace(".allreduce", "") + ".scatter")
    scattered = Op(name, "reduce_scatter", op.operands, [block], attrs, [name], op.loc)
    graph.insert(graph.ops.index(op) + 1, scattered)
    op.result.replace_all_uses_with(scattered.result)
    graph.erase(op)


def _first_reader(graph: Graph, readers: list[Op]) -> int:
    return min(graph.ops.index(u) for u in readers)


def _output(graph: Graph, region: _Region, v: Value, d: int, cost: CollectiveCost | None, whole_out: set[int],
            outputs: dict[int, int]) -> None:
    """Where `v` is an output: a new parameter (`_new_parameters`) put back together by an
    all-gather, since the next step's forward pass reads it whole; new state keeps its blocks
    (`outputs`: index -> axis)."""
    out_at = [k for k, o in enumerate(graph.outputs) if o is v]
    a = region.axis[id(v)]
    if not out_at or id(v) not in whole_out:
        outputs.update(dict.fromkeys(out_at, a))
        return
    assert isinstance(v.type, TensorType) and v.owner is not None  # parameters are read whole, not outputs
    shape = list(v.type.shape)
    shape[a] *= d
    whole = TensorType(v.type.dtype, tuple(shape))
    attrs: dict[str, Attr] = {"replicas": IntAttr(d), "axes": ListAttr((IntAttr(a),))}
    if cost is not None:
        attrs["cost"] = DurationAttr(cost("all_gather", whole.nbytes))
    name = graph.fresh_name(f"{v.name}.gather")
    gathered = Op(name, "all_gather", [v], [whole], attrs, [name], v.owner.loc)
    graph.insert(graph.ops.index(v.owner) + 1, gathered)
    graph.outputs = [gathered.result if o is v else o for o in graph.outputs]


__all__ = ["CollectiveCost", "Sharded", "has_optimizer_state", "optimizer_state_inputs", "shard_optimizer_state"]
