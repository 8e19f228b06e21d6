"""The JAX primitives the lowering (`frontends/jax.py`) does not turn into one op each: the calls
it inlines (`INLINE_RULES`: a call's body and operands) and those it refuses by name
(`REFUSED_PRIMITIVES`: the sentence that says why and what to do instead).

Both are tables keyed by primitive name, apart from the walk over the jaxpr, so that the parameter
survey (`tests/test_param_survey.py`, its cases in `tests/param_survey_cases.py`) and the lowering read
the same lists. These names never become opcodes (`COLLECTIVES` here are JAX's, over mesh axes); what
the compiler knows of an opcode an equation does become is its definition in `pesto_ir/ir/opdefs.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.extend.core as jex

from pesto_ir.frontends.jax_names import sanitize_name
from pesto_ir.util.errors import PestoError

Atom = Any  # a jaxpr Var or Literal


class LoweringError(PestoError):
    """The JAX program uses something Pesto IR cannot represent; says what and where."""


# ---------------------------------------------------------------- inlined calls

InlineRule = Callable[[Any], tuple[Any, list[Atom], str]]


def _func_name(body: Any, default: str) -> str:
    jaxpr = body.jaxpr if isinstance(body, jex.ClosedJaxpr) else body
    info = getattr(jaxpr, "debug_info", None)
    name = getattr(info, "func_name", None) if info is not None else None
    return sanitize_name(name.replace("<lambda>", "lambda"), default) if name else default


def _call(param: str, kind: str) -> InlineRule:
    """A call whose body is `eqn.params[param]`, applied to the equation's operands."""

    def rule(eqn: Any) -> tuple[Any, list[Atom], str]:
        body = eqn.params[param]
        name = eqn.params.get("name") or _func_name(body, kind)
        return body, list(eqn.invars), f"{kind}({name})"

    return rule


def _linear_solve(eqn: Any) -> tuple[Any, list[Atom], str]:
    """custom_linear_solve computes `solve(b)`; its other jaxprs only define derivatives."""
    lengths, jaxprs = eqn.params["const_lengths"], eqn.params["jaxprs"]
    start = lengths.matvec + lengths.vecmat
    consts = eqn.invars[start:start + lengths.solve]
    rhs = eqn.invars[sum(lengths):]
    return jaxprs.solve, [*consts, *rhs], "linear_solve"


def _compute_on(eqn: Any) -> tuple[Any, list[Atom], str]:
    """`compute_on2` asks for a kind of device; placement is pesto_ir's to decide, the body is the value."""
    return eqn.params["jaxpr"], list(eqn.invars), f"compute_on({eqn.params['compute_type']})"


def _run_state(eqn: Any) -> tuple[Any, list[Atom], str]:
    """`run_state` runs a body on references holding its operands and returns their final values: the
    body with its references discharged (what JAX itself evaluates) computes exactly that."""
    from jax._src.state.discharge import discharge_state

    if not all(eqn.params["is_initialized"]):
        raise LoweringError("primitive 'run_state' with references it does not initialize: their first values "
                            "are unspecified; initialize every reference")
    return discharge_state(jex.ClosedJaxpr(eqn.params["jaxpr"], ())), list(eqn.invars), "run_state"


INLINE_RULES: dict[str, InlineRule] = {
    "jit": _call("jaxpr", "jit"),
    "pjit": _call("jaxpr", "jit"),
    "closed_call": _call("call_jaxpr", "call"),
    "call": _call("call_jaxpr", "call"),
    "core_call": _call("call_jaxpr", "call"),
    "custom_jvp_call": _call("call_jaxpr", "custom_jvp"),
    "custom_vjp_call": _call("call_jaxpr", "custom_vjp"),
    "custom_vjp_call_jaxpr": _call("fun_jaxpr", "custom_vjp"),
    # the forward pass of a custom_vjp with optimize_remat=True: residuals and outputs
    "remat_opt": _call("fwd_jaxpr", "custom_vjp_fwd"),
    # jax.custom_batching.custom_vmap: the rule only matters under vmap, which tracing has done
    "custom_vmap_call": _call("call", "custom_vmap"),
    # jax.custom_derivatives.linear_call: the callee computes; its transpose only defines derivatives
    "linear_call": _call("callee", "linear_call"),
    # lax.composite: its decomposition is what it computes
    "composite": _call("jaxpr", "composite"),
    "compute_on": _compute_on,
    "run_state": _run_state,
    "remat2": _call("jaxpr", "checkpoint"),
    "checkpoint": _call("jaxpr", "checkpoint"),
    "custom_linear_solve": _linear_solve,
}


# ---------------------------------------------------------------- primitives refused with a reason

_PMAP_AXIS = "_internal_pmap_axis_name"  # the mesh axis jax.pmap (run as shard_map) names when given none


def _refuse_parallel_map(eqn: Any) -> str:
    """shard_map and pmap split a computation across devices themselves; pesto_ir does that."""
    name = eqn.primitive.name
    mesh = eqn.params.get("mesh")
    axes = tuple(getattr(mesh, "axis_names", ()) or ())
    if name == "xla_pmap" or _PMAP_AXIS in axes:
        source = "from jax.pmap"
    else:  # pmap with an axis name looks like shard_map over that axis
        source = "from jax.shard_map or jax.pmap" + (f", mesh axes {', '.join(map(repr, axes))}" if axes else "")
    return (f"primitive '{name}' ({source}) inside the step: pesto_ir places the step itself across "
            f"devices, so the step cannot also split itself; call the function without shard_map/pmap (on the "
            f"whole batch) and let pesto_ir place it, or jit it outside parallelize")


