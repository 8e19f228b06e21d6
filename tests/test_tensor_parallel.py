"""Tensor parallelism run for real on 8 CPU devices: each rank of a group runs the step on its
blocks of the split parameters, partial sums all-reduced; new parameters and loss as `jax.jit`'s,
and each device holding 1/t of a split parameter. The layout search and the rewrite's invariants on
random layered graphs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_replicas import _sgd

import pesto_ir
from pesto_ir.backends.jax import build
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.jax import lower
from pesto_ir.ir.types import TensorType
from pesto_ir.passes.placement.heuristics.simple import place_single
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.rewrite.replicas import (
    Strategy,
    as_hybrid,
    collective_cost,
    mirror_groups,
    placed_devices,
    replica_graph,
    sub_cluster,
)
from pesto_ir.passes.rewrite.tensor_shard import ShardingError, TensorLayout, tensor_shard
from pesto_ir.passes.sharding.choose import alternating_start, choose_layout
from pesto_ir.passes.sharding.classes import parameter_classes
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import collective_bytes, read_plan_attrs, write_plan_attrs
from pesto_ir.util.errors import PestoError

BATCH = 16
RTOL, ATOL = 2e-5, 2e-6


def mlp(hidden: int = 256) -> tuple[Any, Any, Any, Any]:
    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    k = jax.random.split(jax.random.key(0), 3)
    params = {"w1": 0.3 * jax.random.normal(k[0], (64, hidden)), "b1": jnp.zeros(hidden),
              "w2": 0.3 * jax.random.normal(k[1], (hidden, 64))}
    x = jax.random.normal(k[2], (BATCH, 64))
    return _sgd(loss), params, x, jnp.sin(x)


def gpt() -> tuple[Any, Any, Any, Any]:
    """Two GPT blocks of the zoo (attention, layer norm, GELU MLP, tied embeddings)."""
    zoo_jax = pytest.importorskip("bench.zoo_jax")
    model = zoo_jax._gpt(zoo_jax.GptConfig(layers=2, d_model=64, heads=4, seq=8, batch=BATCH, vocab=64))
    leaves, treedef = jax.tree_util.tree_flatten(model.params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = treedef.unflatten([0.1 * jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves)])
    tokens = jax.random.randint(jax.random.key(2), (BATCH, 8), 0, 64)
    return _sgd(model.loss), params, tokens, jnp.roll(tokens, 1, axis=1)


def cnn() -> tuple[Any, Any, Any, Any]:
    """Two wide convolutions and a dense head: the channels split across the ranks."""
    def conv(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h = jax.nn.relu(conv(x, p["c1"]))
        h = jax.nn.relu(conv(h, p["c2"]))
        logits = h.mean(axis=(1, 2)) @ p["head"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 8), axis=-1))

    k = jax.random.split(jax.random.key(3), 4)
    params = {"c1": 0.3 * jax.random.normal(k[0], (3, 3, 4, 64)), "c2": 0.1 * jax.random.normal(k[1], (3, 3, 64, 64)),
              "head": 0.3 * jax.random.normal(k[2], (64, 8))}
    return _sgd(loss), params, jax.random.normal(k[3], (BATCH, 8, 8, 4)), jnp.arange(BATCH) % 8


MODELS = {"mlp": mlp, "gpt": gpt, "cnn": cnn}


def check_steps(run: Any, step: Any, params: Any, x: jax.Array, y: jax.Array, t: int) -> None:
    """Two steps, each from the same state as jax.jit's; split parameters held 1/t per device."""
    want_params = got_params = params
    for _ in range(2):
        got_params, got_loss = run(got_params, x, y)
        want_params, want_loss = jax.jit(step)(want_params, x, y)
        np.testing.assert_allclose(np.asarray(got_loss), np.asarray(want_loss), rtol=RTOL, atol=ATOL)
        for a, b in zip(jax.tree_util.tree_leaves(got_params), jax.tree_util.tree_leaves(want_params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
    layouts = dict(run.plan.parallelism.layouts)
    assert layouts, "the plan splits no parameter"
    # a parameter split in runs (a fused QKV) has no contiguous block per device to come back as:
    # it comes back whole (documented); every other split parameter stays 1/t per device
    layouts = {n: spec for n, spec in layouts.items() if n not in dict(run.plan.parallelism.interleave)}
    flat = jax.tree_util.tree_flatten_with_path(got_params)[0]
    split = 0
    for path, leaf in flat:
        name = "params." + ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        if name in layouts:
            split += 1
            for shard in leaf.addressable_shards:
                assert shard.data.size * t == leaf.size, (name, shard.data.shape, leaf.shape)
    assert split == len([n for n in layouts if n.startswith("params.")])


@pytest.mark.parametrize("name, t", [("mlp", 2), ("mlp", 4), ("cnn", 2), pytest.param("gpt", 2, marks=pytest.mark.slow),
                                     pytest.param("gpt", 4, marks=pytest.mark.slow), pytest.param("cnn", 4, marks=pytest.mark.slow)])
def test_tensor_parallel_steps_give_jit_s_step(name: str, t: int) -> None:
    step, params, x, y = MODELS[name]()
    run = pesto_ir.parallelize(step, devices=jax.devices()[:t], param_argnums=0, tensor_parallel=t, autotune=False)
    check_steps(run, step, params, x, y, t)
    assert run.plan.parallelism.tensor_parallel == t
    assert "tensor-parallel ranks" in run.executable.describe()


def test_gpt_attention_is_split_by_heads() -> None:
    """The fused QKV projection is split in 3 runs (q, k and v each by heads), the attention
    output's projection by rows, the MLP as Megatron's; the same step as jit."""
    zoo_jax = pytest.importorskip("bench.zoo_jax")
    graph = zoo_jax.lower_config("gpt", zoo_jax.GptConfig(layers=2, d_model=1024, heads=16, seq=512, batch=8,
                                                          vocab=8192))  # shapes only: nothing is allocated
    cluster = Cluster.homogeneous(4, "h100")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    ring = collective_cost(cluster, mirror_groups(cluster, 1, 4))
    layout = choose_layout(graph, 4, cluster.devices[0], ring).layout
    axes = layout.axes
    for block in ("0", "1"):
        assert axes[f"params.blocks.{block}.qkv.w"] == 1 and layout.runs(f"params.blocks.{block}.qkv.w") == 3
        assert axes[f"params.blocks.{block}.proj.w"] == 0
        assert axes[f"params.blocks.{block}.fc.w"] == 1 and axes[f"params.blocks.{block}.out.w"] == 0
    assert axes["params.wte"] == 0  # Megatron's vocabulary-parallel embedding and logits


def test_heads_split_in_runs_run_like_jit() -> None:
    """Megatron's layout of the zoo GPT given by hand, the fused QKV split in 3 runs: jit's step."""
    step, params, x, y = gpt()
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(2, "cpu")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    parts = {"qkv.w": 1, "qkv.b": 0, "proj.w": 0, "fc.w": 1, "fc.b": 0, "out.w": 0}
    split = {v.name: a for v in graph.inputs for p, a in parts.items() if v.name.endswith(f"blocks.0.{p}")
             or v.name.endswith(f"blocks.1.{p}")}
    runs = {n: 3 for n in split if ".qkv." in n}
    strategy = Strategy(1, 1, tensor=TensorLayout(2, tuple(split.items()), tuple(runs.items())))
    rank = replica_graph(graph, cluster, strategy)
    _runs_like_jit(rank, cluster, strategy, step, (params, x, y))
    assert read_plan_attrs(rank).parallelism.interleave == tuple(sorted(runs.items()))  # type: ignore[union-attr]


@pytest.mark.parametrize("name, m", [("mlp", 1), pytest.param("gpt", 1, marks=pytest.mark.slow),
                                     pytest.param("gpt", 2, marks=pytest.mark.slow)])
def test_tensor_parallel_groups_inside_data_parallel_replicas(name: str, m: int) -> None:
    """t = 2 x d = 2 on 4 devices: each replica's batch rows on both its ranks, each rank's blocks on
    both replicas; the replicas' all-reduces over the mesh's replica axis, the ranks' over its
    tensor axis, never merged into one bucket (with m = 2 there are gradients to bucket). jit's
    step, and every split parameter 1/t per device."""
    step, params, x, y = MODELS[name]()
    run = pesto_ir.parallelize(step, devices=jax.devices()[:4], param_argnums=0, tensor_parallel=2,
                               data_parallel=2, microbatches=m, autotune=False)
    check_steps(run, step, params, x, y, 2)
    par = run.plan.parallelism
    assert (par.data_parallel, par.tensor_parallel) == (2, 2) and len(par.replicas) == 4
    assert "2 data-parallel replicas x 2 tensor-parallel ranks" in run.executable.describe()


def test_sequence_parallel_regions_run_like_jit() -> None:
    """Megatron-SP: the tokens and targets split along the sequence, so the residual stream, the
    norms and the loss work on the rank's positions; gathered before each column-parallel layer
    (all_gather) and reduce-scattered after each row-parallel one (an all-reduce only block
    slices read becomes a reduce_scatter). jit's step."""
    step, params, x, y = gpt()
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(2, "cpu")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    parts = {"qkv.w": 1, "qkv.b": 0, "proj.w": 0, "fc.w": 1, "fc.b": 0, "out.w": 0}
    split = {v.name: a for v in graph.inputs for p, a in parts.items() if v.name.endswith(p)}
    split.update({v.name: 1 for v in graph.inputs if not v.param})  # tokens, targets: [batch, seq]
    runs = {n: 3 for n in split if ".qkv." in n}
    strategy = Strategy(1, 1, tensor=TensorLayout(2, tuple(split.items()), tuple(runs.items())))
    rank = replica_graph(graph, cluster, strategy)
    kinds = [op.opcode for op in rank.ops]
    assert kinds.count("all_gather") >= 2 and kinds.count("reduce_scatter") >= 2
    _runs_like_jit(rank, cluster, strategy, step, (params, x, y))


@pytest.mark.parametrize("with_layers", [False, True])
def test_a_table_split_by_vocabulary_is_looked_up_in_each_rank_s_rows(with_layers: bool) -> None:
    """Megatron's vocabulary-parallel embedding and loss: the tied table split along the
    vocabulary, each rank looks its rows up (the other ranks' token ids fall outside its block:
    zeros, summed across the ranks), computes its block of the logits, the log-softmax's max and
    sum all-reduced, the target's log-probability looked up in its block, and the gradients added
    into its rows only. Nothing is gathered whole, and the step is jit's; alone, and with the
    layers split as Megatron's pairs."""
    step, params, x, y = gpt()
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(2, "cpu")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    split = {"params.wte": 0}
    runs: dict[str, int] = {}
    if with_layers:
        parts = {"qkv.w": 1, "qkv.b": 0, "proj.w": 0, "fc.w": 1, "fc.b": 0, "out.w": 0}
        split.update({v.name: a for v in graph.inputs for p, a in parts.items() if v.name.endswith(p)})
        runs = {n: 3 for n in split if ".qkv." in n}
    strategy = Strategy(1, 1, tensor=TensorLayout(2, tuple(split.items()), tuple(runs.items())))
    rank = replica_graph(graph, cluster, strategy)
    kinds = [op.opcode for op in rank.ops]
    assert "all_gather" not in kinds and "replica_slice" not in kinds
    lookups = [op for op in rank.ops if op.opcode == "gather"]
    assert len(lookups) == 2  # the tokens' embeddings, the targets' log-probabilities
    for op in lookups:
        assert op.operands[1].owner is not None and op.operands[1].owner.opcode == "block_indices"
        assert op.get("mode") == "FILL_OR_DROP" and op.get("fill_value") == 0
        assert op.result.uses and all(u.opcode == "all_reduce" for u in op.result.users())
    whole = {op.name: op.result.type.nbytes for op in graph.ops if op.opcode == "scatter-add"}
    scatters = {op.name: op.result.type.nbytes for op in rank.ops if op.opcode == "scatter-add"}
    assert scatters.keys() == whole.keys() and len(scatters) == 2  # the gradients, into the rank's rows only
    assert all(2 * n == whole[name] for name, n in scatters.items())
    _runs_like_jit(rank, cluster, strategy, step, (params, x, y))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from((2, 4)), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_lookups_in_split_tables_are_jit_s(t: int, blocks: int, width: int, seed: int) -> None:
    """Random tables split along their rows across t ranks, looked up by random indices (the
    first and last row of every block among them), as an embedding and as a target's
    log-probability: every rank's lookups and gradients on its rows give jit's step."""
    vocab, h, batch = t * 4 * blocks, 4 * width, 8
    rng = np.random.default_rng(seed)
    edges = np.arange(0, vocab, 4 * blocks)
    ids = np.concatenate([edges, edges + 4 * blocks - 1, rng.integers(0, vocab, 2 * batch)])[:2 * batch]
    tokens = jnp.asarray(rng.permutation(ids).reshape(batch, 2), jnp.int32)
    targets = jnp.asarray(rng.integers(0, vocab, (batch, 2)), jnp.int32)

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        logits = jnp.tanh(p["table"][x]) @ p["head"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, y[..., None], axis=-1))

    params = {"table": jnp.asarray(rng.normal(size=(vocab, h)), jnp.float32),
              "head": jnp.asarray(rng.normal(size=(h, vocab)), jnp.float32)}
    step = _sgd(loss)
    graph = lower(step, params, tokens, targets, param_argnums=(0,))
    cluster = Cluster.homogeneous(t, "cpu")
    strategy = Strategy(1, 1, tensor=TensorLayout(t, (("params.table", 0), ("params.head", 1))))
    rank = replica_graph(graph, cluster, strategy)
    assert "all_gather" not in [op.opcode for op in rank.ops]
    _runs_like_jit(rank, cluster, strategy, step, (params, tokens, targets))


def test_the_layout_search_starts_from_a_vocabulary_split() -> None:
    """A table looked up along its longest axis starts split along it (the position table, looked
    up along its shorter axis, starts whole)."""
    step, params, x, y = gpt()
    graph = lower(step, params, x, y, param_argnums=(0,))
    classes = parameter_classes(graph)
    start = {name: pick for i, pick in alternating_start(graph, classes).items() for name in classes[i].names}
    assert start["params.wte"] == (0, 1)
    assert "params.wpe" not in start


def test_megatron_s_pairs_as_a_fixed_layout_run_like_jit() -> None:
    """`pairs_layout`, Megatron's layout built as it is (a published layout in `bench/llm_zoo.py`):
    the alternating start's splits, the vocabulary-parallel table among them, and a step on it is
    jit's."""
    from pesto_ir.passes.sharding.choose import pairs_layout

    step, params, x, y = gpt()
    graph = lower(step, params, x, y, param_argnums=(0,))
    classes = parameter_classes(graph)
    layout = pairs_layout(graph, 2)
    start = {name: pick for i, pick in alternating_start(graph, classes).items() for name in classes[i].names}
    assert layout.axes == {name: pick[0] for name, pick in start.items()} and layout.axes["params.wte"] == 0
    assert dict(layout.interleave) == {name: pick[1] for name, pick in start.items() if pick[1] > 1}
    cluster = Cluster.homogeneous(2, "cpu")
    strategy = Strategy(1, 1, tensor=layout)
    _runs_like_jit(replica_graph(graph, cluster, strategy), cluster, strategy, step, (params, x, y))


def _runs_like_jit(rank: Any, cluster: Cluster, strategy: Strategy, step: Any, args: tuple[Any, ...]) -> None:
    """`rank` (the strategy's rank graph) placed on one device per group and run on the cluster's
    devices gives jit's outputs of `step` on `args`."""
    sub = sub_cluster(cluster, placed_devices(cluster, strategy))
    write_plan_attrs(rank, as_hybrid(rank, cluster, place_single(rank, sub, PlaceOptions(time_limit=1.0)), strategy))
    got = build(rank, jax.devices()[:len(cluster)])(*jax.tree_util.tree_leaves(args))
    want = jax.tree_util.tree_leaves(jax.jit(step)(*args))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)


