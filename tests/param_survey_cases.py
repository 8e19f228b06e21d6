"""The cases `test_param_survey.py` iterates over: the primitives JAX 0.10 can put in a step's jaxpr,
in three lists. CASES: tiny functions, by family, whose jaxprs hold the covered primitives (COVERED);
REFUSED: a function per primitive that lowering refuses by name, with the reason; INTERNAL: the
primitives internal to JAX that never reach a step. No tests here: they live in test_param_survey.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

F32, I32, U32 = np.float32, np.int32, np.uint32
X = np.linspace(0.1, 0.9, 12, dtype=F32).reshape(3, 4)  # in (0, 1): every function below is defined there
I = np.arange(12, dtype=I32).reshape(3, 4)  # noqa: E741
U = np.arange(1, 13, dtype=U32).reshape(3, 4) * U32(0x9E3779B1)
SPD = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]], F32)  # symmetric positive definite
RAW_KEY = np.array([0, 42], U32)  # threefry2x32 key data


@dataclass(frozen=True)
class Case:
    """A tiny function and the primitives its jaxpr must hold; `exact`: values JAX defines
    (False where they are unspecified: uninitialised memory, a stateful generator)."""

    prims: tuple[str, ...]
    fn: Callable[..., Any]
    args: tuple[Any, ...] = (X,)
    exact: bool = True


def _private(module: str, name: str) -> Any:
    """Something JAX binds only internally (no public name), reached for the survey's sake."""
    return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------- the covered primitives, by family

def _unary(x: Any) -> tuple[Any, ...]:
    return (lax.abs(x - 0.5), lax.neg(x), lax.sign(x - 0.5), lax.floor(x * 4), lax.ceil(x * 4), lax.round(x * 4),
            lax.is_finite(x), lax.exp(x), lax.exp2(x), lax.expm1(x), lax.log(x), lax.log1p(x), lax.logistic(x),
            lax.sqrt(x), lax.rsqrt(x), lax.cbrt(x), lax.square(x), lax.integer_pow(x, 3), lax.sin(x), lax.cos(x),
            lax.tan(x), lax.asin(x), lax.acos(x), lax.atan(x), lax.sinh(x), lax.cosh(x), lax.tanh(x), lax.asinh(x),
            lax.acosh(x + 1), lax.atanh(x), lax.reduce_precision(x, 5, 10), lax.lgamma(x), lax.digamma(x),
            lax.erf(x), lax.erfc(x), lax.erf_inv(x), lax.bessel_i0e(x), lax.bessel_i1e(x))


def _special(x: Any) -> tuple[Any, ...]:
    return (lax.igamma(x, x + 1), lax.igammac(x, x + 1), lax.igamma_grad_a(x, x + 1),
            lax.polygamma(jnp.ones_like(x), x), lax.zeta(x + 2, x), lax.betainc(x + 1, x + 2, x))


def _binary(x: Any) -> tuple[Any, ...]:
    y = x[::-1]
    return (lax.add(x, y), lax.sub(x, y), lax.mul(x, y), lax.div(x, y), lax.rem(x, y), lax.pow(x, y),
            lax.max(x, y), lax.min(x, y), lax.atan2(x, y), lax.nextafter(x, y))


def _integers(i: Any, u: Any) -> tuple[Any, ...]:
    return (lax.bitwise_and(i, 5), lax.bitwise_or(i, 5), lax.bitwise_xor(i, 5), lax.bitwise_not(i),
            lax.shift_left(i, 2), lax.shift_right_arithmetic(-i, 1), lax.shift_right_logical(u, U32(3)),
            lax.population_count(i), lax.clz(i), lax.mulhi(u, u))


def _compare(x: Any) -> tuple[Any, ...]:
    y = x[::-1]
    return (lax.eq(x, y), lax.ne(x, y), lax.lt(x, y), lax.le(x, y), lax.gt(x, y), lax.ge(x, y),
            lax.select_n(lax.lt(x, y), x, y), lax.clamp(F32(0.3), x, F32(0.6)))


def _complex(x: Any) -> tuple[Any, ...]:
    z = lax.complex(x, x[::-1])
    return lax.real(z * lax.conj(z)), lax.imag(z)


