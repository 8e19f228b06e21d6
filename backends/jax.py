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

A plan with d > 1 data-parallel replicas runs each segment over the mesh of the devices that
mirror its device: `backends/jax_replicas.py` lays the replicas out.

Across processes, outputs that are the next value of an input (parameters, optimizer state) come
back as resident arrays on their devices (`pesto_ir/jaxrt/cross_process.py`); small other outputs
(losses, metrics: `EVERYWHERE_BYTES`) are replicated to a device of every process, so that every
process can read them as it would a `jax.jit` result; larger ones stay where they were made
(`backends/jax_outputs.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Protocol

import jax
import numpy as np
from jax.sharding import NamedSharding, Sharding, SingleDeviceSharding

from pesto_ir.backends.jax_outputs import replicated_outputs, resident_outputs, small_outputs, whole_here
from pesto_ir.backends.jax_replicas import BackendError, Replicas
from pesto_ir.backends.replica_runtime import REPLICA_AXIS, TENSOR_AXIS
from pesto_ir.backends.schedule import Move, Schedule, ScheduleError, Segment, schedule, segment_graph
from pesto_ir.distributed import is_multiprocess
from pesto_ir.ir.graph import Graph, Value
from pesto_ir.ir.types import TensorType
from pesto_ir.jaxrt import cross_process
from pesto_ir.jaxrt.interpreter import ACROSS_REPLICAS, as_function, one_replica
from pesto_ir.jaxrt.params import jax_dtype
from pesto_ir.schedule.plan import read_plan_attrs
from pesto_ir.util.errors import PestoError

DeviceSpec = Sequence[Any] | Mapping[str, Any]


class Indexed(Protocol):
    """What a gather reads registers from: a step's arrays by register, or one segment's results."""

    def __getitem__(self, key: int, /) -> Any: ...


Gather = Callable[[Indexed], tuple[Any, ...]]
Instr = tuple[Callable[..., Sequence[Any]], Gather, tuple[int, ...]]  # (function, its arguments, results)


def build(placed_graph: Graph, devices: DeviceSpec, *, constants: Sequence[Any] = (),
          state_map: Mapping[int, int] | None = None, donate: Iterable[int] = (),
          compiler_options: Mapping[str, Any] | None = None) -> Executable:
    """An executable running `placed_graph` on `devices` (a list in the plan's device order, or a dict
    from plan device name to JAX device).

    `constants` are the values of the graph's last `len(constants)` inputs (a lowered function's
    closed-over arrays), fixed for every call. `state_map` maps an output index to the input index it
    is the next value of (see `schedule.infer_state_map` for the default). `donate` lists input
    indices whose arrays the caller gives up, like `jax.jit`'s `donate_argnums`. `compiler_options`
    go to XLA for every segment (as `jax.jit`'s). A plan with data-parallel replicas runs every
    segment over the mesh of the devices that mirror its device (`Replicas`); a graph that
    all-reduces across replicas its plan does not have is refused (`BackendError`).
    """
    plan = read_plan_attrs(placed_graph)
    replicas = plan.parallelism.mirrors if plan is not None and plan.parallelism is not None else 1
    bad = next((op for op in placed_graph.ops if op.opcode in ACROSS_REPLICAS and not one_replica(op)), None)
    if replicas == 1 and bad is not None:
        what = "all-reduces" if bad.opcode == "all_reduce" else f"runs {bad.opcode}"
        raise BackendError(f"{bad.where()}: op '{bad.name}' {what} across {bad.get('replicas')} data-parallel "
                           "replicas, but the plan has no replicas to reduce across (place it with data-parallel > 1)")
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

    def spec(self, r: int) -> jax.ShapeDtypeStruct:
        """The abstract array of register `r` (set once what fills it is built)."""
        spec = self.specs[r]
        assert spec is not None, f"register {self.names[r]} has no array spec yet"
        return spec


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
        # how this executable came to run, when something chose it (parallelize's autotuning says so
        # here, and `describe()` says it first); empty when it was simply built
        self.chosen_by = ""
        self.num_inputs = len(graph.inputs) - len(constants)
        self._compiler_options = dict(compiler_options) if compiler_options else None
        self._sharding = {n: SingleDeviceSharding(d) for n, d in self.devices.items()}
        plan = read_plan_attrs(graph)
        par = plan.parallelism if plan is not None else None
        self.replicas = Replicas(graph, par, self.devices) if par is not None and par.mirrors > 1 else None
        # Devices of several processes: this process runs its own devices' segments and its side of
        # each copy between processes (`pesto_ir/jaxrt/cross_process.py`); None in a single process.
        # With replicas, a device of the schedule stands for its mesh: the process runs its segments
        # when the mesh has a device of its own (SPMD: every such process calls them).
        self._here: set[str] | None = None
        if is_multiprocess(self.devices.values()):
            self._here = {n for n, d in self.devices.items() if cross_process.is_local(d)} if self.replicas is None \
                else {n for n, s in self.replicas.replicated.items() if any(map(cross_process.is_local, s.device_set))}
        self._regs = _Registers()
        for v in graph.inputs:
            r = self._regs(v, sched.input_home[v])
            self._regs.specs[r] = self._spec(v, sched.input_home[v])
        axes = self.replicas.input_axes if self.replicas is not None else {}
        self._inputs = [(self._regs(v, sched.input_home[v]), self._where(v, sched.input_home[v]),
                         jax_dtype(_tensor(v).dtype), axes.get(i)) for i, v in enumerate(graph.inputs[:self.num_inputs])]
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
            if kind == "segment" and not self._runs_here(item.device):
                self._shapes_only(item, args, outs)  # another process runs it
                continue
            if kind == "segment":
                donated = _donatable(item, args, n, last, owned, self.outputs)
                fn = self._compile(item, args, outs, donated)
            else:
                self._regs.specs[outs[0]] = _moved(self._regs.specs[args[0]], self._where(item.value, item.dst))
                if self._here is not None:
                    instr = self._cross_process_move(item, args, outs) if self.replicas is None \
                        else self._mesh_move(item, args, outs)
                    if instr is not None:
                        self._program.append(instr[:3])
                        self._program_args.append(instr[3])
                    continue
                fn = _mover(self._where(item.value, item.dst))
            self._program.append((fn, _gather(args), outs))
            self._program_args.append(args)
        self._input_regs = [r for r, _, _, _ in self._inputs]
        self._input_shardings = [s for _, s, _, _ in self._inputs]
        self._outputs = _gather(tuple(self.outputs))
        if self.replicas is not None:
            self._outputs = _unstacked(self._outputs, self.replicas)
        # outputs a user reads every step (small, not the next value of an input) in every process
        self.everywhere = small_outputs(graph, sched.state_map) if self._here is not None else frozenset()
        if self._here is not None and self.replicas is None:
            self._outputs = resident_outputs(
                self.outputs, [(self.devices[self._regs.names[r][1]], self._regs.spec(r)) for r in self.outputs],
                [self._runs_here(self._regs.names[r][1]) for r in self.outputs], self.everywhere,
                list(self.devices.values()))
        elif self._here is not None:
            self._outputs = replicated_outputs(self._outputs, self.everywhere, list(self.devices.values()))
        self._direct = self._direct_call() if self.replicas is None and self._here is None else None

    def _put(self, x: Any, sharding: Sharding) -> Any:
        """`x` on `sharding`; across processes built from this process's pieces, which every process
        can cut from `x` alike (a put of the whole array makes one that cannot be split by device)."""
        if self._here is None or sharding.is_fully_addressable:
            return jax.device_put(x, sharding)
        return cross_process.put_global(x, sharding)

    def _runs_here(self, device: str) -> bool:
        return self._here is None or device in self._here

    def _where(self, v: Value, device: str) -> Sharding:
        """The sharding of `v`'s array on plan device `device`."""
        return self._sharding[device] if self.replicas is None else self.replicas.sharding(v, device)

    def _spec(self, v: Value, device: str) -> jax.ShapeDtypeStruct:
        stacked = self.replicas is not None and id(v) in self.replicas.varying
        return _spec(v, self._where(v, device), self.replicas.d if stacked else None)  # type: ignore[union-attr]

    # ---------------------------------------------------------------- building
    def _place_constants(self, values: Sequence[Value], constants: Sequence[Any]) -> dict[int, Any]:
        """Constants on their home device and on every other device that reads them, once."""
        sched = self.schedule
        resident: dict[int, Any] = {}
        value_of: dict[int, Any] = {}
        for v, x in zip(values, constants):
            home = sched.input_home[v]
            value_of[id(v)] = x = _converted(x, jax_dtype(_tensor(v).dtype), v)
            if self._runs_here(home):
                resident[self._regs(v, home)] = self._put(x, self._where(v, home))
        for m in sched.input_moves:
            if id(m.value) in value_of:
                dst = self._regs(m.value, m.dst)
                self._regs.specs[dst] = self._spec(m.value, m.dst)
                if self._runs_here(m.dst):  # every process has the constants: no copy between processes
                    resident[dst] = self._put(value_of[id(m.value)], self._where(m.value, m.dst))
        return resident

    def _steps(self) -> list[tuple[str, Any, tuple[int, ...], tuple[int, ...]]]:
        """(kind, segment or move, argument registers, result registers) in dispatch order."""
        sched, reg = self.schedule, self._regs
        steps: list[tuple[str, Any, tuple[int, ...], tuple[int, ...]]] = []

        def move(m: Move) -> None:
            steps.append(("move", m, (reg(m.value, m.src),), (reg(m.value, m.dst),)))

        constant = set(map(id, sched.graph.inputs[self.num_inputs:]))
        for m in sched.input_moves:
            if id(m.value) not in constant:
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
        sub = segment_graph(self.schedule.graph, seg)
        body = self._body(sub, seg)
        in_shardings = tuple(self._where(v, seg.device) for v in seg.inputs)
        out_shardings = [self._where(v, seg.device) for v in seg.outputs]
        fn = jax.jit(body, in_shardings=in_shardings, out_shardings=out_shardings,
                     donate_argnums=donated, compiler_options=self._compiler_options)
        specs = [self._regs.specs[r] for r in args]
        try:
            lowered = fn.lower(*specs)
            lowered.compile()
        except PestoError as e:
            raise BackendError(f"segment {seg.name} of @{self.schedule.graph.name}: {e}") from e
        for r, info, sharding in zip(outs, lowered.out_info, out_shardings):
            self._regs.specs[r] = jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sharding,
                                                       weak_type=getattr(info, "weak_type", False))
        self.segments.append(CompiledSegment(seg, self.devices[seg.device], sub, fn, donated))
        return fn

    def _body(self, sub: Graph, seg: Segment) -> Callable[..., list[Any]]:
        """The function a segment's sub-graph `sub` computes (over its replicas, if any)."""
        if self.replicas is None:
            return as_function(sub)
        r = self.replicas
        return r.per_replica(as_function(sub, REPLICA_AXIS, r.dp, TENSOR_AXIS, r.tp), seg)

    def _shapes_only(self, seg: Segment, args: tuple[int, ...], outs: tuple[int, ...]) -> None:
        """The result shapes of a segment another process runs (for the copies that read them)."""
        specs = [self._regs.specs[r] for r in args]
        results = jax.eval_shape(self._body(segment_graph(self.schedule.graph, seg), seg), *specs)
        for r, info, v in zip(outs, results, seg.outputs):
            self._regs.specs[r] = jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=self._where(v, seg.device),
                                                       weak_type=getattr(info, "weak_type", False))

    def _cross_process_move(self, m: Move, args: tuple[int, ...], outs: tuple[int, ...]
                            ) -> tuple[Callable[..., Sequence[Any]], Gather, tuple[int, ...], tuple[int, ...]] | None:
        """This process's side of copy `m` (None when neither end is its device): the function, its
        argument (none when the source is another process's) and its result (none when the
        destination is)."""
        src, dst = self.devices[m.src], self.devices[m.dst]
        if not (self._runs_here(m.src) or self._runs_here(m.dst)):
            return None
        spec = self._regs.specs[outs[0]]
        assert spec is not None
        takes = args if self._runs_here(m.src) else ()
        gives = outs if self._runs_here(m.dst) else ()

        def move(*x: Any) -> tuple[Any, ...]:
            got = cross_process.copy(x[0] if x else None, src, dst, spec)
            return (got,) if gives else ()

        return move, _gather(takes), gives, takes

    def _mesh_move(self, m: Move, args: tuple[int, ...], outs: tuple[int, ...]
                   ) -> tuple[Callable[..., Sequence[Any]], Gather, tuple[int, ...], tuple[int, ...]] | None:
        """Copy `m` between the meshes of two replica-0 devices, shard by shard (replica r's device
        to replica r's): JAX moves a global array only between meshes of the same devices."""
        src, dst = self._where(m.value, m.src), self._where(m.value, m.dst)
        pairs = list(zip(src.mesh.devices.flat, dst.mesh.devices.flat))  # type: ignore[attr-defined]
        if not (self._runs_here(m.src) or self._runs_here(m.dst)):
            return None
        spec = self._regs.specs[outs[0]]
        assert spec is not None
        shard = jax.ShapeDtypeStruct(dst.shard_shape(spec.shape), spec.dtype)
        takes = args if self._runs_here(m.src) else ()
        gives = outs if self._runs_here(m.dst) else ()

        def move(*x: Any) -> tuple[Any, ...]:
            held = {s.device: s.data for s in x[0].addressable_shards} if x else {}
            got = [cross_process.copy(held.get(a), a, b, shard) for a, b in pairs]
            mine = [g for g in got if g is not None]
            return (jax.make_array_from_single_device_arrays(spec.shape, dst, mine),) if gives else ()

        return move, _gather(takes), gives, takes

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
        if self._here is not None and self.replicas is None:
            return self._placed_here(inputs)
        # arrays this executable made carry its very sharding objects: the list test is then by identity
        if self.replicas is None and [getattr(x, "sharding", None) for x in inputs] == self._input_shardings:
            return inputs
        out = []
        for i, ((_, sharding, dtype, axis), x, v) in enumerate(zip(self._inputs, inputs, self.schedule.graph.inputs)):
            if axis is not None:  # a batch input of replicas: the caller's whole batch, as the replicas' rows
                assert self.replicas is not None
                held = self.replicas.stack_placed(x, i, sharding)  # a split parameter this returned
                x = held if held is not None else self._put(self.replicas.stack(_converted(x, dtype, v), i), sharding)
                out.append(x)
                continue
            placed = getattr(x, "sharding", None)
            if placed is not sharding and placed != sharding:
                x = self._put(_converted(x, dtype, v), sharding)
            out.append(x)
        return out

    def _placed_here(self, inputs: Sequence[Any]) -> list[Any]:
        """Across processes: each input on its home device where that is this process's (None where
        it is another's). A resident input (an output of an earlier call) is already on its device,
        or is copied there from it; anything else every process holds, and puts there itself."""
        out: list[Any] = []
        for (r, sharding, dtype, _), x, v in zip(self._inputs, inputs, self.schedule.graph.inputs):
            home_name = self._regs.names[r][1]
            home = self.devices[home_name]
            at = cross_process.resident_device(x)
            if at is None and self._runs_here(home_name):
                x = whole_here(x, v)  # e.g. an output made readable everywhere, given back
            if at is not None and at != home:
                x = cross_process.copy(cross_process.local_data(x) if cross_process.is_local(at) else None, at, home,
                                       self._regs.specs[r])  # type: ignore[arg-type]
            elif at is not None:
                x = cross_process.local_data(x) if self._runs_here(home_name) else None
            elif self._runs_here(home_name):
                x = jax.device_put(_converted(x, dtype, v), sharding)
            else:
                x = None
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
        """The JAX device each (non-constant) input lives on (with replicas, replica 0's)."""
        return [s.mesh.devices.flat[0] if isinstance(s, NamedSharding) else next(iter(s.device_set))
                for _, s, _, _ in self._inputs]

    def describe(self) -> str:
        """One line per segment and transfer, in dispatch order (after how it was chosen, if it was)."""
        lines = [self.chosen_by] if self.chosen_by else []
        if self.replicas is not None:
            r = self.replicas
            what = " x ".join(([f"{r.dp} data-parallel replicas"] if r.dp > 1 else []) +
                              ([f"{r.tp} tensor-parallel ranks"] if r.tp > 1 else []))
            axes = f"'{REPLICA_AXIS}' x '{TENSOR_AXIS}'" if r.tp > 1 else f"'{REPLICA_AXIS}'"
            lines.append(f"{what}: each segment runs over the mesh {axes} of the devices that mirror its "
                         "device; stacked values carry one replica's array per device, the others are replicated")
        for item in self._order:
            if isinstance(item, Segment):
                ops = item.planned_ops
                where = item.device
                if self.replicas is not None:
                    mesh = self.replicas.replicated[item.device].mesh  # type: ignore[attr-defined]
                    where += " x mesh(" + ", ".join(str(d) for d in mesh.devices.flat) + ")"
                stacked = sum(1 for v in item.inputs if self.replicas is not None and id(v) in self.replicas.varying)
                lines.append(f"{item.name}: {len(ops)} ops on {where} ({ops[0].name} .. {ops[-1].name}), "
                             f"{len(item.inputs)} in" + (f" ({stacked} stacked)" if self.replicas else "")
                             + f", {len(item.outputs)} out")
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
    """The device an array lives on, or (replicated or stacked over replicas) the set of them."""
    devices = x.devices()
    return next(iter(devices)) if len(devices) == 1 else frozenset(devices)


def _spec(v: Value, sharding: Sharding, stacked: int | None = None) -> jax.ShapeDtypeStruct:
    """The abstract array of `v` (with a leading replica axis of `stacked` when it differs per replica)."""
    t = _tensor(v)
    shape = t.shape if stacked is None else (stacked, *t.shape)
    return jax.ShapeDtypeStruct(shape, jax_dtype(t.dtype), sharding=sharding)


def _tensor(v: Value) -> TensorType:
    if not isinstance(v.type, TensorType):
        raise BackendError(f"%{v.name} is {v.type}: a cost-only value has no array to compute with")
    return v.type


def _unstacked(outputs: Gather, replicas: Replicas) -> Gather:
    """`outputs`, with the replicas' rows of each stacked output put together."""
    axes = replicas.output_axes

    def gather(regs: Indexed) -> tuple[Any, ...]:
        return tuple(replicas.unstack(x, k) if k in axes else x for k, x in enumerate(outputs(regs)))

    return gather


def _moved(spec: jax.ShapeDtypeStruct | None, sharding: Sharding) -> jax.ShapeDtypeStruct:
    assert spec is not None  # a move reads a register that an earlier step or an input filled
    return jax.ShapeDtypeStruct(spec.shape, spec.dtype, sharding=sharding, weak_type=spec.weak_type)


def _mover(sharding: Sharding) -> Callable[[Any], tuple[Any]]:
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


__all__ = ["BackendError", "CompiledSegment", "Executable", "Replicas", "ScheduleError", "build", "resolve_devices"]
