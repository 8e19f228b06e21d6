"""The dispatch program of a placed graph: segments, transfers and where every input lives.

Both executable backends (`backends/jax.py`, `backends/python_emit.py`) run a placed graph the
same way, decided here without touching JAX:

* **Dispatch order.** Ops are taken in one global order: by the plan's start time, ties by graph
  position, through a topological sort (so a zero-length op never comes before its producer).
  On each device this is the plan's own order.
* **Segments.** A segment is a run of consecutive ops of one device, compiled as one program.
  Each device keeps one open segment and ops join the open segment of their device. A segment is
  closed (dispatched) only when an op on another device needs one of its results; then every open
  segment depends only on dispatched ones, so the segments are dispatched in a valid order and
  each device runs its ops in plan order. Segments still open at the end close in the order of
  their first op. Segments whose results nobody reads are dead code and are dropped.
* **Operand-free ops** (`constant`, `iota`, ...) that are not graph outputs are recomputed in
  every segment that reads them (XLA folds them): they cut no segment and never cross a link.
  This departs from the plan's transfers for those ops only, and only by removing transfers.
* **Transfers.** A value read on another device than the one that computed it moves there once
  per destination device (what the plan's transfers and `pesto_ir.schedule.simulate.transfer_bytes` say),
  right after the segment that computes it is dispatched.
* **Graph inputs** are not ops of the plan. Each lives on the device of its first reader in
  dispatch order (its *home*); other devices that read it get a copy at the start of a step. An
  input nobody reads lives on the device of the output it is returned as, else the first device.
* **State.** `state_map` says which outputs are the next value of which inputs (new parameters,
  new optimizer state). Such an output is delivered on its input's home device, so the next step
  finds it there and a training loop moves no weights. Without a map, `infer_state_map` pairs each
  `param` input, in order, with the next output of the same type.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field

from pesto_ir.ir.graph import Graph, Op, Value, infer_state_map
from pesto_ir.schedule.plan import read_plan_attrs
from pesto_ir.util.errors import PestoError


class ScheduleError(PestoError):
    """The graph cannot be run as placed (not placed, or placed on devices the plan lacks)."""


@dataclass(frozen=True, eq=False)
class Segment:
    """Ops of one device run as one compiled program, and the values it reads and produces."""

    index: int
    device: str
    ops: tuple[Op, ...]  # recomputed operand-free ops first, then the plan's order
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    recomputed: int = 0  # how many of `ops` are copies of operand-free ops placed elsewhere

    @property
    def planned_ops(self) -> tuple[Op, ...]:
        """The ops the plan put in this segment, in plan order."""
        return self.ops[self.recomputed:]

    @property
    def name(self) -> str:
        return f"seg{self.index}_{self.device}"


@dataclass(frozen=True, eq=False)
class Move:
    """One value copied from one device to another (`src_op` is None for a graph input)."""

    value: Value
    src: str
    dst: str

    @property
    def src_op(self) -> str | None:
        return self.value.owner.name if self.value.owner is not None else None


@dataclass
class Schedule:
    graph: Graph
    devices: tuple[str, ...]  # the plan's device names, in order
    segments: list[Segment]  # in dispatch order
    input_home: dict[Value, str]
    input_moves: list[Move]  # copies of inputs to their other readers' devices, at the step's start
    moves_after: list[list[Move]]  # per segment: transfers issued right after it is dispatched
    outputs: list[tuple[Value, str]]  # per graph output: the value and the device it is delivered on
    state_map: dict[int, int] = field(default_factory=dict)

    @property
    def moves(self) -> list[Move]:
        return [*self.input_moves, *(m for ms in self.moves_after for m in ms)]

    def device_of(self, value: Value) -> str:
        """Where a value is first available: its producer's device, or an input's home."""
        return self.input_home[value] if value.owner is None else str(value.owner.get("device"))


# ---------------------------------------------------------------- building the schedule

def schedule(graph: Graph, state_map: Mapping[int, int] | None = None) -> Schedule:
    """The dispatch program of a placed graph (see the module docstring for the rules)."""
    devices = _plan_devices(graph)
    smap = dict(infer_state_map(graph) if state_map is None else state_map)
    _check_state_map(graph, smap)
    remat = _recomputed_ops(graph)
    order = [op for op in dispatch_order(graph) if id(op) not in remat]
    groups = _segment_ops(order)
    segments = _make_segments(graph, groups, remat)
    home = _input_homes(graph, order, smap, devices)
    placed = _Placed(home)
    input_moves: list[Move] = []
    moves_after: list[list[Move]] = [[] for _ in segments]
    producer_segment = {id(v): s.index for s in segments for v in s.outputs}
    for s in segments:
        for v in s.inputs:
            placed.need(v, s.device, input_moves, moves_after, producer_segment)
    outputs: list[tuple[Value, str]] = []
    for k, v in enumerate(graph.outputs):
        where = home[graph.inputs[smap[k]]] if k in smap else placed.source(v)
        placed.need(v, where, input_moves, moves_after, producer_segment)
        outputs.append((v, where))
    return Schedule(graph, devices, segments, home, input_moves, moves_after, outputs, smap)


def _plan_devices(graph: Graph) -> tuple[str, ...]:
    plan = read_plan_attrs(graph)
    if plan is None:
        raise ScheduleError(f"graph @{graph.name} is not placed: run place (and expand) before building it")
    names = tuple(plan.devices)
    unplaced = [op for op in graph.ops if "device" not in op.attrs]
    if unplaced:
        op = unplaced[0]
        raise ScheduleError(f"{len(unplaced)} op(s) of @{graph.name} have no device, e.g. '{op.name}' "
                            f"({op.where()}): run place (and expand) on the whole graph")
    stray = sorted({str(op.get("device")) for op in graph.ops} - set(names))
    if stray:
        raise ScheduleError(f"ops of @{graph.name} are placed on {', '.join(stray)}, which the plan's "
                            f"devices ({', '.join(names)}) do not include")
    return names


def dispatch_order(graph: Graph) -> list[Op]:
    """Every op once, producers first, by (plan start time, graph position)."""
    position = {id(op): i for i, op in enumerate(graph.ops)}

    def key(op: Op) -> tuple[float, int]:
        return float(op.get("start", 0.0)), position[id(op)]

    waiting = {id(op): len(op.producers()) for op in graph.ops}
    ready = [(key(op), position[id(op)], op) for op in graph.ops if waiting[id(op)] == 0]
    heapq.heapify(ready)
    out: list[Op] = []
    while ready:
        _, _, op = heapq.heappop(ready)
        out.append(op)
        for c in op.consumers():
            waiting[id(c)] -= 1
            if waiting[id(c)] == 0:
                heapq.heappush(ready, (key(c), position[id(c)], c))
    if len(out) != len(graph.ops):
        raise ScheduleError(f"graph @{graph.name} has a cycle")
    return out


def _recomputed_ops(graph: Graph) -> dict[int, Op]:
    """Operand-free ops that are not graph outputs: copied into each segment that reads them."""
    outputs = {id(v) for v in graph.outputs}
    return {id(op): op for op in graph.ops
            if not op.operands and op.results and not any(id(r) in outputs for r in op.results)}


class _Open:
    """The segment a device is filling."""

    __slots__ = ("device", "ops", "closed")

    def __init__(self, device: str) -> None:
        self.device = device
        self.ops: list[Op] = []
        self.closed = False


def _segment_ops(order: list[Op]) -> list[tuple[str, list[Op]]]:
    """Lazy closing: a device's open segment is dispatched when another device needs its result."""
    open_: dict[str, _Open] = {}
    bucket: dict[int, _Open] = {}
    closed: list[_Open] = []

    def close(b: _Open) -> None:
        b.closed = True
        closed.append(b)
        del open_[b.device]

    for op in order:
        device = str(op.get("device"))
        for p in op.producers():
            b = bucket.get(id(p))
            if b is not None and not b.closed and b.device != device:
                close(b)
        b = open_.get(device)
        if b is None:
            b = open_[device] = _Open(device)
        b.ops.append(op)
        bucket[id(op)] = b
    first = {id(op): i for i, op in enumerate(order)}
    for b in sorted(open_.values(), key=lambda b: first[id(b.ops[0])]):
        closed.append(b)
    return [(b.device, b.ops) for b in closed]


