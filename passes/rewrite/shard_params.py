"""Fully sharded parameters (FSDP, ZeRO-3): each data-parallel replica holds 1/d of the parameters too.

After `shard_optimizer_state` (ZeRO-1), each replica updates its block of a parameter (it reads the
parameter through a `replica_slice`, its gradient through a `reduce_scatter`, and gathers the new
parameter whole for the next step). This rewrite goes the rest of the way, as FSDP does:

- the parameter input is the replica's block (the `replica_slice` goes: the update reads the input);
- the new parameter goes out as the replica's block (the `all_gather` after the update goes), so a
  parameter stays sharded between steps;
- every other reader (the forward pass, the backward pass) reads the whole parameter from an
  `all_gather` of the blocks made just before it: one per reader, or per group of micro-batch
  copies of one op (they share a `colocate` group), so the whole parameter lives only while the
  ops that need it run, and the forward and backward passes each gather it again.

Gradients were already reduce-scattered (ZeRO-2's saving falls out of ZeRO-1's rewrite here). A
parameter is taken only where ZeRO-1 sharded its update that way; the others stay whole, and the
rewrite says which and why.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from pesto_ir.ir.attributes import Attr, DictAttr, DurationAttr, IntAttr, ListAttr, StringAttr
from pesto_ir.ir.graph import Graph, Op, Value, infer_state_map
from pesto_ir.ir.types import TensorType
from pesto_ir.passes.rewrite.shard_state import CollectiveCost


@dataclass
class ShardedParameters:
    """What `shard_parameters` did: the parameters split (name -> axis), and those kept whole with why."""

    inputs: dict[str, int] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)


def shard_parameters(graph: Graph, replicas: int, cost: CollectiveCost | None = None) -> ShardedParameters:
    """Rewrite `graph` (one replica's, its optimizer state sharded) in place so that each replica
    holds 1/replicas of each parameter whose update is sharded (see the module docstring)."""
    done = ShardedParameters()
    sharded_in = _axes(graph, "sharded_inputs")
    sharded_out = {int(k): a for k, a in _axes(graph, "sharded_outputs").items()}
    for k, i in sorted(infer_state_map(graph).items()):
        p = graph.inputs[i]
        if p.name in sharded_in:
            continue
        why = _why_not(graph, p, graph.outputs[k])
        if why:
            done.kept[p.name] = why
            continue
        axis = _shard(graph, p, k, replicas, cost)
        done.inputs[p.name] = sharded_in[p.name] = sharded_out[k] = axis
    if done.inputs:
        graph.attrs["sharded_inputs"] = DictAttr(tuple((n, IntAttr(a)) for n, a in sharded_in.items()))
        graph.attrs["sharded_outputs"] = DictAttr(tuple((str(k), IntAttr(a)) for k, a in sorted(sharded_out.items())))
        graph.attrs["sharded_parameters"] = DictAttr(tuple((n, IntAttr(a)) for n, a in done.inputs.items()))
    return done


def _why_not(graph: Graph, p: Value, new: Value) -> str:
    """Why parameter `p` (its next value `new`) cannot be sharded, or ''."""
    slices = [u for u in p.users() if u.opcode == "replica_slice"]
    gather = new.owner
    if len(slices) != 1 or gather is None or gather.opcode != "all_gather" or len(gather.operands) != 1:
        return "its update is not sharded (the optimizer state's rewrite left it whole)"
    if [int(a) for a in gather.get("axes")] != [int(slices[0].get("axis"))]:
        return "its update reads and writes blocks along different axes"
    if sum(1 for o in graph.outputs if o is new) != 1 or new.users():
        return "its new value is read in the step or returned twice"
    return ""


def _shard(graph: Graph, p: Value, k: int, d: int, cost: CollectiveCost | None) -> int:
    """Make input `p` and output k (its next value) blocks; gather `p` whole for its other readers."""
    sliced = next(u for u in p.users() if u.opcode == "replica_slice")
    axis = int(sliced.get("axis"))
    whole = p.type
    assert isinstance(whole, TensorType)
    readers: dict[str, list[Op]] = defaultdict(list)
    for u in p.users():
        if u is not sliced:
            group = u.get("colocate")
            readers[f"group {group}" if group is not None else f"op {u.name}"].append(u)
    for ops in readers.values():
        first = min(ops, key=graph.ops.index)
        gathered = _gather(graph, p, whole, axis, d, cost, first)
        for u in ops:
            for j, v in enumerate(u.operands):
                if v is p:
                    u.set_operand(j, gathered)
    p.type = sliced.result.type
    sliced.result.replace_all_uses_with(p)
    graph.erase(sliced)
    gather = graph.outputs[k].owner
    assert gather is not None
    outputs = list(graph.outputs)
    outputs[k] = gather.operands[0]
    graph.outputs = outputs
    graph.erase(gather)
    return axis


def _gather(graph: Graph, p: Value, whole: TensorType, axis: int, d: int, cost: CollectiveCost | None,
            before: Op) -> Value:
    """An `all_gather` of `p`'s blocks into the whole parameter, inserted before op `before`."""
    attrs: dict[str, Attr] = {"replicas": IntAttr(d), "axes": ListAttr((IntAttr(axis),))}
    if cost is not None:
        attrs["cost"] = DurationAttr(cost("all_gather", whole.nbytes))
    if before.get("colocate") is not None:
        attrs["colocate"] = StringAttr(str(before.get("colocate")))
    name = graph.fresh_name(f"{p.name}.gather")
    made = Op(name, "all_gather", [p], [whole], attrs, [name], before.loc)
    graph.insert(graph.ops.index(before), made)
    return made.result


def _axes(graph: Graph, key: str) -> dict[str, int]:
    raw = graph.attrs.get(key)
    return {k: int(a) for k, a in raw.value.items()} if raw is not None and isinstance(raw.value, dict) else {}


__all__ = ["ShardedParameters", "shard_parameters"]
