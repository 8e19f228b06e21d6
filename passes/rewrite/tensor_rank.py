"""What a tensor-parallel rank graph records about its split, read by those who run or plan it.

`tensor_shard` leaves the split in the rank graph's attributes (`tensor_inputs`, `tensor_input_runs`)
(and `sequence_parallel`) and keeps the names of the values it splits or copies; the plan's `layouts` and `interleave`, and the
memory model's per-sample values, are read back from them here.
"""

from __future__ import annotations

from collections.abc import Mapping

from pesto_ir.ir.graph import Graph
from pesto_ir.ir.types import TensorType
from pesto_ir.passes.rewrite.tensor_rules import ACROSS_REPLICAS


def split_axes(graph: Graph, key: str) -> Mapping[str, int]:
    """A graph attribute mapping names (or output indices) to split axes, or {} without one."""
    raw = graph.attrs.get(key)
    return {k: int(a) for k, a in raw.value.items()} if raw is not None and isinstance(raw.value, dict) else {}


def interleaved(graph: Graph) -> tuple[tuple[str, int], ...]:
    """A rank graph's inputs split in several runs, for the plan's `interleave`."""
    return tuple(sorted(split_axes(graph, "tensor_input_runs").items()))


def sequence_parallel(graph: Graph) -> bool:
    """Whether a rank graph splits its activations along the sequence (`TensorLayout.sequence_parallel`)."""
    raw = graph.attrs.get("sequence_parallel")
    return raw is not None and bool(raw.value)


def partition_specs(graph: Graph) -> tuple[tuple[str, tuple[str | None, ...]], ...]:
    """A rank graph's split inputs as partition specs over the mesh axis "tensor" (one entry per
    axis, as `jax.sharding.PartitionSpec` has them), for the plan's `layouts`."""
    ranks = {v.name: v.type.rank for v in graph.inputs if isinstance(v.type, TensorType)}
    return tuple((name, tuple("tensor" if i == axis else None for i in range(ranks[name])))
                 for name, axis in sorted(split_axes(graph, "tensor_inputs").items()))


def rank_sample_values(rank: Graph, names: frozenset[str]) -> set[int]:
    """The ids of a rank graph's per-sample values, given the `names` of its source's
    (`batch_axes.sample_names`): `tensor_shard` keeps the names of the values it splits or copies,
    and what it adds reads them (an all-reduce of partial sums, a block slice, shifted indices)."""
    out = {id(v) for v in rank.inputs if v.name in names}
    for op in rank.ops:
        added = op.opcode in ACROSS_REPLICAS
        for k, r in enumerate(op.results):
            if r.name in names or added and k < len(op.operands) and id(op.operands[k]) in out:
                out.add(id(r))
    return out
