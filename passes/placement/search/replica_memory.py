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

from pesto_ir.ir.graph import Graph, infer_state_map
from pesto_ir.passes.rewrite.batch_axes import MicrobatchError, per_sample_values
from pesto_ir.passes.rewrite.replicas import Strategy
from pesto_ir.passes.rewrite.shard_state import optimizer_state_inputs
from pesto_ir.schedule.memory import lifetimes
from pesto_ir.schedule.plan import OpSlot, Plan
from pesto_ir.util.units import human_bytes

WHOLE, SAMPLE, PARAM, STATE = range(4)  # the kinds of bytes, the columns of `ReplicaMemory.held`
WALK = "walk"  # the one device of the walk's plan


@dataclass(frozen=True)
class ReplicaMemory:
    """The bytes of each kind held at each op of the one-batch graph's walk (rows: ops in graph
    order; columns: `WHOLE`, `SAMPLE`, `PARAM`, `STATE`)."""

    held: np.ndarray

    @classmethod
    def of(cls, graph: Graph) -> ReplicaMemory | None:
        """The walk of `graph`, or None where the graph has no batch to split (no prediction)."""
        try:
            sample = per_sample_values(graph)
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
        return cls(np.cumsum(change, axis=0)[:-1])

    def predicted_peak(self, strategy: Strategy) -> float:
        """The peak bytes of one device of `strategy`'s one-device replicas (see the module)."""
        d, m = strategy.data_parallel, strategy.microbatches
        scale = np.array([1.0, 1.0 / (d * m),
                          1.0 / d if strategy.parameters == "sharded" else 1.0,
                          1.0 / d if strategy.optimizer_state == "sharded" else 1.0])
        return float((self.held @ scale).max())


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


def variant_to_screen(memory: ReplicaMemory, strategy: Strategy, capacity: float, shard: bool, fsdp: bool
                      ) -> tuple[Strategy | None, str]:
    """Which variant of a one-device replica `strategy` to screen first, by `memory`'s prediction,
    and why not a less sharded one: the least sharded predicted to fit in `capacity` bytes (whole
    state; the state sharded where `shard`; the parameters too where `fsdp`), else the most
    sharded; None, with why, where even that is predicted over `SKIP_MARGIN` times the capacity
    (screening it would only say so, after seconds of rewriting and list scheduling)."""
    variants = [strategy]
    if shard and strategy.data_parallel > 1 and strategy.optimizer_state == "replicated":
        variants.append(strategy.sharded())
        if fsdp:
            variants.append(strategy.fully_sharded())
    peaks = [memory.predicted_peak(v) for v in variants]
    fits = next((k for k, peak in enumerate(peaks) if peak <= capacity), None)
    if fits is None and peaks[-1] > SKIP_MARGIN * capacity:
        return None, (f"not screened: {variants[-1]} is predicted to peak at {human_bytes(peaks[-1])} per device, "
                      f"over {SKIP_MARGIN:g} x the {human_bytes(capacity)} it has")
    chosen = len(variants) - 1 if fits is None else fits
    if chosen == 0:
        return strategy, ""
    return variants[chosen], (f"{variants[chosen - 1]} is predicted to peak at {human_bytes(peaks[chosen - 1])} per "
                              f"device, over the {human_bytes(capacity)} it has")
