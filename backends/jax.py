"""Run a placed graph across JAX devices: `build(placed_graph, devices) -> Executable`.

The dispatch program comes from `backends/schedule.py` (segments, transfers, where inputs live);
this module turns it into JAX calls:

* each segment becomes a sub-graph, made a function by the reference interpreter (`as_function`)
  and jitted with its inputs and outputs pinned to its device; it is compiled when the executable
  is built, so errors surface there and the first step is not slower than the others;
* each transfer is one `jax.device_put` of one array to one device;
* a call runs the program from Python without ever waiting on a device: JAX dispatches
  asynchronously, so devices run their segments concurrently and the step's only synchronisation
  is the caller's when it reads a result;
* inputs already on their home device are used as they are (a training loop feeding back the
  new parameters, which come back on their inputs' home devices, moves no weights); others are
  converted like `jax.jit` converts them and copied there;
* closed-over constants (`constants`, the trailing inputs of a lowered function) are placed once,
  on every device that reads them, when the executable is built;
* a buffer is donated to the segment that reads it last when the executable owns it (a result or
  a copy made in the step, or an input the caller listed in `donate`), it is not a result of the
  step, and the segment has a result of the same shape and dtype to reuse it for (the caller's
  donated inputs are matched first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from pesto_ir.backends.schedule import Move, Schedule, ScheduleError, Segment, schedule, segment_graph
from pesto_ir.errors import PestoError
from pesto_ir.interpreter import as_function, check_single_replica
from pesto_ir.ir import Graph, Value
from pesto_ir.jax_params import jax_dtype
from pesto_ir.types import TensorType

DeviceSpec = Sequence[Any] | Mapping[str, Any]
Gather = Callable[[Mapping[int, Any]], tuple[Any, ...]]
Instr = tuple[Callable[..., Sequence[Any]], Gather, tuple[int, ...]]  # (function, its arguments, results)


class BackendError(PestoError):
    """The placed graph cannot run on the given JAX devices."""


def build(placed_graph: Graph, devices: DeviceSpec, *, constants: Sequence[Any] = (),
          state_map: Mapping[int, int] | None = None, donate: Iterable[int] = (),
          compiler_options: Mapping[str, Any] | None = None) -> Executable:
    """An executable running `placed_graph` on `devices` (a list in the plan's device order, or a dict
    from plan device name to JAX device).

    `constants` are the values of the graph's last `len(constants)` inputs (a lowered function's
    closed-over arrays), fixed for every call. `state_map` maps an output index to the input index it
    is the next value of (see `schedule.infer_state_map` for the default). `donate` lists input
    indices whose arrays the caller gives up, like `jax.jit`'s `donate_argnums`. `compiler_options`
    go to XLA for every segment (as `jax.jit`'s). It runs one replica: a graph that all-reduces
    across data-parallel replicas is refused (`BackendError`).
    """
    try:
        check_single_replica(placed_graph)
    except PestoError as e:
        raise BackendError(str(e)) from None
    sched = schedule(placed_graph, state_map)
    return Executable(sched, resolve_devices(sched.devices, devices), constants, frozenset(donate),
                      dict(compiler_options or {}))


def resolve_devices(names: Sequence[str], devices: DeviceSpec) -> dict[str, Any]:
    """Plan device name -> JAX device."""
    if isinstance(devices, Mapping):
        missing = [n for n in names if n not in devices]
        if missing:
            raise BackendError(f"no JAX device given for plan device(s) {', '.join(missing)} "
                               f"(given: {', '.join(map(str, devices))})")
        return {n: devices[n] for n in names}
    devices = list(devices)
    if len(devices) != len(names):
        raise BackendError(f"the plan has {len(names)} device(s) ({', '.join(names)}) but {len(devices)} JAX "
                           "device(s) were given; pass one per plan device, in order, or a dict by name")
    if len({id(d) for d in devices}) != len(devices):
        raise BackendError(f"the same JAX device is given twice in {devices}")
    return dict(zip(names, devices))


@dataclass(frozen=True)
class CompiledSegment:
    segment: Segment
    device: Any  # the JAX device
    graph: Graph  # the segment as a graph of its own
    fn: Callable[..., Sequence[Any]]  # jitted, pinned to the device
    donated: tuple[int, ...]  # argument positions whose buffers it reuses


class _Registers:
    """One slot per (value, device): where a step keeps the array of a value on a device."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, str], int] = {}
        self.names: list[tuple[str, str]] = []
        self.specs: list[jax.ShapeDtypeStruct | None] = []

    def __call__(self, v: Value, device: str) -> int:
        key = (id(v), device)
        r = self.index.get(key)
        if r is None:
            r = self.index[key] = len(self.names)
            self.names.append((v.name, device))
            self.specs.append(None)
        return r


class Executable:
    """A placed graph compiled into per-device segments. Call it with the graph's (non-constant)
    inputs, flat and in order; it returns the graph's outputs as a list of arrays."""

    def __init__(self, sched: Schedule, devices: Mapping[str, Any], constants: Sequence[Any],
                 donate: frozenset[int] = frozenset(), compiler_options: Mapping[str, Any] | None = None) -> None:
        graph = sched.graph
        if len(constants) > len(graph.inputs):
            raise BackendError(f"{len(constants)} constants given for a graph of {len(graph.inputs)} inputs")
        self.schedule = sched
        self.devices = dict(devices)
        self.num_inputs = len(graph.inputs) - len(constants)
        self._compiler_options = dict(compiler_options) if compiler_options else None
        self._sharding = {n: SingleDeviceSharding(d) for n, d in self.devices.items()}
        self._regs = _Registers()
        for v in graph.inputs:
            r = self._regs(v, sched.input_home[v])
            self._regs.specs[r] = _spec(v, self._sharding[sched.input_home[v]])
        self._inputs = [(self._regs(v, sched.input_home[v]), self._sharding[sched.input_home[v]],
                         jax_dtype(v.type.dtype)) for v in graph.inputs[:self.num_inputs]]
        self._resident = self._place_constants(graph.inputs[self.num_inputs:], constants)
        self.outputs = [self._regs(v, d) for v, d in sched.outputs]
        steps = self._steps()
        self._moves = [item for kind, item, _, _ in steps if kind == "move"]
        self._order = [item for _, item, _, _ in steps]
        owned = self._owned(donate)
        self.segments: list[CompiledSegment] = []
        self._program: list[Instr] = []
        self._program_args: list[tuple[int, ...]] = []
        last = _last_uses(steps)
        for n, (kind, item, args, outs) in enumerate(steps):
            if kind == "segment":
                donated = _donatable(item, args, n, last, owned, self.outputs)
                fn = self._compile(item, args, outs, donated)
            else:
                fn = _mover(self._sharding[item.dst])
                self._regs.specs[outs[0]] = _moved(self._regs.specs[args[0]], self._sharding[item.dst])
            self._program.append((fn, _gather(args), outs))
            self._program_args.append(args)
        self._input_regs = [r for r, _, _ in self._inputs]
        self._input_shardings = [s for _, s, _ in self._inputs]
        self._outputs = _gather(tuple(self.outputs))
        self._direct = self._direct_call()

    # ---------------------------------------------------------------- building
    def _place_constants(self, values: Sequence[Value], constants: Sequence[Any]) -> dict[int, Any]:
        """Constants on their home device and on every other device that reads them, once."""
        sched = self.schedule
        resident: dict[int, Any] = {}
        for v, x in zip(values, constants):
            home = sched.input_home[v]
            resident[self._regs(v, home)] = jax.device_put(_converted(x, jax_dtype(v.type.dtype), v),
                                                           self._sharding[home])
        for m in sched.input_moves:
            src = self._regs(m.value, m.src)
            if src in resident:
                dst = self._regs(m.value, m.dst)
                resident[dst] = jax.device_put(resident[src], self._sharding[m.dst])
                self._regs.specs[dst] = _spec(m.value, self._sharding[m.dst])
        return resident

    def _steps(self) -> list[tuple[str, Any, tuple[int, ...], tuple[int, ...]]]:
        """(kind, segment or move, argument registers, result registers) in dispatch order."""
        sched, reg = self.schedule, self._regs
        steps: list[tuple[str, Any, tuple[int, ...], tuple[int, ...]]] = []

        def move(m: Move) -> None:
            steps.append(("move", m, (reg(m.value, m.src),), (reg(m.value, m.dst),)))

        for m in sched.input_moves:
            if reg(m.value, m.dst) not in self._resident:
                move(m)
        for seg, moves in zip(sched.segments, sched.moves_after):
            steps.append(("segment", seg, tuple(reg(v, seg.device) for v in seg.inputs),
                          tuple(reg(v, seg.device) for v in seg.outputs)))
            for m in moves:
                move(m)
        return steps

    def _owned(self, donate: frozenset[int]) -> set[int]:
        """Registers whose buffers the executable may reuse: all but the caller's inputs not donated."""
        graph, home = self.schedule.graph, self.schedule.input_home
        bad = sorted(i for i in donate if not 0 <= i < self.num_inputs)
        if bad:
            raise BackendError(f"donated input index(es) {bad} out of range for {self.num_inputs} input(s)")
        kept = {self._regs(v, home[v]) for i, v in enumerate(graph.inputs) if i not in donate}
        return set(range(len(self._regs.names))) - kept - set(self._resident)

    def _compile(self, seg: Segment, args: tuple[int, ...], outs: tuple[int, ...],
                 donated: tuple[int, ...]) -> Callable[..., Sequence[Any]]:
        sharding = self._sharding[seg.device]
        sub = segment_graph(self.schedule.graph, seg)
        fn = jax.jit(as_function(sub), in_shardings=tuple(sharding for _ in args), out_shardings=sharding,
                     donate_argnums=donated, compiler_options=self._compiler_options)
        specs = [self._regs.specs[r] for r in args]
        try:
            lowered = fn.lower(*specs)
            lowered.compile()
        except PestoError as e:
            raise BackendError(f"segment {seg.name} of @{self.schedule.graph.name}: {e}") from e
        for r, info in zip(outs, lowered.out_info):
            self._regs.specs[r] = jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sharding,
                                                       weak_type=getattr(info, "weak_type", False))
        self.segments.append(CompiledSegment(seg, self.devices[seg.device], sub, fn, donated))
        return fn

    # ---------------------------------------------------------------- running
    def __call__(self, *inputs: Any) -> list[Any]:
        if self._direct is not None:  # one segment, nothing else: call it on the inputs as they are
            fn, take_args, take_outs = self._direct
            return list(take_outs(fn(*take_args(self._placed(inputs)))))
        regs = self._load(inputs)
        for fn, gather, outs in self._program:
            regs.update(zip(outs, fn(*gather(regs))))
        return list(self._outputs(regs))

    def run_traced(self, *inputs: Any) -> tuple[list[Any], dict[tuple[str, str], Any]]:
        """The outputs, and the JAX device of every array the step placed, made or moved, keyed by
        (value name, plan device name) and read as it was made (before any donation); for tests."""
        regs = self._load(inputs)
        names = self._regs.names
        seen = {names[r]: _device(x) for r, x in regs.items()}
        for fn, gather, outs in self._program:
            results = list(fn(*gather(regs)))
            regs.update(zip(outs, results))
            seen.update((names[r], _device(x)) for r, x in zip(outs, results))
        return list(self._outputs(regs)), seen

    def _load(self, inputs: Sequence[Any]) -> dict[int, Any]:
        """Registers holding the resident constants, and the inputs on their home devices. Registers
        live in a dict: a step reads arguments and stores results with C-level itemgetter/update."""
        regs = dict(self._resident)
        regs.update(zip(self._input_regs, self._placed(inputs)))
        return regs

    def _placed(self, inputs: Sequence[Any]) -> Sequence[Any]:
        """The inputs, each on its home device (converted like jax.jit converts arguments)."""
        if len(inputs) != self.num_inputs:
            raise BackendError(f"@{self.schedule.graph.name} takes {self.num_inputs} input(s), got {len(inputs)}")
        # arrays this executable made carry its very sharding objects: the list test is then by identity
        if [getattr(x, "sharding", None) for x in inputs] == self._input_shardings:
            return inputs
        out = []
        for (_, sharding, dtype), x, v in zip(self._inputs, inputs, self.schedule.graph.inputs):
            placed = getattr(x, "sharding", None)
            if placed is not sharding and placed != sharding:
                x = jax.device_put(_converted(x, dtype, v), sharding)
            out.append(x)
        return out

    def _direct_call(self) -> tuple[Callable[..., Sequence[Any]], Gather, Gather] | None:
        """For a program of one segment and no constants or copies (a one-device plan): the segment
        and how to pick its arguments from the inputs and the outputs from its results."""
        if len(self._program) != 1 or self._resident or self._moves:
            return None
        fn, gather, outs = self._program[0]
        input_of = {r: i for i, r in enumerate(self._input_regs)}
        result_of = {r: j for j, r in enumerate(outs)}
        if not all(r in result_of for r in self.outputs):
            return None  # an input returned as it is
        return fn, _gather(tuple(input_of[r] for r in self._program_args[0])), \
            _gather(tuple(result_of[r] for r in self.outputs))

    # ---------------------------------------------------------------- facts
    @property
    def num_segments(self) -> int:
        return len(self.segments)

    @property
    def transfers(self) -> list[Move]:
        """The copies one step makes between devices (inputs to their other readers, then results)."""
        return list(self._moves)

    def input_devices(self) -> list[Any]:
        """The JAX device each (non-constant) input lives on."""
        return [next(iter(s.device_set)) for _, s, _ in self._inputs]

    def describe(self) -> str:
        """One line per segment and transfer, in dispatch order."""
        lines = []
        for item in self._order:
            if isinstance(item, Segment):
                ops = item.planned_ops
                lines.append(f"{item.name}: {len(ops)} ops on {item.device} ({ops[0].name} .. {ops[-1].name}), "
                             f"{len(item.inputs)} in, {len(item.outputs)} out")
            else:
                lines.append(f"  move %{item.value.name} {item.src} -> {item.dst}")
        return "\n".join(lines)


