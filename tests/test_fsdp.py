"""Fully sharded parameters (FSDP, ZeRO-3) run for real on 8 CPU devices: each data-parallel replica
holds 1/d of every parameter and of its optimizer state, gathers a parameter whole before the ops
that read it, reduce-scatters its gradient; the new parameters and state equal `jax.jit`'s, and each
device holds 1/d of a parameter between steps."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pesto_ir
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.jax import lower
from pesto_ir.passes.rewrite.replicas import Strategy, replica_graph
from pesto_ir.util.errors import PestoError

optax = pytest.importorskip("optax")
# Adam divides each gradient by its own scale: a gradient near zero summed in another order (the
# replicas' reduce-scatter against jit's one sum) moves its update by up to lr x its rounding
RTOL, ATOL = 2e-5, 2e-5


def _adam(loss: Any) -> Any:
    opt = optax.adam(1e-2)

    def step(params: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
        grads = jax.grad(loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step, opt


def mlp() -> tuple[Any, Any, Any, Any, Any]:
    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    step, opt = _adam(loss)
    k = jax.random.split(jax.random.key(0), 3)
    params = {"w1": 0.3 * jax.random.normal(k[0], (16, 32)), "b1": jnp.zeros(32),
              "w2": 0.3 * jax.random.normal(k[1], (32, 8))}
    x = jax.random.normal(k[2], (16, 16))
    return step, params, opt.init(params), x, jnp.sin(x[:, :8])


def gpt() -> tuple[Any, Any, Any, Any, Any]:
    zoo_jax = pytest.importorskip("bench.zoo_jax")
    model = zoo_jax._gpt(zoo_jax.GptConfig(layers=2, d_model=32, heads=4, seq=8, batch=16, vocab=64))
    leaves, treedef = jax.tree_util.tree_flatten(model.params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = treedef.unflatten([0.1 * jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves)])
    step, opt = _adam(model.loss)
    tokens = jax.random.randint(jax.random.key(2), (16, 8), 0, 64)
    return step, params, opt.init(params), tokens, jnp.roll(tokens, 1, axis=1)


def _two_steps_like_jit(run: Any, step: Any, params: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
    """Two steps of `run`, each from the same state as jax.jit's and giving its new parameters and
    state; the last new parameters."""
    got_p, got_s = params, state
    want_p, want_s = params, state
    for _ in range(2):
        got_p, got_s = run(got_p, got_s, x, y)
        want_p, want_s = jax.jit(step)(want_p, want_s, x, y)
        for a, b in zip(jax.tree_util.tree_leaves((got_p, got_s)), jax.tree_util.tree_leaves((want_p, want_s))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
    return got_p


@pytest.mark.parametrize("name, d", [("mlp", 4), ("mlp", 8), pytest.param("gpt", 4, marks=pytest.mark.slow),
                                     pytest.param("gpt", 8, marks=pytest.mark.slow)])
def test_fully_sharded_steps_give_jit_s_step(name: str, d: int) -> None:
    step, params, state, x, y = {"mlp": mlp, "gpt": gpt}[name]()
    run = pesto_ir.parallelize(step, devices=jax.devices()[:d], param_argnums=(0, 1), data_parallel=d,
                               parameters="sharded", autotune=False)
    got_p = _two_steps_like_jit(run, step, params, state, x, y)
    par = run.plan.parallelism
    assert par.parameters == "sharded" and par.optimizer_state == "sharded"
    assert run.plan.to_json()["parallelism"]["parameters"] == "sharded"
    sharded = dict(run.graph.attrs["sharded_parameters"].value)
    assert sharded, "no parameter was sharded"
    for leaf in jax.tree_util.tree_leaves(got_p):
        if leaf.ndim and leaf.shape[0] % d == 0 and leaf.size >= d:
            assert all(s.data.size * d == leaf.size for s in leaf.addressable_shards)


def test_parameters_are_gathered_before_each_reader_and_not_kept() -> None:
    """Each parameter input is a block; the forward and the backward pass each gather it whole; the
    new parameter goes out as a block (no all-gather after the update)."""
    step, params, state, x, y = mlp()
    graph = lower(step, params, state, x, y, param_argnums=(0, 1))
    rank = replica_graph(graph, Cluster.homogeneous(4, "cpu"), Strategy(4, 1).fully_sharded())
    inputs = {v.name: v for v in rank.inputs}
    assert inputs["p.w2"].type.shape == (8, 8) if "p.w2" in inputs else True
    gathers = [op for op in rank.ops if op.opcode == "all_gather"]
    read = {op.operands[0].name for op in gathers}
    assert {v.name for v in rank.inputs if v.name in dict(rank.attrs["sharded_parameters"].value)} == read
    w2 = next(v for v in rank.inputs if v.name.endswith("w2") and v.name in read)
    assert sum(1 for op in gathers if op.operands[0] is w2) == 2  # the forward matmul, the input gradient
    outputs = {id(v) for v in rank.outputs}
    assert not any(id(op.result) in outputs for op in gathers)


def test_fsdp_options_are_checked() -> None:
    step, params, state, x, y = mlp()
    with pytest.raises(PestoError, match="parameters"):
        pesto_ir.parallelize(step, devices=jax.devices()[:2], param_argnums=(0, 1), parameters="fsdp")(
            params, state, x, y)
    with pytest.raises(PestoError, match="nothing to split them across"):
        pesto_ir.parallelize(step, devices=jax.devices()[:2], param_argnums=(0, 1), data_parallel=1,
                             parameters="sharded")(params, state, x, y)


@pytest.mark.parametrize("name, shard", [("mlp", "optimizer_state"), ("mlp", "parameters"),
                                         pytest.param("gpt", "parameters", marks=pytest.mark.slow)])
def test_tensor_parallel_ranks_shard_their_blocks_across_replicas(name: str, shard: str) -> None:
    """t = 2 x d = 2 with the state sharded (Megatron's distributed optimizer: ZeRO-1 inside each
    rank) or the parameters too (FSDP): each rank's block of a split parameter's state is split
    again across the replicas, so each device's graph reads 1/(t d) of it. jit's step, twice."""
    step, params, state, x, y = {"mlp": mlp, "gpt": gpt}[name]()
    run = pesto_ir.parallelize(step, devices=jax.devices()[:4], param_argnums=(0, 1), data_parallel=2,
                               tensor_parallel=2, autotune=False, **{shard: "sharded"})
    _two_steps_like_jit(run, step, params, state, x, y)
    par = run.plan.parallelism
    assert (par.data_parallel, par.tensor_parallel, par.optimizer_state) == (2, 2, "sharded")
    assert par.parameters == ("sharded" if shard == "parameters" else "replicated")
    whole = {v.name: v.type.size for v in lower(step, params, state, x, y, param_argnums=(0, 1)).inputs}
    split = dict(run.graph.attrs["tensor_inputs"].value)
    both = [v for v in run.graph.inputs if v.name in split and v.name in dict(run.graph.attrs["sharded_inputs"].value)]
    assert both, "no block of state is split across both ranks and replicas"
    assert all(v.type.size * 4 == whole[v.name] for v in both)
