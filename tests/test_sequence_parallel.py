"""Sequence parallelism (Megatron-SP): partial sums of activations reduce-scattered along the
sequence, gathered again before the layers that split their parameters, the backward pass
gathering anew; checked against `jax.jit` and by the plan contract."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest
from test_tensor_parallel import _runs_like_jit, gpt

from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.jax import lower
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.types import TensorType
from pesto_ir.passes.placement.common import is_backward
from pesto_ir.passes.placement.heuristics.simple import place_single
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.rewrite.replicas import Strategy, as_hybrid, placed_devices, replica_graph, sub_cluster
from pesto_ir.passes.rewrite.tensor_shard import ShardingError, TensorLayout, tensor_shard
from pesto_ir.passes.sharding.choose import choose_layout, pairs_layout, score_layout
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.memory import peak_memory
from pesto_ir.schedule.plan import Parallelism, Plan
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util.errors import PestoError


def costed(graph: Graph, cluster: Cluster) -> Graph:
    return PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))


def _zoo_step(tied: bool) -> tuple[Any, tuple[Any, ...]]:
    """The LLM zoo's mixed-precision GPT step in miniature (2 layers, d 64, seq 16)."""
    llm_models = pytest.importorskip("bench.llm_models")
    zoo_jax_models = pytest.importorskip("bench.zoo_jax_models")
    config = zoo_jax_models.GptConfig(2, 64, 4, 16, 2, 128)
    step, abstract = llm_models.gpt_step(config, "f32", "tiny", tied, "attention")
    params, state, *batch = abstract
    rng = np.random.default_rng(0)

    def values(tree: Any, scale: float, positive: bool = False) -> Any:
        def one(a: Any) -> Any:
            x = scale * rng.normal(size=a.shape)
            return jax.numpy.asarray(np.abs(x) if positive else x, a.dtype)
        return jax.tree_util.tree_map(one, tree)

    tokens = [jax.numpy.asarray(rng.integers(0, config.vocab, b.shape), b.dtype) for b in batch]
    return step, (values(params, 0.05), (values(state[0], 1e-3), values(state[1], 1e-4, True)), *tokens)


@pytest.mark.parametrize("tied", [True, False])
def test_megatron_pairs_with_sequence_parallelism_run_like_jit(tied: bool) -> None:
    """Megatron's pairs, sequence-parallel, on the zoo's GPT step: every partial sum of an
    activation is reduce-scattered (none all-reduced), only activation blocks are gathered (no
    parameter), an untied head is split by vocabulary like the table, and the new parameters and
    loss are jit's."""
    step, args = _zoo_step(tied)
    graph = lower(step, *args, param_argnums=(0, 1))
    cluster = Cluster.homogeneous(2, "cpu")
    costed(graph, cluster)
    layout = dataclasses.replace(pairs_layout(graph, 2), sequence_parallel=True)
    if not tied:
        assert dict(layout.splits).get("params.head") == 1
    rank = replica_graph(graph, cluster, Strategy(1, 1, tensor=layout))
    seq = 16
    assert rank.attrs["sequence_parallel"].value is True
    scatters = [op for op in rank.ops if op.opcode == "reduce_scatter"]
    assert len(scatters) >= 4 * 2  # per layer: attention and MLP, forward and backward
    for op in rank.ops:
        if op.opcode not in ("all_reduce", "all_gather"):
            continue
        shape = op.result.type.shape if isinstance(op.result.type, TensorType) else ()
        if op.opcode == "all_reduce":
            assert not (len(shape) >= 3 and shape[1] == seq), f"{op.name} all-reduces an activation"
        if op.opcode == "all_gather":
            block = op.operands[0].type
            assert isinstance(block, TensorType) and block.rank >= 3 and block.shape[1] == seq // 2, op.name
    # the table's gradient stays on the rank's rows: its updates (split along the sequence) are
    # gathered, not the whole table's gradient all-reduced
    scatters_into_rows = [op for op in rank.ops if op.opcode == "scatter-add"]
    assert scatters_into_rows and all(u.opcode != "all_reduce" for op in scatters_into_rows for u in op.result.users())
    strategy = Strategy(1, 1, tensor=layout)
    _runs_like_jit(rank, cluster, strategy, step, args)