def test_megatron_mlp_layout_is_found() -> None:
    """Column-parallel first layer (its bias with it), row-parallel second: one all-reduce."""
    step, params, x, y = mlp(512)
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(2, "h100")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    choice = choose_layout(graph, 2, cluster.devices[0], collective_cost(cluster, mirror_groups(cluster, 1, 2)))
    params = {n: a for n, a in choice.layout.axes.items() if n.startswith("params.")}
    assert params == {"params.w1": 1, "params.b1": 0, "params.w2": 0}
    rank = tensor_shard(graph, choice.layout)
    assert [op.opcode for op in rank.ops].count("all_reduce") >= 1  # the row-parallel layer's


def test_two_stage_pipeline_of_tensor_parallel_groups() -> None:
    """t = 2 inside a 2-stage pipeline of 2 micro-batches: 4 devices, 2 placed (each standing for its
    group), values crossing between the groups' meshes."""
    step, params, x, y = mlp(128)
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(4, "cpu")
    placed = PassManager("annotate-costs{model=roofline},place{algo=m-topo microbatches=2 tensor-parallel=2},expand",
                         verify_each=False).run(graph, PassContext(cluster=cluster, quiet=True))
    plan = read_plan_attrs(placed)
    assert plan is not None and plan.parallelism is not None
    assert plan.parallelism.tensor_parallel == 2 and plan.parallelism.microbatches == 2
    assert {slot.device for slot in plan.ops.values()} <= {"cpu0", "cpu2"}
    executable = build(placed, jax.devices()[:4])
    got = executable(*jax.tree_util.tree_leaves((params, x, y)))
    want = jax.tree_util.tree_leaves(jax.jit(step)(params, x, y))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)


