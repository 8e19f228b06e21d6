"""Hybrid plans run for real: data-parallel replicas as `jax.shard_map` over meshes of mirrored
devices, micro-batches, and both at once, on 8 CPU devices, against `jax.jit` on the whole batch."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pesto_ir
from pesto_ir.backends.jax import build
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.jax import lower
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import read_plan_attrs

BATCH = 16
RTOL, ATOL = 2e-5, 2e-6


def _sgd(loss: Any) -> Any:
    def step(params: Any, x: jax.Array, y: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), value

    return step


def _normal(key: jax.Array, tree: Any) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten([0.3 * jax.random.normal(k, s.shape, s.dtype) if jnp.issubdtype(s.dtype, jnp.floating)
                              else jnp.zeros(s.shape, s.dtype) for k, s in zip(keys, leaves)])


def mlp() -> tuple[Any, Any, Any, Any]:
    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    k = jax.random.split(jax.random.key(0), 3)
    params = {"w1": 0.3 * jax.random.normal(k[0], (12, 24)), "b1": jnp.zeros(24),
              "w2": 0.3 * jax.random.normal(k[1], (24, 3))}
    x = jax.random.normal(k[2], (BATCH, 12))
    return _sgd(loss), params, x, jnp.sin(x[:, :3])


def gpt() -> tuple[Any, Any, Any, Any]:
    """Two GPT blocks (attention, layer norm, GELU MLP) with tied embeddings: the zoo's layers."""
    zoo_jax = pytest.importorskip("bench.zoo_jax")
    model = zoo_jax._gpt(zoo_jax.GptConfig(layers=2, d_model=16, heads=2, seq=4, batch=BATCH, vocab=32))
    params = _normal(jax.random.key(1), model.params)
    tokens = jax.random.randint(jax.random.key(2), (BATCH, 4), 0, 32)
    return _sgd(model.loss), params, tokens, jnp.roll(tokens, 1, axis=1)


def cnn() -> tuple[Any, Any, Any, Any]:
    """Two convolutions (no batch norm), average pooling, a dense head."""
    def conv(x: jax.Array, w: jax.Array) -> jax.Array:
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h = jax.nn.relu(conv(x, p["c1"]))
        h = jax.nn.relu(conv(h, p["c2"]))
        logits = h.mean(axis=(1, 2)) @ p["head"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 5), axis=-1))

    k = jax.random.split(jax.random.key(3), 4)
    params = {"c1": 0.3 * jax.random.normal(k[0], (3, 3, 2, 4)), "c2": 0.3 * jax.random.normal(k[1], (3, 3, 4, 4)),
              "head": 0.3 * jax.random.normal(k[2], (4, 5))}
    return _sgd(loss), params, jax.random.normal(k[3], (BATCH, 6, 6, 2)), jnp.arange(BATCH) % 5


def tagger() -> tuple[Any, Any, Any, Any]:
    """Per-token logits [B, T, V] and optax's integer-label cross-entropy: it gathers each token's
    label logit by per-sample index, then takes `[..., 0]` of that as a gather whose window takes
    the batch whole; the gradient scatter-adds both back."""
    optax = pytest.importorskip("optax")

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        logits = jnp.tanh(x @ p["w1"]) @ p["w2"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    k = jax.random.split(jax.random.key(4), 4)
    params = {"w1": 0.3 * jax.random.normal(k[0], (6, 8)), "w2": 0.3 * jax.random.normal(k[1], (8, 5))}
    return _sgd(loss), params, jax.random.normal(k[2], (BATCH, 4, 6)), jax.random.randint(k[3], (BATCH, 4), 0, 5)


def pick() -> tuple[Any, Any, Any, Any]:
    """Features picked off the last axis of per-sample values: `h[..., 0]` (a slice) and
    `jnp.take(h, 1, axis=-1)` (a gather whose window takes the batch whole)."""
    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ p["w"])
        return jnp.mean((h[..., 0] - y) ** 2) + jnp.mean((jnp.take(h, 1, axis=-1) + y) ** 2)

    k = jax.random.split(jax.random.key(5), 3)
    x = jax.random.normal(k[1], (BATCH, 4, 6))
    return _sgd(loss), {"w": 0.3 * jax.random.normal(k[0], (6, 3))}, x, jnp.sin(x[..., 0])


