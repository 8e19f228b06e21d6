"""Train a small GPT on 8 CPU devices as 2 data-parallel replicas x 4 micro-batches, next to `jax.jit`.

The task is synthetic and seeded: sequences of 16 tokens over a vocabulary of 32, where each token
is the previous one plus a fixed stride (mod 32) from a random start; the model learns to predict
the next token. It is a 2-layer GPT (d = 64, 4 heads, causal attention, GELU MLP, tied embeddings)
trained with optax's AdamW on batches of 32. The same step runs twice from the same parameters on
the same batches: once by `pesto_ir.parallelize(..., data_parallel=2, microbatches=4)` (each
replica a pipeline over 4 devices, each segment a `jax.shard_map` over the two devices that
mirror each other; gradients accumulated over the micro-batches and all-reduced across the
replicas), once under `jax.jit` on one device. Both losses are printed; they agree to float32
rounding (micro-batches sum the gradients in another order).

    python3 examples/train_gpt.py [--steps 200] [--devices 8] [--data-parallel 2] [--microbatches 4]
    python3 examples/train_gpt.py --data-parallel 2 --microbatches 2 --tensor-parallel 2

With `--tensor-parallel 2`, each device of a replica's pipeline is a group of 2 devices that run
every op on their blocks of the parameters the planner splits (Megatron's layout: the QKV and MLP
input projections by columns, the output projections by rows), their partial sums all-reduced.

JAX reads XLA_FLAGS when it is imported, so the script asks for CPU devices before importing it.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from train_common import ask_for_cpu_devices, make_train_step, side_by_side

VOCAB, SEQ, D, HEADS, LAYERS, BATCH = 32, 16, 64, 4, 2, 32


def init(key: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    def dense(k: Any, n_in: int, n_out: int) -> dict[str, Any]:
        return {"w": jax.random.normal(k, (n_in, n_out)) * n_in ** -0.5, "b": jnp.zeros(n_out)}

    def norm() -> dict[str, Any]:
        return {"g": jnp.ones(D), "b": jnp.zeros(D)}

    keys = iter(jax.random.split(key, 2 + 4 * LAYERS))
    blocks = [{"ln1": norm(), "qkv": dense(next(keys), D, 3 * D), "proj": dense(next(keys), D, D), "ln2": norm(),
               "fc": dense(next(keys), D, 4 * D), "out": dense(next(keys), 4 * D, D)} for _ in range(LAYERS)]
    return {"wte": jax.random.normal(next(keys), (VOCAB, D)) * 0.02,
            "wpe": jax.random.normal(next(keys), (SEQ, D)) * 0.02, "blocks": blocks, "ln_f": norm()}


def loss_fn(params: dict[str, Any], tokens: Any, targets: Any) -> Any:
    import jax
    import jax.numpy as jnp
    import optax

    def layer_norm(p: Any, x: Any) -> Any:
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * p["g"] + p["b"]

    def dense(p: Any, x: Any) -> Any:
        return x @ p["w"] + p["b"]

    b, s = tokens.shape
    x = params["wte"][tokens] + params["wpe"]
    causal = jnp.tril(jnp.ones((s, s), bool))
    for p in params["blocks"]:
        q, k, v = (t.reshape(b, s, HEADS, D // HEADS) for t in jnp.split(dense(p["qkv"], layer_norm(p["ln1"], x)),
                                                                         3, axis=-1))
        scores = jnp.where(causal, jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D // HEADS), -1e9)
        x = x + dense(p["proj"], jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(b, s, D))
        x = x + dense(p["out"], jax.nn.gelu(dense(p["fc"], layer_norm(p["ln2"], x))))
    logits = layer_norm(params["ln_f"], x) @ params["wte"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--data-parallel", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--tensor-parallel", type=int, default=1,
                    help="tensor-parallel groups of this many devices (e.g. 2 with --data-parallel 2 "
                         "--microbatches 2: 2 replicas x 2 pipeline devices x 2 ranks on 8 devices)")
    ap.add_argument("--log-every", type=int, default=20)
    opts = ap.parse_args(argv)
    ask_for_cpu_devices(opts.devices)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import pesto_ir

    optimizer = optax.adamw(3e-3)
    train_step = make_train_step(loss_fn, optimizer)
    devices = jax.devices()[:opts.devices]
    # autotune=False: the strategy asked for runs as asked (by default it would be timed against plain
    # jax.jit, which wins on CPU devices that share the machine's cores)
    pesto_step = pesto_ir.parallelize(train_step, devices=devices, param_argnums=(0, 1), algo="m-topo",
                                      data_parallel=opts.data_parallel, microbatches=opts.microbatches,
                                      tensor_parallel=opts.tensor_parallel, autotune=False)
    rng = np.random.default_rng(1)
    stride = 5

    def batch() -> tuple[jax.Array, jax.Array]:
        start = rng.integers(0, VOCAB, (BATCH, 1))
        seq = (start + stride * np.arange(SEQ + 1)) % VOCAB
        return jnp.asarray(seq[:, :-1], jnp.int32), jnp.asarray(seq[:, 1:], jnp.int32)

    def plan_line() -> str:
        plan = pesto_step.plan
        par = plan.parallelism
        stages = len({slot.device for slot in plan.ops.values()})
        ranks = f" of {par.tensor_parallel} tensor-parallel ranks ({len(par.layouts)} inputs split)" \
            if par.tensor_parallel > 1 else ""
        return (f"{par.data_parallel} replicas x {par.microbatches} micro-batches, each replica on {stages} "
                f"device(s){ranks}; simulated step {plan.makespan * 1e3:.2f} ms; "
                f"{pesto_step.executable.num_segments} segments per step; {len(pesto_step.graph.ops)} ops")

    params = init(jax.random.key(0))
    first, last, worst, p_pesto = side_by_side(pesto_step, jax.jit(train_step), params, optimizer.init(params),
                                               batch, opts.steps, opts.log_every, plan_line)
    replicated = {len(leaf.sharding.device_set) for leaf in jax.tree_util.tree_leaves(p_pesto)}
    print(f"\nloss {first:.4f} -> {last:.4f}; largest relative difference pesto vs jit {worst:.1e}; "
          f"each parameter lives on {sorted(replicated)} devices (its replicas and ranks)")
    return 0 if last < first and worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
