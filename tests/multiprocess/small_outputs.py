"""Outputs across processes (for tests/test_multiprocess.py), run by the launcher in two processes of
four CPU devices each: a step in `expert` stages over all eight devices (data-parallel 1), then one
replica per process (data-parallel 2), each for two steps next to `jax.jit` on one device of this
process. In every process, without `pesto_ir.distributed.fetch`:

* the small outputs (a loss, a metric of the first stage, per-example losses, a learning rate fed
  back as the next step's input) read as `float`/`np.asarray` and agree with jax.jit's, and JAX's
  own `multihost_utils.process_allgather(loss, tiled=True)` reads the loss;
* the parameters stay where the plan put them (resident arrays, data-parallel 1), and a large
  output stays on its device: `fetch` gives it to every process.

Also checks that parallelize's default does not autotune across processes (it cannot time them
from one), and that `autotune=True` is refused there with the reason. Each process prints
"process P: data-parallel D: outputs ok" and, at data-parallel 1, the processes whose devices made
the small outputs.
"""

from __future__ import annotations

import sys

import pesto_ir.distributed

pesto_ir.distributed.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import pesto_ir  # noqa: E402
from pesto_ir.jaxrt.cross_process import resident_device  # noqa: E402

WIDTH, BATCH, LAYERS = 128, 256, 8  # the last activation is 128 KiB: above EVERYWHERE_BYTES


def step(ws: list[jax.Array], x: jax.Array, lr: jax.Array) -> tuple[list[jax.Array], jax.Array, jax.Array,
                                                                   jax.Array, jax.Array, jax.Array]:
    def forward(ws: list[jax.Array]) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
        h = jnp.tanh(x @ ws[0])
        first = jnp.mean(h)  # made by the first stage
        for w in ws[1:]:
            h = jnp.tanh(h @ w)
        per_example = jnp.mean(h ** 2, axis=1)
        return jnp.mean(per_example), (first, per_example, h)

    (loss, (first, per_example, h)), grads = jax.value_and_grad(forward, has_aux=True)(ws)
    new = [w - lr * g for w, g in zip(ws, grads)]
    return new, loss, first, per_example, h, lr * 0.5


def main() -> int:
    me = jax.process_index()
    rng = np.random.default_rng(0)
    ws0 = [jnp.asarray(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * WIDTH ** -0.5)
           for _ in range(LAYERS)]
    x = jnp.asarray(rng.standard_normal((BATCH, WIDTH)).astype(np.float32))
    local = jax.local_devices()[0]
    reference = jax.jit(step)
    try:
        pesto_ir.parallelize(step, devices=jax.devices(), algo="expert", param_argnums=0, autotune=True)(
            ws0, x, jnp.float32(0.1))
        raise SystemExit("autotune=True across processes was not refused")
    except pesto_ir.PestoError as e:
        assert "one process's devices" in str(e), e
    for d in (1, 2):
        run = pesto_ir.parallelize(step, devices=jax.devices(), algo="expert", param_argnums=0, quiet=True,
                                   data_parallel=d, microbatches=1)
        ws, lr = ws0, jnp.float32(0.1)
        ref_ws, ref_lr = jax.device_put((ws0, lr), local)
        ref_x = jax.device_put(x, local)
        for _ in range(2):
            ws, loss, first, per_example, h, lr = run(ws, x, lr)
            ref_ws, ref_loss, ref_first, ref_per, ref_h, ref_lr = reference(ref_ws, ref_x, ref_lr)
            # read here as they are, in every process
            np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
            np.testing.assert_allclose(float(first), float(ref_first), rtol=1e-5)
            np.testing.assert_allclose(np.asarray(per_example), np.asarray(ref_per), rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(float(lr), float(ref_lr), rtol=1e-6)
            # a global array, as a jax.jit result across processes is: JAX gathers those with tiled=True
            np.testing.assert_allclose(multihost_utils.process_allgather(loss, tiled=True), float(ref_loss),
                                       rtol=1e-5)
            # the large output: where it was made, every process gets it with fetch (a collective)
            np.testing.assert_allclose(pesto_ir.distributed.fetch(h), np.asarray(ref_h), rtol=1e-4, atol=1e-6)
        got = pesto_ir.distributed.fetch(ws)
        for a, b in zip(got, ref_ws):
            np.testing.assert_allclose(a, np.asarray(b), rtol=1e-4, atol=1e-6)
        assert "not autotuned (devices of several processes" in run.report(), run.report()
        if d == 1:
            assert all(resident_device(w) is not None for w in ws), "the parameters left their devices"
            assert resident_device(h) is not None, "the large output was copied"
            exe = run.executable
            makers = sorted({exe.devices[dev].process_index for k, (_, dev) in enumerate(exe.schedule.outputs)
                             if k in exe.everywhere})
            print(f"process {me}: small outputs made on processes {makers}", flush=True)
        print(f"process {me}: data-parallel {d}: outputs ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
