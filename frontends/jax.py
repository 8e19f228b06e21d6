"""Lower a JAX function into a Pesto IR Graph, one op per jaxpr equation.

`lower(fn, *example_args)` traces `fn` with `jax.make_jaxpr` and walks the jaxpr:

* every equation becomes an op whose opcode is the primitive's name and whose attributes are its
  parameters, printed through the codec table of `pesto_ir.jaxrt.params` (so the interpreter can
  decode them back and bind the primitive);
* calls (`jit`/`pjit`, `closed_call`, `custom_jvp_call`, `custom_vjp_call`, `remat`/`checkpoint`,
  `custom_linear_solve`) are inlined: their bodies' equations become ops of the enclosing graph,
  tagged with a `scope` attribute naming the call boundary (`"jit(relu)"`); placement wants to see
  every operation, not an opaque call;
* `scan`, `while` and `cond` stay single ops whose bodies are nested graphs (`GraphAttr`);
* scalar literals become `constant` ops with a `value` attribute; closed-over arrays become
  trailing graph inputs (listed in the graph attribute `consts`; their arrays are
  `LoweredFunction.consts`), never giant literals. Arrays a nested body closes over are threaded
  into it as extra leading body inputs and extra operands (raising `num_consts` and friends);
* each op's location is the user's frame of its equation (`jax.extend.source_info_util`);
* typed PRNG keys (`jax.random.key`) are arrays of element type `key<impl>` (`key<threefry2x32>[2]`),
  and the key primitives (`random_seed`, `random_split`, `random_bits`, ...) plain ops;
* mutable array references (`jax.new_ref`) made inside the step are discharged into plain array
  ops and hijax types (`is_high` jaxprs) lowered to plain arrays, as `jax.jit` does before compiling;
* `shard_map`, `pmap` and the collectives over named axes, Python callbacks, custom calls and kernels
  (`ffi_call`, `pallas_call`, ...), tokens and a few others are refused by name, each with the reason
  and what to do instead (`REFUSED_PRIMITIVES`): pesto_ir places the step itself, and a `.pir` graph
  holds array operations only.

Inputs are marked `param` (trainable state) by position: `param_argnums=(0, 1)` marks every leaf of
the first two positional arguments. The leaves of rank >= 1 of the positional arguments in
`batch_argnums` (default: every positional argument not in `param_argnums`) carry the batch along
axis 0; the graph attribute `batch_inputs` (`{x = 0, y = 0}`: input name -> batch axis) lists
them for micro-batching and data parallelism. `lower` returns the Graph; `lower_function` also
returns the pytree structures and constant arrays a caller needs to run it
(`LoweredFunction.__call__`).

The tables of inlined and refused primitives are `frontends/jax_primitives.py`; op names and
locations, `frontends/jax_names.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.extend.core as jex
import numpy as np

from pesto_ir.frontends.jax_names import FreshNames, arg_names, function_name, sanitize_name, source_location
from pesto_ir.frontends.jax_partitioning import record_hints
from pesto_ir.frontends.jax_primitives import (
    COLLECTIVE_ADVICE,
    COLLECTIVES,
    INLINE_RULES,
    REFUSED_PRIMITIVES,
    Atom,
    InlineRule,
    LoweringError,
)
from pesto_ir.ir.attributes import Attr, DictAttr, FloatAttr, GraphAttr, IntAttr, ListAttr, StringAttr, to_attr
from pesto_ir.ir.graph import Graph, Location, Op, Value, donate_inputs
from pesto_ir.ir.types import TensorType, dtype_short_name
from pesto_ir.ir.verifier import verify as verify_graph
from pesto_ir.jaxrt.interpreter import evaluate
from pesto_ir.jaxrt.params import (
    DERIVED_PARAMS,
    ParamEncodeError,
    encode_param,
    is_key_dtype,
    key_type_name,
    remember_primitive,
)
from pesto_ir.util.errors import PestoError
from pesto_ir.util.gc_pause import gc_paused

Env = dict[Any, Value]


class _Ctx(NamedTuple):
    """Where equations are lowered from: the call boundaries around them, and the location of the
    innermost call site (JAX traces a library function's body without the user's frames)."""

    scope: tuple[str, ...] = ()
    loc: Location | None = None

    def location(self, eqn: Any) -> Location | None:
        return source_location(eqn.source_info) or self.loc


# ---------------------------------------------------------------- public API

@dataclass
class LoweredFunction:
    """A lowered function and what running it needs besides the graph.

    Graph inputs are the flattened leaves of `(args, kwargs)`, then the closed-over constants
    (`consts`, in order). Outputs are the flattened leaves of the result (`out_tree`).
    """

    graph: Graph
    consts: list[Any]
    in_tree: Any
    out_tree: Any
    jaxpr: Any = field(repr=False, default=None)

    @property
    def num_args(self) -> int:
        return len(self.graph.inputs) - len(self.consts)

    def flat_inputs(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Every graph input, in order, for a call with these arguments."""
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        if tree != self.in_tree:
            raise PestoError(f"arguments do not match the example the graph was lowered with: "
                             f"{tree} vs {self.in_tree}")
        return [*leaves, *self.consts]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the graph with the reference interpreter; same pytree result as the function."""
        outs = evaluate(self.graph, *self.flat_inputs(*args, **kwargs))
        return jax.tree_util.tree_unflatten(self.out_tree, outs)


def lower(fn: Callable[..., Any], *example_args: Any, param_argnums: int | Sequence[int] = (),
          batch_argnums: int | Sequence[int] | None = None, donate_argnums: int | Sequence[int] = (),
          verify: bool = True, **example_kwargs: Any) -> Graph:
    """Trace `fn` on example arguments and lower its jaxpr into a verified Graph."""
    return lower_function(fn, *example_args, param_argnums=param_argnums, batch_argnums=batch_argnums,
                          donate_argnums=donate_argnums, verify=verify, **example_kwargs).graph


def lower_function(fn: Callable[..., Any], *example_args: Any, param_argnums: int | Sequence[int] = (),
                   batch_argnums: int | Sequence[int] | None = None, donate_argnums: int | Sequence[int] = (),
                   verify: bool = True, **example_kwargs: Any) -> LoweredFunction:
    """Like `lower`, keeping the pytree structures and constants needed to run the graph.

    `donate_argnums`: the positional arguments whose buffers the caller gives up, as `jax.jit`'s;
    their leaves are recorded as the graph's `donated` inputs, which the memory model frees after
    their last read (an executable built from the plan must then be given them to donate).

    `batch_argnums`: the positional arguments whose leaves of rank >= 1 carry the batch along axis 0
    (None: every positional argument not in `param_argnums`); recorded as the graph attribute
    `batch_inputs` (input name -> 0), written only when there is at least one such leaf. Explicit
    `batch_argnums` are checked: in range, not parameters, each with an array of rank >= 1, and
    all those arrays of one size along axis 0 (a LoweringError otherwise). The default is a
    guess: when its arrays disagree on that size (`f(x, w)` with `w` a weight not in
    `param_argnums`), lowering goes on and no `batch_inputs` is written.
    """
    batch_set = _batch_argnums(example_args, param_argnums, batch_argnums)
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*example_args, **example_kwargs)
    except NameError as e:  # JAX's error for a collective (psum, axis_index, ...) outside shard_map/pmap
        if "unbound axis name" not in str(e):
            raise
        raise LoweringError(f"tracing {function_name(fn)}: {e} ({COLLECTIVE_ADVICE})") from None
    in_tree = jax.tree_util.tree_structure((example_args, example_kwargs))
    flags = _argnum_flags(example_args, example_kwargs, param_argnums, "param_argnums")
    donated = _argnum_flags(example_args, example_kwargs, donate_argnums, "donate_argnums")
    graph, consts = lower_jaxpr(closed, name=function_name(fn), param_flags=flags)
    donate_inputs(graph, [v.name for v, d in zip(graph.inputs, donated) if d])
    batch = _batch_inputs(graph, example_args, batch_set, explicit=batch_argnums is not None)
    if batch or batch_argnums is not None:  # `batch_argnums=()` says: no batch (written as {})
        graph.attrs["batch_inputs"] = DictAttr(tuple((name, IntAttr(0)) for name in batch))
    record_hints(graph, example_args, example_kwargs)  # flax partitioning metadata, for the layout search
    if verify:
        verify_graph(graph, f"after lowering {graph.name}")
    return LoweredFunction(graph, consts, in_tree, jax.tree_util.tree_structure(out_shape), closed)


def lower_jaxpr(closed: Any, name: str = "main", param_flags: Sequence[bool] | None = None,
                input_names: Sequence[str] | None = None) -> tuple[Graph, list[Any]]:
    """Lower a ClosedJaxpr; returns the graph and the constant arrays its trailing inputs take."""
    with gc_paused():
        return _lower_closed(closed, name, param_flags, input_names)


def _lower_closed(closed: Any, name: str, param_flags: Sequence[bool] | None,
                  input_names: Sequence[str] | None) -> tuple[Graph, list[Any]]:
    graph = Graph(sanitize_name(name, "main"))
    b = _Builder(graph)
    names = input_names or arg_names(closed.jaxpr, len(closed.jaxpr.invars))
    closed = plain_arrays(closed)
    jaxpr = without_dead_code(closed.jaxpr)
    refuse_unsupported(jaxpr)
    flags = list(param_flags) if param_flags is not None else [False] * len(jaxpr.invars)
    env: Env = {}
    for var, hint, is_param in zip(jaxpr.invars, names, flags):
        env[var] = graph.add_input(b.names.fresh(hint), b.tensor_type(var.aval, None, "input"), param=is_param)
    read = _read_vars(jaxpr)
    for var, c in zip(jaxpr.constvars, closed.consts):
        if var in read:  # a constant only dead code read is not captured
            env[var] = b.const_value(c)
    b.lower_eqns(jaxpr, env, _Ctx())
    graph.set_outputs(b.read(v, env, None) for v in jaxpr.outvars)
    consts = [array for array, _ in b.captured.values()]
    if consts:
        graph.attrs["consts"] = ListAttr(tuple(StringAttr(v.name) for _, v in b.captured.values()))
    return graph, consts


def plain_arrays(closed: Any) -> Any:
    """`closed` computing on plain arrays only, as `jax.jit` turns it before compiling: hijax types
    (boxes, `accum_grad_in_ref`, user `VJPHiPrimitive`s) lowered to their plain parts, and mutable
    array references made inside it (`jax.new_ref`, `jax.empty_ref`) discharged: a read becomes the
    value, a write a new value. References and hijax values among its inputs or outputs are refused:
    the caller's own buffers cannot be updated by a planned step."""
    from jax._src import core as jax_core
    from jax._src.interpreters import partial_eval as pe
    from jax._src.state.types import AbstractRef

    for where, avals in (("input", closed.in_avals), ("output", closed.out_avals)):
        for i, aval in enumerate(avals):
            if getattr(aval, "is_high", False) or isinstance(aval, AbstractRef):
                raise LoweringError(f"{where} {i} of the step is {aval.str_short()}, not an array: pass and return "
                                    f"arrays (make mutable references with jax.new_ref inside the step, and "
                                    f"read them with jax.freeze or ref[...] before returning)")
    if getattr(closed.jaxpr, "is_high", False):
        closed = pe.lower_jaxpr2(closed)
    if any(isinstance(e, jax_core.InternalMutableArrayEffect) for e in closed.effects):
        from jax._src.state.discharge import discharge_state

        closed = discharge_state(closed)
    return closed


