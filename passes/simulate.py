"""`simulate`: re-time the plan recorded in the graph with the discrete-event simulator.

A placement algorithm's own times may be optimistic or stale (costs changed, the graph was
expanded from a coarse plan). This pass keeps what was decided, each op's device and the order
of ops on each device (by recorded start, then end, then `tie`, then graph position, which is
topological: `pesto_ir.schedule.simulate.recorded_order`), and lets `pesto_ir.schedule.simulate`
compute the times under the cluster's link model. The result is validated, written back in place
of the old times, and summarised. A placed graph this pass (or `expand`) wrote, printed and read
back, is simulated to the same times: that order is the one the simulator ran.

A graph with no placement at all on a one-device cluster runs on that device in graph order, so
`annotate-costs,simulate` gives the single-device makespan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.attributes import format_duration
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.expansion import TimedPlan
from pesto_ir.passes.placement.label import plan_label
from pesto_ir.passes.rewrite.replicas import sub_cluster
from pesto_ir.passmanager import Pass, PassContext
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import OpSlot, Plan, read_plan_attrs, recorded_ties, write_plan_attrs
from pesto_ir.schedule.report import format_summary, summarize
from pesto_ir.schedule.simulate import recorded_order, simulate
from pesto_ir.schedule.validate import check_plan, collectives_for
from pesto_ir.util.errors import PestoError
from pesto_ir.util.gc_pause import gc_paused


class SimulateError(PestoError):
    pass


def recorded_schedule(graph: Graph, cluster: Cluster) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(placement, per-device order) from the ops' `device`, `start`, `end` and `tie` attributes:
    the orders that give a plan the simulator timed its times again (`recorded_order`)."""
    placed = {op.name: op.get("device") for op in graph.ops if "device" in op.attrs}
    if not placed and len(cluster) == 1:
        only = cluster.names[0]
        return {op.name: only for op in graph.ops}, {only: [op.name for op in graph.ops]}
    missing = [op for op in graph.ops if op.name not in placed]
    if missing:
        first = missing[0]
        raise SimulateError(f"simulate needs a placed graph: {len(missing)} op(s) have no device, e.g. "
                            f"'{first.name}' ({first.where()}); run a place pass first")
    if not all("start" in op.attrs for op in graph.ops):  # no times: graph order
        order: dict[str, list[str]] = {}
        for op in graph.ops:
            order.setdefault(placed[op.name], []).append(op.name)
        return placed, order
    slots = {op.name: OpSlot(placed[op.name], float(op.get("start")), float(op.get("end", op.get("start"))))
             for op in graph.ops}
    order = recorded_order(graph, Plan(graph.name, "", list(cluster.names), slots, ties=recorded_ties(graph)))
    # The orders are topological; where they are not by time, the times put an op before one it
    # waits for, and running them as recorded would deadlock.
    for device, names in order.items():
        for ahead, then in zip(names, names[1:]):
            a, b = slots[ahead], slots[then]
            if (b.start, b.end) < (a.start, a.end):
                raise SimulateError(
                    f"the recorded order deadlocks on {device}: '{then}' ({graph.op(then).where()}) starts at "
                    f"{format_duration(b.start)}, before '{ahead}' at {format_duration(a.start)}, but needs "
                    "results that the times make it wait for until after that")
    return placed, order


def resimulate(graph: Graph, cluster: Cluster, timed: TimedPlan | None = None) -> Plan:
    """The recorded schedule, re-timed, with the lower bound, checked by the plan validator.
    `timed`: the recorded plan as the pass before timed and checked it, which is what re-timing
    it gives; its lower bound is found again unless it is the graph's already."""
    if timed is not None:
        plan = dataclasses.replace(timed.plan)
        if not (timed.bounded and plan.parallelism is None):
            bounded = cluster if plan.parallelism is None else sub_cluster(cluster, plan.parallelism.replicas[0])
            plan.lower_bound = lower_bound(graph, bounded)
        return plan
    previous = read_plan_attrs(graph)
    placement, order = recorded_schedule(graph, cluster)
    plan = simulate(graph, cluster, placement, order, algorithm=previous.algorithm if previous else "simulate")
    if previous is not None:
        plan.solver, plan.notes = previous.solver, list(previous.notes)
    bounded = cluster
    if previous is not None and previous.parallelism is not None:  # replica 0's schedule, run by every replica
        plan.devices, plan.parallelism = list(previous.devices), previous.parallelism
        plan.collectives = collectives_for(graph, plan)
        bounded = sub_cluster(cluster, previous.parallelism.replicas[0])
    plan.lower_bound = lower_bound(graph, bounded)
    check_plan(graph, cluster, plan)
    return plan


@dataclass(frozen=True)
class SimulatePass(Pass):
    name: ClassVar[str] = "simulate"

    def run(self, graph: Graph, ctx: PassContext) -> None:
        if ctx.cluster is None:
            raise SimulateError("simulate needs a cluster (give --cluster FILE or --devices N)")
        timed = TimedPlan.of(ctx.checked, graph, ctx.cluster)
        with gc_paused():  # a plan of every op, kept: the collector would walk it again and again
            plan = resimulate(graph, ctx.cluster, timed)
            if timed is None or plan.lower_bound != timed.plan.lower_bound:  # else the graph records it already
                write_plan_attrs(graph, plan)
        ctx.recorded = TimedPlan(graph, ctx.cluster, plan, bounded=plan.parallelism is None)
        ctx.progress(format_summary(dataclasses.replace(summarize(graph, plan, ctx.cluster), algorithm=plan_label(plan))))
