"""A reference interpreter: evaluate a Graph on one device by binding JAX primitives.

It walks the ops in order like `jax.core.eval_jaxpr`: an environment keyed by Value, and by
default binds the JAX primitive of the opcode's name with the op's parameters (its attributes but
the analysis annotations, `pesto_ir.ir.annotations`) decoded by `pesto_ir.jaxrt.params`; the few
ops that are not such a primitive name a run kind in their definition (`run` of
`pesto_ir.ir.opdefs.OpDef`), run by its rule in `RUN_KINDS`. Nested graphs (`scan`, `while`,
`cond` bodies) decode to closed jaxprs by tracing this interpreter over them, so any depth of
nesting works, and so does a `.pir` file written by hand with JAX primitive names.

Subclass `Interpreter` and override `run_op` to observe or change each op's evaluation (the
torch.fx habit): e.g. time it, or place it on a device.

It runs one replica in one process. An `all_reduce` (or another op of `ACROSS_REPLICAS`) over one
replica is the identity; one over
more replicas (a plan with data_parallel > 1) has no other replicas here to reduce with, so it is
refused (`check_single_replica`), unless the graph runs as one replica of a `jax.shard_map`
(`ReplicaInterpreter`, what the JAX backend does for replicas; emitted modules write the same
collectives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from pesto_ir.ir.annotations import primitive_params
from pesto_ir.ir.attributes import Attr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.opdefs import OPDEFS, check_kinds, opcodes
from pesto_ir.ir.types import TensorType
from pesto_ir.jaxrt.params import decode_params, decode_plain, jax_dtype, lookup_primitive, set_graph_decoder
from pesto_ir.util.errors import PestoError

EvalRule = Callable[["Interpreter", Op, list[Any]], list[Any]]


class Interpreter:
    """Evaluates one graph; `run_op` is the hook subclasses override."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def run(self, *inputs: Any) -> list[Any]:
        """The graph's outputs for these inputs (one per graph input, in order)."""
        graph = self.graph
        if len(inputs) != len(graph.inputs):
            raise PestoError(f"graph @{graph.name} takes {len(graph.inputs)} input(s), got {len(inputs)}")
        env: dict[Value, Any] = {v: self.load_input(v, x) for v, x in zip(graph.inputs, inputs)}
        for op in graph.ops:
            outs = self.run_op(op, [env[v] for v in op.operands])
            if len(outs) != len(op.results):
                raise PestoError(f"{op.where()}: op '{op.name}' gave {len(outs)} value(s) for "
                                 f"{len(op.results)} result(s)")
            env.update(zip(op.results, outs))
        return [env[v] for v in graph.outputs]

    def load_input(self, value: Value, x: Any) -> Any:
        """Check one input against its declared type; Python scalars and numpy arrays are converted
        the way JAX converts them."""
        t = value.type
        if not isinstance(t, TensorType):
            raise PestoError(f"input %{value.name} is {t}, which has no values to compute with")
        dtype = jax_dtype(t.dtype)
        given = getattr(x, "dtype", None)
        if t.key_impl is not None:  # typed PRNG keys: only JAX key arrays hold them, nothing converts
            if given != dtype or tuple(getattr(x, "shape", ())) != t.shape:
                raise PestoError(f"input %{value.name} of graph @{self.graph.name} is {t}, got "
                                 f"{given if given is not None else type(x).__name__}{list(np.shape(x))} "
                                 f"(pass a key array of that implementation: jax.random.key(seed, "
                                 f"impl={t.key_impl!r}))")
            return x
        if given is None or (isinstance(x, (np.ndarray, np.generic))
                             and jax.dtypes.canonicalize_dtype(given) == dtype):
            x = np.asarray(x, dtype=dtype)  # what JAX does to numpy inputs (f64 -> f32 without x64)
        if tuple(np.shape(x)) != t.shape or jax.numpy.dtype(x.dtype) != dtype:
            raise PestoError(f"input %{value.name} of graph @{self.graph.name} is {t}, "
                             f"got {x.dtype}{list(np.shape(x))}")
        return x

    def run_op(self, op: Op, args: list[Any]) -> list[Any]:
        """Evaluate one op on its operands' values; returns one value per result."""
        rule = EVAL_RULES.get(op.opcode, bind_primitive)
        try:
            return rule(self, op, args)
        except PestoError:
            raise
        except Exception as e:
            raise PestoError(f"{op.where()}: evaluating op '{op.name}' ({op.opcode}): "
                             f"{type(e).__name__}: {e}") from e

    def param_attrs(self, op: Op) -> dict[str, Attr]:
        """The attributes of `op` that are primitive parameters (analysis annotations left out)."""
        return primitive_params(op)


