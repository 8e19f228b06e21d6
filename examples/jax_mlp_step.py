"""A JAX training step for `pesto-compile`: `make_step()` returns the step and example arguments.

    pesto-compile examples/jax_mlp_step.py:make_step --devices 4 --plan-json plan.json

`make_step()` returns the step function, example arguments (here `jax.ShapeDtypeStruct`s: only
shapes and dtypes matter, nothing is computed) and which arguments are parameters
(`param_argnums`: they stay on their devices between steps; the others are the batch, split along
axis 0 by data parallelism and micro-batches). It may return a tuple `(fn, args)` or
`(fn, args, param_argnums)`, a dict as here, or any object with those attributes. The graph is
lowered by `pesto_ir.frontends.jax.lower`, which `pesto_ir.load("model.py:make_step")` calls too.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

BATCH, DIM, HIDDEN, CLASSES = 256, 512, 1024, 10
LR, MOMENTUM = 0.05, 0.9


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    h = jax.nn.relu(h @ params["w2"] + params["b2"])
    logits = h @ params["w3"] + params["b3"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, CLASSES), axis=-1))


def train_step(params: dict[str, jax.Array], velocity: dict[str, jax.Array], x: jax.Array,
               y: jax.Array) -> tuple[dict[str, jax.Array], dict[str, jax.Array], jax.Array]:
    """SGD with momentum: new parameters, new velocity, the loss."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    velocity = jax.tree_util.tree_map(lambda v, g: MOMENTUM * v + g, velocity, grads)
    params = jax.tree_util.tree_map(lambda p, v: p - LR * v, params, velocity)
    return params, velocity, loss


def make_step() -> dict[str, Any]:
    f32 = jnp.float32
    shapes = {"w1": (DIM, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, HIDDEN), "b2": (HIDDEN,),
              "w3": (HIDDEN, CLASSES), "b3": (CLASSES,)}
    params = {k: jax.ShapeDtypeStruct(s, f32) for k, s in shapes.items()}
    x = jax.ShapeDtypeStruct((BATCH, DIM), f32)
    y = jax.ShapeDtypeStruct((BATCH,), jnp.int32)
    return {"fn": train_step, "args": (params, params, x, y), "param_argnums": (0, 1)}
