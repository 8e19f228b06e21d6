"""What the training examples share: CPU devices asked for before JAX is imported, the optax training
step, and the same step run twice from the same start (planned by Pesto, and under `jax.jit`) with
both losses printed as they fall.

The examples import it as a sibling module (Python puts the script's folder on `sys.path`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any


def ask_for_cpu_devices(n: int) -> None:
    """Ask XLA for `n` CPU devices; JAX reads XLA_FLAGS when it is imported, so this comes
    before the first import of JAX. Exits with status 2 where JAX still sees fewer."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    import jax

    if len(jax.devices()) < n:
        print(f"JAX sees {len(jax.devices())} device(s), fewer than --devices {n} "
              "(was JAX imported, or XLA_FLAGS set, before this script ran?)", file=sys.stderr)
        raise SystemExit(2)


def make_train_step(loss_fn: Callable[..., Any], optimizer: Any) -> Callable[..., Any]:
    """One optimizer step on `loss_fn(params, x, y)`: (params, opt_state, x, y) -> (params, opt_state, loss)."""
    import jax
    import optax

    def train_step(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def side_by_side(pesto_step: Any, jit_step: Any, params: Any, opt_state: Any, batch: Callable[[], tuple[Any, Any]],
                 steps: int, log_every: int, plan_line: Callable[[], str]) -> tuple[float, float, float, Any]:
    """`steps` steps of `pesto_step` and of `jit_step` from the same parameters and optimizer state on
    the same batches; prints the plan after the first step (`plan_line`) and both losses every
    `log_every` steps. (first and last Pesto loss, largest relative difference, Pesto's parameters)."""
    p_pesto, s_pesto, p_jit, s_jit = params, opt_state, params, opt_state
    print(f"{'step':>5}  {'pesto loss':>11}  {'jit loss':>11}")
    first = last = 0.0
    worst = 0.0
    for step in range(1, steps + 1):
        x, y = batch()
        p_pesto, s_pesto, loss_pesto = pesto_step(p_pesto, s_pesto, x, y)
        p_jit, s_jit, loss_jit = jit_step(p_jit, s_jit, x, y)
        a, b = float(loss_pesto), float(loss_jit)
        worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
        first = first if step > 1 else a
        last = a
        if step == 1:
            print(f"       plan: {plan_line()}")
        if step == 1 or step % log_every == 0 or step == steps:
            print(f"{step:>5}  {a:>11.5f}  {b:>11.5f}")
    return first, last, worst, p_pesto