# ---------------------------------------------------------------- helpers

def _gather(regs: tuple[int, ...]) -> Gather:
    """A function reading these registers as a tuple (itemgetter, with its 0- and 1-item cases)."""
    if not regs:
        return lambda _: ()
    if len(regs) == 1:
        (r,) = regs
        return lambda m: (m[r],)
    return itemgetter(*regs)


def _converted(x: Any, dtype: Any, v: Value) -> Any:
    """`x` as an array of `dtype`, converted like jax.jit converts an argument. Typed PRNG keys
    exist only as JAX key arrays: anything else given for one is refused by name."""
    if isinstance(x, jax.Array):
        return x
    if isinstance(v.type, TensorType) and v.type.key_impl is not None:
        raise BackendError(f"input %{v.name} is {v.type}, got a {type(x).__name__}: pass a JAX key array "
                           f"(jax.random.key(seed, impl={v.type.key_impl!r}))")
    return np.asarray(x, dtype)


def _device(x: Any) -> Any:
    (device,) = x.devices()
    return device


def _spec(v: Value, sharding: SingleDeviceSharding) -> jax.ShapeDtypeStruct:
    if not isinstance(v.type, TensorType):
        raise BackendError(f"%{v.name} is {v.type}: a cost-only value has no array to compute with")
    return jax.ShapeDtypeStruct(v.type.shape, jax_dtype(v.type.dtype), sharding=sharding)


