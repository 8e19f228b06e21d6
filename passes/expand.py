"""`expand`: turn the plan recorded on a graph into a per-op plan with exact times.

After `place` solved the coarse graph, each op carries its group's device and start time;
`expansion.expand_plan` re-times every op with the simulator, keeping each device's order, and the
validator checks the result, which replaces the recorded plan. A graph placed without groups is
re-simulated and validated the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.expansion import TimedPlan, expand_plan
from pesto_ir.passes.placement.options import PlaceError, require_cluster
from pesto_ir.passmanager import Pass, PassContext
from pesto_ir.schedule.plan import read_plan_attrs, write_plan_attrs
from pesto_ir.util.gc_pause import gc_paused
from pesto_ir.util.units import human_time


@dataclass(frozen=True)
class ExpandPass(Pass):
    """Replace the recorded (possibly coarse) plan by a simulated, validated per-op plan."""

    name = "expand"

    def run(self, graph: Graph, ctx: PassContext) -> None:
        cluster = require_cluster(ctx, self.name)
        timed = TimedPlan.of(ctx.checked, graph, cluster)  # place's plan, timed and checked as expand would
        if timed is not None:
            ctx.recorded, fine = timed, timed.plan
        else:
            plan = read_plan_attrs(graph)
            if plan is None:
                raise PlaceError("expand needs a placed graph: run place before it")
            with gc_paused():  # a plan of every op, kept: the collector would walk it again and again
                fine = expand_plan(graph, cluster, plan)
                write_plan_attrs(graph, fine)
            ctx.recorded = TimedPlan(graph, cluster, fine)
        ctx.progress(f"expand: {len(graph.ops)} ops, re-timed with first-come links: {human_time(fine.makespan, 4)}")