def bind_primitive(interp: Interpreter, op: Op, args: list[Any]) -> list[Any]:
    """The default rule: bind the JAX primitive named by the opcode."""
    prim = lookup_primitive(op.opcode)
    out = prim.bind(*args, **decode_params(op.opcode, interp.param_attrs(op)))
    return list(out) if prim.multiple_results else [out]


def _eval_constant(interp: Interpreter, op: Op, args: list[Any]) -> list[Any]:
    """`constant {value = ...}`: a scalar (broadcast to the result shape) or nested lists."""
    t = op.result.type
    if not isinstance(t, TensorType) or "value" not in op.attrs:
        raise PestoError(f"{op.where()}: constant '{op.name}' needs a tensor type and a 'value' attribute")
    dtype = jax_dtype(t.dtype)
    value = decode_plain(op.attrs["value"])
    if np.issubdtype(dtype, np.complexfloating) and isinstance(value, tuple) and len(value) == 2 \
            and not isinstance(value[0], tuple):
        value = complex(*value)
    arr = np.asarray(value, dtype=dtype)
    if arr.shape == ():
        return [np.full(t.shape, arr, dtype=dtype) if t.shape else arr]
    if arr.shape != t.shape:
        raise PestoError(f"{op.where()}: constant '{op.name}' has a value of shape {list(arr.shape)}, "
                         f"not {list(t.shape)}")
    return [arr]


def one_replica(op: Op) -> bool:
    """True when `op` (an `all_reduce`) reduces over exactly one replica: then it is the identity."""
    n = op.get("replicas", 1)
    return isinstance(n, int) and not isinstance(n, bool) and n == 1


# Ops over data-parallel replicas (run kind "replicas"): the identity over one replica, a
# collective of the replicas' mesh axis over more (`ReplicaInterpreter`).
ACROSS_REPLICAS: frozenset[str] = opcodes(run="replicas")


def _single_replica_error(op: Op) -> PestoError:
    what = "all-reduces" if op.opcode == "all_reduce" else f"runs {op.opcode}"
    return PestoError(f"{op.where()}: op '{op.name}' {what} across {op.get('replicas')} data-parallel "
                      "replicas, but this runs one replica in one process: run plans with data_parallel > 1 "
                      "through the JAX backend (pesto_ir.parallelize, or pesto_ir.backends.jax.build)")


def check_single_replica(graph: Graph) -> None:
    """Refuse a graph (nested bodies included) with an `all_reduce` over more than one replica:
    the single-process backends run one replica and have nothing to reduce with."""
    stack = [graph]
    while stack:
        g = stack.pop()
        for op in g.ops:
            if op.opcode in ACROSS_REPLICAS and not one_replica(op):
                raise _single_replica_error(op)
            stack.extend(op.subgraphs())


def _eval_all_reduce(interp: Interpreter, op: Op, args: list[Any]) -> list[Any]:
    """Over one replica an op across replicas is the identity; over more, see `check_single_replica`."""
    if not one_replica(op):
        raise _single_replica_error(op)
    return list(args)


RUN_KINDS: dict[str, EvalRule] = {
    "constant": _eval_constant,
    "replicas": _eval_all_reduce,
}
check_kinds("run", RUN_KINDS)
# The rule of each opcode that is not bound as the JAX primitive of its name, by its run kind.
EVAL_RULES: dict[str, EvalRule] = {d.name: RUN_KINDS[d.run] for d in OPDEFS.values() if d.run is not None}


def evaluate(graph: Graph, *inputs: Any) -> list[Any]:
    """Evaluate `graph` on one device: one array per graph output."""
    return Interpreter(graph).run(*inputs)


def graph_to_closed_jaxpr(graph: Graph, interpreter: type[Interpreter] = Interpreter) -> Any:
    """The closed jaxpr of a (nested) graph, traced through the interpreter; what `scan`,
    `while` and `cond` bind with."""
    specs: list[jax.ShapeDtypeStruct] = []
    for v in graph.inputs:
        if not isinstance(v.type, TensorType):
            raise PestoError(f"input %{v.name} of body @{graph.name} is {v.type}, not a tensor")
        specs.append(jax.ShapeDtypeStruct(v.type.shape, jax_dtype(v.type.dtype)))
    return jax.make_jaxpr(lambda *xs: interpreter(graph).run(*xs))(*specs)


set_graph_decoder(graph_to_closed_jaxpr)  # how jax_params decodes nested graphs (bodies of scan, pjit, ...)


