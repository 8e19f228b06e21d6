"""The `batch_inputs` graph attribute: which graph inputs carry the batch, along which axis.

The JAX frontend writes it from `batch_argnums` (default: every positional argument not in
`param_argnums`), the .pir text round-trips it, and `parallelize` checks its batch options and
passes `batch_argnums` on to the lowering.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pesto_ir
from pesto_ir import PestoError
from pesto_ir.frontends.jax import LoweringError, lower, lower_function
from pesto_ir.ir.attributes import DictAttr, IntAttr
from pesto_ir.parallel.options import ParallelizeOptions
from pesto_ir.passes.rewrite.rebatch import rebatch

BATCH = 8


def _params() -> dict[str, Any]:
    return {"w1": jnp.ones((4, 16)), "b1": jnp.zeros(16), "w2": jnp.ones((16, 3)), "b2": jnp.zeros(3)}


def _loss(p: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)


def step(params: dict[str, Any], opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
    """A momentum-SGD train step: (params, opt_state) are state, (x, y) the batch."""
    loss, g = jax.value_and_grad(_loss)(params, x, y)
    count, mom = opt_state
    mom = jax.tree_util.tree_map(lambda m, gi: 0.9 * m + gi, mom, g)
    params = jax.tree_util.tree_map(lambda w, m: w - 0.1 * m, params, mom)
    return params, (count + 1, mom), loss


def _step_args(batch: int = BATCH, y_batch: int | None = None) -> tuple[Any, ...]:
    p = _params()
    opt_state = (jnp.zeros((), jnp.int32), jax.tree_util.tree_map(jnp.zeros_like, p))
    x = jnp.ones((batch, 4))
    y = jnp.ones((y_batch if y_batch is not None else batch, 3))
    return p, opt_state, x, y


def _batch_inputs(graph: pesto_ir.Graph) -> dict[str, int] | None:
    attr = graph.attrs.get("batch_inputs")
    return None if attr is None else attr.value


# ---------------------------------------------------------------- which inputs

def test_default_batch_inputs_of_a_train_step_are_the_non_param_arrays() -> None:
    graph = lower(step, *_step_args(), param_argnums=(0, 1))
    assert _batch_inputs(graph) == {"x": 0, "y": 0}
    attr = graph.attrs["batch_inputs"]
    assert attr == DictAttr((("x", IntAttr(0)), ("y", IntAttr(0))))
    by_name = {v.name: v for v in graph.inputs}
    assert not by_name["x"].param and not by_name["y"].param
    assert all(by_name[n].type.shape[0] == BATCH for n in _batch_inputs(graph))


def test_the_names_are_the_graph_input_names_of_the_leaves() -> None:
    """Pytree leaves are named after their path (`batch.0`, `batch.1.y`); the attribute uses them."""

    def f(params: Any, batch: Any) -> jax.Array:
        x, extra = batch
        return _loss(params, x, extra["y"]) + extra["scale"]

    args = (_params(), (jnp.ones((BATCH, 4)), {"y": jnp.ones((BATCH, 3)), "scale": jnp.float32(2.0)}))
    graph = lower(f, *args, param_argnums=0)
    names = {v.name for v in graph.inputs}
    batch = _batch_inputs(graph)
    assert batch == {"batch.0": 0, "batch.1.y": 0}  # the scalar leaf `batch.1.scale` is not batch
    assert set(batch) <= names and "batch.1.scale" in names


def test_explicit_batch_argnums() -> None:
    def f(params: Any, x: jax.Array, y: jax.Array, table: jax.Array) -> jax.Array:
        return _loss(params, x, y) + table.sum()

    args = (_params(), jnp.ones((BATCH, 4)), jnp.ones((BATCH, 3)), jnp.ones((5, 2)))
    graph = lower(f, *args, param_argnums=(0,), batch_argnums=(1, 2))
    assert _batch_inputs(graph) == {"x": 0, "y": 0}
    assert _batch_inputs(lower(f, *args, param_argnums=(0,), batch_argnums=1)) == {"x": 0}
    assert _batch_inputs(lower(f, *args, batch_argnums=[2, 1])) == {"x": 0, "y": 0}  # graph-input order


def test_scalars_are_not_batch_inputs_and_no_leaf_means_no_attribute() -> None:
    def f(x: jax.Array, lr: jax.Array) -> jax.Array:
        return x * lr

    graph = lower(f, jnp.ones((BATCH, 2)), jnp.float32(0.5))
    assert _batch_inputs(graph) == {"x": 0}
    graph = lower(f, jnp.ones((BATCH, 2)), jnp.float32(0.5), param_argnums=0)
    assert "batch_inputs" not in graph.attrs  # only a scalar is left
    graph = lower(lambda w: w * 2, jnp.ones(3), param_argnums=0)
    assert "batch_inputs" not in graph.attrs
    graph = lower(lambda x: x * 2, jnp.ones((BATCH, 2)), batch_argnums=())
    assert graph.attrs["batch_inputs"].value == {}  # said: no batch, so nothing is split by default
    with pytest.raises(PestoError, match="declares no batch input"):
        rebatch(graph, 2)


def test_keyword_arguments_and_constants_are_not_batch_inputs() -> None:
    table = jnp.arange(6.0).reshape(2, 3)  # closed over: a trailing `const` input

    def f(x: jax.Array, *, bias: jax.Array) -> jax.Array:
        return x @ table + bias

    lowered = lower_function(f, jnp.ones((BATCH, 2)), bias=jnp.ones((BATCH, 3)))
    graph = lowered.graph
    assert lowered.consts and "consts" in graph.attrs
    assert _batch_inputs(graph) == {"x": 0}


def test_lowering_is_otherwise_unchanged() -> None:
    """Only the attribute is added: the same graph as without it, and it still runs."""
    args = _step_args()
    lowered = lower_function(step, *args, param_argnums=(0, 1))
    graph = lowered.graph
    text = str(graph)
    del graph.attrs["batch_inputs"]
    assert "attributes" not in str(graph).splitlines()[0]
    assert text.replace("attributes {batch_inputs = {x = 0, y = 0}} ", "") == str(graph)
    got = lowered(*args)
    want = jax.jit(step)(*args)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert jnp.allclose(a, b, atol=1e-5)


# ---------------------------------------------------------------- errors

def _two_batches(params: Any, x: jax.Array, batch: Any) -> jax.Array:
    """Traces with any leading sizes: x and the leaves of batch need not agree."""
    return _loss(params, x, jnp.ones((x.shape[0], 3))) + sum(b.sum() for b in batch)


def _two_batches_args(*sizes: int) -> tuple[Any, ...]:
    return _params(), jnp.ones((BATCH, 4)), [jnp.ones((n, 2)) for n in sizes]


def test_mismatched_batch_sizes_name_the_leaves_and_their_sizes() -> None:
    with pytest.raises(LoweringError) as info:
        lower(_two_batches, *_two_batches_args(BATCH, 6, 8), param_argnums=0, batch_argnums=(1, 2))
    message = str(info.value)
    assert "disagree on their size along axis 0" in message
    assert "size 8: %x, %batch.0, %batch.2; size 6: %batch.1" in message
    assert "pass batch_argnums naming only the arguments that carry the batch" in message


def test_many_mismatched_leaves_are_listed_briefly() -> None:
    with pytest.raises(LoweringError, match=r"\(size 8: %x; size 6: %batch.0, .*, %batch.5 and 3 more\)"):
        lower(_two_batches, *_two_batches_args(*[6] * 9), batch_argnums=(1, 2))


def test_default_guess_that_does_not_hold_writes_nothing() -> None:
    """`f(x, w)` with a weight not in param_argnums: lowering works as before, nothing is declared."""
    graph = lower(lambda x, w: x @ w, jnp.ones((BATCH, 4)), jnp.ones((4, 3)))
    assert "batch_inputs" not in graph.attrs
    graph = lower(_two_batches, *_two_batches_args(BATCH, 6), param_argnums=0)
    assert "batch_inputs" not in graph.attrs
    graph = lower(_two_batches, *_two_batches_args(BATCH, 6), param_argnums=0, batch_argnums=1)
    assert _batch_inputs(graph) == {"x": 0}  # naming the batch argument settles it


@pytest.mark.parametrize("batch_argnums, message", [
    (4, r"batch_argnums \[4\] out of range: the function was given 4 positional argument\(s\)"),
    ((2, -1), r"batch_argnums \[-1\] out of range"),
    ((0, 2), r"argument\(s\) \[0\] are in both batch_argnums and param_argnums"),
    ((1,), r"argument\(s\) \[1\] are in both batch_argnums and param_argnums"),
    (True, "batch_argnums must be a position or a list of positions"),
    ((2, "y"), "batch_argnums must be a position or a list of positions"),
    ("x", "batch_argnums must be a position or a list of positions"),
    (2.0, "batch_argnums must be a position or a list of positions"),
])
def test_bad_batch_argnums_are_refused(batch_argnums: Any, message: str) -> None:
    with pytest.raises(LoweringError, match=message):
        lower(step, *_step_args(), param_argnums=(0, 1), batch_argnums=batch_argnums)


def test_a_batch_argument_without_an_array_is_refused() -> None:
    with pytest.raises(LoweringError, match="batch_argnums names argument 1, but it has no array of rank >= 1"):
        lower(lambda x, lr: x * lr, jnp.ones((BATCH, 2)), jnp.float32(0.5), batch_argnums=(0, 1))


def test_bad_batch_argnums_fail_before_tracing() -> None:
    traced = []

    def f(x: jax.Array) -> jax.Array:
        traced.append(1)
        return x

    with pytest.raises(LoweringError):
        lower(f, jnp.ones(3), batch_argnums=3)
    assert not traced


# ---------------------------------------------------------------- the .pir text

def test_printed_pir_has_the_attribute_and_parses_back_equal() -> None:
    graph = lower(step, *_step_args(), param_argnums=(0, 1))
    text = str(graph)
    header = text.splitlines()[0]
    assert "attributes {batch_inputs = {x = 0, y = 0}}" in header
    again = pesto_ir.parse(text)
    assert again.structurally_equal(graph)
    assert again.attrs["batch_inputs"] == graph.attrs["batch_inputs"]
    assert str(again) == text


def test_quoted_names_round_trip() -> None:
    def f(batch: Any) -> jax.Array:
        return batch[0] * batch[1]

    graph = lower(f, (jnp.ones((BATCH, 2)), jnp.ones((BATCH, 2))))
    text = str(graph)
    assert 'batch_inputs = {"batch.0" = 0, "batch.1" = 0}' in text
    again = pesto_ir.parse(text)
    assert _batch_inputs(again) == {"batch.0": 0, "batch.1": 0}
    assert again.structurally_equal(graph)


def test_hand_written_attribute_parses() -> None:
    graph = pesto_ir.parse("graph @g(%x: f32[4,3], %y: f32[3,4]) attributes {batch_inputs = {x = 0, y = 1}} {\n"
                           "  %z = add(%x, %x) : f32[4,3]\n  return %z\n}\n")
    assert _batch_inputs(graph) == {"x": 0, "y": 1}


# ---------------------------------------------------------------- parallelize

def _f(x: jax.Array) -> jax.Array:
    return jnp.sin(x) * 2


@pytest.mark.parametrize("kwargs, message", [
    ({"data_parallel": 0}, 'data_parallel must be a whole number from 1 to 1024 or "auto", got 0'),
    ({"data_parallel": -2}, 'data_parallel must be a whole number from 1 to 1024 or "auto"'),
    ({"data_parallel": 2.0}, 'data_parallel must be a whole number from 1 to 1024 or "auto"'),
    ({"data_parallel": True}, 'data_parallel must be a whole number from 1 to 1024 or "auto"'),
    ({"data_parallel": "Auto"}, 'data_parallel must be a whole number from 1 to 1024 or "auto"'),
    ({"microbatches": 0}, 'microbatches must be a whole number from 1 to 1024 or "auto", got 0'),
    ({"microbatches": "4"}, 'microbatches must be a whole number from 1 to 1024 or "auto"'),
    ({"microbatches": False}, 'microbatches must be a whole number from 1 to 1024 or "auto"'),
    ({"microbatches": 10**9}, 'microbatches must be a whole number from 1 to 1024 or "auto", got 1000000000'),
    ({"batch_argnums": (-1,)}, "batch_argnums must be argument positions"),
    ({"batch_argnums": ("x",)}, "batch_argnums must be argument positions"),
    ({"batch_argnums": True}, "batch_argnums must be argument positions"),
    ({"batch_argnums": 1.5}, "batch_argnums must be argument positions"),
    ({"batch_argnums": "x"}, "batch_argnums must be argument positions"),
    ({"batch_argnums": (0, 1), "param_argnums": (1,)}, r"argument\(s\) \[1\] are in both batch_argnums and "
                                                        "param_argnums"),
    ({"autotune": 1}, "autotune must be True, False or \"auto\" .*, got 1"),
    ({"autotune": "yes"}, "autotune must be True, False or \"auto\""),
    ({"autotune_steps": 0}, "autotune_steps must be a whole number from 1 to 1000, got 0"),
    ({"autotune_steps": 2.5}, "autotune_steps must be a whole number"),
])
def test_parallelize_batch_options_are_checked(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(PestoError, match=message):
        pesto_ir.parallelize(_f, **kwargs)
    with pytest.raises(PestoError, match=message):  # also as a decorator
        pesto_ir.parallelize(**kwargs)(_f)


def test_parallelize_batch_options_are_stored() -> None:
    step = pesto_ir.parallelize(_f, data_parallel=1, microbatches=None, batch_argnums=2, autotune=False)
    o = step.options
    assert (o.data_parallel, o.microbatches, o.batch_argnums, o.autotune) == (1, None, (2,), False)
    assert pesto_ir.parallelize(_f, batch_argnums=[0, 2]).options.batch_argnums == (0, 2)
    defaults = pesto_ir.parallelize(_f).options
    assert (defaults.data_parallel, defaults.microbatches, defaults.batch_argnums, defaults.autotune) == \
        (None, None, None, "auto")
    assert defaults == ParallelizeOptions()


def test_parallelize_passes_batch_argnums_to_the_lowering() -> None:
    def f(w: jax.Array, x: jax.Array, y: jax.Array) -> Any:
        return w - 0.1 * (x.T @ (x @ w - y)), jnp.mean(y)

    w, x, y = jnp.ones((4, 3)), jnp.ones((BATCH, 4)), jnp.ones((BATCH, 3))
    with pytest.raises(LoweringError, match=r"batch_argnums \[5\] out of range"):
        pesto_ir.parallelize(f, devices=jax.devices()[:1], param_argnums=0, batch_argnums=5)(w, x, y)
    step = pesto_ir.parallelize(f, devices=jax.devices()[:2], algo="m-topo", param_argnums=0, batch_argnums=1,
                                compiler_options={"xla_backend_optimization_level": 0}, autotune=False)
    compiled = step.compile(w, x, y)
    assert _batch_inputs(compiled.lowered.graph) == {"x": 0}
    default = pesto_ir.parallelize(f, devices=jax.devices()[:2], algo="m-topo", param_argnums=0,
                                   compiler_options={"xla_backend_optimization_level": 0}, autotune=False)
    assert _batch_inputs(default.compile(w, x, y).lowered.graph) == {"x": 0, "y": 0}


@pytest.mark.parametrize("microbatches", [2, 4, "auto"])
def test_parallelize_runs_a_step_as_micro_batches_with_jit_s_numbers(microbatches: Any) -> None:
    """A training step run as micro-batches (the rewritten graph on 4 CPU devices) gives the
    loss and the updated parameters of plain `jax.jit`."""
    def loss(w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

    def step(w: jax.Array, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        value, grad = jax.value_and_grad(loss)(w, x, y)
        return w - 0.1 * grad, value

    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((16, 4)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((32, 16)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((32, 4)), jnp.float32)
    run = pesto_ir.parallelize(step, devices=jax.devices()[:4], param_argnums=0, microbatches=microbatches,
                               time_limit=3, autotune=False)
    got, want = run(w, x, y), jax.jit(step)(w, x, y)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)
    plan = run.plan
    if microbatches != "auto":
        assert plan.parallelism is not None and plan.parallelism.microbatches == microbatches
        assert {op.get("microbatch") for op in run.graph.ops if "microbatch" in op.attrs} == set(range(microbatches))