def refuse_unsupported(jaxpr: Any, loc: Location | None = None) -> None:
    """A LoweringError for the first equation (nested bodies included) whose primitive is in
    `REFUSED_PRIMITIVES`, with its reason: before any input or result type is read, so that the
    error says what the step does (a `precv` makes a token) rather than what it cannot type.
    `loc`: where the enclosing call is, for equations of library code that carry no user frame."""
    for eqn in jaxpr.eqns:
        where = source_location(eqn.source_info) or loc
        refusal = REFUSED_PRIMITIVES.get(eqn.primitive.name)
        if refusal is not None:
            raise LoweringError(f"{where or '<unknown location>'}: {refusal(eqn)}")
        for sub in sub_jaxprs(eqn.params):
            refuse_unsupported(sub, where)


def without_dead_code(jaxpr: Any) -> Any:
    """`jaxpr` without the equations whose results nothing uses (JAX's own `dce_jaxpr`, into the
    bodies of `cond`, `scan`, `pjit` and the rest; effects such as debug prints are kept), with
    the same inputs: libraries trace work they drop (flax's RNN builds a default carry from a
    random key), and it would be costed and placed as if it ran."""
    from jax._src.interpreters import partial_eval as pe

    pruned, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
    return pruned.replace(invars=jaxpr.invars, constvars=jaxpr.constvars)


