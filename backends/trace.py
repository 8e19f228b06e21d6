"""`--trace`: the plan as Chrome trace JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Process "devices" has one row (thread) per device, process "links" one per directed link that
carries a transfer. Ops are named by op name, with opcode, group and cost in their args; a
transfer is named `producer -> destination device`. Times are microseconds, as the format wants.
"""

from __future__ import annotations

import json
from typing import Any

from pesto_ir.ir import Graph
from pesto_ir.plan import Plan

DEVICES_PID = 1
LINKS_PID = 2
US = 1e6


def _meta(pid: int, tid: int | None, kind: str, name: str, sort: int | None = None) -> list[dict[str, Any]]:
    base: dict[str, Any] = {"ph": "M", "pid": pid}
    if tid is not None:
        base["tid"] = tid
    out = [{**base, "name": kind, "args": {"name": name}}]
    if sort is not None:
        out.append({**base, "name": kind.replace("_name", "_sort_index"), "args": {"sort_index": sort}})
    return out


def _op_args(graph: Graph | None, name: str, start: float, end: float) -> dict[str, Any]:
    args: dict[str, Any] = {"cost": end - start, "start": start, "end": end}
    if graph is not None and graph.has_op(name):
        op = graph.op(name)
        args["opcode"] = op.opcode
        for key in ("group", "label", "flops"):
            if key in op.attrs:
                args[key] = op.get(key)
    return args


def chrome_trace(plan: Plan, graph: Graph | None = None) -> dict[str, Any]:
    """The trace as a JSON-able dict (`traceEvents` plus display hints)."""
    events: list[dict[str, Any]] = []
    events += _meta(DEVICES_PID, None, "process_name", "devices", 0)
    events += _meta(LINKS_PID, None, "process_name", "links", 1)
    device_tid = {d: i for i, d in enumerate(plan.devices)}
    for slot in plan.ops.values():
        device_tid.setdefault(slot.device, len(device_tid))
    for d, tid in device_tid.items():
        events += _meta(DEVICES_PID, tid, "thread_name", d, tid)
    links = sorted({(t.src_device, t.to) for t in plan.transfers}, key=lambda k: (device_tid.get(k[0], 0),
                                                                                  device_tid.get(k[1], 0)))
    link_tid = {k: i for i, k in enumerate(links)}
    for (src, dst), tid in link_tid.items():
        events += _meta(LINKS_PID, tid, "thread_name", f"{src} -> {dst}", tid)
    for name, slot in sorted(plan.ops.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        events.append({"name": name, "cat": "op", "ph": "X", "pid": DEVICES_PID, "tid": device_tid[slot.device],
                       "ts": slot.start * US, "dur": (slot.end - slot.start) * US,
                       "args": _op_args(graph, name, slot.start, slot.end)})
    for t in sorted(plan.transfers, key=lambda t: (t.start, t.end)):
        events.append({"name": f"{t.src} -> {t.to}", "cat": "transfer", "ph": "X", "pid": LINKS_PID,
                       "tid": link_tid[(t.src_device, t.to)], "ts": t.start * US, "dur": (t.end - t.start) * US,
                       "args": {"src": t.src, "from": t.src_device, "to": t.to, "bytes": t.nbytes}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"graph": plan.graph, "algorithm": plan.algorithm, "makespan": plan.makespan,
                          "lower_bound": plan.lower_bound}}


def trace_json_text(plan: Plan, graph: Graph | None = None) -> str:
    """Chrome trace JSON text of `plan`; `graph` adds opcodes and groups to each op's args."""
    return json.dumps(chrome_trace(plan, graph), default=str) + "\n"
