"""`emit_python(placed_graph) -> str`: a placed graph as a readable, standalone JAX module.

The module needs only JAX and numpy. It holds one function per segment of the dispatch program
(`backends/schedule.py`: the same segments, transfers and input homes the JAX backend runs), each
op one line binding its JAX primitive with its decoded parameters under a comment naming the IR
op, its plan slot and its source line; nested graphs (`scan`, `while`, `cond` bodies, reduction
bodies) become functions traced to jaxprs the way the interpreter traces them. `run(*inputs,
devices=None)` dispatches the segments in plan order, jitted on their devices, with one
`jax.device_put` per transfer; run as a script, the module runs one step on zeros.

A plan with d > 1 data-parallel replicas gives a module that runs them all, as the JAX backend
does (`backends/jax.py`, `Replicas`): it takes the devices of every replica, runs each segment as a
`jax.shard_map` over the mesh of its device and the devices mirroring it, writes each
`all_reduce` as the collective of that mesh axis (`psum`, `pmax`, `pmin`), splits batch inputs into
the replicas' rows and puts per-sample outputs back together. The code that lays replicas out is
`backends/replica_runtime.py`'s, copied into the module, so both run the same.

Parameter values are written as Python source by a rule table over their types (numbers, tuples,
dtypes, lax enums and named tuples, primitives: `backends/python_source.py`); a value no rule
covers is an error naming the op and the parameter, never a silently wrong program.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pesto_ir.backends.jax_replicas import BackendError, ReplicaLayout
from pesto_ir.backends.python_source import (
    DERIVED_SOURCE,
    REPLICA_RESERVED,
    RESERVED,
    EmitError,
    Namespace,
    dtype_name,
    dtype_source,
    source,
)
from pesto_ir.backends.replica_runtime import REPLICA_AXIS, RUNTIME
from pesto_ir.backends.schedule import Move, Schedule, Segment, schedule
from pesto_ir.ir.annotations import primitive_params
from pesto_ir.ir.attributes import Attr, GraphAttr, ListAttr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.types import TensorType
from pesto_ir.jaxrt.interpreter import ACROSS_REPLICAS, EVAL_RULES, ReplicaInterpreter, one_replica
from pesto_ir.jaxrt.params import (
    DERIVED_PARAMS,
    OPEN_JAXPR_CODEC,
    PARAM_DEFAULTS,
    codec_for,
    decode_plain,
    jax_dtype,
    lookup_primitive,
)
from pesto_ir.schedule.plan import Parallelism, read_plan_attrs
from pesto_ir.util.errors import PestoError


def emit_python(placed_graph: Graph, state_map: Mapping[int, int] | None = None) -> str:
    """The Python source of a module running `placed_graph` as planned (see the module docstring),
    every data-parallel replica of its plan included."""
    check_computable(placed_graph)
    par = _parallelism(placed_graph)
    if par is not None and par.tensor_parallel > 1:  # the JAX backend (build, parallelize) runs them
        raise EmitError(f"@{placed_graph.name}: emitted modules do not run tensor-parallel ranks yet")
    try:
        layout = ReplicaLayout(placed_graph, par.data_parallel) if par is not None else None
    except BackendError as e:
        raise EmitError(f"@{placed_graph.name}: {e}") from None
    _check_all_reduces(placed_graph, par)
    return _Emitter(schedule(placed_graph, state_map), par, layout).module()


def check_computable(graph: Graph) -> None:
    """A cost graph (a `pesto-graph/1` import: opaque ops with blob results) holds no computation:
    its module would run nothing. Refused, naming the first value that is not an array."""
    for op in graph.ops:
        for v in op.results:
            if not isinstance(v.type, TensorType):
                raise EmitError(f"@{graph.name} is a cost graph: op '{op.name}' ({op.opcode}) gives %{v.name}: "
                                f"{v.type}, a cost-only value with no array to compute, and a module of it would "
                                "run nothing (emit Python from a model of JAX ops: a .pir file or a JAX function)")


def _parallelism(graph: Graph) -> Parallelism | None:
    """The plan's replicas when it has more than one."""
    plan = read_plan_attrs(graph)
    par = plan.parallelism if plan is not None else None
    return par if par is not None and par.mirrors > 1 else None


