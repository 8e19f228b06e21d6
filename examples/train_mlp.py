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
import os
import sys
from typing import Any


def _ask_for_cpu_devices(n: int) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--algo", default="m-etf", help="placement algorithm (m-etf, m-topo, expert, random, ...)")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--log-every", type=int, default=25)
    opts = ap.parse_args(argv)
    _ask_for_cpu_devices(opts.devices)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import pesto_ir

    if len(jax.devices()) < opts.devices:
        print(f"JAX sees {len(jax.devices())} device(s), fewer than --devices {opts.devices} "
              "(was JAX imported, or XLA_FLAGS set, before this script ran?)", file=sys.stderr)
        return 2

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

    def train_step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    devices = jax.devices()[:opts.devices]
    pesto_step = pesto_ir.parallelize(train_step, devices=devices, algo=opts.algo, param_argnums=(0, 1))
    jit_step = jax.jit(train_step)

    params = init(jax.random.PRNGKey(0))
    state = optimizer.init(params)
    p_pesto, s_pesto, p_jit, s_jit = params, state, params, state
    batches = np.random.default_rng(1)
    print(f"{'step':>5}  {'pesto loss':>11}  {'jit loss':>11}")
    first = last = None
    worst = 0.0
    for step in range(1, opts.steps + 1):
        idx = batches.integers(0, n, 128)
        x, y = jnp.asarray(x_all[idx]), jnp.asarray(y_all[idx])
        p_pesto, s_pesto, loss_pesto = pesto_step(p_pesto, s_pesto, x, y)
        p_jit, s_jit, loss_jit = jit_step(p_jit, s_jit, x, y)
        a, b = float(loss_pesto), float(loss_jit)
        worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
        first = first if first is not None else a
        last = a
        if step == 1:
            exe = pesto_step.executable
            plan = pesto_step.plan
            print(f"       plan: {plan.algorithm} on {', '.join(plan.devices)}, simulated makespan "
                  f"{plan.makespan * 1e6:.0f} us; {exe.num_segments} segments, {len(exe.transfers)} transfers "
                  f"per step; {len(pesto_step.graph.ops)} ops")
        if step == 1 or step % opts.log_every == 0 or step == opts.steps:
            print(f"{step:>5}  {a:>11.5f}  {b:>11.5f}")

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
