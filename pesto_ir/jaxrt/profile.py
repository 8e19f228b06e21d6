"""Measured op costs: run each op alone with `jax.jit` on a real JAX device and time it.

An op is bound through the interpreter (`pesto_ir.jaxrt.interpreter`), so whatever the interpreter can
evaluate (JAX primitive names, nested `scan`/`while`/`cond` bodies, hand-written `.pir`) can be
profiled. Its operands are made-up arrays of the declared types, already on the device. After
`warmup` untimed calls (compilation, caches), the median of `runs` timed calls is kept, minus the
median time of an empty jitted call on the same device: what is left is the op's own device time,
not Python dispatch, which a whole-graph executable pays once and not once per op.

Results are cached on disk (`pesto_ir.util.diskcache`) by op signature (opcode, operand and result
types, primitive parameters) and machine (`pesto_ir.cluster.host.machine_key`: device kind, processor,
cores, JAX version); ops with the same signature in one graph are measured once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from pesto_ir.cluster.devices import Device, kind_key
from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.host import machine_key
from pesto_ir.cluster.model import jax_device_kind
from pesto_ir.cost.fusion import FusionGroup
from pesto_ir.ir.annotations import primitive_params
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.printer import print_attr_dict
from pesto_ir.ir.types import TensorType
from pesto_ir.jaxrt.timing import CLOCKS, STATS, call_time
from pesto_ir.util.diskcache import cache_get, cache_put
from pesto_ir.util.errors import PestoError

PROGRESS_EVERY_S = 2.0


class ProfileError(PestoError):
    pass


def _interpreter_class() -> type[Any]:
    """The interpreter, imported when first needed (it imports JAX)."""
    from pesto_ir.jaxrt.interpreter import Interpreter  # start-up: JAX

    return Interpreter


def op_signature(op: Op) -> str:
    """What the time of an op depends on: opcode, types and primitive parameters, as text."""
    params = print_attr_dict(primitive_params(op), "")
    ins = ",".join(str(v.type) for v in op.operands)
    outs = ",".join(str(r.type) for r in op.results)
    return f"{op.opcode}({ins}) {params} -> {outs}"


def group_signature(ops: Sequence[Op]) -> str:
    """What the time of ops run as one executable depends on: each op's signature and where its
    operands come from (an earlier op of the group and its result, or outside)."""
    where = {id(r): f"{i}.{j}" for i, op in enumerate(ops) for j, r in enumerate(op.results)}
    for v in (v for op in ops for v in op.operands):
        where.setdefault(id(v), f"in{len(where)}")
    return " ; ".join(f"{op_signature(op)} <- {','.join(where[id(v)] for v in op.operands)}" for op in ops)


def example_arrays(values: Sequence[Value], device: Any, who: str) -> list[Any]:
    """Arrays of the values' types on `device`: floats in [0.5, 1.5) (no NaN, no denormals),
    integers and booleans zero (always a valid index), PRNG keys distinct. `who` names the user in errors."""
    import jax
    import numpy as np

    from pesto_ir.jaxrt.params import jax_dtype  # start-up: JAX

    rng = np.random.default_rng(0)
    out = []
    for v in values:
        if not isinstance(v.type, TensorType):
            raise ProfileError(f"{who} reads %{v.name} of type {v.type}, which has no values to run it on; "
                               "profile needs tensor types")
        dtype = jax_dtype(v.type.dtype)
        if v.type.key_impl is not None:  # typed PRNG keys: distinct keys, split from one
            key = jax.random.key(0, impl=dtype)
            out.append(jax.device_put(jax.random.split(key, v.type.shape) if v.type.shape else key, device))
            continue
        if np.issubdtype(dtype, np.inexact):
            arr = (rng.random(v.type.shape, dtype=np.float32) + 0.5).astype(dtype)
        else:
            arr = np.zeros(v.type.shape, dtype=dtype)
        out.append(jax.device_put(arr, device))
    return out


def subgraph(ops: Sequence[Op]) -> Graph:
    """A new graph of copies of `ops` (in the given, topological order): values they read from
    outside become inputs, values read outside (or returned by the graph) become outputs."""
    inside = {id(op) for op in ops}
    g = Graph(f"segment_{ops[0].name}" if ops else "segment")
    mapped: dict[int, Value] = {}

    def operand(v: Value) -> Value:
        if id(v) not in mapped:
            mapped[id(v)] = g.add_input(v.name, v.type)
        return mapped[id(v)]

    for op in ops:
        copy = g.add_op(op.opcode, [operand(v) for v in op.operands], [r.type for r in op.results],
                        attrs=dict(op.attrs), name=op.name, result_names=[r.name for r in op.results])
        mapped.update((id(r), c) for r, c in zip(op.results, copy.results))
    graph_outputs = {id(v) for v in ops[0].graph.outputs} if ops and ops[0].graph is not None else set()
    g.set_outputs([mapped[id(r)] for op in ops for r in op.results
                   if id(r) in graph_outputs or any(id(u) not in inside for u, _ in r.uses)])
    return g


class Profiler:
    """Times ops on local JAX devices, one device per device kind, with an on-disk cache."""

    def __init__(self, runs: int = 5, warmup: int = 2, cache: bool = True,
                 progress: Callable[[str], None] | None = None, devices: Sequence[Any] | None = None,
                 stat: str = "median", clock: str = "wall") -> None:
        if stat not in STATS or clock not in CLOCKS:
            raise ProfileError(f"unknown statistic '{stat}' or clock '{clock}' "
                               f"(known: {', '.join(STATS)}; {', '.join(CLOCKS)})")
        self.runs, self.warmup, self.cache, self.stat, self.clock = runs, warmup, cache, stat, clock
        self.progress = progress or (lambda message: None)
        self._devices = list(devices) if devices is not None else None
        self._memo: dict[tuple[str, str], float] = {}
        self._baseline: dict[int, float] = {}
        self.measured = 0
        self.cached = 0
        self._last_report = time.perf_counter()
        self._done = 0

    # ---------------------------------------------------------------- devices
    def jax_device_for(self, kind: str) -> Any:
        """A local JAX device of a cluster device kind; an error lists the kinds this machine has."""
        import jax

        local = self._devices if self._devices is not None else jax.devices()
        kinds: dict[str, Any] = {}
        for d in local:
            try:
                kinds.setdefault(jax_device_kind(d), d)
            except ClusterError:
                kinds.setdefault(kind_key(str(d.device_kind)), d)
        kind = kind_key(kind)
        if kind not in kinds:
            raise ProfileError(f"cannot profile for device kind '{kind}': no local JAX device of that kind "
                               f"(this machine has: {', '.join(sorted(kinds))}); use model=roofline, or a "
                               "cluster of the local devices")
        return kinds[kind]

    def time_on_kind(self, op: Op, device: Device) -> float:
        """Seconds `op` takes on a local JAX device of the cluster device's kind."""
        return self.time_op(op, self.jax_device_for(device.kind))

    # ---------------------------------------------------------------- timing
    def baseline(self, device: Any) -> float:
        """Median time of an empty jitted call on `device`: dispatch and synchronisation only."""
        key = id(device)
        if key not in self._baseline:
            import jax
            import numpy as np

            x = jax.device_put(np.zeros((), np.float32), device)
            self._baseline[key] = call_time(jax.jit(lambda a: a), [x], max(self.runs, 11), self.warmup + 1,
                                            self.stat, self.clock)
        return self._baseline[key]

    def time_op(self, op: Op, device: Any) -> float:
        """Seconds of `op` on JAX `device`: measured once per signature, cached on disk."""
        return self._cached(op_signature(op), device, lambda: self._measure(op, device))

    def time_group_on_kind(self, group: FusionGroup, device: Device) -> float:
        """Seconds of a fused kernel on a local JAX device of the cluster device's kind: its ops
        run as one executable, measured once per signature (ops, types, parameters, wiring)."""
        if group.free:
            return 0.0
        jax_device = self.jax_device_for(device.kind)
        if len(group.ops) == 1:
            return self.time_op(group.ops[0], jax_device)
        return self._cached(group_signature(group.ops), jax_device, lambda: self.time_ops(group.ops, jax_device))

    def _cached(self, signature: str, device: Any, measure: Callable[[], float]) -> float:
        key = self._cache_key(signature, device)
        memo_key = (signature, key)
        if memo_key in self._memo:
            return self._memo[memo_key]
        hit = cache_get("profile", key) if self.cache else None
        if hit is not None:
            seconds = float(hit)
            self.cached += 1
        else:
            seconds = measure()
            self.measured += 1
            if self.cache:
                cache_put("profile", key, seconds)
        self._memo[memo_key] = seconds
        self._tick()
        return seconds

    def time_ops(self, ops: Sequence[Op], device: Any) -> float:
        """Seconds of `ops` run together as one jitted executable (XLA fuses what it can).

        Not cached: a segment's time depends on all of its ops, and segments are rarely repeated.
        """
        import jax

        sub = subgraph(ops)
        interp = _interpreter_class()(sub)
        fn = jax.jit(lambda *xs: interp.run(*xs))
        args = example_arrays(sub.inputs, device, f"the segment from op '{ops[0].name}'")
        try:
            t = call_time(fn, args, self.runs, self.warmup, self.stat, self.clock)
        except Exception as e:
            raise ProfileError(f"cannot profile the segment of {len(ops)} op(s) from '{ops[0].name}': "
                               f"{type(e).__name__}: {e}") from None
        return max(t - self.baseline(device), 0.0)

    def _cache_key(self, signature: str, device: Any) -> str:
        return f"{machine_key(device)} | {self.stat} of {self.runs} by {self.clock} clock | {signature}"

    def _measure(self, op: Op, device: Any) -> float:
        import jax

        interp = _interpreter_class()(op.graph)
        args = example_arrays(op.operands, device, f"op '{op.name}' ({op.where()})")
        fn = jax.jit(lambda *xs: interp.run_op(op, list(xs)))
        try:
            t = call_time(fn, args, self.runs, self.warmup, self.stat, self.clock)
        except PestoError as e:
            raise ProfileError(f"cannot profile op '{op.name}' ({op.where()}): {e}") from None
        except Exception as e:  # JAX rejects the op's parameters or types
            raise ProfileError(f"cannot profile op '{op.name}' ({op.where()}, {op.opcode}): "
                               f"{type(e).__name__}: {e}") from None
        return max(t - self.baseline(device), 0.0)

    def _tick(self) -> None:
        self._done += 1
        now = time.perf_counter()
        if now - self._last_report >= PROGRESS_EVERY_S:
            self._last_report = now
            self.progress(f"annotate-costs: profiled {self._done} ops ({self.measured} measured, "
                          f"{self.cached} cached)")