def _check_all_reduces(graph: Graph, par: Parallelism | None) -> None:
    """All-reduces across replicas need replicas to reduce across, and run only at the top level
    (as the JAX backend runs them): the mesh axis is not bound inside a nested graph's trace."""
    stack = [(graph, False)]
    while stack:
        g, nested = stack.pop()
        for op in g.ops:
            if op.opcode in ACROSS_REPLICAS and not one_replica(op):
                what = "all-reduces" if op.opcode == "all_reduce" else f"runs {op.opcode}"
                if par is None:
                    raise EmitError(f"{op.where()}: op '{op.name}' {what} across {op.get('replicas')} "
                                    "data-parallel replicas, but the plan has no replicas to reduce across (place "
                                    "it with data-parallel > 1)")
                if nested:
                    raise EmitError(f"{op.where()}: op '{op.name}' {what} across replicas inside the nested "
                                    f"graph @{g.name}; only the placed graph's own ops can reduce across replicas")
            stack.extend((sub, True) for sub in op.subgraphs())


# ---------------------------------------------------------------- the emitter

_HELPERS = '''
def _primitive(name):
    """The JAX primitive called `name`: jax.extend.core.primitives and jax.lax first, then any
    loaded JAX module (a few primitives live only there)."""
    from jax.extend.core import Primitive, primitives

    for module in (primitives, lax, lax.linalg):
        for v in vars(module).values():
            if isinstance(v, Primitive) and v.name == name:
                return v
    for module_name, module in list(sys.modules.items()):
        if module is not None and (module_name == "jax" or module_name.startswith("jax.")):
            for v in list(vars(module).values()):
                if isinstance(v, Primitive) and v.name == name:
                    return v
    raise LookupError(f"JAX has no primitive named {name!r}")


def _closed_jaxpr(fn, *specs):
    """The closed jaxpr of a body function over (shape, dtype) inputs, as scan/while/cond bind it."""
    return jax.make_jaxpr(fn)(*[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs])


def _as_fun(closed):
    return lambda *args: jax.extend.core.jaxpr_as_fun(closed)(*args)


_JITTED = {}


def _jitted(fn, device):
    """`fn` compiled for `device` (its inputs are already there; its results stay there)."""
    key = (fn, device)
    if key not in _JITTED:
        _JITTED[key] = jax.jit(fn, out_shardings=jax.sharding.SingleDeviceSharding(device))
    return _JITTED[key]


def _to(x, device, dtype):
    """An input on `device`, converted the way jax.jit converts arguments."""
    return jax.device_put(x if isinstance(x, jax.Array) else np.asarray(x, dtype), device)


def _prng_impl(name):
    """JAX's PRNG implementation called `name` (the `impl` of random_seed and random_wrap)."""
    from jax._src.random import prng  # JAX's registry by name; it has no public one

    return prng.prngs[name]


def _dtype(name):
    """A dtype by name: numpy's (`float32`), or typed PRNG keys of an implementation (`key<rbg>`)."""
    if name.startswith("key<") and name.endswith(">"):
        return jax.random.key(0, impl=_prng_impl(name[4:-1])).dtype
    return jnp.dtype(name)


def _example(shape, dtype):
    """Zeros of an input's shape and dtype; distinct keys (split from seed 0) for PRNG keys."""
    dtype = _dtype(dtype)
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        key = jax.random.key(0, impl=dtype)
        return jax.random.split(key, shape) if shape else key
    return np.zeros(shape, dtype)


def _device_map(devices):
    devices = list(jax.devices()[:len(DEVICES)] if devices is None else devices)
    if len(devices) != len(DEVICES):
        raise ValueError(f"this plan runs on {len(DEVICES)} devices ({', '.join(DEVICES)}), got {len(devices)}; "
                         "on a CPU host set XLA_FLAGS=--xla_force_host_platform_device_count=N first")
    return dict(zip(DEVICES, devices))
'''