def _make_segments(graph: Graph, groups: list[tuple[str, list[Op]]], remat: dict[int, Op]) -> list[Segment]:
    """Inputs and outputs of each group; groups nobody reads from are dropped."""
    segment_of = {id(op): i for i, (_, ops) in enumerate(groups) for op in ops}
    graph_outputs = {id(v) for v in graph.outputs}
    position = {id(op): i for i, op in enumerate(graph.ops)}
    segments: list[Segment] = []
    for i, (device, ops) in enumerate(groups):
        inside = {id(op) for op in ops}
        inputs: dict[int, Value] = {}
        copied: dict[int, Op] = {}
        for op in ops:
            for v in op.operands:
                if v.owner is not None and id(v.owner) in remat:
                    copied.setdefault(id(v.owner), v.owner)
                elif v.owner is None or id(v.owner) not in inside:
                    inputs.setdefault(id(v), v)
        outputs = [r for op in ops for r in op.results
                   if id(r) in graph_outputs or any(segment_of.get(id(u)) != i for u, _ in r.uses)]
        if not outputs:
            continue
        head = sorted(copied.values(), key=lambda op: position[id(op)])
        segments.append(Segment(len(segments), device, (*head, *ops), tuple(inputs.values()), tuple(outputs),
                                len(head)))
    return segments


