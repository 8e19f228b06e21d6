"""Memory of lowered JAX steps: inputs resident, results alive until read, remat freeing early."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.jax import lower
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.memory import footprints, peak_memory

QUIET = PlaceOptions(quiet=True)


def _layer(w: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.tanh(jnp.tanh(x @ w) @ w.T @ w)


def _grad_step(remat: bool):  # type: ignore[no-untyped-def]
    layer = jax.checkpoint(_layer) if remat else _layer

    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        for w in ws:
            x = layer(w, x)
        return (x ** 2).sum()

    return jax.grad(loss)


def _single_device_peak(fn, *args) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """(peak, all-alive footprint, ops) of `fn` lowered, costed and run on one H100 in graph order."""
    graph = lower(fn, *args)
    cluster = Cluster.homogeneous(1, "h100")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    plan = ALGORITHMS["single"].run(graph, cluster, QUIET)
    return peak_memory(graph, plan)["gpu0"].nbytes, sum(footprints(graph).values()), len(graph.ops)


def test_inputs_are_resident_and_results_live_until_read() -> None:
    """y = tanh(x @ w), out = y.sum(): x and w (the arguments) the whole step; y until the sum
    has read it, the product until tanh has; the scalar output to the end."""
    x, w = jnp.zeros((64, 32)), jnp.zeros((32, 16))
    peak, _, _ = _single_device_peak(lambda x, w: jnp.tanh(x @ w).sum(), x, w)
    assert peak == 4 * (64 * 32 + 32 * 16) + 4 * 2 * (64 * 16)  # the product and tanh's result at once


def test_remat_frees_the_forward_activations() -> None:
    """With `jax.checkpoint` the backward pass recomputes each layer instead of reading the forward's
    intermediates, so they die early: more ops, a lower peak; the all-alive count would say the reverse."""
    ws, x = [jnp.zeros((256, 256))] * 6, jnp.zeros((512, 256))
    plain, plain_all, plain_ops = _single_device_peak(_grad_step(False), ws, x)
    remat, remat_all, remat_ops = _single_device_peak(_grad_step(True), ws, x)
    assert remat_ops > plain_ops and remat_all > plain_all
    assert remat < 0.6 * plain