def _searchsorted(x: Any) -> tuple[Any, ...]:
    """Binary search compares with the total-order comparators (`lt_to`, `le_to`; `eq_to` between the
    two keys of a complex number)."""
    z = lax.complex(x[0], x[1])
    return (jnp.searchsorted(x[0], x[1]), jnp.searchsorted(x[0], x[1], side="right", method="compare_all"),
            jnp.searchsorted(z, z[::-1], method="compare_all"))


def _shapes(x: Any) -> tuple[Any, ...]:
    return (lax.broadcast_in_dim(x, (2, 3, 4), (1, 2)), lax.reshape(x, (4, 3)), lax.squeeze(x[None], (0,)),
            lax.transpose(x, (1, 0)), lax.rev(x, (0,)), lax.pad(x, F32(0), ((1, 0, 1), (0, 2, 0))),
            lax.concatenate([x, x], 0), lax.split(x, (1, 3), 1), lax.stack([x, x], 1), lax.unstack(x, 1),
            lax.tile(x, (2, 1)), lax.iota(np.int32, 5), lax.convert_element_type(x, np.int32),
            lax.bitcast_convert_type(x, np.int32), jnp.array(x, copy=True))


def _reductions(x: Any, i: Any) -> tuple[Any, ...]:
    b = x > 0.5
    return (x.sum(0), x.max(1), x.min(0), x.prod(1), b.all(0), b.any(1), jnp.bitwise_xor.reduce(i, axis=0),
            jnp.argmax(x, 1), jnp.argmin(x, 0),
            lax.reduce((x, i), (F32(0), I32(1)), lambda a, b: (a[0] + b[0], a[1] * b[1]), (1,)))


def _cumulative(x: Any) -> tuple[Any, ...]:
    return (lax.cumsum(x, 0), lax.cumprod(x, 1, reverse=True), lax.cummax(x, 1), lax.cummin(x, 0),
            lax.cumlogsumexp(x, 1))


def _sorting(x: Any) -> tuple[Any, ...]:
    return lax.sort((x[::-1], x), dimension=1, num_keys=1), lax.top_k(x, 2), lax.approx_max_k(x, 2)


def _slicing(x: Any, i: Any) -> tuple[Any, ...]:
    k, idx = i[0, 1], jnp.array([2, 0])
    return (lax.slice(x, (0, 1), (2, 4), (1, 2)), lax.dynamic_slice(x, (k, 0), (2, 2)),
            lax.dynamic_update_slice(x, jnp.zeros((2, 2), F32), (1, k)), x[idx], x.at[idx].set(5.0),
            x.at[idx].add(1.0), x.at[idx].subtract(1.0), x.at[idx].multiply(2.0), x.at[idx].min(0.2),
            x.at[idx].max(0.7))


def _maxpool(x: Any) -> Any:
    return lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), "VALID")


def _windows(x: Any) -> tuple[Any, ...]:
    return (lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 1), "VALID"), _maxpool(x),
            lax.reduce_window(x, jnp.inf, lax.min, (2, 2), (1, 2), "SAME"),
            lax.reduce_window(x, 1.0, lax.mul, (1, 2), (1, 1), "VALID"),  # a body of its own: reduce_window
            jax.grad(lambda x: (_maxpool(x) ** 2).sum())(x),  # select_and_scatter_add
            jax.jvp(_maxpool, (x,), (x,))[1])  # select_and_gather_add


def _select_and_scatter(x: Any, s: Any) -> Any:
    """select_and_scatter itself JAX binds only when lowering select_and_scatter_add."""
    fn = _private("jax._src.lax.windowed_reductions", "_select_and_scatter")
    return fn(x, lax.ge, (2, 2), (1, 1), ((0, 0), (0, 0)), s, F32(0), lax.add)


def _dots(x: Any) -> tuple[Any, ...]:
    img, kernel = x.reshape(1, 1, 3, 4), jnp.ones((2, 1, 2, 2), F32)
    return (lax.dot_general(x, x, (((1,), (1,)), ((), ()))),
            lax.conv_general_dilated(img, kernel, (1, 1), "SAME", rhs_dilation=(1, 2)),
            lax.ragged_dot(jnp.tile(x, (2, 1)), jnp.stack([x.T, x.T]), jnp.array([2, 4], I32)),
            lax.scaled_dot(x, x, lhs_scale=jnp.ones((3, 1), F32), rhs_scale=jnp.ones((3, 1), F32),
                           dimension_numbers=(((1,), (1,)), ((), ()))),
            lax.scaled_dot(jnp.tile(x, (1, 8)), jnp.tile(x, (1, 8)), dimension_numbers=(((1,), (1,)), ((), ()))))