def _read_vars(jaxpr: Any) -> set[Any]:
    """The variables the equations and outputs of `jaxpr` read (literals aside)."""
    out: set[Any] = set()
    for eqn in jaxpr.eqns:
        out.update(v for v in eqn.invars if not hasattr(v, "val"))
    out.update(v for v in jaxpr.outvars if not hasattr(v, "val"))
    return out


def _argnum_list(argnums: int | Sequence[int], what: str) -> list[int]:
    """`argnums` (one position or several, as `jax.jit` takes them) as a list, checked: whole
    numbers, not bools (a LoweringError naming `what` otherwise); range is the caller's to check."""
    nums = [argnums] if isinstance(argnums, int) and not isinstance(argnums, bool) else argnums
    if isinstance(nums, (str, bytes)) or not isinstance(nums, Sequence) \
            or any(isinstance(i, bool) or not isinstance(i, int) for i in nums):
        raise LoweringError(f"{what} must be a position or a list of positions of the function's "
                            f"arguments (whole numbers from 0), got {argnums!r}")
    return list(nums)


def _argnum_flags(args: tuple[Any, ...], kwargs: dict[str, Any], argnums: int | Sequence[int],
                  what: str) -> list[bool]:
    """Per flattened input (positional leaves, then keyword leaves): whether its argument is in `argnums`."""
    wanted = set(_argnum_list(argnums, what))
    bad = [i for i in wanted if not 0 <= i < len(args)]
    if bad:
        raise PestoError(f"{what} {sorted(bad)} out of range for {len(args)} positional argument(s)")
    flags: list[bool] = []
    for i, a in enumerate(args):
        flags += [i in wanted] * len(jax.tree_util.tree_leaves(a))
    return flags + [False] * len(jax.tree_util.tree_leaves(kwargs))