def test_plan_json_names_the_layouts(tmp_path: Any) -> None:
    step, params, x, y = mlp(256)
    run = pesto_ir.parallelize(step, devices=jax.devices()[:2], param_argnums=0, tensor_parallel=2, autotune=False)
    run(params, x, y)
    par = run.plan.to_json()["parallelism"]
    assert par["tensor_parallel"] == 2
    assert par["layouts"]["params.w1"] == [None, "tensor"]
    assert len(par["replicas"]) == 2


def test_bad_tensor_parallel_options_are_refused() -> None:
    step, params, x, y = mlp()
    for bad in (0, -2, 2.5, True, "two"):
        with pytest.raises(PestoError, match="tensor_parallel"):
            pesto_ir.parallelize(step, devices=jax.devices()[:2], param_argnums=0, tensor_parallel=bad)(params, x, y)
    with pytest.raises(PestoError, match="does not divide"):
        pesto_ir.parallelize(step, devices=jax.devices()[:4], param_argnums=0, tensor_parallel=4,
                             data_parallel=2)(params, x, y)
    with pytest.raises(PestoError, match="does not divide"):
        pesto_ir.parallelize(step, devices=jax.devices()[:3], param_argnums=0, tensor_parallel=2)(params, x, y)


def test_cost_graphs_are_refused_with_a_reason() -> None:
    graph = pesto_ir.load(str(Path(__file__).parent.parent / "graphs" / "msr" / "resnet50_training_layer.json"))
    with pytest.raises(ShardingError, match="cost graph"):
        tensor_shard(graph, TensorLayout(2))
    with pytest.raises(ShardingError, match="cost graph"):
        tensor_shard(graph, TensorLayout(2, (("x", 0),)))


