"""Reference placements to measure the others against: single, expert and random.

- `single`: everything on the fastest device whose memory holds the whole graph (no transfers;
  the makespan is the total work there).
- `expert`: what layer-wise model parallelism does by hand: cut the topological order into one
  contiguous stage per device, each stage about an equal share of the remaining work (measured on
  its device, so faster devices take more). A colocation group goes where its first op went, and a
  unit that does not fit the current stage's memory moves on to the next device with room.
- `random`: each colocation unit on a device drawn with the seed among those it fits on, the
  biggest units first so memory runs out as late as it can.

Each device runs its ops in the graph's topological order; the simulator gives the times.
"""

from __future__ import annotations

import random

from pesto_ir.cluster import Cluster
from pesto_ir.ir import Graph
from pesto_ir.passes.algo_common import Memory, PlaceGraph, PlacementError, timed_plan, topological_orders
from pesto_ir.placement import PlaceOptions
from pesto_ir.plan import Plan


def place_single(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """All ops on the device that runs them all fastest among those that hold them all."""
    pg = PlaceGraph.build(graph, cluster)
    need = sum(pg.mem)
    fits = [d for d in range(pg.k) if need <= pg.capacity[d]]
    if not fits:
        biggest = max(range(pg.k), key=lambda d: pg.capacity[d])
        raise PlacementError(f"single: the graph needs {need} bytes but the largest device, "
                             f"{cluster.devices[biggest].name}, holds {int(pg.capacity[biggest])} "
                             f"(short by {need - int(pg.capacity[biggest])} bytes)")
    best = min(fits, key=lambda d: (sum(c[d] for c in pg.cost), d))
    device_of = [best] * pg.n
    return timed_plan(pg, device_of, topological_orders(pg, device_of), "single")


def place_expert(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Contiguous stages of the topological order, balanced by work, one per device."""
    pg = PlaceGraph.build(graph, cluster)
    mem = Memory(pg)
    mean = [sum(c) / pg.k for c in pg.cost]
    speed = _speeds(pg, mean)
    remaining = sum(mean)  # work of the ops not yet walked past, in average-device seconds
    device_of = [-1] * pg.n
    stage, work = 0, 0.0
    for i in range(pg.n):
        u = pg.unit[i]
        if mem.unit_device[u] < 0:
            if stage < pg.k - 1 and work > 0:
                share = (work + remaining) * speed[stage] / sum(speed[stage:])
                if work + mean[i] / 2 > share:
                    stage, work = stage + 1, 0.0
            while stage < pg.k - 1 and not mem.fits(u, stage):
                stage, work = stage + 1, 0.0
            target = stage if mem.fits(u, stage) else mem.roomiest(u)
            if target < 0:
                raise mem.no_room(u, "expert")
            mem.place(u, target)
        device_of[i] = mem.unit_device[u]
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
    """Each colocation unit on a seeded random device it fits on, biggest units first."""
    pg = PlaceGraph.build(graph, cluster)
    mem = Memory(pg)
    rng = random.Random(options.seed)
    for u in sorted(range(len(pg.unit_ops)), key=lambda u: (-pg.unit_mem[u], u)):
        room = [d for d in range(pg.k) if mem.fits(u, d)]
        if not room:
            raise mem.no_room(u, "random")
        mem.place(u, rng.choice(room))
    device_of = [mem.unit_device[pg.unit[i]] for i in range(pg.n)]
    return timed_plan(pg, device_of, topological_orders(pg, device_of), "random")
