"""Building blocks of the JAX model zoo (`bench/zoo_jax.py`): optimizers, the training step, shared layers.

The f32/i32 dtypes and shape-only specs, the SGD, momentum and Adam updates, the `Model` record and
`_train_step`, and the dense, norm, convolution and pooling layers every model family uses. Kept
apart from the model families (`bench/zoo_jax_models.py`) and the zoo's table and lowering
(`bench/zoo_jax.py`) so that each file stays short; it imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

F32, I32 = jnp.float32, jnp.int32
Tree = Any


def _spec(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# ---------------------------------------------------------------- optimizers

LR, MOMENTUM, B1, B2, EPS = 1e-3, 0.9, 0.9, 0.999, 1e-8


@dataclass(frozen=True)
class Optimizer:
    """An update rule and how many state tensors it keeps per parameter (momentum, Adam's m and v)."""

    name: str
    slots: int
    update: Callable[[Tree, Tree, tuple[Tree, ...]], tuple[Tree, tuple[Tree, ...]]]


def _sgd(params: Tree, grads: Tree, state: tuple[Tree, ...]) -> tuple[Tree, tuple[Tree, ...]]:
    return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), state


def _momentum(params: Tree, grads: Tree, state: tuple[Tree, ...]) -> tuple[Tree, tuple[Tree, ...]]:
    (velocity,) = state
    velocity = jax.tree_util.tree_map(lambda v, g: MOMENTUM * v + g, velocity, grads)
    return jax.tree_util.tree_map(lambda p, v: p - LR * v, params, velocity), (velocity,)


def _adam(params: Tree, grads: Tree, state: tuple[Tree, ...]) -> tuple[Tree, tuple[Tree, ...]]:
    """Adam without bias correction (a constant factor at a fixed step; no step counter to carry)."""
    m, v = state
    m = jax.tree_util.tree_map(lambda m, g: B1 * m + (1 - B1) * g, m, grads)
    v = jax.tree_util.tree_map(lambda v, g: B2 * v + (1 - B2) * g * g, v, grads)
    params = jax.tree_util.tree_map(lambda p, m, v: p - LR * m / (jnp.sqrt(v) + EPS), params, m, v)
    return params, (m, v)


SGD = Optimizer("sgd", 0, _sgd)
MOMENTUM_SGD = Optimizer("momentum sgd", 1, _momentum)
ADAM = Optimizer("adam", 2, _adam)


# ---------------------------------------------------------------- a training step

@dataclass(frozen=True)
class Model:
    """A model at one size: `loss(params, *batch)` and abstract (shape-only) parameters and batch."""

    loss: Callable[..., jax.Array]
    params: Tree
    batch: tuple[Tree, ...]


def _train_step(name: str, loss: Callable[..., jax.Array], optimizer: Optimizer) -> Callable[..., Any]:
    """`loss(params, *batch)` made into a step that returns updated parameters and state."""

    def train_step(params: Tree, opt_state: tuple[Tree, ...], *batch: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(params, *batch)
        params, opt_state = optimizer.update(params, grads, opt_state)
        return params, opt_state, value

    train_step.__name__ = name  # names the lowered graph
    return train_step


# ---------------------------------------------------------------- shared layers

def _dense_spec(n_in: int, n_out: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {"w": _spec(n_in, n_out), "b": _spec(n_out)}


def _dense(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


def _norm_spec(n: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {"gamma": _spec(n), "beta": _spec(n)}


def _layer_norm(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred * lax.rsqrt(var + 1e-5) * p["gamma"] + p["beta"]


def _batch_norm(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """Training-mode batch norm over batch and space, folded into one scale and shift per channel
    (as fused kernels do): fewer full-size intermediates than normalising, then scaling."""
    mean = x.mean(axis=(0, 1, 2))
    var = (x * x).mean(axis=(0, 1, 2)) - mean * mean
    scale = p["gamma"] * lax.rsqrt(var + 1e-5)
    return x * scale + (p["beta"] - mean * scale)


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of integer labels."""
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1).mean()


# ---------------------------------------------------------------- convolutions

def _conv_spec(kh: int, kw: int, c_in: int, c_out: int) -> dict[str, Any]:
    return {"w": _spec(kh, kw, c_in, c_out), "bn": _norm_spec(c_out)}


def _conv_bn(p: dict[str, Any], x: jax.Array, stride: int = 1, relu: bool = True) -> jax.Array:
    """Convolution, batch norm and (optionally) ReLU: the unit of every CNN here."""
    y = lax.conv_general_dilated(x, p["w"], (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = _batch_norm(p["bn"], y)
    return jax.nn.relu(y) if relu else y


def _max_pool(x: jax.Array, stride: int) -> jax.Array:
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, stride, stride, 1), "SAME")


def _avg_pool(x: jax.Array) -> jax.Array:
    return lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME") / 9.0


def _classifier_loss(head: dict[str, jax.Array], features: jax.Array, labels: jax.Array) -> jax.Array:
    """Global average pool, a dense layer to the classes, cross-entropy."""
    return _cross_entropy(_dense(head, features.mean(axis=(1, 2))), labels)


def _image_batch(batch: int, image: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    return _spec(batch, image, image, 3), _spec(batch, dtype=I32)

