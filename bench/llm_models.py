"""GPT training steps as large-model systems run them: bf16 compute, fp32 master weights, fp32 Adam.

`bench/llm_zoo.py` plans these steps at the sizes Alpa and Megatron-Core publish. The zoo's GPT
(`bench/zoo_jax_models.py`) is all f32; here the same decoder (pre-norm blocks, fused QKV, causal
attention by an additive mask, GELU MLP of 4d, tied embeddings, learned positions) runs the way
mixed-precision training runs it:

* the parameters and Adam's two moments are f32 graph inputs (`param`): the master weights and the
  optimizer state, updated in f32 by the zoo's Adam (`bench/zoo_jax_layers.py`);
* the loss casts every parameter to bf16 first, so the forward and backward passes compute and keep
  their activations in bf16; the gradients come back through the casts as f32, as the f32 "main
  grads" of Megatron's optimizer;
* the logits are cast to f32 for the cross-entropy (Megatron's vocab-parallel cross-entropy runs in
  f32), and the loss is an f32 scalar.

`precision="f32"` gives the same decoder all in f32 (no casts), for comparison. Steps are traced from
`jax.ShapeDtypeStruct`s, so nothing is allocated: a 70B step lowers on a laptop.

    from bench.llm_models import GptConfig, lower_gpt, parameter_count
    graph = lower_gpt(GptConfig(24, 1024, 16, 1024, 8, 51200))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from bench.zoo_jax_layers import ADAM, F32, I32, Model, Tree, _cross_entropy, _dense, _layer_norm, _train_step
from bench.zoo_jax_models import GptConfig, _gpt_block_spec, _softmax
from pesto_ir.frontends.jax import lower
from pesto_ir.ir.graph import Graph

BF16 = jnp.bfloat16
PRECISIONS = ("bf16", "f32")
RECOMPUTE = ("none", "blocks", "attention")  # what the backward pass recomputes (`_loss`)
_COMPUTE = {"bf16": BF16, "f32": F32}

__all__ = ["BF16", "PRECISIONS", "RECOMPUTE", "GptConfig", "gpt_model", "gpt_step", "lower_gpt", "parameter_count",
           "describe"]


def _core_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(dh) + causal mask) v over (batch, seq, heads, dh) blocks, in their
    dtype (the mask too, so that bf16 scores stay bf16): the part of a layer that holds the
    seq x seq scores."""
    s, dh = q.shape[1], q.shape[-1]
    causal = lax.broadcasted_iota(I32, (s, s), 0) >= lax.broadcasted_iota(I32, (s, s), 1)
    bias = jnp.where(causal, 0.0, -1e9).astype(q.dtype)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q * jnp.asarray(1 / math.sqrt(dh), q.dtype), k) + bias
    return jnp.einsum("bhqk,bkhd->bqhd", _softmax(scores), v)