def _moved(spec: jax.ShapeDtypeStruct | None, sharding: SingleDeviceSharding) -> jax.ShapeDtypeStruct:
    assert spec is not None  # a move reads a register that an earlier step or an input filled
    return jax.ShapeDtypeStruct(spec.shape, spec.dtype, sharding=sharding, weak_type=spec.weak_type)


def _mover(sharding: SingleDeviceSharding) -> Callable[[Any], tuple[Any]]:
    def move(x: Any) -> tuple[Any]:
        return (jax.device_put(x, sharding),)

    return move


def _last_uses(steps: Sequence[tuple[str, Any, tuple[int, ...], tuple[int, ...]]]) -> dict[int, int]:
    last: dict[int, int] = {}
    for n, (_, _, args, _) in enumerate(steps):
        for r in args:
            last[r] = n
    return last


def _donatable(seg: Segment, args: tuple[int, ...], n: int, last: Mapping[int, int], owned: set[int],
               outputs: Sequence[int]) -> tuple[int, ...]:
    """Argument positions whose buffers this segment may reuse for a result of the same type."""
    if not seg.outputs:
        return ()
    free_results = [(v.type.shape, v.type.dtype) for v in seg.outputs if isinstance(v.type, TensorType)]
    keep = set(outputs)
    donated = []
    # the caller's donated inputs first: that is what they gave up, and what they expect to be reused
    for pos in sorted(range(len(args)), key=lambda p: seg.inputs[p].owner is not None):
        r = args[pos]
        if r not in owned or r in keep or last.get(r) != n or args.count(r) != 1:
            continue
        v = seg.inputs[pos]
        key = (v.type.shape, v.type.dtype) if isinstance(v.type, TensorType) else None
        if key in free_results:
            free_results.remove(key)
            donated.append(pos)
    return tuple(donated)


__all__ = ["BackendError", "CompiledSegment", "Executable", "ScheduleError", "build", "resolve_devices"]