class ReplicaInterpreter(Interpreter):
    """One replica's graph inside `jax.shard_map` over a mesh axis of the replicas: an `all_reduce`
    over them is the collective of that axis (`psum`, `pmax`, `pmin`), a `reduce_scatter` its
    `psum_scatter` (each operand along its axis), an `all_gather` its `all_gather`, a `replica_slice`
    the block of the replica's index, `block_indices` the indices less that block's start; the rest
    as usual."""

    REDUCE = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}

    def __init__(self, graph: Graph, axis: str, replicas: int, tensor_axis: str | None = None,
                 tensor: int = 1) -> None:
        super().__init__(graph)
        self.axis, self.replicas = axis, replicas
        self.tensor_axis, self.tensor = tensor_axis, tensor

    def run_op(self, op: Op, args: list[Any]) -> list[Any]:
        if op.opcode not in ACROSS_REPLICAS or one_replica(op):
            return super().run_op(op, args)
        # a tensor-parallel group's collective (`across = "tensor"`) runs over the mesh's tensor axis
        ranks = op.get("across") == "tensor" and self.tensor_axis is not None
        axis, size = (self.tensor_axis, self.tensor) if ranks else (self.axis, self.replicas)
        assert axis is not None
        if op.opcode == "all_reduce":
            reduce = self.collective(op, size)
            return [reduce(x, axis) for x in args]
        self.check_replicas(op, size)
        if op.opcode == "replica_slice":  # the replica's block (of each run)
            dim, runs, x = int(op.get("axis")), int(op.get("runs", 1)), args[0]
            shape = x.shape
            x = x.reshape(*shape[:dim], runs, shape[dim] // runs, *shape[dim + 1:])
            block = shape[dim] // (runs * size)
            x = jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(axis) * block, block, dim + 1)
            return [x.reshape(*shape[:dim], shape[dim] // size, *shape[dim + 1:])]
        if op.opcode == "block_indices":  # indices into the replica's block: those of the others fall outside
            block = int(op.get("size")) // size
            return [args[0] - (jax.lax.axis_index(axis) * block).astype(args[0].dtype)]
        dims = [int(a) for a in op.get("axes")]
        if op.opcode == "all_gather":
            return [jax.lax.all_gather(x, axis, axis=a, tiled=True) for x, a in zip(args, dims)]
        if op.get("reduction", "sum") != "sum":
            raise PestoError(f"{op.where()}: op '{op.name}' reduce-scatters with {op.get('reduction')!r}; "
                             "only sums are run")
        return [jax.lax.psum_scatter(x, axis, scatter_dimension=a, tiled=True) for x, a in zip(args, dims)]

    @staticmethod
    def check_replicas(op: Op, replicas: int) -> None:
        if op.get("replicas") != replicas:
            what = "all-reduces" if op.opcode == "all_reduce" else f"runs {op.opcode}"
            raise PestoError(f"{op.where()}: op '{op.name}' {what} across {op.get('replicas')} replicas, "
                             f"but the step runs {replicas}")

    @classmethod
    def collective(cls, op: Op, replicas: int) -> Callable[..., Any]:
        """The collective that `op`, an `all_reduce` across `replicas` replicas, runs; refused when
        it names another replica count or an unknown reduction."""
        cls.check_replicas(op, replicas)
        reduce = cls.REDUCE.get(str(op.get("reduction", "sum")))
        if reduce is None:
            raise PestoError(f"{op.where()}: op '{op.name}' has reduction {op.get('reduction')!r} "
                             f"(known: {', '.join(cls.REDUCE)})")
        return reduce


def as_function(graph: Graph, replica_axis: str | None = None, replicas: int = 1,
                tensor_axis: str | None = None, tensor: int = 1) -> Callable[..., list[Any]]:
    """`graph` as a Python function of its inputs, to wrap in `jax.jit` (one compile, not one per op);
    with `replica_axis`, one replica's function for `jax.shard_map` over that axis of `replicas`
    (and `tensor_axis` of `tensor` ranks, where tensor-parallel groups' collectives run)."""

    def fn(*inputs: Any) -> list[Any]:
        if replica_axis is not None:
            return ReplicaInterpreter(graph, replica_axis, replicas, tensor_axis, tensor).run(*inputs)
        return Interpreter(graph).run(*inputs)

    fn.__name__ = graph.name.replace(".", "_").replace("-", "_") or "graph"
    return fn


def input_specs(graph: Graph) -> Sequence[jax.ShapeDtypeStruct]:
    """Abstract inputs of `graph` (for `jax.jit(...).lower(*specs)` or `jax.eval_shape`)."""
    return [jax.ShapeDtypeStruct(v.type.shape, jax_dtype(v.type.dtype)) for v in graph.inputs
            if isinstance(v.type, TensorType)]


__all__ = ["ACROSS_REPLICAS", "EVAL_RULES", "RUN_KINDS", "EvalRule", "Interpreter", "ReplicaInterpreter", "as_function",
           "bind_primitive", "check_single_replica", "evaluate", "graph_to_closed_jaxpr", "input_specs", "one_replica"]
