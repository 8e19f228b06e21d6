"""The order each stage of a pipeline runs its ops in: the fixed schedules' slots, timed on an
abstract pipeline, and the eager schedule's choice among ready ops.

Every op with a `microbatch` attribute belongs to a slot (phase F or B, micro-batch i) of its
stage. On each stage GPipe runs F0 .. F(m-1), then B0 .. B(m-1); 1F1B runs w = min(S-s-1, m)
warm-up forwards, then m-w pairs (next forward, oldest backward), then drains the w backwards left.
The slots are timed once on an abstract pipeline (forward 1, backward 2 time units) and an op's
priority is its slot's start there. Along the edges of a training step (micro-batch i's forward
from stage s to s+1, its backward back down) priorities never decrease, and `order_from_priority`
pops ops in priority order, so each stage runs exactly its slot order (ties inside a slot by graph
order). Where a graph's edges run against the schedule (the MSR cost graphs' backward chains run
from the first layer to the last) the order is still valid, as close to the schedule as the
dependencies allow. An op without a micro-batch runs with its latest producer's slot (after it, by
graph order), or, with no producer in a slot, just before its first consumer. The simulator
times the orders; `check_plan` checks the plan, memory included.
"""

from __future__ import annotations

from collections.abc import Mapping

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import is_backward
from pesto_ir.schedule.simulate import Prepared

PHASE_TIME = {"F": 1.0, "B": 2.0}  # the abstract pipeline's slot lengths (backward ~ twice forward)

Slot = tuple[str, int]  # (phase "F" or "B", micro-batch)


def stage_slots(schedule: str, s: int, n_stages: int, m: int) -> list[Slot]:
    """The order in which stage s runs its slots."""
    forwards = [("F", i) for i in range(m)]
    backwards = [("B", i) for i in range(m)]
    if schedule == "gpipe":
        return forwards + backwards
    warm = min(n_stages - s - 1, m)
    steady = [slot for i in range(m - warm) for slot in (forwards[warm + i], backwards[i])]
    return forwards[:warm] + steady + backwards[m - warm:]


def slot_ticks(schedule: str, n_stages: int, m: int) -> dict[tuple[int, str, int], float]:
    """Each (stage, phase, micro-batch) slot's start on the abstract pipeline: stages run their slots
    in `stage_slots` order; F(s, i) waits for F(s-1, i); B(s, i) for B(s+1, i), and on the last
    stage for F(s, i)."""
    seqs = [stage_slots(schedule, s, n_stages, m) for s in range(n_stages)]
    pos, free = [0] * n_stages, [0.0] * n_stages
    end: dict[tuple[int, str, int], float] = {}
    start: dict[tuple[int, str, int], float] = {}
    while any(p < len(seq) for p, seq in zip(pos, seqs)):
        progressed = False
        for s, seq in enumerate(seqs):
            while pos[s] < len(seq):
                phase, i = seq[pos[s]]
                dep = (s - 1, "F", i) if phase == "F" else (s + 1, "B", i) if s < n_stages - 1 else (s, "F", i)
                if dep[0] in (-1, n_stages) or dep in end:
                    t = max(free[s], end.get(dep, 0.0))
                    start[(s, phase, i)] = t
                    end[(s, phase, i)] = free[s] = t + PHASE_TIME[phase]
                    pos[s] += 1
                    progressed = True
                else:
                    break
        if not progressed:
            raise AssertionError(f"the {schedule} slot orders deadlock")  # not for these two schedules
    return start


def priorities(graph: Graph, stage_of: dict[str, int], ticks: dict[tuple[int, str, int], float]) -> dict[str, float]:
    """Each op's priority: its slot's tick; an op outside the slots takes its latest producer's, or
    with no producer in a slot its earliest consumer's (it runs just before that consumer)."""
    prio: dict[str, float] = {}
    for op in graph.ops:
        i = op.get("microbatch")
        if i is not None:
            prio[op.name] = ticks[(stage_of[op.name], "B" if is_backward(op) else "F", int(i))]
        else:
            found = [prio[p.name] for p in op.producers() if p.name in prio]
            if found:
                prio[op.name] = max(found)
    for op in reversed(graph.ops):
        if op.name not in prio:
            prio[op.name] = min((prio[c.name] for c in op.consumers()), default=0.0)
    return prio


def eager_priorities(graph: Graph, cluster: Cluster, placement: Mapping[str, str],
                     prepared: Prepared | None = None) -> dict[str, tuple[float, ...]]:
    """The eager schedule's choice among ready ops: the oldest micro-batch first, then the longest
    path from the op to the step's end (its cost on its device included, transfers not). Oldest
    first keeps micro-batches moving through the stages, as a pipeline must; by longest path alone
    a device would run one op for every micro-batch before the next. An op without a micro-batch
    takes its latest producer's (a gradient sum, the update), else its earliest consumer's (an
    optimizer term that reads only state runs with the first micro-batch that needs it), else 0,
    as `priorities` places such ops in the fixed schedules."""
    prepared = prepared.of(graph, cluster) if prepared else Prepared(graph, cluster)
    consumers = prepared.consumers
    to_end: dict[str, float] = {}
    for op in reversed(graph.ops):
        tail = max((to_end[c] for c in consumers[op.name]), default=0.0)
        to_end[op.name] = prepared.cost(op.name, placement[op.name]) + tail
    batch: dict[str, int] = {}
    for op in graph.ops:
        i = op.get("microbatch")
        found = [batch[p] for p in prepared.producers[op.name] if p in batch]
        if i is not None or found:
            batch[op.name] = int(i) if i is not None else max(found)
    for op in reversed(graph.ops):
        if op.name not in batch:
            batch[op.name] = min((batch[c] for c in consumers[op.name]), default=0)
    return {op.name: (float(batch[op.name]), -to_end[op.name]) for op in graph.ops}