def _control_flow(x: Any) -> tuple[Any, ...]:
    c = lax.cond(x.sum() > 1, lambda x: x * 2, lambda x: x - 1, x)
    w = lax.while_loop(lambda v: v.sum() < 20, lambda v: v * 1.5, x)
    s = lax.scan(lambda carry, row: (carry + row, carry * row), jnp.zeros(4, F32), x)
    solved = lax.custom_linear_solve(lambda v: 2.0 * v, x[0], lambda mv, b: b / 2.0, symmetric=True)
    p = lax.platform_dependent(x, cpu=jnp.sin, default=jnp.cos)
    return c, w, s, solved, p, lax.optimization_barrier((x, x + 1))


def _linalg(a: Any) -> tuple[Any, ...]:
    la = lax.linalg
    geqrf = _private("jax._src.lax.linalg", "geqrf")
    geqp3 = _private("jax._src.lax.linalg", "geqp3")
    q, r, taus = la.qr(a, full_matrices=True), geqrf(a), geqp3(a, jnp.zeros(3, I32))
    chol = la.cholesky(a)
    return (q, r, taus, chol, la.triangular_solve(chol, a, left_side=True, lower=True), la.lu(a),
            la.lu_pivots_to_permutation(jnp.array([2, 2, 2], I32), 3), la.svd(a), la.eigh(a), la.eig(a),
            la.schur(a), la.hessenberg(a), la.tridiagonal(a), la.tridiagonal_solve(a[0], a[1], a[2], a),
            la.householder_product(a, a[0, :2]), la.ormqr(a, a[0, :2], a), la.cholesky_update(chol.T, a[0]),
            la.symmetric_product(a, a))


def _fft(x: Any) -> tuple[Any, ...]:
    return jnp.fft.fft(x), jnp.fft.irfft(x), jnp.fft.ifft2(x.astype(jnp.complex64))


def _typed_keys(raw: Any) -> tuple[Any, ...]:
    key = jax.random.wrap_key_data(raw)
    a, b = jax.random.split(key)
    return (jax.random.key_data(jax.random.fold_in(a, 3)), jax.random.bits(b, (3,)), jax.random.key(7),
            jax.random.clone(a), jax.random.gamma(b, 2.0, (3,)))


def _raw_generators(raw: Any) -> tuple[Any, ...]:
    """The counter-based hash functions under the key implementations, called on key data."""
    philox2 = _private("jax._src.random.philox2x32", "philox2x32_random_bits")
    philox4 = _private("jax._src.random.philox4x32", "philox4x32_random_bits")
    threefry4 = _private("jax._src.random.threefry4x32", "threefry4x32_random_bits")
    iota = _private("jax._src.random.prng", "iota_2x32_shape")
    return (jax.extend.random.threefry_2x32(raw, jnp.arange(4, dtype=U32)), philox2(raw[:1], 32, (3,)),
            philox4(raw, 32, (3,)), threefry4(jnp.concatenate([raw, raw]), 32, (3,)), iota((2, 3)),
            lax.rng_bit_generator(jnp.concatenate([raw, raw]), (2, 3)))


def _rng_uniform(x: Any) -> Any:
    """A stateful generator: XLA gives no two compiles the same numbers."""
    return lax.rng_uniform(F32(0), F32(1), (3,)) + x[0, :3]


def _custom_jvp(x: Any) -> Any:
    return jax.nn.relu(x - 0.5) + jax.nn.softplus(x)


@jax.custom_vjp
def _sin_vjp(x: Any) -> Any:
    return jnp.sin(x)


_sin_vjp.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (c * g,))


@jax.custom_vjp
def _sin_remat(x: Any) -> Any:
    return jnp.sin(x)


_sin_remat.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (c * g,), optimize_remat=True)


@jax.custom_batching.custom_vmap
def _batched_sin(x: Any) -> Any:
    return jnp.sin(x)


_batched_sin.def_vmap(lambda axis_size, in_batched, x: (jnp.sin(x), in_batched[0]))