# In a module running replicas, besides `backends/replica_runtime.py`'s functions (copied in).
_REPLICA_HELPERS = '''
def _replica_meshes(devices):
    """Replica 0's device name -> the mesh of it and the devices that mirror it, one per replica."""
    devices = list(jax.devices()[:len(DEVICES)] if devices is None else devices)
    if len(devices) != len(DEVICES):
        replicas = "; ".join(f"replica {r}: {', '.join(names)}" for r, names in enumerate(REPLICAS))
        raise ValueError(f"this plan runs {len(REPLICAS)} data-parallel replicas on {len(DEVICES)} devices, given "
                         f"in the order {', '.join(DEVICES)} ({replicas}), got {len(devices)}; on a CPU host set "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=N first")
    dev = dict(zip(DEVICES, devices))
    return {name: replica_mesh([dev[names[i]] for names in REPLICAS]) for i, name in enumerate(REPLICAS[0])}


def _jitted_over(fn, mesh, ins, outs):
    """`fn` (one replica's segment) compiled as a shard_map over `mesh`; an argument or result is
    stacked (one replica's array per device) where `ins` or `outs` says so, else replicated."""
    key = (fn, mesh, ins, outs)
    if key not in _JITTED:
        _JITTED[key] = jax.jit(over_replicas(fn, mesh, ins, outs),
                               in_shardings=tuple(replica_sharding(mesh, s) for s in ins),
                               out_shardings=[replica_sharding(mesh, s) for s in outs])
    return _JITTED[key]


def _to_mesh(x, mesh, dtype, axis=None):
    """An input on `mesh`, converted the way jax.jit converts arguments: replicated, or (a batch
    input, `axis` its batch axis) the whole batch split into the replicas' rows."""
    x = x if isinstance(x, jax.Array) else np.asarray(x, dtype)
    if axis is None:
        return jax.device_put(x, replica_sharding(mesh, False))
    return jax.device_put(split_rows(x, axis, len(REPLICAS)), replica_sharding(mesh, True))
'''


