"""Partitioning metadata a model carries (flax's `nn.with_partitioning`, `nnx.with_partitioning`),
kept as hints for the tensor-parallel layout search.

Flax boxes a parameter in a `Partitioned` node whose `names` give, per axis, the mesh axis it is
meant to be split over (or None). A box's axis named for a model-parallel mesh axis (`MODEL_AXES`)
becomes a hint: the graph attribute `partition_hints` (input name -> axis), which
`passes/sharding/choose.py` takes as the layout its search starts from. The search keeps a hint
where nothing it tries scores better, and changes it where something does: a hint is a start, not
a constraint (the plan's `layouts` say what was chosen). Boxes are recognised by their shape (a
`value`, `names` and `unbox`), so this module does not import flax.
"""

from __future__ import annotations

from typing import Any

import jax

from pesto_ir.ir.attributes import DictAttr, IntAttr
from pesto_ir.ir.graph import Graph

MODEL_AXES = frozenset({"model", "tensor", "mp", "tp"})  # mesh axis names that mean tensor parallelism


def is_box(x: Any) -> bool:
    """A flax partitioning box (`nn.Partitioned`, `nn.LogicallyPartitioned`) or alike."""
    return hasattr(x, "names") and hasattr(x, "unbox") and hasattr(x, "value")


def partition_hints(graph: Graph, example_args: Any, example_kwargs: Any) -> dict[str, int]:
    """Input name -> the axis its box names for a model-parallel mesh axis, for the lowered
    `graph` of a function of (`example_args`, `example_kwargs`) (one graph input per leaf)."""
    leaves = jax.tree_util.tree_leaves((example_args, example_kwargs), is_leaf=is_box)
    if len(leaves) != len(graph.inputs) - len(graph.attrs["consts"].value if "consts" in graph.attrs else ()):
        return {}  # not one input per leaf: no names to match
    hints = {}
    for v, leaf in zip(graph.inputs, leaves):
        names = getattr(leaf, "names", None) if is_box(leaf) else None
        if not isinstance(names, (tuple, list)):
            continue
        axes = [i for i, n in enumerate(names) if _model_axis(n)]
        if len(axes) == 1:
            hints[v.name] = axes[0]
    return hints


def record_hints(graph: Graph, example_args: Any, example_kwargs: Any) -> None:
    """Write `partition_hints` on `graph` where its arguments carry any."""
    hints = partition_hints(graph, example_args, example_kwargs)
    if hints:
        graph.attrs["partition_hints"] = DictAttr(tuple((n, IntAttr(a)) for n, a in hints.items()))


def _model_axis(name: Any) -> bool:
    if isinstance(name, str):
        return name in MODEL_AXES
    return isinstance(name, (tuple, list)) and any(isinstance(n, str) and n in MODEL_AXES for n in name)