def _calls(x: Any) -> tuple[Any, ...]:
    closed_call_p, call_p = _private("jax._src.core", "closed_call_p"), _private("jax._src.core", "call_p")
    body = jax.make_jaxpr(jnp.cos)(x)
    closed_call = closed_call_p.bind(x, **closed_call_p.get_bind_params({"call_jaxpr": body}))
    call = call_p.bind(x, **call_p.get_bind_params({"call_jaxpr": body.jaxpr}))
    compute_on2 = _private("jax.experimental.compute_on", "compute_on2")
    return (jax.jit(jnp.tanh)(x), closed_call, call, _custom_jvp(x), _sin_vjp(x),
            jax.checkpoint(lambda v: jnp.sin(v) * 2)(x), _batched_sin(x),
            jax.custom_derivatives.linear_call(lambda r, t: r * t, lambda r, t: r * t, 2.0, x),
            lax.composite(lambda v, *, k: jnp.sin(v) * k, "test.scaled_sin")(x, k=2.0),
            compute_on2(compute_type="device_host", out_memory_spaces=jax.memory.Space.Device,
                        compiler_options=None)(jnp.sin)(x))


def _gradients(x: Any) -> tuple[Any, ...]:
    from jax.ad_checkpoint import checkpoint_name

    def loss(x: Any) -> Any:
        y = checkpoint_name(jnp.sin(x), "y")
        y = lax.cond(x.sum() > 0, lambda y: y * lax.stop_gradient(x), lambda y: y, y)  # empty2 in reverse
        return (y * jnp.cos(x)).sum() + _sin_remat(x).sum()

    return jax.grad(loss)(x)


def _run_state(x: Any) -> Any:
    run_state = _private("jax._src.state.discharge", "run_state")

    def body(refs: Any) -> None:
        a, b = refs
        a[...] = a[...] * 2 + b[...]

    return run_state(body)((x, x[::-1]))


def _identities(x: Any) -> tuple[Any, ...]:
    """Ops that pass values through: a device_put with no device, shard_alike, XLA metadata, a
    DCE sink, tie, and a debug print (kept as an effect)."""
    from jax.experimental.shard_alike import shard_alike
    from jax.experimental.xla_metadata import set_xla_metadata

    tie = _private("jax._src.lax.lax", "tie_p")
    jax.debug.print("survey {}", x[0, 0])
    lax.dce_sink(x[1])
    return (jax.device_put(x) + 1, shard_alike(x, x * 2), set_xla_metadata(jnp.sin(x), tag="survey"),
            tie.bind(x, x + 2))


def _empty(x: Any) -> Any:
    return lax.empty((2, 3), jnp.float32), x


def _refs(x: Any) -> tuple[Any, ...]:
    r = jax.new_ref(x)
    r[...] += 1.0
    r[0] = x[1]
    jax.ref.addupdate(r, 1, x[2])
    e = jax.empty_ref(jax.typeof(x))
    e[...] = x * 3
    f = jax.new_ref(x)
    jax.ref.free_ref(f)
    acc = _private("jax._src.core", "accum_grad_in_ref")(x)
    return r[...], jax.freeze(e), acc


class _Twice(_private("jax._src.hijax", "VJPHiPrimitive")):  # type: ignore[misc]
    """A user-defined hijax primitive (jax.experimental.hijax.VJPHiPrimitive)."""

    def __init__(self, aval: Any) -> None:
        self.in_avals, self.out_aval, self.params = (aval,), aval, {}
        super().__init__()

    def expand(self, x: Any) -> Any:
        return x * 2


def _hijax(x: Any) -> tuple[Any, ...]:
    hijax = _private("jax._src", "hijax")
    box = hijax.new_box()
    hijax.box_set(box, x * 3)
    hijax.new_log().append("x", x + 1)  # a log read back outside the step only: dropped
    return hijax.box_get(box), _Twice(jax.typeof(x))(x)


