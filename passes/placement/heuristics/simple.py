"""Reference placements to measure the others against: single, expert and random.

- `single`: everything on the fastest device whose memory holds the whole graph at its peak (no
  transfers; the makespan is the total work there).
- `expert`: what layer-wise model parallelism does by hand: cut the topological order into one
  contiguous stage per device, each stage about an equal share of the remaining work (measured on
  its device, so faster devices take more). A colocation group goes where its first op went, and a
  unit that does not fit the current stage's memory moves on to the next device with room.
- `random`: in topological order, each colocation unit on a device drawn with the seed among those
  its first op fits on.

Each device runs its ops in the graph's topological order; the simulator gives the times. Memory
is followed as the ops are walked (`algo_common.Memory`), and `single` checks the exact peak.
"""

from __future__ import annotations

import random

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import (
    Memory,
    PlaceGraph,
    PlacementError,
    schedule_within_memory,
    simulated_plan,
    timed_plan,
    topological_orders,
)
from pesto_ir.passes.placement.links import checkpoint
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.schedule.memory import peak_memory
from pesto_ir.schedule.plan import Plan


def place_single(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """All ops on the device that runs them all fastest among those that hold their peak."""
    pg = PlaceGraph.build(graph, cluster)
    short: list[str] = []
    tried: set[tuple[float, tuple[float, ...]]] = set()
    for d in sorted(range(pg.k), key=lambda d: (sum(c[d] for c in pg.cost), d)):
        alike = (pg.capacity[d], tuple(c[d] for c in pg.cost))
        if alike in tried:  # a device like one tried: the same times and peak (8 alike GPUs: one try)
            continue
        tried.add(alike)
        device_of = [d] * pg.n
        plan = simulated_plan(pg, device_of, topological_orders(pg, device_of), "single")
        peak = peak_memory(graph, plan)[cluster.names[d]]
        if peak.nbytes <= pg.capacity[d]:
            return plan
        short.append(peak.describe(pg.capacity[d]))
    raise PlacementError("single: the graph fits on no one device in topological order:\n  " + "\n  ".join(short))


def place_expert(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Contiguous stages of the topological order, balanced by work, one per device."""
    pg = PlaceGraph.build(graph, cluster)
    return schedule_within_memory(pg, lambda reserve: _expert(pg, reserve))


def _expert(pg: PlaceGraph, reserve: list[int]) -> Plan:
    mem = Memory(pg, reserve=reserve, algorithm="expert")
    mean = [sum(c) / pg.k for c in pg.cost]
    speed = _speeds(pg, mean)
    remaining = sum(mean)  # work of the ops not yet walked past, in average-device seconds
    device_of = [-1] * pg.n
    stage, work = 0, 0.0
    for i in range(pg.n):
        target = mem.unit_device[pg.unit[i]]
        if target < 0:
            if stage < pg.k - 1 and work > 0:
                share = (work + remaining) * speed[stage] / sum(speed[stage:])
                if work + mean[i] / 2 > share:
                    stage, work = stage + 1, 0.0
            while stage < pg.k - 1 and not mem.fits(i, stage):
                stage, work = stage + 1, 0.0
            target = stage if mem.fits(i, stage) else mem.roomiest(i)
        if target < 0 or not mem.fits(i, target):
            raise mem.no_room(i, "expert")
        mem.place(i, target)
        device_of[i] = target
        checkpoint("expert", i + 1)
        if device_of[i] == stage:
            work += mean[i]
        remaining -= mean[i]
    return timed_plan(pg, device_of, topological_orders(pg, device_of), "expert")


def _speeds(pg: PlaceGraph, mean: list[float]) -> list[float]:
    """Relative speed of each device: average-device work over its own time for the whole graph."""
    total = sum(mean)
    own = [sum(c[d] for c in pg.cost) for d in range(pg.k)]
    if total <= 0 or min(own) <= 0:
        return [1.0] * pg.k
    return [total / t for t in own]


def place_random(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Each colocation unit on a seeded random device its first op fits on, in topological order."""
    pg = PlaceGraph.build(graph, cluster)
    return schedule_within_memory(pg, lambda reserve: _random(pg, reserve, random.Random(options.seed)))


def _random(pg: PlaceGraph, reserve: list[int], rng: random.Random) -> Plan:
    mem = Memory(pg, reserve=reserve, algorithm="random")
    device_of = [-1] * pg.n
    for i in range(pg.n):
        target = mem.unit_device[pg.unit[i]]
        if target < 0:
            room = [d for d in range(pg.k) if mem.fits(i, d)]
            target = rng.choice(room) if room else -1
        if target < 0 or not mem.fits(i, target):
            raise mem.no_room(i, "random")
        mem.place(i, target)
        device_of[i] = target
    return timed_plan(pg, device_of, topological_orders(pg, device_of), "random")
