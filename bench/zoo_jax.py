"""The JAX half of the benchmark model zoo: realistic training steps, lowered to Pesto IR graphs.

Each model is one full training step, written in plain `jax.numpy` / `lax`: forward pass, loss,
`jax.value_and_grad` backward pass and an optimizer update (SGD, momentum or Adam written in jnp).
Parameters and optimizer state are graph inputs marked `param`. Steps are traced from
`jax.ShapeDtypeStruct` arguments, so nothing is allocated or computed, and nothing is downloaded.

Everything is f32, so that the zoo's numbers stay comparable with the results already published
in the README; the frontend lowers mixed-precision (bf16) steps too.

Sizes:

* `full`: realistic for 2-8 H100s (hundreds to a few thousand ops, tens of ms per step on one
  H100 by the roofline model), at the batches one 80 GiB H100 really holds: the peak by tensor
  lifetimes (`pesto_ir.schedule.memory`) of every step on one device is within 80 GiB (GPT: 16 sequences
  of 1024, 54 GiB; ResNet-50 and Inception: 256 images), so the single-device baseline has a
  makespan. The exception is `gpt24`, GPT twice as deep at GPT's batch: it does not fit one
  device, so only plans that split it (a pipeline, micro-batches, replicas) have a step time. `python3 bench/bench_memory.py` prints each peak next to XLA's own figure.
* `quick`: the same model with tiny dimensions and few layers (100-700 ops), for CI smoke runs:
  lowering and costing take well under a second.

This module holds the zoo's table and lowering; the building blocks (optimizers, the training step,
shared layers) are in `bench/zoo_jax_layers.py` and the model families in `bench/zoo_jax_models.py`,
both re-exported here.

    from bench.zoo_jax import MODELS, describe, lower_model
    graph = lower_model("gpt", "quick")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from bench.zoo_jax_layers import (
    ADAM,
    B1,
    B2,
    EPS,
    F32,
    I32,
    LR,
    MOMENTUM,
    MOMENTUM_SGD,
    SGD,
    Model,
    Optimizer,
    Tree,
    _train_step,
)
from bench.zoo_jax_models import (
    GPT,
    GPT24,
    INCEPTION,
    MLP,
    MULTITOWER,
    RESNET,
    SEQ2SEQ,
    GptConfig,
    InceptionConfig,
    MlpConfig,
    MultiTowerConfig,
    ResNetConfig,
    Seq2SeqConfig,
    State,
    StemConv,
    Widths,
    _gpt,
    _gpt_describe,
    _inception,
    _inception_describe,
    _mlp,
    _mlp_describe,
    _multitower,
    _multitower_describe,
    _resnet,
    _resnet_describe,
    _seq2seq,
    _seq2seq_describe,
    bottleneck,
)
from pesto_ir.frontends.jax import lower
from pesto_ir.ir.graph import Graph

SIZES = ("full", "quick")
MODELS: tuple[str, ...] = ("mlp", "resnet", "inception", "gpt", "gpt24", "lstm_seq2seq", "multitower")

# The public names, those of the building blocks (`bench/zoo_jax_layers.py`) and model families
# (`bench/zoo_jax_models.py`) included: they were all defined here once, and are imported from here.
__all__ = [
    "SIZES", "MODELS", "Entry", "ZOO", "describe", "lower_model", "lower_config", "step_at", "concrete_arguments",
    "ADAM", "B1", "B2", "EPS", "F32", "I32", "LR", "MOMENTUM", "MOMENTUM_SGD", "SGD", "Model", "Optimizer", "Tree",
    "GPT", "GPT24", "INCEPTION", "MLP", "MULTITOWER", "RESNET", "SEQ2SEQ", "GptConfig", "InceptionConfig",
    "MlpConfig", "MultiTowerConfig", "ResNetConfig", "Seq2SeqConfig", "State", "StemConv", "Widths", "bottleneck",
]


# ---------------------------------------------------------------- the zoo

@dataclass(frozen=True)
class Entry:
    """One model of the zoo: its configuration per size, how to build and describe it, its optimizer."""

    configs: dict[str, Any]
    build: Callable[[Any], Model]
    describe: Callable[[Any], str]
    optimizer: Optimizer


ZOO: dict[str, Entry] = {
    "mlp": Entry(MLP, _mlp, _mlp_describe, MOMENTUM_SGD),
    "resnet": Entry(RESNET, _resnet, _resnet_describe, MOMENTUM_SGD),
    "inception": Entry(INCEPTION, _inception, _inception_describe, SGD),
    "gpt": Entry(GPT, _gpt, _gpt_describe, ADAM),
    "gpt24": Entry(GPT24, _gpt, _gpt_describe, ADAM),
    "lstm_seq2seq": Entry(SEQ2SEQ, _seq2seq, _seq2seq_describe, ADAM),
    "multitower": Entry(MULTITOWER, _multitower, _multitower_describe, ADAM),
}


def _entry(name: str, size: str) -> Entry:
    if name not in ZOO:
        raise KeyError(f"unknown model '{name}' (models: {', '.join(MODELS)})")
    if size not in SIZES:
        raise KeyError(f"unknown size '{size}' (sizes: {', '.join(SIZES)})")
    return ZOO[name]


def describe(name: str, size: str = "full") -> str:
    """One line saying what the model's training step is, at this size."""
    entry = _entry(name, size)
    return f"{entry.describe(entry.configs[size])}, {entry.optimizer.name} train step"


def lower_model(name: str, size: str = "full") -> Graph:
    """The verified graph of one training step of `name` at `size` (graph `<name>_<size>`).

    Inputs: the parameters, the optimizer state (one copy of the parameter tree per slot), both
    marked `param`, then the batch. Outputs: new parameters, new state, the loss.
    """
    return lower_config(name, _entry(name, size).configs[size], f"{name}_{size}")


def lower_config(name: str, config: Any, graph_name: str | None = None) -> Graph:
    """`lower_model` at a configuration of one's own (the model's config class, e.g. `MlpConfig`):
    sizes between `quick` and `full`, such as `bench/calibrate.py` times on a CPU."""
    step, args = step_at(name, config, graph_name)
    return lower(step, *args, param_argnums=(0, 1))


def step_at(name: str, config: Any, step_name: str | None = None) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The training step of `name` at `config` and its abstract arguments (parameters, optimizer
    state, batch as `jax.ShapeDtypeStruct`s), for timing the step itself under `jax.jit`."""
    entry = _entry(name, SIZES[0])
    model = entry.build(config)
    state = tuple(model.params for _ in range(entry.optimizer.slots))
    return _train_step(step_name or f"{name}_custom", model.loss, entry.optimizer), (model.params, state, *model.batch)


def concrete_arguments(spec: Any, seed: int = 3) -> Any:
    """Arrays for an abstract argument tree (`step_at`'s): small random floats, integers zero
    (valid labels and indices), to run a step for real."""
    leaves, tree = jax.tree_util.tree_flatten(spec)
    keys = jax.random.split(jax.random.PRNGKey(seed), max(len(leaves), 1))
    arrays = [jax.random.normal(k, s.shape, s.dtype) * 0.05 if jnp.issubdtype(s.dtype, jnp.floating)
              else jnp.zeros(s.shape, s.dtype) for k, s in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(tree, arrays)
