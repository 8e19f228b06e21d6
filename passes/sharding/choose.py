"""Choose a tensor-parallel layout: which parameter classes t ranks split, and along which axis.

Each class (`classes.py`) is whole or split along one of its axes; a layout is valid when the
rank's graph can be built from it (`tensor_shard`, which inserts the collectives and block slices
the layout implies). A layout is scored on the rank's graph itself: its peak memory, with the ops
one after another on a device of the group (the lifetimes `pesto_ir.schedule.memory` follows),
over the device's capacity first, then the ops' total time (compute on blocks, all-reduces on the
group's ring, whole ops repeated on every rank). The search is coordinate descent over the classes,
largest first: each class in turn takes its best option with the others fixed, until a sweep
changes nothing (at most `MAX_SWEEPS`). It counts rewrites, not seconds, so the same graph,
cluster and degree always give the same layout; `max_evaluations` bounds the work, and a time
limit only caps it (saying so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.rewrite.replicas import collective_cost, mirror_groups
from pesto_ir.passes.rewrite.tensor_shard import CollectiveCost, ShardingError, TensorLayout, tensor_shard
from pesto_ir.passes.sharding.classes import ParamClass, parameter_classes
from pesto_ir.schedule.memory import peak_memory
from pesto_ir.schedule.plan import OpSlot, Plan
from pesto_ir.util import work

MAX_SWEEPS = 3
Option = tuple[int, int] | None  # a class split along an axis in some runs of blocks, or whole
MAX_EVALUATIONS = 400  # rewrites one choice may build: about 60 on a GPT block stack


@dataclass(frozen=True, order=True)
class Score:
    """A layout's score, compared as a tuple: bytes over capacity, then seconds."""

    overflow: float
    seconds: float
    peak: int


@dataclass(frozen=True)
class Choice:
    layout: TensorLayout
    score: Score
    evaluations: int
    cut: bool = False  # the time limit stopped the search before it converged


def score_layout(graph: Graph, layout: TensorLayout, device: Device, cost: CollectiveCost | None) -> Score | None:
    """The score of `layout` (None when its rank graph cannot be built)."""
    try:
        rank = tensor_shard(graph, layout, cost)
    except ShardingError:
        return None
    slots = {op.name: OpSlot(device.name, float(i), float(i + 1)) for i, op in enumerate(rank.ops)}
    plan = Plan(rank.name, "sequential", [device.name], slots)
    peak = peak_memory(rank, plan).get(device.name)
    nbytes = peak.nbytes if peak is not None else 0
    seconds = sum(op_cost(op, device) for op in rank.ops)
    return Score(max(0.0, nbytes - device.memory), seconds, nbytes)