def _batch_argnums(args: tuple[Any, ...], param_argnums: int | Sequence[int],
                   batch_argnums: int | Sequence[int] | None) -> list[int]:
    """The positions of the arguments that carry the batch, checked against the arguments and
    `param_argnums`; None means every positional argument that is not a parameter."""
    params = {param_argnums} if isinstance(param_argnums, int) else set(param_argnums)
    if batch_argnums is None:
        return [i for i in range(len(args)) if i not in params]
    nums = _argnum_list(batch_argnums, "batch_argnums")
    bad = sorted({i for i in nums if not 0 <= i < len(args)})
    if bad:
        raise LoweringError(f"batch_argnums {bad} out of range: the function was given {len(args)} positional "
                            f"argument(s), so positions run from 0 to {len(args) - 1}")
    both = sorted(set(nums) & params)
    if both:
        raise LoweringError(f"argument(s) {both} are in both batch_argnums and param_argnums: an argument is "
                            f"either trainable state or batch data, not both")
    return sorted(set(nums))


def _batch_inputs(graph: Graph, args: tuple[Any, ...], argnums: Sequence[int], explicit: bool) -> list[str]:
    """Names of the graph inputs that carry the batch: the leaves of rank >= 1 of the arguments
    `argnums` (graph inputs start with the flattened positional arguments, in order). They must
    agree on their size along axis 0."""
    names: list[str] = []
    sizes: dict[int, list[str]] = {}
    start = 0
    for i, a in enumerate(args):
        n = len(jax.tree_util.tree_leaves(a))
        if i in argnums:
            found = [(v.name, v.type.shape[0]) for v in graph.inputs[start:start + n]
                     if isinstance(v.type, TensorType) and v.type.rank >= 1]
            if explicit and not found:
                raise LoweringError(f"batch_argnums names argument {i}, but it has no array of rank >= 1 to split "
                                    f"along axis 0 (its leaves are scalars, or it has none)")
            for name, size in found:
                names.append(name)
                sizes.setdefault(size, []).append(name)
        start += n
    if len(sizes) > 1:
        if not explicit:
            return []  # the default guess does not hold; nothing is declared (see lower_function)

        def listed(group: list[str]) -> str:
            shown = ", ".join(f"%{n}" for n in group[:6])
            return shown + (f" and {len(group) - 6} more" if len(group) > 6 else "")

        detail = "; ".join(f"size {size}: {listed(group)}" for size, group in sizes.items())
        raise LoweringError(f"the batch inputs disagree on their size along axis 0 ({detail}): every array of rank "
                            f">= 1 among the arguments {list(argnums)} in batch_argnums is taken to carry the batch "
                            f"along axis 0, so they must all have the same size there; pass batch_argnums naming "
                            f"only the arguments that carry the batch")
    return names