# ---------------------------------------------------------------- random layered graphs

def _layered(widths: list[int], sequence: int | None = None) -> Any:
    """An MLP training step of the given widths (tanh between layers, SGD), on a batch of 4
    samples, or of 2 sequences of `sequence` positions."""
    def loss(p: Any, x: jax.Array) -> jax.Array:
        h = x
        for i in range(len(widths) - 1):
            h = jnp.tanh(h @ p[f"w{i}"] + p[f"b{i}"])
        return jnp.sum(h ** 2)

    params = {}
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        params[f"w{i}"] = jax.ShapeDtypeStruct((a, b), jnp.float32)
        params[f"b{i}"] = jax.ShapeDtypeStruct((b,), jnp.float32)
    x = jax.ShapeDtypeStruct((4, widths[0]) if sequence is None else (2, sequence, widths[0]), jnp.float32)

    def step(p: Any, x: jax.Array) -> Any:
        return jax.tree_util.tree_map(lambda w, g: w - 0.1 * g, p, jax.grad(loss)(p, x))

    return lower(step, params, x, param_argnums=(0,))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(widths=st.lists(st.sampled_from([4, 8, 12]), min_size=2, max_size=4), t=st.sampled_from([2, 4]),
       data=st.data())
def test_random_layouts_give_valid_plans_and_exact_collective_bytes(widths: list[int], t: int, data: Any) -> None:
    """Any layout the rewrite accepts, with sequence parallelism or not, gives a plan the validator
    accepts, on t devices; every collective carries exactly the bytes its layout implies (an
    all-reduce the rank's value, a gather or a scatter t blocks), and every split input holds 1/t
    of its elements."""
    sequence_parallel = data.draw(st.booleans())
    graph = _layered(widths, 4 if sequence_parallel else None)
    params = [v for v in graph.inputs if v.param and isinstance(v.type, TensorType)]
    splits = []
    for v in params:
        axis = data.draw(st.sampled_from([None, *[a for a, n in enumerate(v.type.shape) if n % t == 0]]))
        if axis is not None:
            splits.append((v.name, axis))
    cluster = Cluster.homogeneous(t, "h100")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    strategy = Strategy(1, 1, tensor=TensorLayout(t, tuple(splits), sequence_parallel=sequence_parallel))
    try:
        rank = replica_graph(graph, cluster, strategy)
    except ShardingError:
        return  # a layout whose split axes meet in a product across blocks: refused with the op named
    sub = sub_cluster(cluster, placed_devices(cluster, strategy))
    plan = as_hybrid(rank, cluster, place_single(rank, sub, PlaceOptions(time_limit=1.0)), strategy)  # validated inside
    assert plan.parallelism is not None and plan.parallelism.sequence_parallel == sequence_parallel
    whole = {v.name: v for v in graph.inputs}
    for v in rank.inputs:
        if v.name in dict(splits):
            assert isinstance(v.type, TensorType) and v.type.size * t == whole[v.name].type.size  # type: ignore[union-attr]
    for c in plan.collectives:
        op = next(o for o in rank.ops if o.name == c.op)
        block = sum(x.type.nbytes for x in (op.results if op.opcode == "reduce_scatter" else op.operands))
        whole = block if op.opcode == "all_reduce" else block * t  # a gather's or a scatter's whole value
        assert c.nbytes == collective_bytes(op) == whole
        assert len(c.devices) == t