def _attention(p: dict[str, Any], x: jax.Array, heads: int, core: Callable[..., jax.Array]) -> jax.Array:
    """Causal multi-head self-attention in `x`'s dtype (the zoo's), its core `core`."""
    b, s, d = x.shape
    q, k, v = (t.reshape(b, s, heads, d // heads) for t in jnp.split(_dense(p["qkv"], x), 3, axis=-1))
    return _dense(p["proj"], core(q, k, v).reshape(b, s, d))


def _block(p: dict[str, Any], x: jax.Array, heads: int, core: Callable[..., jax.Array] = _core_attention) -> jax.Array:
    x = x + _attention(p, _layer_norm(p["ln1"], x), heads, core)
    hidden = jax.nn.gelu(_dense(p["fc"], _layer_norm(p["ln2"], x)), approximate=False)
    return x + _dense(p["out"], hidden)


def _loss(params: Tree, tokens: jax.Array, targets: jax.Array, heads: int, compute: Any,
          remat: str = "none") -> jax.Array:
    """Mean cross-entropy of next tokens; the output layer is `head` where the parameters have one,
    else the token embedding (tied). `remat` (`RECOMPUTE`) says what the backward pass recomputes
    from what the forward pass kept: nothing, each block from its input (`blocks`), or each
    attention core from its q, k and v (`attention`: the scores are never held, as Megatron's
    selective recomputation and fused flash attention keep them)."""
    if remat not in RECOMPUTE:
        raise ValueError(f"unknown recomputation {remat!r} (one of: {', '.join(RECOMPUTE)})")
    if compute != F32:  # the master weights, cast for the forward and backward passes
        params = jax.tree_util.tree_map(lambda w: w.astype(compute), params)
    core = jax.checkpoint(_core_attention) if remat == "attention" else _core_attention
    block_fn = jax.checkpoint(_block, static_argnums=(2, 3)) if remat == "blocks" else _block
    x = params["wte"][tokens] + params["wpe"]
    for block in params["blocks"]:
        x = block_fn(block, x, heads, core)
    logits = _layer_norm(params["ln_f"], x) @ params["head"] if "head" in params else \
        _layer_norm(params["ln_f"], x) @ params["wte"].T  # tied embeddings
    return _cross_entropy(logits.astype(F32), targets)


def gpt_model(c: GptConfig, precision: str = "bf16", tied: bool = True, remat: str = "none") -> Model:
    """The decoder at `c`: f32 parameters (master weights), the loss computing in `precision`; the
    output layer the token embedding (`tied`, GPT-2's and Alpa's) or a d x V matrix of its own
    (Megatron's `--untie-embeddings-and-output-weights`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (precisions: {', '.join(PRECISIONS)})")
    if c.d_model % c.heads:
        raise ValueError(f"d_model {c.d_model} is not a multiple of heads {c.heads}")
    compute = _COMPUTE[precision]
    params = {"wte": jax.ShapeDtypeStruct((c.vocab, c.d_model), F32),
              "wpe": jax.ShapeDtypeStruct((c.seq, c.d_model), F32),
              "blocks": [_gpt_block_spec(c.d_model) for _ in range(c.layers)],
              "ln_f": {"gamma": jax.ShapeDtypeStruct((c.d_model,), F32),
                       "beta": jax.ShapeDtypeStruct((c.d_model,), F32)}}
    if not tied:
        params["head"] = jax.ShapeDtypeStruct((c.d_model, c.vocab), F32)
    tokens = jax.ShapeDtypeStruct((c.batch, c.seq), I32)

    def loss(params: Tree, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        return _loss(params, tokens, targets, c.heads, compute, remat)

    return Model(loss, params, (tokens, tokens))


def gpt_step(c: GptConfig, precision: str = "bf16", name: str = "gpt_llm",
             tied: bool = True, remat: str = "none") -> tuple[Any, tuple[Any, ...]]:
    """The training step (f32 Adam on the master weights) and its abstract arguments."""
    model = gpt_model(c, precision, tied, remat)
    state = tuple(model.params for _ in range(ADAM.slots))
    return _train_step(name, model.loss, ADAM), (model.params, state, *model.batch)


def lower_gpt(c: GptConfig, precision: str = "bf16", name: str = "gpt_llm", tied: bool = True,
              remat: str = "none") -> Graph:
    """The verified graph of one training step at `c`: inputs are the f32 parameters and Adam's
    moments (`param`), then tokens and targets (the batch); outputs the new parameters, the new
    moments and the loss. The parameters and moments are donated, as a training loop donates its
    state to the step that replaces it (`jax.jit(..., donate_argnums=...)`)."""
    step, args = gpt_step(c, precision, name, tied, remat)
    return lower(step, *args, param_argnums=(0, 1), donate_argnums=(0, 1))


def parameter_count(c: GptConfig, tied: bool = True) -> int:
    """The parameters of the decoder at `c` (positions included; tied embeddings counted once, else
    the output layer's V d too): V d + s d + L (12 d^2 + 13 d) + 2 d (+ V d)."""
    d = c.d_model
    per_block = (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 4 * d
    return c.vocab * d * (1 if tied else 2) + c.seq * d + c.layers * per_block + 2 * d


def describe(c: GptConfig, precision: str = "bf16", tied: bool = True, remat: str = "none") -> str:
    mixed = "bf16 compute, f32 master weights and Adam" if precision == "bf16" else "f32"
    return (f"GPT decoder, {c.layers} layers, d={c.d_model}, {c.heads} heads, seq {c.seq}, vocab {c.vocab}, "
            f"{'tied' if tied else 'untied'} embeddings, batch {c.batch}; {mixed}"
            + {"none": "", "blocks": "; every block rematerialized",
               "attention": "; attention cores recomputed (flash attention's memory)"}[remat])