def _scope_of(ctx: _Ctx, source_info: Any) -> str:
    stack = str(source_info.name_stack)
    return "/".join((*ctx.scope, stack) if stack else ctx.scope)


# ---------------------------------------------------------------- the builder

class _Builder:
    """Builds one graph from one jaxpr (and the calls inlined into it); nested bodies get their own."""

    def __init__(self, graph: Graph, types: dict[tuple[Any, ...], TensorType] | None = None) -> None:
        self.graph = graph
        self.names = FreshNames()
        self.captured: dict[int, tuple[Any, Value]] = {}  # id(array) -> (array, input it is read from)
        self.literals: dict[tuple[str, bytes], Value] = {}
        self._types = types if types is not None else {}  # (shape, dtype) -> TensorType, shared with bodies

    # -- values
    def tensor_type(self, aval: Any, loc: Location | None, what: str) -> TensorType:
        key = (aval.shape, aval.dtype) if hasattr(aval, "dtype") else (aval,)
        t = self._types.get(key)
        if t is None:
            t = self._types[key] = _tensor_type(aval, loc, what)
        return t

    def const_value(self, array: Any) -> Value:
        """The input that carries a closed-over array (created on first use)."""
        hit = self.captured.get(id(array))
        if hit is not None:
            return hit[1]
        aval = jax.typeof(array)
        v = self.graph.add_input(self.names.fresh("const"), self.tensor_type(aval, None, "constant"))
        self.captured[id(array)] = (array, v)
        return v

    def read(self, atom: Atom, env: Env, loc: Location | None) -> Value:
        if isinstance(atom, jex.Literal):
            return self.literal_value(atom.val, loc)
        return env[atom]

    def literal_value(self, val: Any, loc: Location | None) -> Value:
        """A `constant` op for a scalar literal (one per distinct value and dtype), else an input."""
        arr = np.asarray(val)
        if arr.shape != ():
            return self.const_value(val)
        t = self.tensor_type(jax.typeof(val), loc, "literal")
        key = (t.dtype, arr.tobytes())
        hit = self.literals.get(key)
        if hit is not None:
            return hit
        name = self.names.fresh("lit")
        op = Op(name, "constant", (), [t], {"value": _scalar_attr(arr)}, [name], loc)
        self.graph.append(op)
        self.literals[key] = op.result
        return op.result

    # -- equations
    def lower_eqns(self, jaxpr: Any, env: Env, ctx: _Ctx) -> None:
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            refusal = REFUSED_PRIMITIVES.get(name)
            if refusal is not None:
                raise LoweringError(f"{ctx.location(eqn) or '<unknown location>'}: {refusal(eqn)}")
            rule = INLINE_RULES.get(name)
            if rule is not None:
                outs = self.inline(eqn, rule, env, ctx)
            else:
                outs = STRUCTURED_RULES.get(name, _lower_plain)(self, eqn, env, ctx)
            for var, value in zip(eqn.outvars, outs):
                env[var] = value

    def inline(self, eqn: Any, rule: InlineRule, env: Env, ctx: _Ctx) -> list[Value]:
        body, atoms, label = rule(eqn)
        loc = ctx.location(eqn)
        args = [self.read(a, env, loc) for a in atoms]
        jaxpr, consts = (body.jaxpr, body.consts) if isinstance(body, jex.ClosedJaxpr) else (body, ())
        inner: Env = dict(zip(jaxpr.invars, args))
        for var, c in zip(jaxpr.constvars, consts):
            inner[var] = self.const_value(c)
        stack = str(eqn.source_info.name_stack)
        self.lower_eqns(jaxpr, inner, _Ctx((*ctx.scope, *((stack,) if stack else ()), label), loc))
        return [self.read(v, inner, loc) for v in jaxpr.outvars]

    def emit(self, eqn: Any, operands: Sequence[Value], attrs: dict[str, Attr], ctx: _Ctx,
             loc: Location | None) -> list[Value]:
        """Append the op of one equation; results are named after the opcode."""
        name = eqn.primitive.name
        remember_primitive(eqn.primitive)
        types = [self.tensor_type(v.aval, loc, f"result of {name}") for v in eqn.outvars]
        scope_text = _scope_of(ctx, eqn.source_info)
        if scope_text:
            attrs["scope"] = StringAttr(scope_text)
        base = self.names.fresh(sanitize_name(name, "op"))
        results = [base] if len(types) == 1 else [self.names.fresh(f"{base}_{i}") for i in range(len(types))]
        op = Op(base, name, operands, types, attrs, results, loc)
        self.graph.append(op)
        return op.results

    def encode(self, eqn: Any, loc: Location | None, graphs: dict[str, Attr] | None = None) -> dict[str, Attr]:
        """Printed parameters of an equation; `graphs` replaces the jaxpr-valued ones."""
        name = eqn.primitive.name
        derived = DERIVED_PARAMS.get(name, {})
        graphs = graphs or {}
        try:
            return {k: graphs[k] if k in graphs else encode_param(name, k, v)
                    for k, v in eqn.params.items() if k not in derived}
        except ParamEncodeError as e:
            if not graphs and sub_jaxprs(eqn.params):
                raise LoweringError(
                    f"{loc or '<unknown location>'}: primitive '{name}' carries sub-jaxprs and the JAX "
                    f"frontend does not know how to lower it (it inlines {', '.join(sorted(INLINE_RULES))}; "
                    f"keeps {', '.join(sorted(STRUCTURED_RULES))} as ops with nested graphs)") from None
            raise LoweringError(f"{loc or '<unknown location>'}: {e}") from None

    # -- nested bodies
    def lower_body(self, body: Any, name: str, loc: Location | None) -> _Builder:
        """Lower a sub-jaxpr into a nested graph; arrays it closes over are collected, not resolved."""
        jaxpr, consts = (body.jaxpr, body.consts) if isinstance(body, jex.ClosedJaxpr) else (body, ())
        child = _Builder(Graph(name), self._types)
        env: Env = {}
        for var, hint in zip(jaxpr.invars, arg_names(jaxpr, len(jaxpr.invars))):
            env[var] = child.graph.add_input(child.names.fresh(hint), child.tensor_type(var.aval, None, "input"))
        for var, c in zip(jaxpr.constvars, consts):
            env[var] = child.const_value(c)
        child.lower_eqns(jaxpr, env, _Ctx((), loc))
        child.graph.set_outputs(child.read(v, env, None) for v in jaxpr.outvars)
        return child

    def thread_captures(self, bodies: Sequence[_Builder]) -> list[Value]:
        """Make every array the bodies captured a leading input of each body (in one shared order),
        and return the values that feed them here."""
        order: dict[int, Any] = {}
        for body in bodies:
            for key, (array, _) in body.captured.items():
                order.setdefault(key, array)
        for body in bodies:
            leading = []
            for key, array in order.items():
                hit = body.captured.get(key)
                leading.append(hit[1] if hit is not None else
                               body.graph.add_input(body.names.fresh("const"), self.tensor_type(
                                   jax.typeof(array), None, "constant")))
            rest = [v for v in body.graph.inputs if all(v is not x for x in leading)]
            body.graph.inputs = leading + rest
        return [self.const_value(array) for array in order.values()]


