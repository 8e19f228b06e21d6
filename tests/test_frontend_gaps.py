"""Programs real libraries produce (issue: random keys, dead code, gradients of `cond`, debug
prints): what lowers now, round-trips through `.pir` and runs with jax.jit's numbers."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pesto_ir
from pesto_ir.frontends.jax import lower


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
    run = pesto_ir.parallelize(grad, devices=jax.devices()[:4])
    np.testing.assert_allclose(np.asarray(run(w, xs)), np.asarray(jax.jit(grad)(w, xs)), rtol=1e-6)