CASES: dict[str, Case] = {
    # elementwise (lax.lax, lax.special)
    "unary": Case(("abs", "neg", "sign", "floor", "ceil", "round", "is_finite", "exp", "exp2", "expm1", "log",
                   "log1p", "logistic", "sqrt", "rsqrt", "cbrt", "square", "integer_pow", "sin", "cos", "tan",
                   "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "reduce_precision",
                   "lgamma", "digamma", "erf", "erfc", "erf_inv", "bessel_i0e", "bessel_i1e"), _unary),
    "special": Case(("igamma", "igammac", "igamma_grad_a", "polygamma", "zeta", "regularized_incomplete_beta"),
                    _special),
    "binary": Case(("add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter"), _binary),
    "integers": Case(("and", "or", "xor", "not", "shift_left", "shift_right_arithmetic", "shift_right_logical",
                      "population_count", "clz", "mulhi"), _integers, (I, U)),
    "compare": Case(("eq", "ne", "lt", "le", "gt", "ge", "select_n", "clamp"), _compare),
    "complex": Case(("complex", "conj", "real", "imag"), _complex),
    "total_order": Case(("lt_to", "le_to", "eq_to"), _searchsorted),
    # shapes and types (lax.lax)
    "shapes": Case(("broadcast_in_dim", "reshape", "squeeze", "transpose", "rev", "pad", "concatenate", "split",
                    "stack", "unstack", "tile", "iota", "convert_element_type", "bitcast_convert_type", "copy"),
                   _shapes),
    # reductions, scans, sorting (lax.lax, lax.control_flow, lax.ann)
    "reductions": Case(("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                        "reduce_xor", "argmax", "argmin", "reduce"), _reductions, (X, I)),
    "cumulative": Case(("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"), _cumulative),
    "sorting": Case(("sort", "top_k", "approx_top_k"), _sorting),
    # indexing (lax.slicing)
    "slicing": Case(("slice", "dynamic_slice", "dynamic_update_slice", "gather", "scatter", "scatter-add",
                     "scatter-sub", "scatter-mul", "scatter-min", "scatter-max"), _slicing, (X, I)),
    # windows (lax.windowed_reductions)
    "windows": Case(("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window",
                     "select_and_scatter_add", "select_and_gather_add"), _windows),
    "select_and_scatter": Case(("select_and_scatter",), _select_and_scatter, (X, np.ones((2, 3), F32))),
    # contractions (lax.lax, lax.convolution, lax.scaled_dot); the default scales are f8e8m0fnu
    "dots": Case(("dot_general", "conv_general_dilated", "ragged_dot_general", "scaled_dot"), _dots),
    # control flow (lax.control_flow)
    "control_flow": Case(("cond", "while", "scan", "custom_linear_solve", "platform_index",
                          "optimization_barrier"), _control_flow),
    # linear algebra (lax.linalg), Fourier transforms (lax.fft)
    "linalg": Case(("qr", "geqrf", "geqp3", "cholesky", "triangular_solve", "lu", "lu_pivots_to_permutation", "svd",
                    "eigh", "eig", "schur", "hessenberg", "tridiagonal", "tridiagonal_solve", "householder_product",
                    "ormqr", "cholesky_update", "symmetric_product"), _linalg, (SPD,)),
    "fft": Case(("fft",), _fft),
    # random numbers (random.prng, random.core and the hash functions under the implementations)
    "typed_keys": Case(("random_wrap", "random_split", "random_fold_in", "random_unwrap", "random_bits",
                        "random_seed", "random_clone", "random_gamma"), _typed_keys, (RAW_KEY,)),
    "raw_generators": Case(("threefry2x32", "philox2x32", "philox4x32", "threefry4x32", "iota_2x32_shape",
                            "rng_bit_generator"), _raw_generators, (RAW_KEY,)),
    "rng_uniform": Case(("rng_uniform",), _rng_uniform, exact=False),
    # calls, inlined into the graph (pjit, core, custom_derivatives, custom_batching, ad_checkpoint, compute_on)
    "calls": Case(("jit", "closed_call", "call", "custom_jvp_call", "custom_vjp_call", "remat2",
                   "custom_vmap_call", "linear_call", "composite", "compute_on"), _calls),
    # reverse mode (ad_util, ad_checkpoint, custom_derivatives)
    "gradients": Case(("add_any", "stop_gradient", "name", "empty2", "remat_opt"), _gradients),
    # values passed through (dispatch, shard_alike, xla_metadata, debugging)
    "identities": Case(("device_put", "shard_alike", "xla_metadata_value", "dce_sink", "tie", "debug_print"),
                       _identities),
    "empty": Case(("empty",), _empty, exact=False),
    # mutable references and hijax types, made plain before lowering as jax.jit does (core, state, hijax)
    "refs": Case(("new_ref", "get", "swap", "addupdate", "empty_ref", "free_ref", "freeze", "accum_grad_in_ref"),
                 _refs),
    "run_state": Case(("run_state",), _run_state),
    "hijax": Case(("new_box", "box_set", "box_get", "new_log", "log_extend", "call_hi_primitive"), _hijax),
}

COVERED: frozenset[str] = frozenset(p for case in CASES.values() for p in case.prims)


# ---------------------------------------------------------------- the refused primitives

@dataclass(frozen=True)
class Refusal:
    """A function whose jaxpr holds `prim`, which lowering refuses; `axis_env` traces it over a named
    axis (how a collective reaches the frontend outside shard_map), `in_shard_map` lowers the body
    of a shard_map over that axis."""

    prim: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = (X,)
    axis_env: bool = False
    in_shard_map: tuple[str | None, ...] | None = None  # the body's in_specs over axis 'i'
    says: str = ""  # more of the message that must be there


def _callback(x: Any) -> Any:
    return np.sin(x)


def _shape(x: Any) -> Any:
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _pallas(x: Any) -> Any:
    from jax.experimental import pallas as pl

    def kernel(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] * 2

    return pl.pallas_call(kernel, out_shape=_shape(x), interpret=True)(x)


def _custom_partitioning(x: Any) -> Any:
    from jax.experimental.custom_partitioning import custom_partitioning

    @custom_partitioning
    def f(x: Any) -> Any:
        return jnp.sin(x)

    f.def_partition(infer_sharding_from_operands=lambda *a: None, partition=lambda *a: None,
                    sharding_rule="i j -> i j")
    return f(x)


def _exported(x: Any) -> Any:
    return jax.export.export(jax.jit(jnp.sin))(_shape(x)).call(x)


def _buffer_callback(x: Any) -> Any:
    from jax.experimental.buffer_callback import buffer_callback

    return buffer_callback(lambda ctx, out, x: None, _shape(x))(x)


def _mesh() -> Any:
    return jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:2])