def test_parameter_classes_tie_repeated_layers() -> None:
    graph = _layered([8, 8, 8, 8])
    params = {v.name for v in graph.inputs if v.param}
    classes = [c for c in parameter_classes(graph) if set(c.names) <= params]  # the batch input is one too
    shapes = sorted((c.shape, len(c.families)) for c in classes)
    # the first layer's weight is read by one op fewer (no input gradient): a class of its own
    assert shapes == [((8,), 3), ((8, 8), 1), ((8, 8), 2)]


@pytest.mark.slow
def test_gpt_training_example_with_tensor_and_data_parallelism() -> None:
    """examples/train_gpt.py: 2 replicas x 2 pipeline devices x 2 ranks on 8 CPU devices trains as
    jax.jit does (the script exits 0 only when the loss falls and the two agree)."""
    script = Path(__file__).parent.parent / "examples" / "train_gpt.py"
    done = subprocess.run([sys.executable, str(script), "--steps", "4", "--log-every", "2", "--data-parallel", "2",
                           "--microbatches", "2", "--tensor-parallel", "2"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2 tensor-parallel ranks" in done.stdout


def test_cli_plans_reads_back_and_restarts_tensor_parallel_plans(tmp_path: Path, capsys: Any) -> None:
    """pesto-compile --tensor-parallel 2: the plan JSON names the layout; the placed .pir re-simulates
    and verifies; the plan JSON is a start plan for the same options; bad degrees are refused."""
    from pesto_ir.cli import main

    model = Path(__file__).parent.parent / "examples" / "transformer_block.pir"
    plan_json, placed = tmp_path / "p.json", tmp_path / "out.pir"
    assert main([str(model), "--devices", "4", "--tensor-parallel", "2", "--plan-json", str(plan_json),
                 "-o", str(placed), "-q"]) == 0
    par = json.loads(plan_json.read_text())["parallelism"]
    assert par["tensor_parallel"] == 2 and par["layouts"] and len(par["replicas"]) == 2
    assert main([str(placed), "-p", "simulate,verify", "--devices", "4", "-o", str(tmp_path / "back.pir"), "-q"]) == 0
    assert main([str(model), "--devices", "4", "--tensor-parallel", "2", "--start", str(plan_json),
                 "-o", str(tmp_path / "again.pir"), "-q"]) == 0
    capsys.readouterr()
    assert main([str(model), "--devices", "4", "--tensor-parallel", "3", "-q"]) == 1
    assert "does not divide" in capsys.readouterr().err
    assert main([str(model), "--devices", "2", "--parameters", "sharded", "--data-parallel", "1", "-q"]) == 1
    assert "nothing to split them across" in capsys.readouterr().err


def test_flax_partitioning_metadata_is_the_layout_search_s_start() -> None:
    """flax's nn.with_partitioning names a model-parallel axis: the lowering keeps it as a hint, the
    search starts from it (with no budget to move, the hint is the layout), and a step on boxed
    parameters runs as jit's."""
    nn = pytest.importorskip("flax.linen")

    class Mlp(nn.Module):  # type: ignore[misc]
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            init = nn.initializers.lecun_normal()
            h = nn.tanh(nn.Dense(256, kernel_init=nn.with_partitioning(init, (None, "model")))(x))
            return nn.Dense(64, kernel_init=nn.with_partitioning(init, ("model", None)))(h)

    model = Mlp()
    x = jax.random.normal(jax.random.key(0), (BATCH, 64))
    params = model.init(jax.random.key(1), x)["params"]
    step = _sgd(lambda p, x, y: jnp.mean((model.apply({"params": p}, x) - y) ** 2))
    graph = lower(step, params, x, jnp.sin(x), param_argnums=(0,))
    hints = {n: int(a) for n, a in graph.attrs["partition_hints"].value.items()}
    assert sorted(hints.items()) == [("params.Dense_0.kernel.value", 1), ("params.Dense_1.kernel.value", 0)]
    cluster = Cluster.homogeneous(2, "h100")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    start = choose_layout(graph, 2, cluster.devices[0], None, max_evaluations=1).layout
    assert {n: a for n, a in start.axes.items() if n in hints} == {n: int(a) for n, a in hints.items()}
    run = pesto_ir.parallelize(step, devices=jax.devices()[:2], param_argnums=0, tensor_parallel=2, autotune=False)
    got = run(params, x, jnp.sin(x))
    want = jax.jit(step)(params, x, jnp.sin(x))
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