def test_the_backward_pass_gathers_again() -> None:
    """A sequence-split activation that a forward and a backward matmul read whole is gathered
    twice, each gather in its reader's pass; so the forward pass's whole copy is not held until
    the backward pass, and a device holds less than without sequence parallelism."""
    step, params, x, y = gpt()
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(2, "h100")
    costed(graph, cluster)
    plain = pairs_layout(graph, 2)
    ranks = {sp: tensor_shard(graph, dataclasses.replace(plain, sequence_parallel=sp)) for sp in (False, True)}
    gathers = [op for op in ranks[True].ops if op.opcode == "all_gather"]
    sources = {op.operands[0].name for op in gathers}
    twice = [name for name in sources if sum(op.operands[0].name == name for op in gathers) == 2]
    assert twice
    for name in twice:
        assert sorted(is_backward(op) for op in gathers if op.operands[0].name == name) == [False, True]
    for op in gathers:  # the readers it is made for (not the block slices a reshard adds after it)
        assert all(is_backward(u) == is_backward(op) for u in op.result.users() if u.get("scope") is not None)

    def peak(rank: Graph) -> int:
        slots = place_single(rank, Cluster.homogeneous(1, "h100"), PlaceOptions(time_limit=1.0))
        return max(p.nbytes for p in peak_memory(rank, slots).values())

    assert peak(ranks[True]) < peak(ranks[False])


@pytest.mark.parametrize("memory", [1.0, 80e9])
def test_the_layout_search_keeps_sequence_parallelism_where_it_cuts_memory(memory: float) -> None:
    """The search scores its layout with and without sequence parallelism and keeps it exactly
    where it holds less over the device's memory (on devices too small for the step; not with
    room), saying which."""
    step, params, x, y = gpt()
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(2, "h100")
    costed(graph, cluster)
    device = dataclasses.replace(cluster.devices[0], memory=memory)
    said: list[str] = []
    choice = choose_layout(graph, 2, device, None, progress=said.append)
    flipped = dataclasses.replace(choice.layout, sequence_parallel=not choice.layout.sequence_parallel)
    other = score_layout(graph, flipped, device, None)
    assert other is not None
    on, off = (choice.score, other) if choice.layout.sequence_parallel else (other, choice.score)
    assert choice.layout.sequence_parallel == (on.overflow < off.overflow)
    kept = "kept" if choice.layout.sequence_parallel else "not kept"
    assert any(f"sequence parallelism {kept}" in line for line in said)
    if memory > 1e9:
        assert not choice.layout.sequence_parallel  # room for every layout: nothing to cut


def test_a_graph_without_a_sequence_is_refused_in_a_sentence() -> None:
    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        return (x @ w).sum()

    graph = lower(jax.grad(loss), np.ones((4, 4), np.float32), np.ones((4,), np.float32), param_argnums=(0,))
    with pytest.raises(ShardingError, match="sequence parallelism splits activations along the sequence"):
        tensor_shard(graph, TensorLayout(2, (("w", 1),), sequence_parallel=True))
    with pytest.raises(ShardingError, match="true or false"):
        TensorLayout(2, sequence_parallel=1)  # type: ignore[arg-type]


def test_the_plan_says_it_is_sequence_parallel() -> None:
    """`parallelism.sequence_parallel` is in the plan's JSON and graph attributes, read back, refused
    without tensor parallelism or as a non-bool, and checked against the rank graph by the validator."""
    step, params, x, y = gpt()
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(2, "cpu")
    costed(graph, cluster)
    strategy = Strategy(1, 1, tensor=dataclasses.replace(pairs_layout(graph, 2), sequence_parallel=True))
    rank = replica_graph(graph, cluster, strategy)
    sub = sub_cluster(cluster, placed_devices(cluster, strategy))
    plan = as_hybrid(rank, cluster, place_single(rank, sub, PlaceOptions(time_limit=1.0)), strategy)
    assert plan.parallelism is not None and plan.parallelism.sequence_parallel
    raw = plan.to_json()
    assert raw["parallelism"]["sequence_parallel"] is True
    again = Plan.from_json(raw)
    assert again.parallelism == plan.parallelism
    raw["parallelism"]["sequence_parallel"] = "yes"
    with pytest.raises(PestoError, match="sequence_parallel must be true or false"):
        Plan.from_json(raw)
    with pytest.raises(PestoError, match="tensor_parallel is 1"):
        Parallelism(1, 1, (("a",),), sequence_parallel=True)
    lying = dataclasses.replace(plan, parallelism=dataclasses.replace(plan.parallelism, sequence_parallel=False))
    with pytest.raises(PestoError, match="sequence-parallel"):
        check_plan(rank, cluster, lying)


def test_sequence_parallel_micro_batches_and_replicas_run_like_jit() -> None:
    """t = 2 sequence-parallel inside 2 data-parallel replicas of 2 micro-batches each: jit's step."""
    step, params, x, y = gpt()
    graph = lower(step, params, x, y, param_argnums=(0,))
    cluster = Cluster.homogeneous(4, "cpu")
    costed(graph, cluster)
    layout = dataclasses.replace(pairs_layout(graph, 2), sequence_parallel=True)
    strategy = Strategy(2, 2, tensor=layout)
    rank = replica_graph(graph, cluster, strategy)
    assert [op.opcode for op in rank.ops].count("reduce_scatter") >= 8
    _runs_like_jit(rank, cluster, strategy, step, (params, x, y))