def _shard_map(x: Any) -> Any:
    from jax.sharding import PartitionSpec as P

    return jax.shard_map(lambda x: x * 2, mesh=_mesh(), in_specs=P(), out_specs=P())(x)


def _layout_constraint(x: Any) -> Any:
    from jax.experimental.layout import Layout, with_layout_constraint

    return with_layout_constraint(x, Layout((0, 1)))


def _check(x: Any) -> Any:
    from jax.experimental import checkify

    checkify.check(x.sum() > 0, "negative sum")
    return x


_TOKEN = lax.create_token()  # a step handed a token (a refusal must not wait for an input it cannot type)


def _ragged_all_to_all(x: Any) -> Any:
    sizes, offsets = jnp.ones(2, I32), jnp.zeros(2, I32)
    return lax.ragged_all_to_all(x, jnp.zeros_like(x), offsets, sizes, offsets, sizes, axis_name="i")


REFUSED: dict[str, Refusal] = {r.prim: r for r in (
    # parallel maps and collectives (shard_map, lax.parallel): pesto_ir places the step itself
    Refusal("shard_map", _shard_map, says="pesto_ir places the step itself"),
    Refusal("psum", lambda x: lax.psum(x, "i"), axis_env=True, says="over mesh axis 'i'"),
    Refusal("pmax", lambda x: lax.pmax(x, "i"), axis_env=True),
    Refusal("pmin", lambda x: lax.pmin(x, "i"), axis_env=True),
    Refusal("ppermute", lambda x: lax.ppermute(x, "i", [(0, 1), (1, 0)]), axis_env=True),
    Refusal("pbroadcast", lambda x: lax.pbroadcast(x, "i", 0), axis_env=True),
    Refusal("all_gather", lambda x: lax.all_gather(x, "i"), axis_env=True),
    Refusal("all_to_all", lambda x: lax.all_to_all(x[:2], "i", 0, 0), axis_env=True),
    Refusal("reduce_scatter", lambda x: lax.psum_scatter(x[:2], "i", tiled=True), axis_env=True),
    Refusal("axis_index", lambda x: x + lax.axis_index("i"), axis_env=True),
    Refusal("ragged_all_to_all", _ragged_all_to_all, axis_env=True),
    Refusal("psend", lambda x: lax.psend(x, "i", [(0, 1)]), axis_env=True),
    Refusal("precv", lambda x, token: lax.precv(token, _shape(x), "i", [(0, 1)]), (X, _TOKEN), axis_env=True),
    Refusal("psum_invariant", lambda x: lax.psum(x, "i"), (X[:2],), in_shard_map=("i",)),
    Refusal("pvary", lambda x: lax.pcast(x, "i", to="varying"), in_shard_map=(None,)),
    Refusal("all_gather_invariant", lambda x: lax.all_gather(x, "i", to="invarying"), (X[:2],),
            in_shard_map=("i",)),
    # Python callbacks (callback, debugging, buffer_callback)
    Refusal("pure_callback", lambda x: jax.pure_callback(_callback, _shape(x), x), says="calls back into Python"),
    Refusal("io_callback", lambda x: jax.experimental.io_callback(_callback, _shape(x), x)),
    Refusal("debug_callback", lambda x: (jax.debug.callback(print, x), x)[1], says="jax.debug.print"),
    Refusal("inspect_sharding", lambda x: (jax.debug.inspect_array_sharding(x, callback=print), x)[1]),
    Refusal("buffer_callback", _buffer_callback),
    # custom calls and kernels (ffi, pallas, custom_partitioning, export)
    Refusal("ffi_call", lambda x: jax.ffi.ffi_call("survey_kernel", _shape(x))(x), says="'survey_kernel'"),
    Refusal("pallas_call", _pallas),
    Refusal("custom_partitioning", _custom_partitioning),
    Refusal("call_exported", _exported),
    # ordering tokens (lax.lax): Pesto IR has no token type
    Refusal("create_token", lambda x: (x, lax.create_token())),
    Refusal("after_all", lambda x, a, b: (x, lax.after_all(a, b)), (X, _TOKEN, _TOKEN)),
    # programs JAX cannot run under jit either (interpreters.ad, checkify)
    Refusal("custom_lin", lambda x: jax.jvp(_sin_vjp, (x,), (x,)), says="jax.custom_vjp"),
    Refusal("check", _check, says="checkify.checkify"),
    # sharding and layout constraints (pjit): pesto_ir places whole arrays
    Refusal("sharding_constraint", lambda x: lax.with_sharding_constraint(
        x, jax.sharding.SingleDeviceSharding(jax.devices()[1])), says="'sharding'"),
    Refusal("reshard", lambda x: jax.sharding.reshard(
        x, jax.sharding.NamedSharding(_mesh(), jax.sharding.PartitionSpec())), says="'dst_sharding'"),
    Refusal("layout_constraint", _layout_constraint, says="'layout'"),
)}


