"""Programs real libraries produce (issue: random keys, dead code, gradients of `cond`, debug
prints, flax's LSTM with its default carry): what lowers now, round-trips through `.pir` and runs
with jax.jit's numbers."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pesto_ir
from pesto_ir.frontends.jax import lower
from pesto_ir.frontends.text import ENGINES


def _cond(w: jax.Array, x: jax.Array) -> jax.Array:
    return lax.cond(x.sum() > 0, lambda w: (w * x).sum(), lambda w: (w * w * x).sum(), w)


def _switch(w: jax.Array, x: jax.Array) -> jax.Array:
    branches = [lambda w: (w * x).sum(), lambda w: jnp.sin(w * x).sum(), lambda w: (w * w).sum()]
    return lax.switch(jnp.abs(x.sum()).astype(jnp.int32) % 3, branches, w)


@pytest.mark.parametrize("loss", [_cond, _switch], ids=["cond", "switch"])
@pytest.mark.parametrize("x", [[1.0, -2.0, 4.0], [-1.0, -2.0, 0.5], [2.0, 2.0, 0.0]])
def test_gradients_through_cond_and_switch(loss: Callable[..., jax.Array], x: list[float]) -> None:
    """The backward pass of a `cond` makes zeros with `empty2`, whose `memory_space` now prints."""
    grad = jax.grad(loss)
    w, xs = jnp.arange(3.0) + 1, jnp.asarray(x)
    graph = lower(grad, w, xs)
    text = str(graph)
    assert "memory_space" in text and str(pesto_ir.parse(text)) == text
    run = pesto_ir.parallelize(grad, devices=jax.devices()[:4], autotune=False)
    np.testing.assert_allclose(np.asarray(run(w, xs)), np.asarray(jax.jit(grad)(w, xs)), rtol=1e-6)


def _printing_step(w: jax.Array, x: jax.Array) -> jax.Array:
    y = x @ w
    jax.debug.print("y is {} and {z}", y, z=y * 2)
    return jnp.tanh(y)


def test_debug_print_lowers_round_trips_and_prints_once_per_step(capfd: pytest.CaptureFixture[str]) -> None:
    w, x = jnp.ones((3, 2)), jnp.arange(12.0).reshape(4, 3)
    text = str(lower(_printing_step, w, x))
    assert "debug_print" in text and str(pesto_ir.parse(text)) == text
    expected = jax.jit(_printing_step)(w, x)
    jax.effects_barrier()
    printed_by_jit = capfd.readouterr().out
    run = pesto_ir.parallelize(_printing_step, devices=jax.devices()[:4], autotune=False)  # timing would print
    np.testing.assert_allclose(np.asarray(run(w, x)), np.asarray(expected), rtol=1e-6)
    jax.effects_barrier()
    assert capfd.readouterr().out == printed_by_jit and printed_by_jit.count("y is") == 1


def test_a_pytree_with_custom_nodes_is_refused_by_name() -> None:
    from typing import NamedTuple

    class Pair(NamedTuple):
        a: jax.Array
        b: jax.Array

    def step(x: jax.Array) -> jax.Array:
        jax.debug.print("{}", Pair(x, x))
        return x

    with pytest.raises(pesto_ir.PestoError, match="primitive 'debug_print': .*'in_tree'.* tuples, lists, dicts"):
        lower(step, jnp.ones(2))


def _lstm_training_step() -> tuple[Callable[..., tuple[jax.Array, dict, dict]], tuple[object, ...]]:
    """A flax linen LSTM over a sequence (nn.RNN, default carry: no initial carry given) and a dense
    head; one SGD step with optax. flax builds the default carry from a random key it then drops."""
    import flax.linen as nn
    import optax

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            h = nn.RNN(nn.LSTMCell(8))(x)
            return nn.Dense(2)(h[:, -1])

    model, opt = Model(), optax.sgd(0.1)
    x = jnp.linspace(-1.0, 1.0, 2 * 5 * 3).reshape(2, 5, 3)
    y = jnp.array([[0.5, -0.5], [1.0, 0.0]])
    params = model.init(jax.random.key(0), x)

    def step(params: dict, opt_state: dict, x: jax.Array, y: jax.Array) -> tuple[jax.Array, dict, dict]:
        loss, grads = jax.value_and_grad(lambda p: ((model.apply(p, x) - y) ** 2).mean())(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return step, (params, opt.init(params), x, y)


@pytest.mark.slow
def test_flax_lstm_with_its_default_carry_trains_under_parallelize_like_jit() -> None:
    step, args = _lstm_training_step()
    text = str(lower(step, *args, param_argnums=(0, 1)))
    assert "scan(" in text and "random_" not in text  # the carry's key is dead code: not lowered
    for engine in ENGINES:
        assert str(pesto_ir.parse(text, engine=engine)) == text
    run = pesto_ir.parallelize(step, devices=jax.devices()[:4], param_argnums=(0, 1), autotune=False)
    got, want = run(*args), jax.jit(step)(*args)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    assert len({s.device for s in run.executable.segments}) > 1  # it ran split across devices
