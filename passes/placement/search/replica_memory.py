"""The memory a one-device replica of a strategy is predicted to need, before its graph is built.

Building a replica graph of m micro-batches and list-scheduling it takes seconds per strategy on
a large model, and most strategies of a model that outgrows its device cannot fit: on a 1.3B GPT
over 4 V100s, one batch per replica peaks at 67 GiB of 16. So the screening first walks the
one-batch graph once, in graph order on one device (as a one-device list schedule runs it), takes
its lifetimes from `pesto_ir.schedule.memory`, and keeps at each op the bytes held by kind:
- per-sample values (those the micro-batch rewrite copies, `per_sample_values`), which a replica
  of d replicas x m micro-batches holds 1/(d m) of: one micro-batch's activations at a time, as a
  one-device 1F1B (gradient accumulation) frees each micro-batch's before the next;
- optimizer state (inputs and the outputs that are their next values), 1/d of it where sharded;
- parameters (the same), 1/d where the parameters are sharded too (FSDP);
- everything else whole (gradients, the forward pass's casts of the parameters, resident bytes).
A strategy's predicted peak is the largest weighted sum over the walk. It is a prediction (the
engines' orders and the rewrites' collectives differ from the walk), used to choose what to
screen first and to skip what is predicted far over its device's memory; the screening's own
plans are what is checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pesto_ir.ir.graph import Graph, Value, infer_state_map
from pesto_ir.passes.rewrite.batch_axes import MicrobatchError, per_sample_values, sample_names
from pesto_ir.passes.rewrite.replicas import Strategy
from pesto_ir.passes.rewrite.shard_state import optimizer_state_inputs
from pesto_ir.passes.rewrite.tensor_rank import rank_sample_values
from pesto_ir.schedule.memory import lifetimes
from pesto_ir.schedule.plan import OpSlot, Plan
from pesto_ir.util.units import human_bytes

WHOLE, SAMPLE, PARAM, STATE = range(4)  # the kinds of bytes, the columns of `ReplicaMemory.held`
WALK = "walk"  # the one device of the walk's plan


@dataclass(frozen=True)
class ReplicaMemory:
    """The bytes of each kind held at each op of the one-batch graph's walk (rows: ops in graph
    order; columns: `WHOLE`, `SAMPLE`, `PARAM`, `STATE`); for `floor`, the most per-sample bytes
    one op reads and writes, and the parameters' and the optimizer state's bytes."""

    held: np.ndarray
    op_sample_bytes: float = 0.0
    param_bytes: float = 0.0
    state_bytes: float = 0.0
    cut: tuple[float, float] = (0.0, 0.0)  # (whole, per-sample) bytes alive under any order (`_alive_under_any_order`)

    @classmethod
    def of(cls, graph: Graph, source: Graph | None = None) -> ReplicaMemory | None:
        """The walk of `graph`, or None where the graph has no batch to split (no prediction).
        `graph` may be one tensor-parallel rank's graph of the one-batch step `source`: its
        per-sample values are then those named as `source`'s are, and what the rank's collectives,
        block slices and indices make of them."""
        try:
            sample = per_sample_values(graph) if source is None else rank_sample_values(graph, sample_names(source))
        except MicrobatchError:
            return None
        if not graph.ops:
            return None
        kind = _kinds(graph, sample)
        order = {op.name: OpSlot(WALK, float(i), float(i + 1)) for i, op in enumerate(graph.ops)}
        change = np.zeros((len(graph.ops) + 1, 4))  # bytes of each kind taken (+) and freed (-) at each op
        for held in lifetimes(graph, Plan(graph.name, "sequential", [WALK], order)):
            k = kind.get(held.what, WHOLE)
            change[int(held.start), k] += held.nbytes
            if held.end < len(graph.ops):
                change[int(held.end), k] -= held.nbytes
        inputs = {k: sum(v.type.nbytes for v in graph.inputs if kind.get(f"input %{v.name}") == k)
                  for k in (PARAM, STATE)}
        walk = np.cumsum(change, axis=0)[:-1]
        return cls(walk, _largest_op_sample(graph, sample), inputs[PARAM], inputs[STATE],
                   _alive_under_any_order(graph, int(walk[:, SAMPLE].argmax()), sample))

    def predicted_peak(self, strategy: Strategy, stages: int = 1) -> float:
        """The peak bytes of one device of `strategy`'s replicas (see the module), of `stages`
        devices each where they run a pipeline: each stage holds about 1/stages of every kind, and
        the first stage of a 1F1B pipeline the activations of min(stages, m) micro-batches in
        flight (the 13B GPT of `bench/tensor_layouts.py`: the simulator's 1F1B peaks were 259 and
        147 GiB at m = 2 and 4 over 2 stages at t = 4, and 208 and 207 GiB over 8 stages at t = 1:
        the activations held scale as min(stages, m) / m)."""
        d, m = strategy.data_parallel, strategy.microbatches
        scale = np.array([1.0, min(stages, m) / (d * m),
                          1.0 / d if strategy.parameters == "sharded" else 1.0,
                          1.0 / d if strategy.optimizer_state == "sharded" else 1.0]) / stages
        return float((self.held @ scale).max())

    def floor(self, strategy: Strategy, devices: int) -> float:
        """Bytes that one device of `strategy`'s replicas (of `devices` devices each) holds at once
        under any plan: a lower bound, where `predicted_peak` is a guess. The op that reads and
        writes the most per-sample bytes holds them on its device while it runs, 1/(d m t) of them
        (a micro-batch's, a rank's block at best); and a replica's devices hold its share of the
        parameters and optimizer state all step (1/d of what the strategy shards across replicas):
        one device holds both, several at least their average of the state. And while the op where
        the walk holds the most activations runs (the loss), every value an op before it made for
        an op after it is alive, whatever the order (`_alive_under_any_order`): a replica's devices
        hold those of its first micro-batch (1/(d m) of the per-sample ones; the t ranks together
        at least each value once) beside the state, at least their average each. One batch of the
        13B GPT's fp32 step over 8 devices holds 1.3 TiB of activations at its loss: 190 GiB a
        device, over the 80 an H100 has, where the first two terms give 30 GiB."""
        d, m, t = strategy.data_parallel, strategy.microbatches, strategy.tensor_parallel
        op = self.op_sample_bytes / (d * m * t)
        state = self.param_bytes / (d if strategy.parameters == "sharded" else 1) + \
            self.state_bytes / (d if strategy.optimizer_state == "sharded" else 1)
        alive = (self.cut[0] + self.cut[1] / (d * m) + state) / devices
        return max(alive, op + state if devices == 1 else max(op, state / devices))


def _alive_under_any_order(graph: Graph, at: int, sample: set[int]) -> tuple[float, float]:
    """(whole, per-sample) bytes of the values alive while `graph.ops[at]` runs in every order
    the graph allows: its own operands and results, and each result of an op it depends on that
    an op depending on it reads (made before it starts, read after). Graph inputs are left out
    (the state's are counted apart), so the sum is a lower bound."""
    producer = {id(r): i for i, op in enumerate(graph.ops) for r in op.results}
    before: set[int] = set()
    stack = [at]
    while stack:
        for v in graph.ops[stack.pop()].operands:
            i = producer.get(id(v))
            if i is not None and i not in before:
                before.add(i)
                stack.append(i)
    after = {at}
    for i in range(at + 1, len(graph.ops)):  # graph order is a topological order
        if any(producer.get(id(v)) in after for v in graph.ops[i].operands):
            after.add(i)
    alive: dict[int, Value] = {id(v): v for v in (*graph.ops[at].operands, *graph.ops[at].results)
                               if id(v) in producer}
    for i in after:
        alive.update((id(v), v) for v in graph.ops[i].operands if producer.get(id(v)) in before)
    sample_bytes = sum(v.type.nbytes for k, v in alive.items() if k in sample)
    return float(sum(v.type.nbytes for v in alive.values()) - sample_bytes), float(sample_bytes)


def _largest_op_sample(graph: Graph, sample: set[int]) -> float:
    """The most bytes of per-sample values one op reads and writes (each value once)."""
    most = 0
    for op in graph.ops:
        values = {id(v): v for v in (*op.operands, *op.results) if id(v) in sample}
        most = max(most, sum(v.type.nbytes for v in values.values()))
    return float(most)


def _kinds(graph: Graph, sample: set[int]) -> dict[str, int]:
    """The kind of the bytes of each lifetime that holds a value, by its name
    (`pesto_ir.schedule.memory.Lifetime.what`); the others (resident, workspace) are `WHOLE`."""
    state = {id(v) for v in optimizer_state_inputs(graph)}
    by_value: dict[int, int] = {id(v): SAMPLE if id(v) in sample else STATE if id(v) in state
                                else PARAM if v.param else WHOLE for v in graph.inputs}
    for k, i in infer_state_map(graph).items():  # a new parameter or state is held as its input is
        by_value[id(graph.outputs[k])] = by_value[id(graph.inputs[i])]
    out = {f"input %{v.name}": by_value[id(v)] for v in graph.inputs}
    for op in graph.ops:
        for r in op.results:
            out[f"%{r.name}"] = SAMPLE if id(r) in sample else by_value.get(id(r), WHOLE)
        if op.results:  # a cost graph's op holds its output as one tensor
            out[f"output of '{op.name}'"] = out[f"%{op.results[0].name}"]
    return out


SKIP_MARGIN = 1.2  # a strategy predicted over this many times its device's memory, however sharded, is not screened


def variant_to_screen(memory: ReplicaMemory, strategy: Strategy, capacity: float, shard: bool, fsdp: bool,
                      stages: int = 1) -> tuple[Strategy | None, str]:
    """Which variant of `strategy` (its replicas pipelines of `stages` devices) to screen first,
    by `memory`'s prediction, and why not a less sharded one: the least sharded predicted to fit in `capacity` bytes (whole
    state; the state sharded where `shard`; the parameters too where `fsdp`), else the most
    sharded; None, with why, where even that is predicted over `SKIP_MARGIN` times the capacity
    (screening it would only say so, after seconds of rewriting and list scheduling)."""
    variants = [strategy]
    if shard and strategy.data_parallel > 1 and strategy.optimizer_state == "replicated":
        variants.append(strategy.sharded())
        if fsdp:
            variants.append(strategy.fully_sharded())
    peaks = [memory.predicted_peak(v, stages) for v in variants]
    fits = next((k for k, peak in enumerate(peaks) if peak <= capacity), None)
    if fits is None and peaks[-1] > SKIP_MARGIN * capacity:
        return None, (f"not screened: {variants[-1]} is predicted to peak at {human_bytes(peaks[-1])} per device, "
                      f"over {SKIP_MARGIN:g} x the {human_bytes(capacity)} it has")
    chosen = len(variants) - 1 if fits is None else fits
    if chosen == 0:
        return strategy, ""
    return variants[chosen], (f"{variants[chosen - 1]} is predicted to peak at {human_bytes(peaks[chosen - 1])} per "
                              f"device, over the {human_bytes(capacity)} it has")
