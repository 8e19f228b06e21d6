"""Train an MLP on 4 CPU devices with `pesto_ir.parallelize`, next to `jax.jit`.

The data set is synthetic and seeded: 4096 points in 32 dimensions labelled by a random "teacher"
network into 10 classes. The model is a 32-128-128-10 ReLU MLP trained with Adam on mini-batches
of 128. The same training step runs twice from the same initial parameters on the same batches:
once planned by Pesto (m-ETF by default) and split over four CPU devices, once under `jax.jit` on
one device. Both losses are printed as they fall; they agree to float32 rounding.

    python3 examples/train_mlp.py [--steps 300] [--algo m-etf] [--devices 4]

JAX reads XLA_FLAGS when it is imported, so the script asks for CPU devices before importing it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from train_common import ask_for_cpu_devices, make_train_step, side_by_side


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--algo", default="m-etf", help="placement algorithm (m-etf, m-topo, expert, random, ...)")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--log-every", type=int, default=25)
    opts = ap.parse_args(argv)
    ask_for_cpu_devices(opts.devices)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import pesto_ir

    # ---- a seeded synthetic data set: labels from a random teacher network
    rng = np.random.default_rng(0)
    n, dim, classes = 4096, 32, 10
    x_all = rng.standard_normal((n, dim)).astype(np.float32)
    teacher = rng.standard_normal((dim, 64)).astype(np.float32), rng.standard_normal((64, classes)).astype(np.float32)
    y_all = np.argmax(np.tanh(x_all @ teacher[0]) @ teacher[1], axis=1).astype(np.int32)

    # ---- the model and its training step
    def init(key: Any) -> list[dict[str, jax.Array]]:
        sizes = [dim, 128, 128, classes]
        keys = jax.random.split(key, len(sizes) - 1)
        return [{"w": jax.random.normal(k, (a, b)) * (2.0 / a) ** 0.5, "b": jnp.zeros(b)}
                for k, a, b in zip(keys, sizes, sizes[1:])]

    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        for layer in params[:-1]:
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
        logits = x @ params[-1]["w"] + params[-1]["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    optimizer = optax.adam(3e-3)
    train_step = make_train_step(loss_fn, optimizer)
    devices = jax.devices()[:opts.devices]
    # autotune=False: this example shows the plan running split over the devices; by default parallelize
    # would time it against plain jax.jit and, on CPU devices that share the machine's cores, run jax.jit
    pesto_step = pesto_ir.parallelize(train_step, devices=devices, algo=opts.algo, param_argnums=(0, 1),
                                      autotune=False)
    batches = np.random.default_rng(1)

    def batch() -> tuple[jax.Array, jax.Array]:
        idx = batches.integers(0, n, 128)
        return jnp.asarray(x_all[idx]), jnp.asarray(y_all[idx])

    def plan_line() -> str:
        plan, exe = pesto_step.plan, pesto_step.executable
        return (f"{plan.algorithm} on {', '.join(plan.devices)}, simulated makespan {plan.makespan * 1e6:.0f} us; "
                f"{exe.num_segments} segments, {len(exe.transfers)} transfers per step; "
                f"{len(pesto_step.graph.ops)} ops")

    params = init(jax.random.PRNGKey(0))
    first, last, worst, p_pesto = side_by_side(pesto_step, jax.jit(train_step), params, optimizer.init(params), batch,
                                               opts.steps, opts.log_every, plan_line)

    devices_of_params = sorted({d.id for leaf in jax.tree_util.tree_leaves(p_pesto) for d in leaf.devices()})
    gathered = jax.device_put(p_pesto, devices[0])  # the parameters live on several devices; evaluate on one
    accuracy = float((jnp.argmax(_forward(gathered, jnp.asarray(x_all)), 1) == jnp.asarray(y_all)).mean())
    print(f"\nloss {first:.4f} -> {last:.4f}; largest relative difference pesto vs jit {worst:.1e}; "
          f"train accuracy {accuracy:.3f}; parameters live on CPU devices {devices_of_params}")
    return 0 if last < first and worst < 1e-3 else 1


def _forward(params: Any, x: Any) -> Any:
    import jax

    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


if __name__ == "__main__":
    sys.exit(main())