# ---------------------------------------------------------------- primitives that never reach a step

INTERNAL: frozenset[str] = frozenset({
    # never bound in JAX 0.10: a stub kept for old pickles, zeros made symbolically, an unhashable param
    "custom_jvp_call_jaxpr", "zeros_like", "unreachable",
    # staged as something else: eval_jaxpr as closed_call, stage is folded into its constant
    "eval_jaxpr", "stage",
    # converting to/from extended dtypes other than PRNG keys (which use random_wrap/unwrap)
    "to_edtype", "from_edtype",
    # shape polymorphism (jax.export with symbolic shapes); lowering traces concrete examples
    "dim_as_value", "dimension_size", "shape_assertion",
    # hijax: linearization, bound while jax.linearize runs a VJPHiPrimitive; a log is read outside
    # any trace (reading it inside one raises)
    "call_hi_primitive_linearized", "log_read",
    # kernel-level state (Pallas / Triton lowering helpers and pinned linear buffers)
    "broadcast_to", "create_linear", "pin", "unpin",
    # bound only while lowering a pallas_call for TPU
    "tpu_custom_call",
    # collectives bound only inside shard_map bodies with explicit, reduced or unreduced sharding, or as
    # asynchronous start/done pairs; shard_map is refused before its body is read, and
    # frontends.jax.COLLECTIVES refuses these by name too
    "preduced", "unreduced_psum", "unreduced_reduce_scatter", "all_gather_reduced", "vary_unreduced_cast_p",
    "reduced_vary_cast_p", "psum_start", "psum_invariant_start", "unreduced_psum_start", "all_gather_start",
    "all_gather_reduced_start", "reduce_scatter_start", "unreduced_reduce_scatter_start", "all_to_all_start",
    "pbroadcast_start", "ppermute_start", "psum_done", "all_gather_done", "reduce_scatter_done",
    "all_to_all_done", "pbroadcast_done", "ppermute_done",
})
