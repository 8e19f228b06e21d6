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
  lifetimes (`pesto_ir.memory`) of every step on one device is within 80 GiB (GPT: 16 sequences
  of 1024, 54 GiB; ResNet-50 and Inception: 256 images), so the single-device baseline has a
  makespan. The exception is `gpt24`, GPT twice as deep at GPT's batch: it does not fit one
  device, so only plans that split it (a pipeline, micro-batches, replicas) have a step time. `python3 bench/bench_memory.py` prints each peak next to XLA's own figure.
* `quick`: the same model with tiny dimensions and few layers (100-700 ops), for CI smoke runs:
  lowering and costing take well under a second.

    from bench.zoo_jax import MODELS, describe, lower_model
    graph = lower_model("gpt", "quick")
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pesto_ir.frontends.jax import lower
from pesto_ir.ir import Graph

SIZES = ("full", "quick")
MODELS: tuple[str, ...] = ("mlp", "resnet", "inception", "gpt", "gpt24", "lstm_seq2seq", "multitower")

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
