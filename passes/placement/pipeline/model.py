"""A stage-level model of the fixed pipeline schedules: their step time for every m from one rewrite.

Building the m-micro-batch rewrite and simulating a schedule of it takes time in proportion to
m x ops (a 2,000-op training graph at m = 32 is 64,000 ops: about 3 s per schedule on top of a
2 s rewrite), so the hybrid search cannot try every m within its time limit. The model predicts
each (schedule, m) from the two-micro-batch rewrite instead, in microseconds, and the search
builds the most promising first. It is a prediction, used to choose what to build; the plans the
search keeps are simulated and checked in full.

From the m = 2 graph, cut into the pipeline's stages as `algo_pipeline.split_stages` cuts it (units
are colocate groups that hold every copy of an op, so the cut does not depend on m):

- slots: micro-batch 0's copies on stage s, forward (F) or backward (B) as `is_backward` says;
  their work at m micro-batches is their work at m = 2 scaled by 2 / m (cost graphs scale
  linearly; on roofline-costed graphs each op keeps its launch and setup overhead);
- messages: micro-batch 0's values read on another stage, one per producer and stage (latency +
  bytes / bandwidth, the bytes scaled by 2 / m unless the value is as large as in the source
  step), sent when the producer's slot ends, one at a time on each link;
- once-work: ops without a micro-batch (gradient sums, all-reduces, the update) run on their stage
  after its last slot; a gradient sum (`.acc`) is needed m - 1 times.

Each stage runs its slots in the order the schedule's ticks give them, as far as what they read
allows (`slot_orders`, as `order_from_priority` orders their ops); a slot starts when its stage is free and every slot it reads has
ended (same stage) or its messages have arrived. What the model leaves out: ops of a slot do not
start before the whole slot upstream has ended (the simulator overlaps them), and micro-batches
that wait for each other inside a step (whole-batch statistics) are not modelled.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost, value_bytes
from pesto_ir.cost.roofline import kernel_overhead, op_family
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import is_backward
from pesto_ir.passes.placement.pipeline.priorities import slot_ticks
from pesto_ir.passes.placement.pipeline.schedules import SCHEDULES
from pesto_ir.passes.placement.pipeline.stages import split_stages
from pesto_ir.util import work

MODEL_MICROBATCHES = 2  # the rewrite the model reads

SlotKey = tuple[int, str]  # (stage, phase "F" or "B")


@dataclass(frozen=True)
class PipelineModel:
    """Per stage and phase: micro-batch 0's work split into its part that scales with the batch and
    its launch overheads (at m = 2); messages between slots; once-work per stage."""

    stages: int
    scaled: dict[SlotKey, float]  # seconds at m = 2 that scale as 2 / m
    fixed: dict[SlotKey, float]  # seconds per micro-batch whatever m (launch and setup overheads)
    reads: dict[SlotKey, frozenset[SlotKey]]  # the slots (of the same micro-batch) each slot reads
    # (slot, dst stage) -> [(latency, seconds of the bytes that scale at m = 2, seconds of those that do not)]
    messages: dict[tuple[SlotKey, int], list[tuple[float, float, float]]]
    once: list[float]  # per stage, seconds that do not depend on m
    sums: list[float]  # per stage, seconds of one gradient sum (needed m - 1 times)

    def predict(self, schedule: str, m: int) -> float:
        """The step time of `schedule` with m micro-batches."""
        if schedule not in SCHEDULES or m < 1:
            raise ValueError(f"no model for schedule {schedule!r} with {m} micro-batches")
        scale = MODEL_MICROBATCHES / m
        seqs = self.slot_orders(schedule, m)
        pos = [0] * self.stages
        free = [0.0] * self.stages
        ended: dict[tuple[int, str, int], float] = {}
        arrived: dict[tuple[int, str, int, int], float] = {}  # (src stage, phase, i, dst stage)
        link_free: dict[tuple[int, int], float] = defaultdict(float)
        events: list[tuple[float, int, int, str, int]] = []  # (time, order, stage, phase, i)
        order = 0

        def try_start(s: int) -> None:
            nonlocal order
            while pos[s] < len(seqs[s]):
                phase, i = seqs[s][pos[s]]
                ready = 0.0
                for src in self.reads.get((s, phase), ()):
                    at = ended.get((*src, i)) if src[0] == s else arrived.get((*src, i, s))
                    if at is None:
                        return
                    ready = max(ready, at)
                start = max(free[s], ready)
                free[s] = start + self.scaled.get((s, phase), 0.0) * scale + self.fixed.get((s, phase), 0.0)
                pos[s] += 1
                heapq.heappush(events, (free[s], order, s, phase, i))
                order += 1

        for s in range(self.stages):
            try_start(s)
        while events:
            t, _, s, phase, i = heapq.heappop(events)
            ended[(s, phase, i)] = t
            for dst in range(self.stages):
                msgs = self.messages.get(((s, phase), dst))
                if msgs is None:
                    continue
                link = (s, dst)
                start = max(t, link_free[link])
                link_free[link] = start + sum(lat + scaled * scale + fixed for lat, scaled, fixed in msgs)
                arrived[(s, phase, i, dst)] = link_free[link]
                try_start(dst)
            try_start(s)
        if any(p < len(seq) for p, seq in zip(pos, seqs)):
            raise ValueError("the slots read each other in a cycle: no model for this cut")
        return max(free[s] + self.once[s] + self.sums[s] * (m - 1) for s in range(self.stages))


    def slot_orders(self, schedule: str, m: int) -> list[list[tuple[str, int]]]:
        """Each stage's slots in the order `order_from_priority` gives their ops: a topological
        order of what the slots read, ties by the schedule's tick. Where the graph's edges run
        against the schedule (backward chains from the first stage to the last), a stage runs a
        slot later than the schedule says, not out of order."""
        ticks = slot_ticks(schedule, self.stages, m)
        keys = [key for key in self.reads if key[0] < self.stages]
        users: dict[SlotKey, list[SlotKey]] = defaultdict(list)
        for key in keys:
            for src in self.reads[key]:
                users[src].append(key)
        waiting = {(*key, i): len(self.reads[key]) for key in keys for i in range(m)}
        ready = [(ticks[node], node) for node, n in waiting.items() if n == 0]
        heapq.heapify(ready)
        out: list[list[tuple[str, int]]] = [[] for _ in range(self.stages)]
        while ready:
            _, (s, phase, i) = heapq.heappop(ready)
            out[s].append((phase, i))
            for user in users[(s, phase)]:
                node = (*user, i)
                waiting[node] -= 1
                if waiting[node] == 0:
                    heapq.heappush(ready, (ticks[node], node))
        if sum(map(len, out)) != len(waiting):
            raise ValueError("the slots read each other in a cycle: no model for this cut")
        return out


def build_model(graph: Graph, cluster: Cluster, source: Graph | None = None) -> PipelineModel:
    """The model of `graph`, the two-micro-batch rewrite of `source` (one replica's step),
    pipelined over the devices of `cluster` (stage s on `cluster.names[s]`). A copy's result as
    large as the source's (a cost graph's value that a per-step op sums) does not shrink with m;
    without `source` every copy's result is taken to."""
    assert graph.attrs["microbatched"].value["microbatches"] == MODEL_MICROBATCHES
    work.charge("stages", len(graph.ops))
    stages = split_stages(graph, cluster)
    where = stages.stage_of()
    devices = [cluster.device(n) for n in cluster.names]
    roofline = any("flops" in op.attrs for op in graph.ops)
    scaled: dict[SlotKey, float] = defaultdict(float)
    fixed: dict[SlotKey, float] = defaultdict(float)
    reads: dict[SlotKey, set[SlotKey]] = defaultdict(set)
    messages: dict[tuple[SlotKey, int], list[tuple[float, float, float]]] = defaultdict(list)
    whole = _whole_results(graph, source)
    once = [0.0] * len(devices)
    sums = [0.0] * len(devices)

    def slot(op_name: str, backward: bool) -> SlotKey:
        return (where[op_name], "B" if backward else "F")

    for op in graph.ops:
        s = where[op.name]
        cost = op_cost(op, devices[s])
        i = op.get("microbatch")
        if i is None:
            is_sum = ".acc" in op.name and op.opcode in ("add", "max", "min")
            if is_sum:
                sums[s] += cost
            else:
                once[s] += cost
            continue
        if int(i) != 0:
            continue
        here = slot(op.name, is_backward(op))
        overhead = min(cost, kernel_overhead(devices[s], op_family(op))) if roofline else 0.0
        scaled[here] += cost - overhead
        fixed[here] += overhead
        sent: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # dst stage -> [bytes that scale, bytes that do not]
        for r in op.results:
            to: set[int] = set()
            for user in r.users():
                if user.get("microbatch") is None or int(user.get("microbatch")) != 0:
                    continue
                there = slot(user.name, is_backward(user))
                if there != here:
                    reads[there].add(here)
                if there[0] != s:
                    to.add(there[0])
            for dst in to:
                sent[dst][r.name in whole] += value_bytes(r)
        for dst, (scaled_bytes, fixed_bytes) in sent.items():
            src_name, dst_name = cluster.names[s], cluster.names[dst]
            latency = cluster.transfer_time(src_name, dst_name, 0)
            messages[(here, dst)].append((latency, cluster.transfer_time(src_name, dst_name, scaled_bytes) - latency,
                                          cluster.transfer_time(src_name, dst_name, fixed_bytes) - latency))
    for key in [*scaled, *fixed]:
        reads.setdefault(key, set())
    return PipelineModel(len(devices), dict(scaled), dict(fixed), acyclic(reads), dict(messages), once, sums)


