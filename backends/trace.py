"""`--trace`: the plan as Chrome trace JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Process "devices" has one row (thread) per device, process "links" one per directed link that
carries a transfer. Ops are named by op name, with opcode, group and cost in their args; a
transfer is named `producer -> destination device`. Times are microseconds, as the format wants.

Hybrid plans: an op copied per micro-batch has `args.microbatch` and the categories `op,mb<i>`
(Perfetto and chrome://tracing filter by category, so one micro-batch can be picked out); an
collective op (`all_reduce`, `reduce_scatter`, `all_gather`) has category `collective` and args
naming its kind, the devices of its ring and the bytes of its whole value. Only replica 0's devices get rows, since every replica runs the same
schedule; the devices process says so in its labels, a global instant event at time 0 names the
parallelism, and `otherData.parallelism` holds it as `pesto-plan/1` does.
"""

from __future__ import annotations

import json
from typing import Any

from pesto_ir.backends.figures import mirrored_devices
from pesto_ir.backends.gantt import collectives_of, microbatch_of, parallelism_line
from pesto_ir.ir.graph import Graph
from pesto_ir.schedule.plan import Collective, OpSlot, Plan
from pesto_ir.util.units import human_bytes

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


def _op_event(graph: Graph | None, name: str, slot: OpSlot, tid: int, collectives: dict[str, Collective]) -> dict[str, Any]:
    """The complete ("X") event of one op: category `collective` for an all-reduce, `op,mb<i>` for a
    micro-batch copy, else `op`."""
    args = _op_args(graph, name, slot.start, slot.end)
    cat = "op"
    mb = microbatch_of(graph, name)
    if mb is not None:
        args["microbatch"] = mb
        cat = f"op,mb{mb}"
    c = collectives.get(name)
    if c is not None:
        args.update({"kind": c.kind, "devices": list(c.devices), "bytes": c.nbytes, "size": human_bytes(c.nbytes)})
        cat = "collective"
    return {"name": name, "cat": cat, "ph": "X", "pid": DEVICES_PID, "tid": tid, "ts": slot.start * US,
            "dur": (slot.end - slot.start) * US, "args": args}


def _parallelism_events(plan: Plan) -> list[dict[str, Any]]:
    """For a hybrid plan, what a reader of the trace must know first: which replica the rows are and
    how the step is split, as process labels and a global instant event at time 0."""
    line = parallelism_line(plan)
    if line is None or plan.parallelism is None:
        return []
    mirrors = ",".join(d for d in plan.devices if d in mirrored_devices(plan))
    labels = line + (f"; rows: replica 0 only ({mirrors} mirror it)" if mirrors else "")
    return [{"ph": "M", "pid": DEVICES_PID, "name": "process_labels", "args": {"labels": labels}},
            {"name": line, "cat": "parallelism", "ph": "i", "s": "g", "pid": DEVICES_PID, "tid": 0, "ts": 0.0,
             "args": plan.parallelism.to_json()}]


def chrome_trace(plan: Plan, graph: Graph | None = None) -> dict[str, Any]:
    """The trace as a JSON-able dict (`traceEvents` plus display hints)."""
    events: list[dict[str, Any]] = []
    events += _meta(DEVICES_PID, None, "process_name", "devices", 0)
    events += _meta(LINKS_PID, None, "process_name", "links", 1)
    events += _parallelism_events(plan)
    hidden = mirrored_devices(plan)
    device_tid = {d: i for i, d in enumerate(d for d in plan.devices if d not in hidden)}
    for slot in plan.ops.values():
        device_tid.setdefault(slot.device, len(device_tid))
    for d, tid in device_tid.items():
        events += _meta(DEVICES_PID, tid, "thread_name", d, tid)
    links = sorted({(t.src_device, t.to) for t in plan.transfers}, key=lambda k: (device_tid.get(k[0], 0),
                                                                                  device_tid.get(k[1], 0)))
    link_tid = {k: i for i, k in enumerate(links)}
    for (src, dst), tid in link_tid.items():
        events += _meta(LINKS_PID, tid, "thread_name", f"{src} -> {dst}", tid)
    collectives = collectives_of(plan, graph)
    for name, slot in sorted(plan.ops.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        events.append(_op_event(graph, name, slot, device_tid[slot.device], collectives))
    for t in sorted(plan.transfers, key=lambda t: (t.start, t.end)):
        events.append({"name": f"{t.src} -> {t.to}", "cat": "transfer", "ph": "X", "pid": LINKS_PID,
                       "tid": link_tid[(t.src_device, t.to)], "ts": t.start * US, "dur": (t.end - t.start) * US,
                       "args": {"src": t.src, "from": t.src_device, "to": t.to, "bytes": t.nbytes}})
    other: dict[str, Any] = {"graph": plan.graph, "algorithm": plan.algorithm, "makespan": plan.makespan,
                             "lower_bound": plan.lower_bound}
    if plan.parallelism is not None:
        other["parallelism"] = plan.parallelism.to_json()
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def trace_json_text(plan: Plan, graph: Graph | None = None) -> str:
    """Chrome trace JSON text of `plan`; `graph` adds opcodes and groups to each op's args."""
    return json.dumps(chrome_trace(plan, graph), default=str) + "\n"
