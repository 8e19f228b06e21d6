"""Every report a placed graph can be written as, rendered before anything is written.

The CLI (`--plan-json`, `--trace`, `--gantt`) calls `render_reports` and then writes each result
with `pesto_ir.util.loader.write_atomic`, so a failure in one report leaves no file half written.
"""

from __future__ import annotations

from pesto_ir.backends.gantt import gantt_for_path
from pesto_ir.backends.plan_json import plan_json_text
from pesto_ir.backends.trace import trace_json_text
from pesto_ir.ir.graph import Graph
from pesto_ir.schedule.plan import Plan, read_plan_attrs
from pesto_ir.util.errors import PestoError


class ReportError(PestoError):
    pass


def require_plan(graph: Graph) -> Plan:
    """The plan recorded in `graph`; an error says which passes record one."""
    plan = read_plan_attrs(graph)
    if plan is None:
        raise ReportError(f"graph '{graph.name}' has no plan to report: add a place pass (and simulate) "
                          "to the pipeline, or load a placed .pir")
    return plan


def render_reports(graph: Graph, *, plan_json: str | None = None, trace: str | None = None,
                   gantt: str | None = None) -> list[tuple[str, str | bytes]]:
    """(path, contents) for each requested report; nothing requested, nothing rendered."""
    if plan_json is None and trace is None and gantt is None:
        return []
    plan = require_plan(graph)
    out: list[tuple[str, str | bytes]] = []
    if plan_json is not None:
        out.append((plan_json, plan_json_text(plan)))
    if trace is not None:
        out.append((trace, trace_json_text(plan, graph)))
    if gantt is not None:
        out.append((gantt, gantt_for_path(plan, graph, gantt)))
    return out
