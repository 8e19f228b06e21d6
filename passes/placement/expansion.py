"""A plan with exact per-op times: the coarse plan a solver gives (each op with its group's device
and start) or any recorded plan, re-timed op by op by the simulator and checked by the validator.

Each device runs its ops by (recorded start, end, tie, graph position: `recorded_order`): groups in
the coarse schedule's order, the ops of one group in topological order. That order is a
topological order of the whole graph (a coarse edge a -> b means b's group starts no earlier than
a's ends), so it cannot deadlock; a plan the simulator timed comes out with the same times.
The `expand` pass records it; the searches compare plans by it, as the executable runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.options import COARSE_NOTE, PlaceError
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.simulate import recorded_order, simulate
from pesto_ir.schedule.validate import check_plan, collectives_for


def expand_plan(graph: Graph, cluster: Cluster, plan: Plan) -> Plan:
    """The simulated, validated per-op plan that keeps `plan`'s devices and per-device order."""
    unplaced = [op.name for op in graph.ops if op.name not in plan.ops]
    if unplaced:
        raise PlaceError(f"{len(unplaced)} op(s) have no device, e.g. '{unplaced[0]}' (run place on this graph)")
    placement = {name: slot.device for name, slot in plan.ops.items()}
    # the order the plan records, which re-times a simulated plan to the same times
    fine = simulate(graph, cluster, placement, recorded_order(graph, plan), algorithm=plan.algorithm)
    if plan.parallelism is not None:  # replica 0's schedule, which every replica runs
        fine.devices, fine.parallelism = list(plan.devices), plan.parallelism
        fine.collectives = collectives_for(graph, fine)
    fine.lower_bound = plan.lower_bound
    fine.solver = plan.solver
    coarse = [n for n in plan.notes if n.startswith(COARSE_NOTE)]
    fine.notes = [n for n in plan.notes if not n.startswith(COARSE_NOTE)]
    if coarse:
        fine.notes.append(f"expanded from a {coarse[0].split(':')[0]}")
    return check_plan(graph, cluster, fine)


@dataclass(frozen=True)
class TimedPlan:
    """A plan a pass recorded on `graph` as its last change, after the simulator timed it on
    `cluster` in the order its attributes give (`recorded_order`) and the validator checked it:
    what timing the recorded plan again would give, op for op (a simulated plan re-simulates to
    its own times). `place` (where its engine says so: `Plan.timed_on`), `expand` and `simulate`
    record one (`PassContext.recorded`); the pass after takes it instead of timing and checking a
    50,000-op plan again. `bounded`: the plan's lower bound is `lower_bound(graph, cluster)`, as
    `simulate` finds it for a one-batch plan."""

    graph: Graph
    cluster: Cluster
    plan: Plan
    bounded: bool = False

    @staticmethod
    def of(checked: Any, graph: Graph, cluster: Cluster) -> TimedPlan | None:
        """`checked` (a pass context's) where it is for `graph` on `cluster`, else None."""
        if isinstance(checked, TimedPlan) and checked.graph is graph and checked.cluster is cluster:
            return checked
        return None