def _whole_results(graph: Graph, source: Graph | None) -> set[str]:
    """Results of micro-batch 0's copies that are as large as the source value they copy."""
    if source is None:
        return set()
    size = {r.name: value_bytes(r) for op in source.ops for r in op.results}
    return {r.name for op in graph.ops if op.get("microbatch") == 0 for r in op.results
            if size.get(r.name.removesuffix(".mb0")) == value_bytes(r)}


def acyclic(reads: dict[SlotKey, set[SlotKey]]) -> dict[SlotKey, frozenset[SlotKey]]:
    """`reads` without the edges that close a cycle: inside a group of slots that read each other
    (an operator graph whose backward ops feed both neighbouring stages), only the reads that go
    the schedule's way (forward up the stages, then backward down) are kept."""
    def rank(key: SlotKey) -> tuple[int, int]:
        return (0, key[0]) if key[1] == "F" else (1, -key[0])

    component = _components(reads)
    return {dst: frozenset(src for src in srcs if component[src] != component[dst] or rank(src) < rank(dst))
            for dst, srcs in reads.items()}


def _components(reads: dict[SlotKey, set[SlotKey]]) -> dict[SlotKey, int]:
    """Strongly connected components of the read graph (a handful of slots: by reachability)."""
    nodes = sorted(set(reads) | {src for srcs in reads.values() for src in srcs})
    upstream = {n: _upstream(n, reads) for n in nodes}
    component: dict[SlotKey, int] = {}
    for n in nodes:
        if n not in component:
            ident = len(set(component.values()))
            for other in nodes:
                if other == n or (other in upstream[n] and n in upstream[other]):
                    component[other] = ident
    return component


def _upstream(node: SlotKey, reads: dict[SlotKey, set[SlotKey]]) -> set[SlotKey]:
    """The slots `node` reads, directly or through others."""
    seen: set[SlotKey] = set()
    stack = [node]
    while stack:
        for src in reads.get(stack.pop(), ()):
            if src not in seen:
                seen.add(src)
                stack.append(src)
    return seen