def _input_homes(graph: Graph, order: list[Op], smap: Mapping[int, int],
                 devices: tuple[str, ...]) -> dict[Value, str]:
    """Each input's device: its first reader's in dispatch order (see the module docstring)."""
    home: dict[Value, str] = {}
    for op in order:
        for v in op.operands:
            if v.owner is None:
                home.setdefault(v, str(op.get("device")))
    for k, v in enumerate(graph.outputs):  # unread inputs: where the output they become is made
        i = smap.get(k)
        for unread in (graph.inputs[i] if i is not None else None, v if v.owner is None else None):
            if unread is not None and unread not in home:
                home[unread] = str(v.owner.get("device")) if v.owner is not None else devices[0]
    for v in graph.inputs:
        home.setdefault(v, devices[0])
    return home


class _Placed:
    """Where each value already is; adds one move per value and destination device."""

    def __init__(self, home: Mapping[Value, str]) -> None:
        self.home = home
        self.at: dict[int, set[str]] = {}

    def source(self, v: Value) -> str:
        return self.home[v] if v.owner is None else str(v.owner.get("device"))

    def need(self, v: Value, device: str, input_moves: list[Move], moves_after: list[list[Move]],
             producer_segment: Mapping[int, int]) -> None:
        where = self.at.setdefault(id(v), {self.source(v)})
        if device in where:
            return
        where.add(device)
        move = Move(v, self.source(v), device)
        if v.owner is None:
            input_moves.append(move)
        else:
            moves_after[producer_segment[id(v)]].append(move)


def segment_graph(graph: Graph, segment: Segment) -> Graph:
    """A segment as a graph of its own: its inputs, copies of its ops, its outputs (same names)."""
    sub = Graph(f"{graph.name}.{segment.name}")
    env: dict[int, Value] = {id(v): sub.add_input(v.name, v.type, param=v.param) for v in segment.inputs}
    for op in segment.ops:
        copy = Op(op.name, op.opcode, [env[id(v)] for v in op.operands], [r.type for r in op.results],
                  op.attrs, [r.name for r in op.results], op.loc)
        sub.append(copy)
        env.update((id(r), c) for r, c in zip(op.results, copy.results))
    sub.set_outputs(env[id(v)] for v in segment.outputs)
    return sub


# ---------------------------------------------------------------- state

def _check_state_map(graph: Graph, smap: Mapping[int, int]) -> None:
    for k, i in smap.items():
        if not (0 <= k < len(graph.outputs) and 0 <= i < len(graph.inputs)):
            raise ScheduleError(f"state map entry output {k} -> input {i} is out of range for @{graph.name} "
                                f"({len(graph.outputs)} outputs, {len(graph.inputs)} inputs)")
        if graph.outputs[k].type != graph.inputs[i].type:
            raise ScheduleError(f"state map entry output {k} -> input {i}: output %{graph.outputs[k].name} is "
                                f"{graph.outputs[k].type} but input %{graph.inputs[i].name} is {graph.inputs[i].type}")


__all__ = ["Move", "Schedule", "ScheduleError", "Segment", "dispatch_order", "infer_state_map", "schedule",
           "segment_graph"]
