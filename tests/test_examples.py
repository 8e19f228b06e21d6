"""The hand-written examples compute what their comments say, checked against plain JAX."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pesto_ir
from pesto_ir.ir.types import TensorType
from pesto_ir.jaxrt.interpreter import evaluate

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def random_inputs(graph: pesto_ir.Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        assert isinstance(v.type, TensorType)
        out.append((rng.standard_normal(v.type.shape) * 0.1).astype(v.type.numpy_dtype))
    return out


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.pir")), ids=lambda p: p.stem)
def test_example_evaluates_to_its_declared_types(path: Path) -> None:
    graph = pesto_ir.load(path)
    results = evaluate(graph, *random_inputs(graph))
    for value, result in zip(graph.outputs, results, strict=True):
        assert isinstance(value.type, TensorType)
        assert tuple(result.shape) == value.type.shape
        assert np.isfinite(np.asarray(result)).all()


def test_mlp_train_step_is_sgd_on_mean_squared_error() -> None:
    graph = pesto_ir.load(EXAMPLES / "mlp_train_step.pir")
    x, y, w1, b1, w2, b2 = random_inputs(graph, seed=1)

    def loss(params: tuple[jax.Array, ...]) -> jax.Array:
        w1, b1, w2, b2 = params
        out = jnp.maximum(x @ w1 + b1, 0.0) @ w2 + b2
        return jnp.mean((out - y) ** 2)

    params = (w1, b1, w2, b2)
    value, grads = jax.value_and_grad(loss)(params)
    expected = [value] + [p - 0.1 * g for p, g in zip(params, grads, strict=True)]
    for got, want in zip(evaluate(graph, x, y, *params), expected, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)


def test_lstm_example_is_a_two_layer_lstm() -> None:
    graph = pesto_ir.load(EXAMPLES / "lstm2_unrolled.pir")
    inputs = random_inputs(graph, seed=2)
    xs, (wx0, wh0, b0, wx1, wh1, b1), (h0, c0) = inputs[:4], inputs[4:10], inputs[10:]

    def cell(x: jax.Array, h: jax.Array, c: jax.Array, wx: jax.Array, wh: jax.Array, b: jax.Array):  # noqa: ANN202
        i, f, g, o = jnp.split(x @ wx + h @ wh + b, 4, axis=1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c

    state = [(h0, c0), (h0, c0)]
    tops = []
    for x in xs:
        h, c = cell(x, *state[0], wx0, wh0, b0)
        state[0] = (h, c)
        h, c = cell(h, *state[1], wx1, wh1, b1)
        state[1] = (h, c)
        tops.append(h)
    expected = tops + [state[1][1]]
    for got, want in zip(evaluate(graph, *inputs), expected, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)
