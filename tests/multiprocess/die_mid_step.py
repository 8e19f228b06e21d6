"""A two-process job whose process 1 dies in the middle of its second step (for
tests/test_multiprocess.py): process 0 must not wait for it for ever."""

from __future__ import annotations

import os
import sys

import pesto_ir.distributed

pesto_ir.distributed.initialize(heartbeat_timeout_seconds=5, transfer_timeout_seconds=10)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pesto_ir  # noqa: E402


def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    for _ in range(6):
        x = jnp.tanh(x @ w)
    return w - 0.01 * x.sum(), x.sum()


run = pesto_ir.parallelize(step, devices=jax.devices(), algo="expert", param_argnums=(0,), quiet=True)
w, x = np.eye(64, dtype=np.float32), np.ones((8, 64), np.float32)
for i in range(3):
    if i == 1 and jax.process_index() == 1:
        print("process 1: dying mid-step", flush=True)
        os._exit(9)
    w, loss = run(w, x)
    print(f"process {jax.process_index()}: step {i} loss {float(pesto_ir.distributed.fetch(loss)):.4f}", flush=True)
print("finished", flush=True)
sys.exit(0)
