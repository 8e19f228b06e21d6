"""What a plan is called in the summary, the chart's title and the CLI's last line: the algorithm
asked for and, where another engine's plan is what it returned, that engine.

`plan.algorithm` stays the name asked for (`place{algo=...}`, what start plans and tests compare);
`plan.solver["winner"]` names the engine whose plan it is: the one `auto`'s portfolio kept
(`cpsat-lns + justified`), a heuristic on the fine graph that beat a coarse exact plan, or the warm
start an exact engine returned unchanged (its MILP skipped as too big, or no better plan found).
"""

from __future__ import annotations

from pesto_ir.schedule.plan import Plan
from pesto_ir.util.units import human_time


def plan_label(plan: Plan) -> str:
    """`ilp: m-etf's warm start, MILP skipped`, `auto: cpsat-lns + justified`, or the algorithm alone."""
    winner = (plan.solver or {}).get("winner")
    if not isinstance(winner, str) or not winner or winner == plan.algorithm:
        return plan.algorithm
    return f"{plan.algorithm}: {winner}" if plan.algorithm else winner


def strategy_text(plan: Plan) -> str:
    """The plan's strategy in a few words: `one batch on 2 of 2 devices`, `data-parallel 2 x 2
    micro-batches, 2 devices per replica`, with tensor parallelism and sharded state where used."""
    par = plan.parallelism
    used = sorted({slot.device for slot in plan.ops.values()})
    if par is None:
        return f"one batch on {len(used)} of {len(plan.devices)} device{'s' if len(plan.devices) != 1 else ''}"
    parts = []
    if par.data_parallel > 1 or par.microbatches > 1:
        parts.append(f"data-parallel {par.data_parallel} x {par.microbatches} micro-batch"
                     f"{'es' if par.microbatches != 1 else ''}")
    if par.tensor_parallel > 1:
        parts.append(f"tensor-parallel {par.tensor_parallel}")
    parts.append(f"{len(used)} device{'s' if len(used) != 1 else ''} per replica")
    if par.parameters == "sharded":
        parts.append("parameters and optimizer state sharded (FSDP)")
    elif par.optimizer_state == "sharded":
        parts.append("optimizer state sharded (ZeRO-1)")
    return ", ".join(parts)


def answer_line(plan: Plan) -> str:
    """The run's one answer, the last line pesto-compile prints: the plan's step time (its simulated
    makespan), its lower bound, and its strategy and engine."""
    bound = ""
    if plan.lower_bound is not None and plan.lower_bound > 0:
        bound = f", lower bound {human_time(plan.lower_bound)} ({plan.makespan / plan.lower_bound:.3f}x)"
    label = plan_label(plan)
    return (f"answer: step time {human_time(plan.makespan)}{bound}; {strategy_text(plan)}"
            + (f"; plan by {label}" if label else ""))