def choose_layout(graph: Graph, size: int, device: Device, cost: CollectiveCost | None,
                  max_evaluations: int = MAX_EVALUATIONS,
                  progress: Callable[[str], None] | None = None, split_some: bool = False,
                  until: float | None = None) -> Choice:
    """The best layout found for `size` ranks of `device`'s kind (see the module docstring); with
    `split_some`, the best of those that split a parameter where splitting none scores best (a
    degree the user fixed: a small model whose all-reduces cost more than its blocks save). `until`
    (a `work.now()` reading) caps the search: a layout is not scored past it, and the
    choice says it was cut (`Choice.cut`); the first layout (every parameter whole) is always
    scored."""
    classes = parameter_classes(graph)
    chosen: dict[int, Option] = {i: None for i in range(len(classes))}
    evaluations = 0
    runs = run_counts(graph)
    raw = graph.attrs.get("batch_inputs")
    batch = {k: int(a) for k, a in raw.value.items()} if raw is not None and isinstance(raw.value, dict) else {}

    def layout_of(picks: dict[int, Option]) -> TensorLayout:
        split = [(name, pick, i) for i, pick in picks.items() if pick is not None for name in classes[i].names]
        return TensorLayout(size, tuple((name, pick[0]) for name, pick, _ in split),
                            tuple((name, pick[1]) for name, pick, _ in split if pick[1] > 1))

    best = score_layout(graph, layout_of(chosen), device, cost)
    if best is None:
        tensor_shard(graph, layout_of(chosen), cost)  # its own reason (a cost graph has no shapes to split)
        raise ShardingError(f"graph '{graph.name}' cannot run as {size} tensor-parallel ranks even with every "
                            "parameter whole")
    hinted = _hinted(graph, classes, size)
    if hinted:  # the model's own partitioning (flax metadata) as the start, where it can be built
        found = score_layout(graph, layout_of({**chosen, **hinted}), device, cost)
        evaluations += 1
        if found is not None:
            best = found
            chosen.update(hinted)
        if progress is not None:
            progress(f"tensor-parallel {size}: the model's partitioning metadata splits {len(hinted)} parameter "
                     f"class(es): {'the start of the search' if found is not None else 'not a layout the rewrite builds'}")
    fallback: tuple[Score, dict[int, Option]] | None = None  # the best layout that splits something
    cut = False
    for sweep in range(MAX_SWEEPS):
        changed = False
        for i, cls in enumerate(classes):
            for axis in _options(cls, size, batch):
                # contiguous blocks, and runs of blocks (a fused projection cut into its parts along
                # the split axis: contiguous blocks gather it whole there, runs keep it split)
                for pick in [None] if axis is None else [(axis, r) for r in (1, *runs)
                                                          if cls.shape[axis] % (r * size) == 0]:
                    if until is not None and work.now() > until:
                        cut = True
                    if cut or evaluations >= max_evaluations:
                        break
                    if pick == chosen[i]:
                        continue
                    evaluations += 1
                    found = score_layout(graph, layout_of({**chosen, i: pick}), device, cost)
                    if found is not None and pick is not None and (fallback is None or found < fallback[0]):
                        fallback = (found, {**chosen, i: pick})
                    if found is not None and found < best:
                        best, chosen[i], changed = found, pick, True
        if progress is not None:
            split = sum(1 for a in chosen.values() if a is not None)
            progress(f"tensor-parallel {size}: sweep {sweep + 1}: {split} of {len(classes)} parameter classes split, "
                     f"{best.seconds * 1e3:.4g} ms a step, peak {best.peak / 2**30:.3g} GiB ({evaluations} layouts)")
        if not changed or cut or evaluations >= max_evaluations:
            break
    if cut and progress is not None:
        progress(f"tensor-parallel {size}: the time limit cut the layout search after {evaluations} layouts")
    if split_some and all(pick is None for pick in chosen.values()) and fallback is not None:
        return Choice(layout_of(fallback[1]), fallback[0], evaluations, cut)
    return Choice(layout_of(chosen), best, evaluations, cut)


def tensor_layout(graph: Graph, cluster: Cluster, size: int, progress: Callable[[str], None] | None = None,
                  fixed: bool = False, until: float | None = None) -> TensorLayout:
    """The layout of `size` tensor-parallel ranks on `cluster` (groups of `size` contiguous devices,
    `mirror_groups`), their collectives costed on the group's ring. A degree the search is trying
    (not `fixed`) is refused where splitting nothing scores best; a fixed one splits what is best
    to split, and is refused only where no parameter can be split."""
    groups = mirror_groups(cluster, 1, size)
    choice = choose_layout(graph, size, cluster.device(groups[0][0]), collective_cost(cluster, groups),
                           progress=progress, split_some=fixed, until=until)
    if not choice.layout.splits:
        why = "no parameter of graph '{}' splits into {} equal blocks that the rewrite can follow" if fixed else \
            "splitting no parameter of graph '{}' scores better than any layout found for {} ranks"
        raise ShardingError(f"tensor-parallel {size}: " + why.format(graph.name, size)
                            + f" ({choice.evaluations} layouts tried)")
    return choice.layout


def _options(cls: ParamClass, size: int, batch: dict[str, int]) -> list[int | None]:
    """The class's other options: whole, or split along each axis that divides; a batch input not
    along its batch axis (that is data parallelism, which replicas do, and a replica's share of the
    batch need not divide)."""
    skip = {batch[n] for n in cls.names if n in batch}
    return [a for a in [None, *cls.axes(size)] if a not in skip]


def _hinted(graph: Graph, classes: list[ParamClass], size: int) -> dict[int, Option]:
    """The classes the graph's `partition_hints` (`frontends/jax_partitioning.py`) split: every
    hinted member along one axis that divides into `size` blocks."""
    raw = graph.attrs.get("partition_hints")
    hints = {k: int(a) for k, a in raw.value.items()} if raw is not None and isinstance(raw.value, dict) else {}
    out: dict[int, Option] = {}
    for i, cls in enumerate(classes):
        axes = {hints[n] for n in cls.names if n in hints}
        if len(axes) == 1 and (axis := next(iter(axes))) in cls.axes(size):
            out[i] = (axis, 1)
    return out


def run_counts(graph: Graph) -> list[int]:
    """How many equal runs a split axis may be in: the part counts of the graph's splits and
    concatenations (a fused QKV projection is 3), ascending."""
    counts = {len(op.get("sizes")) for op in graph.ops if op.opcode == "split"} | \
        {len(op.operands) for op in graph.ops if op.opcode == "concatenate"}
    return sorted(n for n in counts if n > 1)
