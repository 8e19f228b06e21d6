"""The memory a one-device replica of a strategy is predicted to need, before its graph is built.

Building a replica graph of m micro-batches and list-scheduling it takes seconds per strategy on
a large model, and most strategies of a model that outgrows its device cannot fit: on a 1.3B GPT
over 4 V100s, one batch per replica peaks at 67 GiB of 16. So the screening first walks the
one-batch graph once, in graph order on one device (as a one-device list schedule runs it), by the
lifetime rules of `pesto_ir.schedule.memory`, and keeps at each op the bytes held by kind:
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

from pesto_ir.cost.lookup import op_memory
from pesto_ir.ir.graph import Graph, infer_state_map
from pesto_ir.passes.rewrite.batch_axes import MicrobatchError, per_sample_values
from pesto_ir.passes.rewrite.replicas import Strategy
from pesto_ir.passes.rewrite.shard_state import optimizer_state_inputs
from pesto_ir.schedule.memory import output_bytes, workspace_bytes
from pesto_ir.util.units import human_bytes

WHOLE, SAMPLE, PARAM, STATE = range(4)  # the kinds of bytes, the columns of `ReplicaMemory.held`


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
        state = {id(v) for v in optimizer_state_inputs(graph)}
        kind: dict[int, int] = {}
        for v in graph.inputs:
            kind[id(v)] = SAMPLE if id(v) in sample else STATE if id(v) in state else PARAM if v.param else WHOLE
        for k, i in infer_state_map(graph).items():  # a new parameter or state is held as its input is
            kind[id(graph.outputs[k])] = kind[id(graph.inputs[i])]
        index = {id(op): n for n, op in enumerate(graph.ops)}
        outputs = {id(v) for v in graph.outputs}
        now = np.zeros(4)
        for v in graph.inputs:  # arguments of the step: resident all step
            now[kind[id(v)]] += v.type.nbytes
        freed: list[list[tuple[int, int]]] = [[] for _ in graph.ops]
        held = np.zeros((len(graph.ops), 4))
        for n, op in enumerate(graph.ops):
            now[WHOLE] += op_memory(op)  # resident bytes: all step, from the op that holds them
            results = [(r, r.type.nbytes) for r in op.results]
            if "activation" in op.attrs:  # a cost graph's op: its output as one tensor
                results = [(op.results[0], output_bytes(op))] if op.results else []
            for r, nbytes in results:
                k = SAMPLE if id(r) in sample else kind.get(id(r), WHOLE)
                now[k] += nbytes
                if id(r) not in outputs:
                    last = max((index[id(u)] for u in r.users() if id(u) in index), default=n)
                    freed[max(last, n)].append((k, nbytes))
            held[n] = now
            held[n, WHOLE] += workspace_bytes(op)
            for k, nbytes in freed[n]:
                now[k] -= nbytes
        return cls(held)

    def predicted_peak(self, strategy: Strategy) -> float:
        """The peak bytes of one device of `strategy`'s one-device replicas (see the module)."""
        d, m = strategy.data_parallel, strategy.microbatches
        scale = np.array([1.0, 1.0 / (d * m),
                          1.0 / d if strategy.parameters == "sharded" else 1.0,
                          1.0 / d if strategy.optimizer_state == "sharded" else 1.0])
        return float((self.held @ scale).max())


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
