"""The model families of the JAX model zoo (`bench/zoo_jax.py`): each one's configuration, sizes and loss.

MLP, ResNet, Inception, GPT, the LSTM encoder-decoder and the multi-tower recommender: per family a
config class, its `full` and `quick` configurations, the abstract parameters and batch (`Model`) and
a one-line description. Kept apart from the zoo's table and lowering (`bench/zoo_jax.py`, which
re-exports these names) so that each file stays short; the layers come from `bench/zoo_jax_layers.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from bench.zoo_jax_layers import (
    F32,
    I32,
    Model,
    Tree,
    _avg_pool,
    _classifier_loss,
    _conv_bn,
    _conv_spec,
    _count,
    _cross_entropy,
    _dense,
    _dense_spec,
    _image_batch,
    _layer_norm,
    _max_pool,
    _norm_spec,
    _spec,
)

# ---------------------------------------------------------------- 1. MLP

@dataclass(frozen=True)
class MlpConfig:
    layers: int
    width: int
    batch: int
    classes: int


MLP = {"full": MlpConfig(8, 8192, 2048, 1000), "quick": MlpConfig(3, 64, 16, 10)}


def _mlp_loss(params: Tree, x: jax.Array, labels: jax.Array) -> jax.Array:
    for layer in params["hidden"]:
        x = jax.nn.relu(_dense(layer, x))
    return _cross_entropy(_dense(params["head"], x), labels)


def _mlp(c: MlpConfig) -> Model:
    params = {"hidden": [_dense_spec(c.width, c.width) for _ in range(c.layers)],
              "head": _dense_spec(c.width, c.classes)}
    batch = (_spec(c.batch, c.width), _spec(c.batch, dtype=I32))
    return Model(_mlp_loss, params, batch)


def _mlp_describe(c: MlpConfig) -> str:
    return f"MLP, {_count(c.layers, 'ReLU layer')} of {c.width}, {c.classes} classes, batch {c.batch}"


# ---------------------------------------------------------------- 2. ResNet

@dataclass(frozen=True)
class ResNetConfig:
    stages: tuple[tuple[int, int, int], ...]  # (bottleneck width, blocks, first stride)
    stem: int
    image: int
    batch: int
    classes: int


RESNET = {
    "full": ResNetConfig(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), 64, 224, 256, 1000),
    "quick": ResNetConfig(((4, 1, 1),), 8, 16, 2, 10),
}


def _bottleneck_spec(c_in: int, width: int, project: bool) -> dict[str, Any]:
    block = {"a": _conv_spec(1, 1, c_in, width), "b": _conv_spec(3, 3, width, width),
             "c": _conv_spec(1, 1, width, 4 * width)}
    return {**block, "proj": _conv_spec(1, 1, c_in, 4 * width)} if project else block


def bottleneck(p: dict[str, Any], x: jax.Array, stride: int, conv_bn: Callable[..., jax.Array] = _conv_bn) -> jax.Array:
    """A ResNet bottleneck block (1x1, 3x3, 1x1, projected shortcut when `p` has one), its
    convolutions with batch norm made by `conv_bn(p, x, stride=1, relu=True)`."""
    y = conv_bn(p["a"], x)
    y = conv_bn(p["b"], y, stride)
    y = conv_bn(p["c"], y, relu=False)
    shortcut = conv_bn(p["proj"], x, stride, relu=False) if "proj" in p else x
    return jax.nn.relu(y + shortcut)


def _resnet_loss(params: Tree, x: jax.Array, labels: jax.Array, strides: tuple[int, ...]) -> jax.Array:
    y = _max_pool(_conv_bn(params["stem"], x, 2), 2)
    for stage, stride in zip(params["stages"], strides):
        for i, block in enumerate(stage):
            y = bottleneck(block, y, stride if i == 0 else 1)
    return _classifier_loss(params["head"], y, labels)


def _resnet(c: ResNetConfig) -> Model:
    stages, c_in = [], c.stem
    for width, blocks, _ in c.stages:
        stages.append([_bottleneck_spec(c_in if i == 0 else 4 * width, width, i == 0) for i in range(blocks)])
        c_in = 4 * width
    params = {"stem": _conv_spec(7, 7, 3, c.stem), "stages": stages, "head": _dense_spec(c_in, c.classes)}
    strides = tuple(s for _, _, s in c.stages)

    def loss(params: Tree, x: jax.Array, labels: jax.Array) -> jax.Array:
        return _resnet_loss(params, x, labels, strides)

    return Model(loss, params, _image_batch(c.batch, c.image))


def _resnet_describe(c: ResNetConfig) -> str:
    depth = 2 + 3 * sum(blocks for _, blocks, _ in c.stages)
    return (f"ResNet-{depth} (bottleneck blocks, batch norm), {c.image}x{c.image}, {c.classes} classes, "
            f"batch {c.batch}")


# ---------------------------------------------------------------- 3. Inception

Widths = tuple[int, int, int, int, int, int]  # 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection


StemConv = tuple[int, int, int, bool]  # kernel, channels, stride, max pool after


@dataclass(frozen=True)
class InceptionConfig:
    stem: tuple[StemConv, ...]
    groups: tuple[tuple[Widths, ...], ...]  # modules per grid size; a reduction module between groups
    image: int
    batch: int
    classes: int


_V3_GROUPS: tuple[tuple[Widths, ...], ...] = (
    ((64, 48, 64, 64, 96, 32), (64, 48, 64, 64, 96, 64), (64, 48, 64, 64, 96, 64)),
    ((192, 128, 192, 128, 192, 192), (192, 160, 192, 160, 192, 192), (192, 160, 192, 160, 192, 192),
     (192, 192, 192, 192, 192, 192)),
    ((320, 384, 384, 448, 384, 192), (320, 384, 384, 448, 384, 192)),
)

INCEPTION = {
    "full": InceptionConfig(((3, 32, 2, False), (3, 32, 1, False), (3, 64, 1, True), (1, 80, 1, False),
                             (3, 192, 1, True)), _V3_GROUPS, 299, 256, 1000),
    "quick": InceptionConfig(((3, 8, 2, True),), ((), ((4, 4, 8, 2, 4, 4),)), 16, 2, 10),
}


def _module_spec(c_in: int, w: Widths) -> dict[str, Any]:
    b1, r3, b3, r5, b5, pool = w
    return {"b1": _conv_spec(1, 1, c_in, b1), "r3": _conv_spec(1, 1, c_in, r3), "b3": _conv_spec(3, 3, r3, b3),
            "r5": _conv_spec(1, 1, c_in, r5), "b5": _conv_spec(5, 5, r5, b5), "pool": _conv_spec(1, 1, c_in, pool)}


def _module(p: dict[str, Any], x: jax.Array) -> jax.Array:
    """Four branches over the same input, concatenated along channels."""
    branches = (_conv_bn(p["b1"], x), _conv_bn(p["b3"], _conv_bn(p["r3"], x)),
                _conv_bn(p["b5"], _conv_bn(p["r5"], x)), _conv_bn(p["pool"], _avg_pool(x)))
    return jnp.concatenate(branches, axis=-1)


def _reduction_spec(c_in: int) -> dict[str, Any]:
    return {"b3": _conv_spec(3, 3, c_in, c_in // 2), "r": _conv_spec(1, 1, c_in, c_in // 4),
            "b3b": _conv_spec(3, 3, c_in // 4, c_in // 4)}


def _reduction(p: dict[str, Any], x: jax.Array) -> jax.Array:
    """Halves the grid: a strided 3x3 branch, a 1x1 then strided 3x3 branch and a max pool."""
    branches = (_conv_bn(p["b3"], x, 2), _conv_bn(p["b3b"], _conv_bn(p["r"], x), 2), _max_pool(x, 2))
    return jnp.concatenate(branches, axis=-1)


def _inception_loss(params: Tree, x: jax.Array, labels: jax.Array, stem: tuple[StemConv, ...]) -> jax.Array:
    for p, (_, _, stride, pool) in zip(params["stem"], stem):
        x = _conv_bn(p, x, stride)
        x = _max_pool(x, 2) if pool else x
    for g, group in enumerate(params["groups"]):
        if g:
            x = _reduction(params["reductions"][g - 1], x)
        for module in group:
            x = _module(module, x)
    return _classifier_loss(params["head"], x, labels)


def _inception(c: InceptionConfig) -> Model:
    stem, c_in = [], 3
    for k, width, _, _ in c.stem:
        stem.append(_conv_spec(k, k, c_in, width))
        c_in = width
    groups, reductions = [], []
    for g, group in enumerate(c.groups):
        if g:
            reductions.append(_reduction_spec(c_in))
            c_in = c_in + c_in // 2 + c_in // 4
        modules = []
        for w in group:
            modules.append(_module_spec(c_in, w))
            c_in = w[0] + w[2] + w[4] + w[5]
        groups.append(modules)
    params = {"stem": stem, "groups": groups, "reductions": reductions, "head": _dense_spec(c_in, c.classes)}

    def loss(params: Tree, x: jax.Array, labels: jax.Array) -> jax.Array:
        return _inception_loss(params, x, labels, c.stem)

    return Model(loss, params, _image_batch(c.batch, c.image))


def _inception_describe(c: InceptionConfig) -> str:
    modules = _count(sum(len(g) for g in c.groups), "module")
    return (f"Inception ({_count(len(c.stem), 'stem conv')}, {modules} of 1x1/3x3/5x5/pool branches, "
            f"{_count(len(c.groups) - 1, 'reduction')}), {c.image}x{c.image}, {c.classes} classes, batch {c.batch}")


# ---------------------------------------------------------------- 4. GPT

@dataclass(frozen=True)
class GptConfig:
    layers: int
    d_model: int
    heads: int
    seq: int
    batch: int
    vocab: int


GPT = {"full": GptConfig(12, 1024, 16, 1024, 16, 32768), "quick": GptConfig(1, 32, 4, 16, 2, 64)}
# Twice as deep: its step does not fit one 80 GiB H100 at this batch, so memory decides the plan.
GPT24 = {"full": GptConfig(24, 1024, 16, 1024, 16, 32768), "quick": GptConfig(2, 32, 4, 16, 4, 64)}


def _gpt_block_spec(d: int) -> dict[str, Any]:
    return {"ln1": _norm_spec(d), "qkv": _dense_spec(d, 3 * d), "proj": _dense_spec(d, d),
            "ln2": _norm_spec(d), "fc": _dense_spec(d, 4 * d), "out": _dense_spec(4 * d, d)}


def _softmax(x: jax.Array) -> jax.Array:
    """Softmax over the last axis, the max shift outside the gradient (as jax.nn.softmax does)."""
    e = jnp.exp(x - lax.stop_gradient(x).max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention(p: dict[str, Any], x: jax.Array, heads: int) -> jax.Array:
    """Causal multi-head self-attention; the mask is an additive bias, the scale applied to q."""
    b, s, d = x.shape
    q, k, v = (t.reshape(b, s, heads, d // heads) for t in jnp.split(_dense(p["qkv"], x), 3, axis=-1))
    causal = lax.broadcasted_iota(I32, (s, s), 0) >= lax.broadcasted_iota(I32, (s, s), 1)
    bias = jnp.where(causal, 0.0, -1e9).astype(F32)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q / math.sqrt(d // heads), k) + bias
    return _dense(p["proj"], jnp.einsum("bhqk,bkhd->bqhd", _softmax(scores), v).reshape(b, s, d))


def _gpt_block(p: dict[str, Any], x: jax.Array, heads: int) -> jax.Array:
    x = x + _attention(p, _layer_norm(p["ln1"], x), heads)
    hidden = jax.nn.gelu(_dense(p["fc"], _layer_norm(p["ln2"], x)), approximate=False)
    return x + _dense(p["out"], hidden)


def _gpt_loss(params: Tree, tokens: jax.Array, targets: jax.Array, heads: int) -> jax.Array:
    x = params["wte"][tokens] + params["wpe"]
    for block in params["blocks"]:
        x = _gpt_block(block, x, heads)
    logits = _layer_norm(params["ln_f"], x) @ params["wte"].T  # tied embeddings
    return _cross_entropy(logits, targets)


def _gpt(c: GptConfig) -> Model:
    params = {"wte": _spec(c.vocab, c.d_model), "wpe": _spec(c.seq, c.d_model),
              "blocks": [_gpt_block_spec(c.d_model) for _ in range(c.layers)], "ln_f": _norm_spec(c.d_model)}
    tokens = _spec(c.batch, c.seq, dtype=I32)

    def loss(params: Tree, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        return _gpt_loss(params, tokens, targets, c.heads)

    return Model(loss, params, (tokens, tokens))


def _gpt_describe(c: GptConfig) -> str:
    return (f"GPT decoder, {_count(c.layers, 'layer')}, d={c.d_model}, {c.heads} heads, seq {c.seq}, vocab {c.vocab}, "
            f"batch {c.batch}")


# ---------------------------------------------------------------- 5. LSTM encoder-decoder

@dataclass(frozen=True)
class Seq2SeqConfig:
    layers: int  # in the encoder, and again in the decoder
    hidden: int
    steps: int  # source and target length
    batch: int
    vocab: int


SEQ2SEQ = {"full": Seq2SeqConfig(4, 1024, 12, 256, 32768), "quick": Seq2SeqConfig(2, 16, 2, 2, 32)}

State = tuple[jax.Array, jax.Array]  # (h, c) of one LSTM layer


def _lstm_cell(p: dict[str, jax.Array], x: jax.Array, state: State) -> State:
    """One step of one layer: the four gates from one matmul over [x, h]."""
    h, c = state
    gates = _dense(p, jnp.concatenate((x, h), axis=-1))
    ifo, g = jnp.split(gates, (3 * h.shape[-1],), axis=-1)
    i, f, o = jnp.split(jax.nn.sigmoid(ifo), 3, axis=-1)
    c = f * c + i * jnp.tanh(g)
    return o * jnp.tanh(c), c


def _lstm_stack(layers: list[dict[str, jax.Array]], inputs: list[jax.Array],
                states: list[State]) -> tuple[list[jax.Array], list[State]]:
    """Layers x steps, unrolled in Python: each cell is its own ops, so the wavefront is visible."""
    states, outputs = list(states), []
    for x in inputs:
        for layer, p in enumerate(layers):
            states[layer] = _lstm_cell(p, x, states[layer])
            x = states[layer][0]
        outputs.append(x)
    return outputs, states


def _embed_steps(table: jax.Array, tokens: jax.Array) -> list[jax.Array]:
    """(batch, steps) tokens to one (batch, hidden) embedding per step: one gather, one split.
    Batch-major, as JAX code usually is: the batch stays the leading axis, so the step splits into
    micro-batches and replicas (`passes/microbatch.py`)."""
    steps = tokens.shape[1]
    return [x.squeeze(1) for x in jnp.split(table[tokens], steps, axis=1)]


def _seq2seq_loss(params: Tree, source: jax.Array, target_in: jax.Array, target_out: jax.Array) -> jax.Array:
    hidden = params["embed"].shape[1]
    zero = jnp.zeros((source.shape[0], hidden), F32)
    _, states = _lstm_stack(params["encoder"], _embed_steps(params["embed"], source),
                            [(zero, zero)] * len(params["encoder"]))
    outputs, _ = _lstm_stack(params["decoder"], _embed_steps(params["embed"], target_in), states)
    hidden = outputs[0].shape[-1]
    logits = _dense(params["head"], jnp.stack(outputs, axis=1).reshape(-1, hidden))
    return _cross_entropy(logits, target_out.reshape(-1))


def _seq2seq(c: Seq2SeqConfig) -> Model:
    cell = _dense_spec(2 * c.hidden, 4 * c.hidden)
    params = {"embed": _spec(c.vocab, c.hidden), "encoder": [cell] * c.layers, "decoder": [cell] * c.layers,
              "head": _dense_spec(c.hidden, c.vocab)}
    tokens = _spec(c.batch, c.steps, dtype=I32)
    return Model(_seq2seq_loss, params, (tokens, tokens, tokens))


def _seq2seq_describe(c: Seq2SeqConfig) -> str:
    return (f"LSTM encoder-decoder, {c.layers}+{c.layers} layers, hidden {c.hidden}, {c.steps}+{c.steps} "
            f"unrolled steps, vocab {c.vocab}, batch {c.batch}")


# ---------------------------------------------------------------- 6. multi-tower

@dataclass(frozen=True)
class MultiTowerConfig:
    towers: int
    features: int  # input features per tower
    width: int  # hidden width of each tower
    depth: int  # hidden layers per tower
    head: int  # hidden width of the shared head
    batch: int


MULTITOWER = {"full": MultiTowerConfig(8, 1024, 4096, 3, 4096, 4096),
              "quick": MultiTowerConfig(3, 8, 16, 2, 16, 4)}


def _tower(layers: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    for layer in layers:
        x = jax.nn.relu(_dense(layer, x))
    return x


def _multitower_loss(params: Tree, features: tuple[jax.Array, ...], clicks: jax.Array) -> jax.Array:
    """Each tower reads its own feature block; the head sees all towers; logistic loss on clicks."""
    towers = [_tower(p, x) for p, x in zip(params["towers"], features)]
    logit = _dense(params["out"], _tower(params["head"], jnp.concatenate(towers, axis=-1)))[:, 0]
    return (jax.nn.softplus(logit) - clicks * logit).mean()


def _multitower(c: MultiTowerConfig) -> Model:
    def tower() -> list[dict[str, jax.ShapeDtypeStruct]]:
        return [_dense_spec(c.features if i == 0 else c.width, c.width) for i in range(c.depth)]

    params = {"towers": [tower() for _ in range(c.towers)],
              "head": [_dense_spec(c.towers * c.width, c.head), _dense_spec(c.head, c.head)],
              "out": _dense_spec(c.head, 1)}
    features = tuple(_spec(c.batch, c.features) for _ in range(c.towers))
    return Model(_multitower_loss, params, (features, _spec(c.batch)))


def _multitower_describe(c: MultiTowerConfig) -> str:
    return (f"multi-tower recommender, {_count(c.towers, 'tower')} of {c.depth}x{c.width} over {c.features} features each, "
            f"2x{c.head} shared head, batch {c.batch}")