class _Emitter:
    def __init__(self, sched: Schedule, par: Parallelism | None = None, layout: ReplicaLayout | None = None) -> None:
        self.sched = sched
        self.graph = sched.graph
        self.par, self.layout = par, layout  # the plan's replicas (None: the module runs one)
        self.reserved = RESERVED if layout is None else REPLICA_RESERVED
        self.module_names = Namespace(self.reserved)
        self.prims: dict[str, str] = {}  # primitive name -> module-level variable
        self.bodies: list[str] = []  # source of nested-graph functions, innermost first
        self.seg_names = [self.module_names.name(("segment", s.index), s.name) for s in sched.segments]

    # -- the module
    def module(self) -> str:
        segments = [self.segment(s, name) for s, name in zip(self.sched.segments, self.seg_names)]
        run = self.run_function()
        prims = [f"{var} = _primitive({name!r})" for name, var in self.prims.items()]
        parts = [self.header(), _HELPERS.strip("\n"), *self.replica_helpers(), "\n".join(prims), *self.bodies,
                 *segments, run, self.main()]
        return "\n\n\n".join(p for p in parts if p) + "\n"

    def header(self) -> str:
        g, sched = self.graph, self.sched
        plan = read_plan_attrs(g)
        algo = plan.algorithm if plan is not None else "?"
        makespan = f"{plan.makespan * 1e6:.1f} us" if plan is not None else "?"
        specs = "".join(f"\n    ({v.name!r}, {self.input_shape(i)!r}, {dtype_name(_tensor(v))!r}),"
                        for i, v in enumerate(g.inputs))
        homes = "".join(f"\n    {sched.input_home[v]!r},  # {v.name}" for v in g.inputs)
        lines = [
            f'"""Graph @{g.name} as placed by {algo} (simulated makespan {makespan}) on '
            f'{", ".join(sched.devices)}.',
            "",
            f"Emitted by pesto_ir.backends.python_emit: {len(sched.segments)} segment(s), "
            f"{len(sched.moves)} transfer(s) per step.",
            "`run(*inputs, devices=None)` takes the graph's inputs in order (INPUTS) and returns its outputs;",
            "as a script it runs one step on zeros.",
            *self.replica_docstring(),
            '"""',
            "",
            "import os",
            "import sys",
            *(["from collections.abc import Callable"] if self.layout is not None else []),
            "",
            'if __name__ == "__main__":  # as a script on a host without accelerators: one CPU device per plan device',
            f'    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count={len(sched.devices)}")',
            "",
            "import jax  # noqa: E402",
            "import jax.numpy as jnp  # noqa: E402",
            "import numpy as np  # noqa: E402",
            "from jax import lax  # noqa: E402",
            "",
            f"GRAPH = {g.name!r}",
            f"DEVICES = {tuple(sched.devices)!r}",
            f"INPUTS = (  # name, shape, dtype of each input{specs}\n)",
            f"INPUT_HOMES = (  # the device each input lives on: its first reader's{homes}\n)",
        ]
        if self.par is not None:
            lines += [f"REPLICAS = {self.par.replicas!r}  # replica r's devices; device i of each mirrors replica 0's",
                      f"REPLICA_AXIS = {REPLICA_AXIS!r}  # the mesh axis of data-parallel replicas"]
        return "\n".join(lines)

    def replica_docstring(self) -> list[str]:
        """What the module docstring says about replicas: the devices it needs and how it runs them."""
        par = self.par
        if par is None:
            return []
        replicas = "; ".join(f"replica {r}: {', '.join(names)}" for r, names in enumerate(par.replicas))
        return [
            "",
            f"It runs {par.data_parallel} data-parallel replicas of {len(par.replicas[0])} device(s), "
            f"{par.microbatches} micro-batch(es) each, and needs",
            f"{len(self.sched.devices)} devices, given in the order of DEVICES ({replicas}).",
            "Each segment runs as a jax.shard_map over the mesh of its device and the devices mirroring it,",
            "an all-reduce is a collective over that mesh; batch inputs are whole batches, split into the",
            "replicas' rows, and per-sample outputs come back whole.",
        ]

    def replica_helpers(self) -> list[str]:
        """The shared replica runtime and the helpers that use it, for a module running replicas."""
        if self.layout is None:
            return []
        copied = "\n\n\n".join(inspect.getsource(f).strip("\n") for f in RUNTIME)
        return [f"# {RUNTIME[0].__module__}, as the JAX backend runs it\n{copied}", _REPLICA_HELPERS.strip("\n")]

    def input_shape(self, i: int) -> tuple[int, ...]:
        """The shape `run` takes input i in: a batch input of replicas is the whole batch."""
        shape = tuple(_tensor(self.graph.inputs[i]).shape)
        layout = self.layout
        axis = layout.input_axes.get(i) if layout is not None else None
        if layout is None or axis is None:
            return shape
        return shape[:axis] + (shape[axis] * layout.d,) + shape[axis + 1:]

    # -- one graph's ops as straight-line code
    def body_lines(self, ops: tuple[Op, ...] | list[Op], names: Namespace, indent: str = "    ") -> list[str]:
        lines: list[str] = []
        for op in ops:
            lines.append(f"{indent}# {self.describe(op)}")
            if op.opcode in EVAL_RULES and op.opcode not in EMIT_RULES:
                raise EmitError(f"{op.where()}: op '{op.name}': the interpreter evaluates '{op.opcode}' by a rule of "
                                "its own, which the emitter has no counterpart for")
            rule = EMIT_RULES.get(op.opcode, _emit_bind)
            lines.append(indent + rule(self, op, names))
        return lines

    def describe(self, op: Op) -> str:
        args = ", ".join(f"%{v.name}" for v in op.operands)
        types = ", ".join(str(r.type) for r in op.results)
        text = f"{op.name}: {op.opcode}({args}) -> {types}"
        if "device" in op.attrs:
            text += f"  @{op.get('device')} [{_us(op.get('start', 0.0))} .. {_us(op.get('end', 0.0))}]"
        if op.loc is not None:
            text += f"  {op.loc}"
        return text

    def segment(self, seg: Any, fname: str) -> str:
        names = Namespace(self.reserved | self.module_names.used)
        params = ", ".join(names.name(id(v), v.name) for v in seg.inputs)
        planned = seg.planned_ops
        copied = f", after {seg.recomputed} recomputed constant(s)" if seg.recomputed else ""
        where = seg.device if self.par is None else \
            f"{seg.device} (one replica's; run over the mesh of {', '.join(self.par.group(seg.device))})"
        lines = [f"def {fname}({params}):",
                 f'    """{len(planned)} op(s) on {where}: {planned[0].name} .. {planned[-1].name}{copied}."""']
        lines += self.body_lines(seg.ops, names)
        lines.append(f"    return [{', '.join(names.name(id(v), v.name) for v in seg.outputs)}]")
        return "\n".join(lines)

    def nested(self, graph: Graph, hint: str) -> str:
        """A module-level function for a nested graph (written once); returns its name."""
        fname = self.module_level(("body", id(graph)), f"_body_{hint}")
        if any(b.startswith(f"def {fname}(") for b in self.bodies):
            return fname
        names = Namespace(self.reserved | self.module_names.used)
        params = ", ".join(names.name(id(v), v.name) for v in graph.inputs)
        lines = [f"def {fname}({params}):", f'    """Nested graph @{graph.name}."""']
        lines += self.body_lines(graph.ops, names)
        lines.append(f"    return [{', '.join(names.name(id(v), v.name) for v in graph.outputs)}]")
        self.bodies.append("\n".join(lines))
        return fname

    def primitive(self, name: str) -> str:
        var = self.prims.get(name)
        if var is None:
            var = self.prims[name] = self.module_level(("prim", name), f"_p_{name}")
        return var

    def module_level(self, key: Any, hint: str) -> str:
        """A module-level name starting with '_', which no value's identifier does."""
        found = self.module_names.of.get(key)
        if found is not None:
            return found
        base = "_" + (re.sub(r"\W", "_", hint).lstrip("_") or "f")
        name, i = base, 1
        while name in self.module_names.used:
            name, i = f"{base}_{i}", i + 1
        self.module_names.used.add(name)
        self.module_names.of[key] = name
        return name

    # -- parameters
    def params(self, op: Op) -> dict[str, str]:
        attrs = primitive_params(op)
        out = {k: source(v) for k, v in PARAM_DEFAULTS.get(op.opcode, {}).items() if k not in attrs}
        for key, attr in attrs.items():
            try:
                out[key] = (self.graph_param(op, key, attr) if _has_graph(attr)
                            else source(codec_for(op.opcode, key).decode(attr)))
            except EmitError as e:
                raise EmitError(f"{op.where()}: op '{op.name}' ({op.opcode}), parameter '{key}': {e}") from None
        for key in DERIVED_PARAMS.get(op.opcode, {}):
            rule = DERIVED_SOURCE.get(op.opcode, {}).get(key)
            if rule is None:
                raise EmitError(f"{op.where()}: op '{op.name}' ({op.opcode}): no rule to write the derived "
                                f"parameter '{key}'")
            out[key] = rule(out)
        return out

    def graph_param(self, op: Op, key: str, attr: Attr) -> str:
        if isinstance(attr, ListAttr):
            return _tuple_source_raw([self.graph_param(op, key, a) for a in attr.items])
        if not isinstance(attr, GraphAttr):
            return source(decode_plain(attr))
        g = attr.graph
        fname = self.nested(g, f"{op.name}_{key}")
        specs = ", ".join(f"({tuple(_tensor(v).shape)!r}, {dtype_source(_tensor(v))})" for v in g.inputs)
        closed = f"_closed_jaxpr({fname}{', ' if specs else ''}{specs})"
        return f"{closed}.jaxpr" if codec_for(op.opcode, key) is OPEN_JAXPR_CODEC else closed

    # -- the dispatch program
    def run_function(self) -> str:
        sched, g, layout = self.sched, self.graph, self.layout
        names = Namespace(self.reserved | self.module_names.used)

        def at(v: Value, device: str) -> str:
            base = names.name(id(v), v.name)
            return base if device == sched.device_of(v) else names.name((id(v), device), f"{base}_{device}")

        if layout is None:
            head = ['    """One step: segments dispatched in plan order, each transfer one jax.device_put."""',
                    "    dev = _device_map(devices)"]
        else:
            head = ['    """One step of every replica: segments dispatched in plan order, each over the mesh of its',
                    '    device and its mirrors; each transfer one jax.device_put from mesh to mesh."""',
                    "    mesh = _replica_meshes(devices)"]
        lines = ["def run(*inputs, devices=None):", *head,
                 f"    if len(inputs) != {len(g.inputs)}:",
                 f"        raise TypeError(f'{g.name} takes {len(g.inputs)} inputs, got {{len(inputs)}}')"]
        if g.inputs:
            lines.append(f"    {', '.join(names.name(id(v), v.name) for v in g.inputs)}, = inputs")
            lines.append("    # each input on its home device (its first reader's)" if layout is None else
                         "    # each input on the mesh of its home device (its first reader's): batch inputs split "
                         "into the replicas' rows, the others replicated")
        for i, v in enumerate(g.inputs):
            lines.append(f"    {names.name(id(v), v.name)} = {self.placed_input(i, names.name(id(v), v.name))}")
        lines += [self.move_line(m, at) for m in sched.input_moves]
        for seg, fname, moves in zip(sched.segments, self.seg_names, sched.moves_after):
            results = ", ".join(at(v, seg.device) for v in seg.outputs)
            args = ", ".join(at(v, seg.device) for v in seg.inputs)
            lines.append(f"    # {fname}: {len(seg.ops)} op(s) on {seg.device}")
            lines.append(f"    {results}, = {self.compiled(seg, fname)}({args})")
            lines += [self.move_line(m, at) for m in moves]
        outs = ", ".join(self.output(k, at(v, d)) for k, (v, d) in enumerate(sched.outputs))
        lines.append(f"    return [{outs}]")
        return "\n".join(lines)

    def placed_input(self, i: int, name: str) -> str:
        """Input i on its home device; with replicas, on its mesh (a batch input split into rows)."""
        v = self.graph.inputs[i]
        home, dtype = self.sched.input_home[v], dtype_source(_tensor(v))
        if self.layout is None:
            return f"_to({name}, dev[{home!r}], {dtype})"
        axis = self.layout.input_axes.get(i)
        return f"_to_mesh({name}, mesh[{home!r}], {dtype}{'' if axis is None else f', {axis}'})"

    def compiled(self, seg: Segment, fname: str) -> str:
        """The segment function compiled for its device, or over its mesh of replicas."""
        if self.layout is None:
            return f"_jitted({fname}, dev[{seg.device!r}])"
        ins, outs = self.layout.stacked_flags(seg.inputs), self.layout.stacked_flags(seg.outputs)
        return f"_jitted_over({fname}, mesh[{seg.device!r}], {source(ins)}, {source(outs)})"

    def output(self, k: int, name: str) -> str:
        """Output k as `run` returns it: with replicas, a per-sample output's rows put back together."""
        axis = self.layout.output_axes.get(k) if self.layout is not None else None
        return name if axis is None else f"join_rows({name}, {axis})"

    def move_line(self, m: Move, at: Callable[[Value, str], str]) -> str:
        what = f"op {m.src_op}" if m.src_op is not None else "input"
        if self.layout is None:
            to = f"dev[{m.dst!r}]"
        else:
            to = f"replica_sharding(mesh[{m.dst!r}], {id(m.value) in self.layout.varying})"
        return (f"    {at(m.value, m.dst)} = jax.device_put({at(m.value, m.src)}, {to})"
                f"  # transfer of %{m.value.name} ({what}) {m.src} -> {m.dst}")

    def main(self) -> str:
        return "\n".join([
            'if __name__ == "__main__":',
            "    outputs = run(*[_example(shape, dtype) for _, shape, dtype in INPUTS])",
            "    for i, x in enumerate(outputs):",
            "        print(f'output {i}: {x.dtype}{list(x.shape)} on {sorted(d.id for d in x.devices())}')",
        ])