COLLECTIVE_ADVICE = ("collectives run inside shard_map or pmap, which split the step across devices; pesto_ir "
                      "places the step itself, so call the function on the whole batch without collectives "
                      "(a sum over the batch is a plain sum)")

# Collectives over named mesh axes (jax.lax.psum, all_gather, axis_index, ... and the forms shard_map's
# type system and asynchronous collectives bind).
COLLECTIVES: tuple[str, ...] = (
    "psum", "pmax", "pmin", "ppermute", "pbroadcast", "all_gather", "all_to_all", "ragged_all_to_all",
    "reduce_scatter", "axis_index", "psend", "precv", "pvary", "preduced", "psum_invariant", "all_gather_invariant",
    "all_gather_reduced", "unreduced_psum", "unreduced_reduce_scatter", "vary_unreduced_cast_p", "reduced_vary_cast_p",
    "psum_start", "psum_invariant_start", "unreduced_psum_start", "all_gather_start", "all_gather_reduced_start",
    "reduce_scatter_start", "unreduced_reduce_scatter_start", "all_to_all_start", "pbroadcast_start",
    "ppermute_start", "psum_done", "all_gather_done", "reduce_scatter_done", "all_to_all_done", "pbroadcast_done",
    "ppermute_done",
)


def _refuse_collective(eqn: Any) -> str:
    """A collective names mesh axes that only exist inside shard_map or pmap."""
    axes = eqn.params.get("axes", eqn.params.get("axis_name"))
    axes = axes if isinstance(axes, tuple) else (axes,) if axes is not None else ()
    over = f" over mesh axis {', '.join(map(repr, axes))}" if axes else ""
    return f"collective '{eqn.primitive.name}'{over} inside the step: {COLLECTIVE_ADVICE}"


_CALLBACK_KINDS = {"pure_callback": "jax.pure_callback", "io_callback": "jax.experimental.io_callback",
                   "debug_callback": "jax.debug.callback", "inspect_sharding": "jax.debug.inspect_array_sharding",
                   "buffer_callback": "jax.experimental.buffer_callback"}


def _refuse_callback(eqn: Any) -> str:
    """A callback runs a Python function, which a `.pir` graph cannot hold."""
    name = eqn.primitive.name
    instead = {"debug_callback": "print with jax.debug.print, which lowers",
               "inspect_sharding": "leave it out: pesto_ir places whole arrays, there is no sharding to inspect",
               }.get(name, "compute the value with jax.numpy/lax, or call the Python function outside the step")
    return (f"primitive '{name}' ({_CALLBACK_KINDS[name]}) calls back into Python: a .pir graph holds array "
            f"operations, not Python functions; {instead}")


_KERNELS = {"ffi_call": "jax.ffi.ffi_call", "pallas_call": "a Pallas kernel",
            "custom_partitioning": "jax.experimental.custom_partitioning",
            "call_exported": "a jax.export.Exported function", "tpu_custom_call": "a Mosaic TPU kernel"}


def _refuse_kernel(eqn: Any) -> str:
    """Custom calls and kernels are opaque: nothing to cost, place or print."""
    name = eqn.primitive.name
    target = eqn.params.get("target_name") or eqn.params.get("name")
    what = _KERNELS[name] + (f" {target!r}" if isinstance(target, str) and target else "")
    return (f"primitive '{name}' ({what}) runs code pesto_ir cannot see into, cost or print as .pir; write "
            f"that part of the step with jax.numpy/lax, or jit it outside parallelize")


def _refuse_token(eqn: Any) -> str:
    return (f"primitive '{eqn.primitive.name}' makes an ordering token: Pesto IR has no token type (tokens "
            f"order side effects such as infeed/outfeed, which JAX no longer has); leave tokens out of the step")


def _refuse_custom_lin(eqn: Any) -> str:
    return ("primitive 'custom_lin' is forward-mode autodiff (jax.jvp, jax.linearize) of a jax.custom_vjp "
            "function, which JAX cannot run either (custom_vjp defines reverse mode only): take gradients "
            "with jax.grad/jax.vjp, or give the function a custom_jvp")


def _refuse_check(eqn: Any) -> str:
    return ("primitive 'check' (jax.experimental.checkify.check) outside checkify.checkify, which JAX cannot "
            "run under jit either: wrap the step in checkify.checkify, which turns its checks into array ops")


# Primitives the frontend refuses, by name, with the sentence that says why and what to do instead.
REFUSED_PRIMITIVES: dict[str, Callable[[Any], str]] = {
    "shard_map": _refuse_parallel_map,
    "xla_pmap": _refuse_parallel_map,
    **{name: _refuse_collective for name in COLLECTIVES},
    **{name: _refuse_callback for name in _CALLBACK_KINDS},
    **{name: _refuse_kernel for name in _KERNELS},
    "create_token": _refuse_token,
    "after_all": _refuse_token,
    "custom_lin": _refuse_custom_lin,
    "check": _refuse_check,
}