MODELS = {"mlp": mlp, "gpt": gpt, "cnn": cnn, "tagger": tagger, "pick": pick}


def check_steps(run: Any, step: Any, params: Any, x: jax.Array, y: jax.Array, d: int) -> None:
    """Two steps, each from the same state as jax.jit's; new parameters replicated over d devices."""
    want_params = got_params = params
    for _ in range(2):
        got_params, got_loss = run(got_params, x, y)
        want_params, want_loss = jax.jit(step)(want_params, x, y)
        np.testing.assert_allclose(np.asarray(got_loss), np.asarray(want_loss), rtol=RTOL, atol=ATOL)
        for a, b in zip(jax.tree_util.tree_leaves(got_params), jax.tree_util.tree_leaves(want_params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
            assert len(a.sharding.device_set) == d
        got_params = jax.tree_util.tree_map(jnp.asarray, got_params)


@pytest.mark.parametrize("d, m", [(1, 2), (2, 1), (2, 2), (4, 1), (4, 4), (2, 4), (1, 4), (4, 2)])
def test_mlp_replicas_and_micro_batches_give_jit_s_step(d: int, m: int) -> None:
    step, params, x, y = mlp()
    run = pesto_ir.parallelize(step, devices=jax.devices()[:d], param_argnums=0, data_parallel=d, microbatches=m,
                               autotune=False)
    check_steps(run, step, params, x, y, d)
    par = run.plan.parallelism
    assert par is not None and (par.data_parallel, par.microbatches) == (d, m)


# Every d in {1, 2, 4} and every m in {1, 2, 4} for each model; the GPT's XLA compile takes seconds
# a step, so it runs one combination of each value rather than all nine (and only in the slow runs).
@pytest.mark.parametrize("name, d, m", [
    *(pytest.param("gpt", d, m, marks=pytest.mark.slow) for d, m in [(2, 1), (4, 2), (2, 4), (1, 2)]),
    *(("cnn", d, m) for d, m in [(2, 1), (4, 2), (2, 4), (1, 2), (1, 4), (2, 2), (4, 1), (4, 4)])])
def test_models_replicas_and_micro_batches_give_jit_s_step(name: str, d: int, m: int) -> None:
    step, params, x, y = MODELS[name]()
    run = pesto_ir.parallelize(step, devices=jax.devices()[:d], param_argnums=0, data_parallel=d, microbatches=m,
                               autotune=False)
    check_steps(run, step, params, x, y, d)


@pytest.mark.parametrize("name", ["tagger", "pick"])
@pytest.mark.parametrize("d, m", [(2, 1), (2, 2), (1, 4)])
def test_windows_that_take_the_batch_whole_give_jit_s_step(name: str, d: int, m: int) -> None:
    """Gathers and scatter-adds whose window takes the batch axis whole split with it."""
    step, params, x, y = MODELS[name]()
    run = pesto_ir.parallelize(step, devices=jax.devices()[:d], param_argnums=0, data_parallel=d, microbatches=m,
                               autotune=False)
    check_steps(run, step, params, x, y, d)


@pytest.mark.parametrize("name", ["mlp", pytest.param("gpt", marks=pytest.mark.slow), "cnn"])
def test_two_replicas_of_two_stage_pipelines(name: str) -> None:
    """The mix: 2 replicas, each a pipeline over 2 devices with 2 micro-batches. The plan puts each
    replica's ops on both its devices; each segment runs over the mesh of its device and its mirror,
    and values cross between the two meshes shard by shard."""
    step, params, x, y = MODELS[name]()
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(4, "cpu")
    placed = PassManager("annotate-costs{model=roofline},place{algo=m-topo data-parallel=2 microbatches=2},expand",
                         verify_each=False).run(graph, PassContext(cluster=cluster, quiet=True))
    plan = read_plan_attrs(placed)
    assert plan is not None and plan.parallelism is not None
    assert {slot.device for slot in plan.ops.values()} == {"cpu0", "cpu1"}  # replica 0's two devices
    executable = build(placed, jax.devices()[:4])
    assert "mesh(" in executable.describe()
    leaves = jax.tree_util.tree_leaves((params, x, y))
    got = executable(*leaves)
    want = jax.tree_util.tree_leaves(jax.jit(step)(params, x, y))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
    groups = {frozenset(jax.devices()[:4][i] for i in (0, 2)), frozenset(jax.devices()[:4][i] for i in (1, 3))}
    assert all(frozenset(a.sharding.device_set) in groups for a in got)


def test_per_sample_outputs_come_back_whole() -> None:
    """An output with a batch axis (per-sample predictions) is every replica's rows, in order."""
    def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        value, grad = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * grad, value, jnp.tanh(x @ w).T  # the rows along axis 1

    w = jnp.ones((5, 3)) * 0.1
    x = jnp.arange(BATCH * 5, dtype=jnp.float32).reshape(BATCH, 5) / 50
    run = pesto_ir.parallelize(step, devices=jax.devices()[:4], param_argnums=0, data_parallel=4, microbatches=2,
                               autotune=False)
    for a, b in zip(run(w, x), jax.jit(step)(w, x)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)


def test_a_batch_that_does_not_split_over_the_replicas_is_refused() -> None:
    step, params, x, y = mlp()
    with pytest.raises(pesto_ir.PestoError) as info:
        pesto_ir.parallelize(step, devices=jax.devices()[:3], param_argnums=0, data_parallel=3)(params, x, y)
    assert "does not split into 3" in info.value.format()


@pytest.mark.slow
def test_an_interleaved_pipeline_runs_like_jit() -> None:
    """Chunks of the GPT's layers dealt round 2 devices (`passes/placement/pipeline/interleaved.py`: each device
    holds layers far apart in the step, values go back and forth), 4 micro-batches, the eager
    schedule justified: the executable gives jax.jit's step."""
    from pesto_ir.passes.placement.justify import justified
    from pesto_ir.passes.placement.pipeline.interleaved import interleaved_layouts
    from pesto_ir.passes.placement.pipeline.schedules import INTERLEAVED, _layout
    from pesto_ir.passes.placement.pipeline.stages import pipeline_units
    from pesto_ir.passes.rewrite.replicas import Strategy, as_hybrid, replica_graph
    from pesto_ir.schedule.plan import write_plan_attrs
    from pesto_ir.schedule.simulate import Prepared
    from pesto_ir.schedule.validate import check_plan

    step, params, x, y = gpt()
    cluster = Cluster.homogeneous(2, "cpu")
    graph = PassManager("annotate-costs{model=roofline}", verify_each=False).run(
        lower(step, params, x, y, param_argnums=(0,)), PassContext(cluster=cluster, quiet=True))
    replica = replica_graph(graph, cluster, Strategy(1, 4))
    units = pipeline_units(replica, cluster)
    label, stage = max(interleaved_layouts(units.weights(), 2, alike=True), key=lambda lay: int(lay[0].split()[0]))
    assert int(label.split()[0]) >= 4  # the devices take turns at least twice each
    layout = _layout(replica, cluster, units, label, stage, Prepared(replica, cluster))
    plan = check_plan(replica, cluster, justified(replica, cluster, layout.placement, layout.plan))
    plan = as_hybrid(replica, cluster, dataclasses.replace(plan, algorithm=INTERLEAVED), Strategy(1, 4))
    write_plan_attrs(replica, plan)
    got = build(replica, jax.devices()[:2])(*jax.tree_util.tree_leaves((params, x, y)))
    want = jax.tree_util.tree_leaves(jax.jit(step)(params, x, y))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