def sub_jaxprs(params: dict[str, Any]) -> list[Any]:
    """The jaxprs among an equation's parameters (also inside tuples, like `cond` branches)."""
    out: list[Any] = []
    for v in params.values():
        for x in v if isinstance(v, tuple) else (v,):
            if isinstance(x, jex.ClosedJaxpr):
                out.append(x.jaxpr)
            elif isinstance(x, jex.Jaxpr):
                out.append(x)
    return out


def _tensor_type(aval: Any, loc: Location | None, what: str) -> TensorType:
    """The IR type of an aval; typed PRNG keys (`key<fry>[2]`) become `key<threefry2x32>[2]`."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    try:
        if shape is None or dtype is None or not isinstance(aval, jax.core.ShapedArray):
            raise ValueError(f"{aval.str_short() if hasattr(aval, 'str_short') else aval} is not an array")
        name = key_type_name(dtype) if is_key_dtype(dtype) else dtype_short_name(dtype)
        return TensorType(name, tuple(int(d) for d in shape))
    except (ValueError, TypeError, ParamEncodeError) as e:
        raise LoweringError(f"{loc or '<unknown location>'}: {what} of type {aval} has no Pesto IR type ({e})") from None


def _scalar_attr(arr: np.ndarray) -> Attr:
    v = arr.item()
    if isinstance(v, complex):
        return ListAttr((FloatAttr(v.real), FloatAttr(v.imag)))
    return to_attr(v)


# ---------------------------------------------------------------- plain equations

def _lower_plain(b: _Builder, eqn: Any, env: Env, ctx: _Ctx) -> list[Value]:
    loc = ctx.location(eqn)
    operands = [b.read(a, env, loc) for a in eqn.invars]
    return b.emit(eqn, operands, b.encode(eqn, loc), ctx, loc)


# ---------------------------------------------------------------- ops with nested graphs

StructuredRule = Callable[[_Builder, Any, Env, _Ctx], list[Value]]


def _lower_scan(b: _Builder, eqn: Any, env: Env, ctx: _Ctx) -> list[Value]:
    loc = ctx.location(eqn)
    body = b.lower_body(eqn.params["jaxpr"], "body", loc)
    extra = b.thread_captures([body])
    operands = [*extra, *(b.read(a, env, loc) for a in eqn.invars)]
    attrs = b.encode(eqn, loc, {"jaxpr": GraphAttr(body.graph)})
    attrs["num_consts"] = to_attr(eqn.params["num_consts"] + len(extra))
    return b.emit(eqn, operands, attrs, ctx, loc)


def _lower_while(b: _Builder, eqn: Any, env: Env, ctx: _Ctx) -> list[Value]:
    loc = ctx.location(eqn)
    p = eqn.params
    cond = b.lower_body(p["cond_jaxpr"], "cond", loc)
    body = b.lower_body(p["body_jaxpr"], "body", loc)
    cond_extra, body_extra = b.thread_captures([cond]), b.thread_captures([body])
    args = [b.read(a, env, loc) for a in eqn.invars]
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    operands = [*cond_extra, *args[:nc], *body_extra, *args[nc:nc + nb], *args[nc + nb:]]
    attrs = b.encode(eqn, loc, {"cond_jaxpr": GraphAttr(cond.graph), "body_jaxpr": GraphAttr(body.graph)})
    attrs["cond_nconsts"] = to_attr(nc + len(cond_extra))
    attrs["body_nconsts"] = to_attr(nb + len(body_extra))
    return b.emit(eqn, operands, attrs, ctx, loc)


def _lower_cond(b: _Builder, eqn: Any, env: Env, ctx: _Ctx) -> list[Value]:
    loc = ctx.location(eqn)
    branches = [b.lower_body(br, f"branch{i}", loc) for i, br in enumerate(eqn.params["branches"])]
    extra = b.thread_captures(branches)
    index, *args = [b.read(a, env, loc) for a in eqn.invars]
    graphs = ListAttr(tuple(GraphAttr(br.graph) for br in branches))
    return b.emit(eqn, [index, *extra, *args], b.encode(eqn, loc, {"branches": graphs}), ctx, loc)


def _lower_with_computations(b: _Builder, eqn: Any, env: Env, ctx: _Ctx) -> list[Value]:
    """Primitives whose jaxpr parameters are small reduction bodies (scatter-add's `add`)."""
    loc = ctx.location(eqn)
    graphs: dict[str, Attr] = {}
    for key, v in eqn.params.items():
        if isinstance(v, (jex.Jaxpr, jex.ClosedJaxpr)):
            body = b.lower_body(v, key, loc)
            if body.captured:
                raise LoweringError(f"{loc}: the '{key}' body of '{eqn.primitive.name}' closes over arrays")
            graphs[key] = GraphAttr(body.graph)
    operands = [b.read(a, env, loc) for a in eqn.invars]
    return b.emit(eqn, operands, b.encode(eqn, loc, graphs), ctx, loc)


STRUCTURED_RULES: dict[str, StructuredRule] = {
    "scan": _lower_scan,
    "while": _lower_while,
    "cond": _lower_cond,
    "reduce": _lower_with_computations,
    "reduce_window": _lower_with_computations,
    "select_and_scatter": _lower_with_computations,
    **{name: _lower_with_computations for name in (
        "scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max",
        "scatter_add", "scatter_sub", "scatter_mul", "scatter_min", "scatter_max")},
}


__all__ = ["LoweredFunction", "LoweringError", "lower", "lower_function", "lower_jaxpr", "plain_arrays",
           "refuse_unsupported", "sub_jaxprs", "without_dead_code", "COLLECTIVES", "INLINE_RULES",
           "STRUCTURED_RULES", "REFUSED_PRIMITIVES"]
