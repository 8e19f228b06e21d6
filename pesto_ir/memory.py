"""Memory as the schedule uses it: the bytes each device holds over one step, from tensor lifetimes.

On the device that runs it, an op of a placed, timed plan holds
- `memory`, its resident bytes (parameters, optimizer state, what a cost graph declares), for the
  whole step;
- its output from its start until it is released: when its last reader on that device has ended,
  its transfers from there have ended and, for a graph output, when the step ends (a result nobody
  reads lives while its op runs). The output is the op's result tensors, or the `activation`
  attribute where one is given (cost graphs, whose `blob` results only size the edges);
- `workspace`, scratch bytes (the internal tensors of a coarse group), while it runs.
A graph input is an argument of the step: resident for the whole step on every device that reads it.
A copy received from another device lives there from its transfer's start until its last reader
there has ended.

Intervals are half-open, [alloc, free): bytes freed at t can hold what is allocated at t, as an
allocator reusing a buffer does. A device's peak is the largest sum of the intervals that hold one
instant; it is reached at the start of some interval.

Placement algorithms that cannot follow lifetimes (the exact engines' linear models, the static
baselines) use `footprints`: every byte an op holds, as if it all lived for the whole step (the
paper's model, an upper bound of what the op adds to any peak, copies received aside).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pesto_ir.costs import op_memory
from pesto_ir.ir import Graph, Op, Value
from pesto_ir.plan import OpSlot, Plan
from pesto_ir.units import human_bytes, human_time

STEP_END = math.inf  # resident bytes and graph outputs are held past the last op


@dataclass(frozen=True)
class Lifetime:
    """`nbytes` held on `device` during [start, end)."""

    device: str
    start: float
    end: float
    nbytes: int
    what: str  # a tensor's name, for messages: `%x`, `input %w`, `resident of 'op'`, `copy of %y from gpu0`


@dataclass(frozen=True)
class DevicePeak:
    device: str
    nbytes: int
    time: float  # the first instant the peak is reached
    alive: tuple[Lifetime, ...]  # what is held then, largest first

    def describe(self, capacity: float | None = None, shown: int = 5) -> str:
        """`gpu0 peaks at 12.3 GiB at 4.1 ms (...)`, with the largest tensors alive then."""
        head = f"{self.device} peaks at {human_bytes(self.nbytes)} ({self.nbytes} bytes) at {human_time(self.time)}"
        if capacity is not None and self.nbytes > capacity:
            head += f", {math.ceil(self.nbytes - capacity)} bytes more than its {human_bytes(capacity)}"
        tensors = ", ".join(f"{lt.what} {human_bytes(lt.nbytes)}" for lt in self.alive[:shown])
        more = f" and {len(self.alive) - shown} more" if len(self.alive) > shown else ""
        return f"{head}; alive then: {tensors}{more}" if tensors else head


def output_bytes(op: Op) -> int:
    """Bytes of what `op` produces and keeps until its readers are done."""
    given = op.get("activation")
    if given is not None:
        return int(given)
    return sum(r.type.nbytes for r in op.results)


def workspace_bytes(op: Op) -> int:
    return int(op.get("workspace", 0) or 0)


def first_read_inputs(graph: Graph) -> dict[str, int]:
    """Bytes of the graph inputs each op is the first reader of (graph order)."""
    index = {id(op): i for i, op in enumerate(graph.ops)}
    out: dict[str, int] = defaultdict(int)
    for v in graph.inputs:
        readers = [op for op in v.users() if id(op) in index]
        if readers:
            out[min(readers, key=lambda op: index[id(op)]).name] += v.type.nbytes
    return out


def footprints(graph: Graph) -> dict[str, int]:
    """Every byte each op holds, as if all of it lived for the whole step (graph inputs counted at
    their first reader): what linear memory models add up."""
    inputs = first_read_inputs(graph)
    return {op.name: op_memory(op) + output_bytes(op) + workspace_bytes(op) + inputs.get(op.name, 0)
            for op in graph.ops}


# ---------------------------------------------------------------- lifetimes of a plan

def lifetimes(graph: Graph, plan: Plan) -> list[Lifetime]:
    """Every interval of bytes held on a device during the step, by the rules of this module."""
    slots = plan.ops
    out: list[Lifetime] = []
    for v in graph.inputs:
        for d in sorted({slots[u.name].device for u in v.users() if u.name in slots}):
            out.append(Lifetime(d, 0.0, STEP_END, v.type.nbytes, f"input %{v.name}"))
    sent: dict[str, dict[str, tuple[float, float, int]]] = defaultdict(dict)  # op -> device -> transfer
    for t in plan.transfers:
        sent[t.src][t.to] = (t.start, t.end, t.nbytes)
    outputs = {id(v) for v in graph.outputs}
    for op in graph.ops:
        slot = slots.get(op.name)
        if slot is None:
            continue
        d = slot.device
        if op_memory(op):
            out.append(Lifetime(d, 0.0, STEP_END, op_memory(op), f"resident of '{op.name}'"))
        if workspace_bytes(op):
            out.append(Lifetime(d, slot.start, slot.end, workspace_bytes(op), f"workspace of '{op.name}'"))
        copies = sent.get(op.name, {})
        released = {id(r): _release(r, d, slot.end, slots, copies, outputs) for r in op.results}
        if "activation" in op.attrs:
            end = max(released.values(), default=slot.end)
            out.append(Lifetime(d, slot.start, end, output_bytes(op), f"output of '{op.name}'"))
        else:
            out.extend(Lifetime(d, slot.start, released[id(r)], r.type.nbytes, f"%{r.name}") for r in op.results)
        for dst, (start, end, nbytes) in copies.items():
            readers_end = max((slots[u.name].end for r in op.results for u in r.users()
                               if u.name in slots and slots[u.name].device == dst), default=end)
            out.append(Lifetime(dst, start, max(end, readers_end), nbytes, f"copy of '{op.name}' from {d}"))
    return [lt for lt in out if lt.nbytes > 0 and lt.end > lt.start]


def _release(r: Value, device: str, op_end: float, slots: Mapping[str, OpSlot],
             copies: dict[str, tuple[float, float, int]], outputs: set[int]) -> float:
    """When result `r` of an op on `device` may be freed there."""
    if id(r) in outputs:
        return STEP_END
    end = op_end
    for u in r.users():
        s = slots.get(u.name)
        if s is None:
            continue
        if s.device == device:
            end = max(end, s.end)
        elif s.device in copies:
            end = max(end, copies[s.device][1])
    return end


def _sweep(spans: Iterable[Lifetime]) -> list[tuple[float, int]]:
    """(time, bytes held from then on) at each instant the sum changes; frees before allocations."""
    events: list[tuple[float, int, int]] = []
    for lt in spans:
        events.append((lt.start, 1, lt.nbytes))
        if lt.end != STEP_END:
            events.append((lt.end, 0, -lt.nbytes))
    events.sort()
    steps: list[tuple[float, int]] = []
    live = 0
    for t, _, delta in events:
        live += delta
        if steps and steps[-1][0] == t:
            steps[-1] = (t, live)
        else:
            steps.append((t, live))
    return steps


def live_bytes(graph: Graph, plan: Plan) -> dict[str, list[tuple[float, int]]]:
    """Per device, the step function of bytes held: (time, bytes from then on), times ascending."""
    per_device: dict[str, list[Lifetime]] = {d: [] for d in plan.devices}
    for lt in lifetimes(graph, plan):
        per_device.setdefault(lt.device, []).append(lt)
    return {d: _sweep(spans) for d, spans in per_device.items()}


def peak_memory(graph: Graph, plan: Plan) -> dict[str, DevicePeak]:
    """Each device's peak, when it is first reached and what is alive then."""
    per_device: dict[str, list[Lifetime]] = {d: [] for d in plan.devices}
    for lt in lifetimes(graph, plan):
        per_device.setdefault(lt.device, []).append(lt)
    peaks: dict[str, DevicePeak] = {}
    for d, spans in per_device.items():
        nbytes, at = 0, 0.0
        for t, live in _sweep(spans):
            if live > nbytes:
                nbytes, at = live, t
        alive = sorted((lt for lt in spans if lt.start <= at < lt.end), key=lambda lt: (-lt.nbytes, lt.what))
        peaks[d] = DevicePeak(d, nbytes, at, tuple(alive) if nbytes else ())
    return peaks


def fits_memory(graph: Graph, plan: Plan, capacity: Mapping[str, float]) -> bool:
    """Whether no device's peak passes its `capacity` (bytes by device name): what a search that
    re-times a plan checks before it keeps it, beside the validator's other rules that the
    simulator keeps by construction."""
    return all(p.nbytes <= capacity[d] for d, p in peak_memory(graph, plan).items())