# ---------------------------------------------------------------- op rules

EmitRule = Callable[[_Emitter, Op, Namespace], str]


def _results(op: Op, names: Namespace, multiple: bool) -> str:
    outs = [names.name(id(r), r.name) for r in op.results]
    if len(outs) == 1 and not multiple:
        return outs[0]
    return ", ".join(outs) + ("," if len(outs) == 1 else "")


def _emit_bind(e: _Emitter, op: Op, names: Namespace) -> str:
    """The default: bind the JAX primitive named by the opcode, as the interpreter does."""
    try:
        prim = lookup_primitive(op.opcode)
    except PestoError as err:
        raise EmitError(f"{op.where()}: op '{op.name}': {err}") from None
    params = e.params(op)
    args = [names.name(id(v), v.name) for v in op.operands]
    kwargs = [f"{k}={v}" for k, v in params.items()]
    call = f"{e.primitive(op.opcode)}.bind({', '.join(args + kwargs)})"
    return f"{_results(op, names, prim.multiple_results)} = {call}"


def _emit_constant(e: _Emitter, op: Op, names: Namespace) -> str:
    """`constant {value}`: a scalar broadcast to the result shape, or nested lists (as the interpreter)."""
    t = _tensor(op.result)
    dtype = f"jnp.dtype({np.dtype(jax_dtype(t.dtype)).name!r})"
    value = decode_plain(op.attrs["value"])
    if np.issubdtype(jax_dtype(t.dtype), np.complexfloating) and isinstance(value, tuple) and len(value) == 2 \
            and not isinstance(value[0], tuple):
        value = complex(*value)
    text = f"complex({value.real!r}, {value.imag!r})" if isinstance(value, complex) else source(value)
    scalar = np.ndim(np.asarray(value, dtype=object)) == 0
    expr = f"np.full({t.shape!r}, {text}, {dtype})" if scalar and t.shape else f"np.asarray({text}, {dtype})"
    return f"{names.name(id(op.result), op.result.name)} = {expr}"


