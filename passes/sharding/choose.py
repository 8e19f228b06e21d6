"""Choose a tensor-parallel layout: which parameter classes t ranks split, and along which axis.

Each class (`classes.py`) is whole or split along one of its axes; a layout is valid when the
rank's graph can be built from it (`tensor_shard`, which inserts the collectives and block slices
the layout implies). A layout is scored on the rank's graph itself: its peak memory where each
micro-batch is one sample, with the ops one after another on a device of the group (the lifetimes
`pesto_ir.schedule.memory` follows), over the device's capacity first (`Score`), then the ops' total time (compute on blocks, all-reduces on the
group's ring, whole ops repeated on every rank). The search is coordinate descent over the classes,
largest first: each class in turn takes its best option with the others fixed, until a sweep
changes nothing (at most `MAX_SWEEPS`). It counts rewrites, not seconds, so the same graph,
cluster and degree always give the same layout; `max_evaluations` bounds the work, and a time
limit only caps it (saying so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.passes.rewrite.batch_axes import MicrobatchError, batch_spec, sample_names
from pesto_ir.passes.rewrite.repeated_layers import find_repeated_layers, shorten
from pesto_ir.passes.rewrite.replicas import collective_cost, mirror_groups
from pesto_ir.passes.rewrite.tensor_rank import rank_sample_values
from pesto_ir.passes.rewrite.tensor_shard import (
    CollectiveCost,
    ShardingError,
    TensorLayout,
    sequence_length,
    tensor_shard,
)
from pesto_ir.passes.sharding.classes import ParamClass, layer_count, parameter_classes
from pesto_ir.schedule.memory import lifetimes
from pesto_ir.schedule.plan import OpSlot, Plan
from pesto_ir.util import work

_T = TypeVar("_T")
MAX_SWEEPS = 3
Option = tuple[int, int] | None  # a class split along an axis in some runs of blocks, or whole
MAX_EVALUATIONS = 400  # rewrites one choice may build: about 60 on a GPT block stack
PROBE_LAYERS = 3  # the layers `LayerProbe` cuts a model to (and one more): two middle layers
MIN_PROBE_LAYERS = 8  # models of fewer repeated layers are scored whole


@dataclass(frozen=True, order=True)
class Score:
    """A layout's score, compared as a tuple: bytes over capacity where each micro-batch is one
    sample (what micro-batching cannot remove: the parameters, their gradients and state, and
    what every step holds whole), then seconds; and the one-batch peak (a rank's report). Scored
    by the one-batch peak instead, a longer search traded a step twice as slow for activations a
    pipeline of micro-batches holds a fraction of (the 13B GPT at t = 4: 4414 ms at 447 GiB over
    2214 ms at 520)."""

    overflow: float
    seconds: float
    peak: int


@dataclass(frozen=True)
class Samples:
    """A graph's per-sample values by name (`batch_axes.sample_names`) and its batch size: a
    rank's bytes held at the most micro-batches are its one-batch bytes with those values' cut to
    one sample's."""

    names: frozenset[str] = frozenset()
    batch: int = 1

    @staticmethod
    def of(graph: Graph) -> Samples:
        try:
            return Samples(sample_names(graph), batch_spec(graph).size)
        except MicrobatchError:  # no batch: micro-batches change nothing
            return Samples()


@dataclass(frozen=True)
class _Profile:
    """A rank graph's ops one after another: their seconds, and the bytes held while each op runs
    at one batch (`held`) and at the most micro-batches (`least`, see `Score`)."""

    seconds: float
    held: dict[str, int]
    least: dict[str, int]

    def score(self, capacity: float) -> Score:
        peak, least = max(self.held.values(), default=0), max(self.least.values(), default=0)
        return Score(max(0.0, least - capacity), self.seconds, peak)


@dataclass(frozen=True)
class Choice:
    layout: TensorLayout
    score: Score
    evaluations: int
    cut: bool = False  # the time limit stopped the search before it converged
    picks: tuple[Option, ...] = ()  # each parameter class's option (`parameter_classes` order)


def score_layout(graph: Graph, layout: TensorLayout, device: Device, cost: CollectiveCost | None,
                 samples: Samples | None = None) -> Score | None:
    """The score of `layout` (None when its rank graph cannot be built); `samples`: `graph`'s."""
    profile = _rank_profile(graph, layout, device, cost, samples or Samples.of(graph))
    return None if profile is None else profile.score(device.memory)


def _rank_profile(graph: Graph, layout: TensorLayout, device: Device, cost: CollectiveCost | None,
                  samples: Samples) -> _Profile | None:
    """`layout`'s rank graph of `graph` profiled on `device`; None when it cannot be built."""
    try:
        rank = tensor_shard(graph, layout, cost)
    except ShardingError:
        return None
    slots = {op.name: OpSlot(device.name, float(i), float(i + 1)) for i, op in enumerate(rank.ops)}
    in_rank = rank_sample_values(rank, samples.names)
    per_sample = {f"input %{v.name}" for v in rank.inputs if id(v) in in_rank} | \
        {f"%{r.name}" for op in rank.ops for r in op.results if id(r) in in_rank}
    change = np.zeros((len(rank.ops) + 1, 2))  # bytes taken (+) and freed (-) at each op: all, per-sample
    for held in lifetimes(rank, Plan(rank.name, "sequential", [device.name], slots)):
        sample = held.what in per_sample
        change[int(held.start), 0] += held.nbytes
        change[int(held.start), 1] += held.nbytes if sample else 0
        if held.end < len(rank.ops):
            change[int(held.end), 0] -= held.nbytes
            change[int(held.end), 1] -= held.nbytes if sample else 0
    held_at = np.cumsum(change, axis=0)[:-1]
    least = held_at[:, 0] - held_at[:, 1] * (1 - 1 / samples.batch)
    names = [op.name for op in rank.ops]
    return _Profile(sum(op_cost(op, device) for op in rank.ops), dict(zip(names, (int(b) for b in held_at[:, 0]))),
                    dict(zip(names, (int(b) for b in least))))


@dataclass(frozen=True)
class LayerProbe:
    """A model of L repeated layers cut to its first `PROBE_LAYERS` layers and to one more
    (`passes/rewrite/repeated_layers.py`). A layout ties the layers, so from one cut to the next
    its rank graph grows by one layer's ops, collectives and held bytes, and the whole model's
    seconds and peak memory follow by adding that share once per further layer. The first layers
    are left out of the share: a layout reaches its steady state along the chain only after them
    (the first layer reads an activation the embedding laid out), and the last kept layer stands
    for the model's last (it feeds the head). Scoring the two cuts instead of the model makes the
    search a few layers' work however deep the model is."""

    layers: int
    short: Graph
    longer: Graph
    positions: dict[str, tuple[int, int, int]]  # a region's op -> (region, layer, offset)
    names: dict[tuple[int, int, int], str]  # the other way
    samples: tuple[Samples, Samples]  # the cuts'

    @staticmethod
    def of(graph: Graph, classes: list[ParamClass]) -> LayerProbe | None:
        """The probe of `graph`, or None where it repeats fewer than `MIN_PROBE_LAYERS` layers
        that correspond copy to copy (the layout is then scored on the graph itself)."""
        layers = layer_count(classes)
        if layers < MIN_PROBE_LAYERS:
            return None
        found = find_repeated_layers(graph, layers)
        work.charge("rewrite", len(graph.ops))  # the scan for repeats reads every op, a rewrite's walk
        if found is None:
            return None
        positions = found.positions(graph)
        short, longer = shorten(graph, found, PROBE_LAYERS), shorten(graph, found, PROBE_LAYERS + 1)
        work.charge("rewrite", 2 * len(graph.ops))  # each cut walks the whole graph once
        return LayerProbe(layers, short, longer, positions, {w: n for n, w in positions.items()},
                          (Samples.of(short), Samples.of(longer)))

    def score(self, layout: TensorLayout, device: Device, cost: CollectiveCost | None) -> Score | None:
        """The whole model's score: its seconds grow by the layer's share per further layer, and
        its peaks (at one batch, and at the most micro-batches) the most bytes held at any point of
        the step (`_held_at_full_depth`)."""
        a = _rank_profile(self.short, restricted_layout(layout, self.short), device, cost, self.samples[0])
        b = _rank_profile(self.longer, restricted_layout(layout, self.longer), device, cost, self.samples[1])
        if a is None or b is None:
            return None
        more = self.layers - PROBE_LAYERS
        peak, least = (max(self._held_at_full_depth(held_a, held_b),
                           max(held_a.values(), default=0) + more * (max(held_b.values(), default=0)
                                                                      - max(held_a.values(), default=0)))
                       for held_a, held_b in ((a.held, b.held), (a.least, b.least)))
        return Score(max(0.0, least - device.memory), a.seconds + more * (b.seconds - a.seconds), max(0, peak))

    def _held_at_full_depth(self, held_a: dict[str, int], held_b: dict[str, int]) -> int:
        """The most bytes held while any op of the whole model runs. Outside the regions, an op
        holds one layer's share more per layer (its bytes in the longer cut less those in the
        shorter). Inside a region, the op of layer l holds what the depth adds and what grows with
        l (activations kept for the backward pass, gradients not yet applied): linear in both
        between the first layer and the last, both slopes read off middle layers of the cuts."""
        k, grow = PROBE_LAYERS, self.layers - PROBE_LAYERS - 1  # the longer cut has layers 0..k
        best = 0
        at: dict[tuple[int, int], dict[int, int]] = {}
        for name, n in held_b.items():
            where = self.positions.get(name)
            if where is None:
                if name in held_a:
                    best = max(best, held_a[name] + (grow + 1) * (n - held_a[name]))
                continue
            at.setdefault((where[0], where[2]), {})[where[1]] = n
        for (region, offset), b in at.items():
            a = held_a.get(self.names[(region, 1, offset)])
            if a is None or len(b) != k + 1:
                continue
            deeper = grow * (b[1] - a)  # layer 1 of a model `grow` layers deeper
            along = grow * (b[k - 1] - b[k - 2])  # `grow` layers further along the region
            best = max(best, b[0] + deeper, b[1] + deeper, b[k - 1] + deeper + along, b[k] + deeper + along)
        return best


def choose_layout(graph: Graph, size: int, device: Device, cost: CollectiveCost | None,
                  max_evaluations: int = MAX_EVALUATIONS,
                  progress: Callable[[str], None] | None = None, split_some: bool = False,
                  until: float | None = None, start: Sequence[Option] = ()) -> Choice:
    """The best layout found for `size` ranks of `device`'s kind (see the module docstring); with
    `split_some`, the best of those that split a parameter where splitting none scores best (a
    degree the user fixed: a small model whose all-reduces cost more than its blocks save). `until`
    (a `work.now()` reading) caps the search: a layout is not scored past it, and the
    choice says it was cut (`Choice.cut`); the first layout (every parameter whole), the start and
    the start with sequence parallelism are always scored. `start` (another degree's
    `Choice.picks`; without one, `alternating_start`) is scored next, where its splits divide into
    `size` blocks, and searched from where it scores better: the classes a layout splits seldom
    depend on the degree, and a cut search keeps what the start found. Sequence parallelism is
    decided on the start (it decides whether a model too large for one device per rank fits a
    pipeline of them at all), then again after the sweeps."""
    classes = parameter_classes(graph)
    probe = LayerProbe.of(graph, classes)
    if probe is not None and progress is not None:
        progress(f"tensor-parallel {size}: {probe.layers} repeated layers: layouts scored on the first "
                 f"{PROBE_LAYERS} and {PROBE_LAYERS + 1} ({len(probe.short.ops)} and {len(probe.longer.ops)} of "
                 f"{len(graph.ops)} ops)")

    samples = Samples.of(graph) if probe is None else Samples()

    def scored(layout: TensorLayout) -> Score | None:
        return score_layout(graph, layout, device, cost, samples) if probe is None \
            else probe.score(layout, device, cost)

    chosen: dict[int, Option] = {i: None for i in range(len(classes))}
    evaluations = 0
    runs = run_counts(graph)
    raw = graph.attrs.get("batch_inputs")
    batch = {k: int(a) for k, a in raw.value.items()} if raw is not None and isinstance(raw.value, dict) else {}

    sequence = False  # sequence parallelism: decided after the start, checked again at the end

    def layout_of(picks: dict[int, Option]) -> TensorLayout:
        return picked_layout(size, classes, picks, sequence)

    best = scored(layout_of(chosen))
    if best is None:
        tensor_shard(graph, layout_of(chosen), cost)  # its own reason (a cost graph has no shapes to split)
        raise ShardingError(f"graph '{graph.name}' cannot run as {size} tensor-parallel ranks even with every "
                            "parameter whole")
    carried = dividing(dict(enumerate(start)), classes, size) or \
        dividing(alternating_start(graph, classes), classes, size)
    if carried:
        found = scored(layout_of({**chosen, **carried}))
        evaluations += 1
        took = found is not None and found < best
        if found is not None and took:
            best = found
            chosen.update(carried)
        if progress is not None:
            whose = "the last degree's layout" if start else "columns then rows, alternating (Megatron's pairs)"
            progress(f"tensor-parallel {size}: {whose} (it splits {len(carried)} parameter class(es)): "
                     f"{'the start of the search' if took else 'scores worse than every parameter whole'}")
    hinted = _hinted(graph, classes, size)
    if hinted:  # the model's own partitioning (flax metadata) as the start, where it can be built
        found = scored(layout_of({**chosen, **hinted}))
        evaluations += 1
        if found is not None:
            best = found
            chosen.update(hinted)
        if progress is not None:
            progress(f"tensor-parallel {size}: the model's partitioning metadata splits {len(hinted)} parameter "
                     f"class(es): {'the start of the search' if found is not None else 'not a layout the rewrite builds'}")

    def sequence_parallelism() -> int:
        """Sequence parallelism on or off, whichever scores better with the layout so far (a
        layout it scores, or none where the layout splits nothing or the graph has no sequence)."""
        nonlocal best, sequence
        assert best is not None
        layout, best, tried = _with_sequence_parallel(graph, layout_of(chosen), best, scored)
        sequence = layout.sequence_parallel
        if progress is not None and tried:
            progress(f"tensor-parallel {size}: sequence parallelism "
                     + ("kept: " if sequence else "not kept: it cuts no memory over the device's ")
                     + f"({best.seconds * 1e3:.4g} ms a step, peak {best.peak / 2**30:.3g} GiB)")
        return tried

    if evaluations < max_evaluations:  # before the sweeps, past `until` too (as the start): a cut search keeps it
        evaluations += sequence_parallelism()
    fallback: tuple[Score, dict[int, Option]] | None = None  # the best layout that splits something
    cut = False
    started = {i for i, pick in chosen.items() if pick is not None}
    for sweep in range(MAX_SWEEPS):
        changed = False
        # the first sweep tries the classes the start left whole first: a cut search then has
        # decided those rather than tried again what the start decided
        order = sorted(range(len(classes)), key=lambda i: (sweep == 0 and i in started, i))
        for i in order:
            cls = classes[i]
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
                    found = scored(layout_of({**chosen, i: pick}))
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
        chosen = fallback[1]
        best = fallback[0]
    if not cut and evaluations < max_evaluations and (until is None or work.now() <= until):
        evaluations += sequence_parallelism()  # the sweeps may have changed what it saves
    return Choice(layout_of(chosen), best, evaluations, cut, tuple(chosen[i] for i in range(len(classes))))


def _with_sequence_parallel(graph: Graph, layout: TensorLayout, score: Score,
                            scored: Callable[[TensorLayout], Score | None]) -> tuple[TensorLayout, Score, int]:
    """`layout` (of `score`) with sequence parallelism (Megatron-SP) where it cuts the memory a
    rank holds over its device's (the score's overflow), without it elsewhere; the score of the
    one kept; and the layouts scored (0 where the layout splits nothing or the graph has no
    sequence to split). Only memory decides: by the ops' seconds one after another SP can score
    better where the placed plan is slower (its gathers and scatters overlap compute less), which
    on the 13B GPT left `auto` without a plan."""
    if not layout.splits:
        return layout, score, 0
    try:
        sequence_length(graph, layout.size)
    except ShardingError:
        return layout, score, 0
    flipped = dataclasses.replace(layout, sequence_parallel=not layout.sequence_parallel)
    found = scored(flipped)
    if found is None:
        return layout, score, 1
    on, off = ((flipped, found), (layout, score)) if flipped.sequence_parallel else ((layout, score), (flipped, found))
    return (*(on if on[1].overflow < off[1].overflow else off), 1)


def tensor_layout(graph: Graph, cluster: Cluster, size: int, progress: Callable[[str], None] | None = None,
                  fixed: bool = False, until: float | None = None, start: Sequence[Option] = ()) -> Choice:
    """The layout of `size` tensor-parallel ranks on `cluster` (groups of `size` contiguous devices,
    `mirror_groups`), their collectives costed on the group's ring. A degree the search is trying
    (not `fixed`) is refused where splitting nothing scores best; a fixed one splits what is best
    to split, and is refused only where no parameter can be split. `start`: `choose_layout`'s."""
    groups = mirror_groups(cluster, 1, size)
    choice = choose_layout(graph, size, cluster.device(groups[0][0]), collective_cost(cluster, groups),
                           progress=progress, split_some=fixed, until=until, start=start)
    if not choice.layout.splits:
        why = "no parameter of graph '{}' splits into {} equal blocks that the rewrite can follow" if fixed else \
            "splitting no parameter of graph '{}' scores better than any layout found for {} ranks"
        raise ShardingError(f"tensor-parallel {size}: " + why.format(graph.name, size)
                            + f" ({choice.evaluations} layouts tried)")
    return choice


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


def restricted_layout(layout: TensorLayout, graph: Graph) -> TensorLayout:
    """`layout` on the inputs `graph` has (a shortened model lacks the later layers' parameters)."""
    names = {v.name for v in graph.inputs}
    if all(n in names for n, _ in layout.splits):
        return layout
    return TensorLayout(layout.size, tuple(kv for kv in layout.splits if kv[0] in names),
                        tuple(kv for kv in layout.interleave if kv[0] in names), layout.sequence_parallel)


def alternating_start(graph: Graph, classes: list[ParamClass]) -> dict[int, Option]:
    """Megatron's pairs as a start: the weight matrices of a repeated layer, taken in the order the
    forward pass multiplies by them, split alternately along their output axis (column-parallel)
    and their contracted axis (row-parallel), so that each row-parallel matmul reads the blocks the
    column-parallel one before it made and one all-reduce ends the pair. A column-parallel output
    split into parts (a fused QKV projection) is split as that many runs. Embedding tables are
    split by vocabulary (`vocabulary_start`); vectors and the other classes outside the layers are
    left whole: the search tries them."""
    layers = layer_count(classes)
    inputs = {v.name: v for v in graph.inputs}
    index = {id(op): i for i, op in enumerate(graph.ops)}
    found: list[tuple[int, int, int, int]] = []  # (first matmul's index, class, contracted axis, parts)
    for i, cls in enumerate(classes):
        if len(cls.shape) != 2 or len(cls.families) < layers or layers < 2:  # a layer's, maybe tied with more
            continue
        for name in cls.names:
            use = _first_matmul(inputs[name])
            if use is not None:
                op, axis = use
                found.append((index[id(op)], i, axis, _parts(op)))
                break
    out: dict[int, Option] = {}
    for n, (_, i, contracted, parts) in enumerate(sorted(found)):
        out[i] = (1 - contracted, parts) if n % 2 == 0 else (contracted, 1)
    vocabulary = vocabulary_start(graph, classes)
    out.update(vocabulary)
    out.update(head_start(graph, classes, {classes[i].shape[pick[0]] for i, pick in vocabulary.items() if pick}))
    return out


def pairs_layout(graph: Graph, size: int) -> TensorLayout:
    """Megatron's layout of `size` ranks as it is, nothing searched: `alternating_start`'s splits
    that divide into `size` blocks (a published layout built as a fixed plan, `bench/llm_zoo.py`)."""
    classes = parameter_classes(graph)
    return picked_layout(size, classes, dividing(alternating_start(graph, classes), classes, size))


def picked_layout(size: int, classes: list[ParamClass], picks: dict[int, Option],
                  sequence_parallel: bool = False) -> TensorLayout:
    """The layout of `size` ranks splitting each class in `picks` by its option (axis, runs)."""
    split = [(name, pick) for i, pick in picks.items() if pick is not None for name in classes[i].names]
    return TensorLayout(size, tuple((name, pick[0]) for name, pick in split),
                        tuple((name, pick[1]) for name, pick in split if pick[1] > 1), sequence_parallel)


def dividing(picks: dict[int, Option], classes: list[ParamClass], size: int) -> dict[int, Option]:
    """The `picks` (class index -> option) whose split axis divides into `size` blocks of its runs."""
    return {i: pick for i, pick in picks.items() if i < len(classes) and pick is not None
            and classes[i].shape[pick[0]] % (pick[1] * size) == 0}


def vocabulary_start(graph: Graph, classes: list[ParamClass]) -> dict[int, Option]:
    """Megatron's vocabulary-parallel embedding as a start: a table the step looks rows up in
    (a `gather` picking one row along an axis, through casts) split along that axis where it is the
    table's longest (the vocabulary, not the hidden size: a position table is left whole). Each rank
    looks up in its rows, and a head tied to the table computes its block of the logits."""
    inputs = {v.name: v for v in graph.inputs}
    out: dict[int, Option] = {}
    for i, cls in enumerate(classes):
        if len(cls.shape) != 2:
            continue
        axes = {axis for name in cls.names if (axis := _looked_up_axis(inputs[name])) is not None}
        if len(axes) == 1:
            picked = next(iter(axes))
            if cls.shape[picked] >= max(cls.shape):
                out[i] = (picked, 1)
    return out


def head_start(graph: Graph, classes: list[ParamClass], vocabularies: set[int]) -> dict[int, Option]:
    """Megatron's output layer as a start: an untied head, a matrix outside the layers (one family)
    whose matmul's output axis is a looked-up table's vocabulary, split along that axis
    (column-parallel): each rank computes its block of the logits, as the vocabulary-parallel
    loss reads them, instead of every rank computing all of them."""
    inputs = {v.name: v for v in graph.inputs}
    out: dict[int, Option] = {}
    for i, cls in enumerate(classes):
        if len(cls.shape) != 2 or len(cls.families) != 1:
            continue
        use = _first_matmul(inputs[cls.names[0]])
        if use is not None and cls.shape[1 - use[1]] in vocabularies:
            out[i] = (1 - use[1], 1)
    return out


def _through_casts(v: Value, match: Callable[[Op, Value], _T | None]) -> _T | None:
    """What `match` finds at the first use of `v`, or of a cast of it, where it finds something."""
    for op in v.users():
        found = _through_casts(op.result, match) if op.opcode == "convert_element_type" else match(op, v)
        if found is not None:
            return found
    return None


def _looked_up_axis(v: Value) -> int | None:
    """The axis of `v` a `gather` picks single rows along (through casts), or None."""
    def picked(op: Op, table: Value) -> int | None:
        if op.opcode != "gather" or op.operands[0] is not table:
            return None
        dn = op.get("dimension_numbers")
        axes = list(dn["start_index_map"])
        return int(axes[0]) if len(axes) == 1 and axes[0] in list(dn["collapsed_slice_dims"]) else None

    return _through_casts(v, picked)


def _first_matmul(v: Value) -> tuple[Op, int] | None:
    """The first `dot_general` that reads `v` (through casts) as its right operand, and the axis of
    `v` it contracts."""
    def contracted(op: Op, weight: Value) -> tuple[Op, int] | None:
        if op.opcode != "dot_general" or op.operands[1] is not weight:
            return None
        axes = list(op.get("dimension_numbers")[0][1])
        return (op, axes[0]) if len(axes) == 1 else None

    return _through_casts(v, contracted)


def _parts(matmul: Op) -> int:
    """How many parts the matmul's output is split into next (a fused projection), else 1."""
    for op in matmul.result.users():
        if op.opcode in ("add", "convert_element_type"):
            for user in op.result.users():
                if user.opcode == "split":
                    return len(user.get("sizes"))
        if op.opcode == "split":
            return len(op.get("sizes"))
    return 1
