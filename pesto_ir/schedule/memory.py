"""Memory as the schedule uses it: the bytes each device holds over one step, from tensor lifetimes.

On the device that runs it, an op of a placed, timed plan holds
- `memory`, its resident bytes (parameters, optimizer state, what a cost graph declares), for the
  whole step;
- its output from its start until it is released: when its last reader on that device has ended,
  its transfers from there have ended and, for a graph output, when the step ends (a result nobody
  reads lives while its op runs). The output is the op's result tensors, or the `activation`
  attribute where one is given (cost graphs, whose `blob` results only size the edges);
- `workspace`, scratch bytes (the internal tensors of a coarse group), while it runs.
A graph input is an argument of the step: held from the step's start on every device that reads
it, for the whole step, unless the caller donates it (`ir.graph.donated_inputs`, as `jax.jit`'s
`donate_argnums`): a donated input is freed on a device when its last reader there has ended, so
a training step that donates its parameters and optimizer state holds each old value and its
update's new one at once only while that update runs, not from the update to the step's end.
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
from collections.abc import Mapping
from dataclasses import dataclass

from pesto_ir.cost.lookup import op_memory
from pesto_ir.ir.attributes import Attr
from pesto_ir.ir.graph import Graph, Op, Value, donated_inputs
from pesto_ir.schedule.plan import OpSlot, Plan
from pesto_ir.util import work
from pesto_ir.util.units import human_bytes, human_time

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

_OpBytes = tuple[str, int, int, int | None, tuple[tuple[str, int, bool, tuple[str, ...]], ...]]
# (name, resident bytes, workspace bytes, the `activation` attribute's bytes (the whole output as one
# tensor) or None, its results as (name, bytes, a graph output, readers))


class GraphBytes:
    """What the lifetimes of any plan of `graph` are made of (each op's resident, workspace and
    output bytes, its results' readers): a search that checks the memory of many plans of one
    graph prepares it once (`simulate.Prepared.memory`)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        donated = donated_inputs(graph)
        outputs = {id(v) for v in graph.outputs}
        # a donated input the step returns as it is stays held: it is the output's buffer
        self.inputs = [(v.name, v.type.nbytes, reader_names(v), v.name in donated and id(v) not in outputs)
                       for v in graph.inputs]
        self.ops: list[_OpBytes] = []
        for op in graph.ops:
            attrs = op.attrs
            results = tuple([(r.name, r.type.nbytes, id(r) in outputs, reader_names(r)) for r in op.results])
            activation = output_bytes(op) if "activation" in attrs else None
            # op_memory(op), workspace_bytes(op), read off the attributes at once (50,000 ops, six times a compile)
            self.ops.append((op.name, _whole(attrs.get("memory")), _whole(attrs.get("workspace")), activation, results))

    def of(self, graph: Graph) -> GraphBytes:
        """Itself, if prepared for `graph`."""
        if graph is not self.graph:
            raise ValueError(f"memory prepared for another graph than graph '{graph.name}'")
        return self


def _whole(a: Attr | None) -> int:
    """The bytes attribute `a` holds (`op_memory`, `workspace_bytes`): 0 where absent or null."""
    return 0 if a is None else int(a.value or 0)


def reader_names(v: Value) -> tuple[str, ...]:
    """The names of the ops that read `v` (`Value.users`)."""
    uses = v.uses
    if not uses:
        return ()
    if len(uses) == 1:
        return (uses[0][0].name,)
    return tuple([u.name for u in v.users()])


Interval = tuple[str, float, float, int, str]  # a `Lifetime`'s fields


def _intervals(graph: GraphBytes, plan: Plan, named: bool) -> list[Interval]:
    """Every interval of bytes held on a device during the step, by the rules of this module, as
    `Lifetime` fields, their `what` left empty unless `named` (checks need only bytes)."""
    work.charge("memory", len(plan.ops))
    slots = plan.ops
    out: list[Interval] = []
    add = out.append
    for name, nbytes, readers, donated in graph.inputs:
        last_read: dict[str, float] = {}  # device -> when its last reader ends
        for u in readers:
            s = slots.get(u)
            if s is not None and s.end > last_read.get(s.device, -1.0):
                last_read[s.device] = s.end
        for d in sorted(last_read):
            add((d, 0.0, last_read[d] if donated else STEP_END, nbytes, f"input %{name}" if named else ""))
    sent: dict[str, dict[str, tuple[float, float, int]]] = defaultdict(dict)  # op -> device -> transfer
    for t in plan.transfers:
        sent[t.src][t.to] = (t.start, t.end, t.nbytes)
    nothing_sent: dict[str, tuple[float, float, int]] = {}
    for op, resident, workspace, activation, results in graph.ops:
        slot = slots.get(op)
        if slot is None:
            continue
        d, start, end = slot.device, slot.start, slot.end
        if resident:
            add((d, 0.0, STEP_END, resident, f"resident of '{op}'" if named else ""))
        if workspace:
            add((d, start, end, workspace, f"workspace of '{op}'" if named else ""))
        copies = sent.get(op, nothing_sent)
        if activation is not None:
            released = [STEP_END if is_output else _release(readers, d, end, slots, copies)
                        for _, _, is_output, readers in results]
            add((d, start, max(released, default=end), activation, f"output of '{op}'" if named else ""))
        else:
            for name, nbytes, is_output, readers in results:
                free = STEP_END if is_output else (_release(readers, d, end, slots, copies) if readers else end)
                add((d, start, free, nbytes, f"%{name}" if named else ""))
        if copies:
            last_read = _last_reads(results, slots, copies)
            for dst, (sent_at, arrived, nbytes) in copies.items():
                add((dst, sent_at, max(arrived, last_read.get(dst, arrived)), nbytes,
                     f"copy of '{op}' from {d}" if named else ""))
    return [held for held in out if held[3] > 0 and held[2] > held[1]]


def _release(readers: tuple[str, ...], device: str, op_end: float, slots: Mapping[str, OpSlot],
             copies: dict[str, tuple[float, float, int]]) -> float:
    """When a result of an op on `device`, read by `readers`, may be freed there."""
    end = op_end
    for u in readers:
        s = slots.get(u)
        if s is None:
            continue
        if s.device == device:
            end = max(end, s.end)
        elif s.device in copies:
            end = max(end, copies[s.device][1])
    return end


def _last_reads(results: tuple[tuple[str, int, bool, tuple[str, ...]], ...], slots: Mapping[str, OpSlot],
                copies: dict[str, tuple[float, float, int]]) -> dict[str, float]:
    """Per device an op's results are copied to, the latest end of the ops there that read them
    (the first such end, as max() picks it, over results then readers): one pass over the readers
    for every device, where asking per device passed over all of them (a star's 50,000) each time."""
    last: dict[str, float] = {}
    for _, _, _, readers in results:
        for u in readers:
            s = slots.get(u)
            if s is not None and s.device in copies:
                before = last.get(s.device)
                if before is None or s.end > before:
                    last[s.device] = s.end
    return last


def _sweep(spans: list[Interval]) -> list[tuple[float, int]]:
    """(time, bytes held from then on) at each instant the sum of the spans' bytes changes; frees
    before allocations."""
    events = [(start, 1, nbytes) for _, start, _, nbytes, _ in spans]
    events += [(end, 0, -nbytes) for _, _, end, nbytes, _ in spans if end != STEP_END]
    events.sort()
    steps: list[tuple[float, int]] = []
    live = 0
    last = None  # the time of the last step
    for t, _, delta in events:
        live += delta
        if t == last:
            steps[-1] = (t, live)
        else:
            steps.append((t, live))
            last = t
    return steps


def _peak(spans: list[Interval]) -> tuple[int, float]:
    """The most bytes `spans` hold at once (0 if none) and the first instant they do."""
    nbytes, at = 0, 0.0
    for t, live in _sweep(spans):
        if live > nbytes:
            nbytes, at = live, t
    return nbytes, at


def _per_device(plan: Plan, held: list[Interval]) -> dict[str, list[Interval]]:
    """`held` by device: every device of the plan, those that hold nothing too."""
    out: dict[str, list[Interval]] = {d: [] for d in plan.devices}
    for h in held:
        spans = out.get(h[0])
        if spans is None:
            out[h[0]] = spans = []
        spans.append(h)
    return out


def live_bytes(graph: Graph, plan: Plan) -> dict[str, list[tuple[float, int]]]:
    """Per device, the step function of bytes held: (time, bytes from then on), times ascending."""
    per_device = _per_device(plan, _intervals(GraphBytes(graph), plan, False))
    return {d: _sweep(spans) for d, spans in per_device.items()}


def lifetimes(graph: Graph, plan: Plan) -> list[Lifetime]:
    """Every interval of bytes the plan holds on a device, named (`Lifetime.what`)."""
    return [Lifetime(*h) for h in _intervals(GraphBytes(graph), plan, True)]


def peak_memory(graph: Graph, plan: Plan) -> dict[str, DevicePeak]:
    """Each device's peak, when it is first reached and what is alive then."""
    peaks: dict[str, DevicePeak] = {}
    for d, spans in _per_device(plan, _intervals(GraphBytes(graph), plan, True)).items():
        nbytes, at = _peak(spans)
        alive = sorted([h for h in spans if h[1] <= at < h[2]], key=lambda h: (-h[3], h[4])) if nbytes else []
        peaks[d] = DevicePeak(d, nbytes, at, tuple([Lifetime(*h) for h in alive]))
    return peaks


def peak_bytes(graph: Graph, plan: Plan, prepared: GraphBytes | None = None) -> dict[str, tuple[int, float]]:
    """Each device's peak `peak_memory` gives, as (bytes, when first reached), without naming
    what is alive then: what checks and summaries read, at a fraction of the cost (no names, no
    `Lifetime` per tensor alive at the peak). `prepared`: `GraphBytes(graph)`, where the caller has it."""
    held = _intervals(prepared.of(graph) if prepared else GraphBytes(graph), plan, False)
    return {d: _peak(spans) for d, spans in _per_device(plan, held).items()}


def fits_memory(graph: Graph, plan: Plan, capacity: Mapping[str, float], prepared: GraphBytes | None = None) -> bool:
    """Whether no device's peak passes its `capacity` (bytes by device name): what a search that
    re-times a plan checks before it keeps it, beside the validator's other rules that the
    simulator keeps by construction (`prepared`: `GraphBytes(graph)`, where the caller has it)."""
    held = _intervals(prepared.of(graph) if prepared else GraphBytes(graph), plan, False)
    return all(max((live for _, live in _sweep(spans)), default=0) <= capacity[d]
               for d, spans in _per_device(plan, held).items())