def _emit_all_reduce(e: _Emitter, op: Op, names: Namespace) -> str:
    """`all_reduce` over one replica: the identity (as the interpreter); over the plan's replicas,
    the collective of the mesh axis the segment runs over (as `ReplicaInterpreter`)."""
    args = [names.name(id(v), v.name) for v in op.operands]
    if one_replica(op):
        return f"{_results(op, names, True)} = {_tuple_source_raw(args)}"
    d = e.par.data_parallel if e.par is not None else 1  # emit_python checked there are replicas
    try:
        reduce = ReplicaInterpreter.collective(op, d)
    except PestoError as err:
        raise EmitError(str(err)) from None
    reduced = [f"lax.{reduce.__name__}({a}, REPLICA_AXIS)" for a in args]
    return f"{_results(op, names, True)} = {_tuple_source_raw(reduced)}"


def _emit_sharded(e: _Emitter, op: Op, names: Namespace) -> str:
    """The ops across replicas but `all_reduce`: over one replica the identity, else `ReplicaInterpreter.run_op`'s."""
    args = [names.name(id(v), v.name) for v in op.operands]
    if one_replica(op):
        return f"{_results(op, names, True)} = {_tuple_source_raw(args)}"
    d = e.par.data_parallel if e.par is not None else 1
    try:
        ReplicaInterpreter.check_replicas(op, d)
    except PestoError as err:
        raise EmitError(str(err)) from None
    if op.opcode == "replica_slice":
        axis = int(op.get("axis"))
        block = _tensor(op.result).shape[axis]
        return (f"{names.name(id(op.result), op.result.name)} = lax.dynamic_slice_in_dim({args[0]}, "
                f"lax.axis_index(REPLICA_AXIS) * {block}, {block}, {axis})")
    if op.opcode == "block_indices":  # the indices less the start of the replica's block
        return f"{_results(op, names, False)} = {args[0]} - lax.axis_index(REPLICA_AXIS) * {int(op.get('size')) // d}"
    axes = [int(a) for a in op.get("axes")]
    if op.opcode == "all_gather":
        calls = [f"lax.all_gather({a}, REPLICA_AXIS, axis={axis}, tiled=True)" for a, axis in zip(args, axes)]
    else:
        if op.get("reduction", "sum") != "sum":
            raise EmitError(f"{op.where()}: op '{op.name}' reduce-scatters with {op.get('reduction')!r}; only sums are run")
        calls = [f"lax.psum_scatter({a}, REPLICA_AXIS, scatter_dimension={axis}, tiled=True)"
                 for a, axis in zip(args, axes)]
    return f"{_results(op, names, True)} = {_tuple_source_raw(calls)}"


EMIT_RULES: dict[str, EmitRule] = {
    "constant": _emit_constant,
    "all_reduce": _emit_all_reduce,
    **{opcode: _emit_sharded for opcode in ("reduce_scatter", "all_gather", "replica_slice", "block_indices")},
}


# ---------------------------------------------------------------- helpers

def _has_graph(a: Attr) -> bool:
    return isinstance(a, GraphAttr) or (isinstance(a, ListAttr) and any(_has_graph(x) for x in a.items))


def _tuple_source_raw(items: list[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _tensor(v: Value) -> TensorType:
    if not isinstance(v.type, TensorType):
        raise EmitError(f"%{v.name} is {v.type}: a cost-only value has no array to compute with")
    return v.type


def _us(seconds: Any) -> str:
    return f"{float(seconds) * 1e6:.2f}us"


__all__ = ["DERIVED_SOURCE", "EMIT_RULES", "EmitError", "check_computable", "emit_python", "source"]
