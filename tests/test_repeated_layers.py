"""Repeated layers: the regions a stack of identical layers repeats are found, the model cut to its
first layers is a valid graph, and a tensor-parallel layout scored on the cut models (one layer and
two, extrapolated) scores exactly as on the whole model."""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.llm_models import GptConfig, lower_gpt
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.jax import lower
from pesto_ir.ir.graph import Graph, donate_inputs, donated_inputs
from pesto_ir.ir.verifier import verify
from pesto_ir.passes.placement.search.replica_memory import ReplicaMemory
from pesto_ir.passes.rewrite.repeated_layers import find_repeated_layers, shorten
from pesto_ir.passes.rewrite.replicas import Strategy, collective_cost, mirror_groups
from pesto_ir.passes.rewrite.tensor_shard import TensorLayout, tensor_shard
from pesto_ir.passes.sharding.choose import LayerProbe, choose_layout, restricted_layout, score_layout
from pesto_ir.passes.sharding.classes import layer_count, parameter_classes
from pesto_ir.passmanager import PassContext, PassManager


@pytest.fixture(autouse=True, scope="module")
def _freed_after() -> Any:
    """The lowered stacks and GPTs, and JAX's traces of them, are garbage once this module ends:
    collected here, not in the middle of a later test's timed search."""
    yield
    jax.clear_caches()
    gc.collect()


def _stack(layers: int, width: int, adam: bool) -> Graph:
    """A residual stack: an input layer, then `layers` identical tanh layers, SGD or Adam."""
    def loss(p: Any, x: jax.Array) -> jax.Array:
        h = x @ p["w_in"]
        for block in p["blocks"]:
            h = h + jnp.tanh(h @ block["w"] + block["b"])
        return jnp.sum(h ** 2)

    def step(p: Any, m: Any, x: jax.Array) -> Any:
        g = jax.grad(loss)(p, x)
        if not adam:
            return jax.tree_util.tree_map(lambda w, d: w - 0.1 * d, p, g), m
        m = jax.tree_util.tree_map(lambda a, d: 0.9 * a + 0.1 * d, m, g)
        return jax.tree_util.tree_map(lambda w, a: w - 0.01 * a / (jnp.abs(a) + 1e-8), p, m), m

    f32 = jnp.float32
    params = {"w_in": jax.ShapeDtypeStruct((4, width), f32),
              "blocks": [{"w": jax.ShapeDtypeStruct((width, width), f32), "b": jax.ShapeDtypeStruct((width,), f32)}
                         for _ in range(layers)]}
    return lower(step, params, params, jax.ShapeDtypeStruct((8, 4), f32), param_argnums=(0, 1))


def _costed(graph: Graph, t: int, fusion: str = "xla") -> tuple[Any, Any]:
    cluster = Cluster.homogeneous(t, "h100")
    PassManager(f"annotate-costs{{model=roofline fusion={fusion}}}").run(graph, PassContext(cluster=cluster, quiet=True))
    return cluster.devices[0], collective_cost(cluster, mirror_groups(cluster, 1, t))


def test_layers_are_found_and_the_model_is_cut_to_its_first() -> None:
    graph = _stack(5, 8, adam=True)
    donate_inputs(graph, [v.name for v in graph.params])
    assert layer_count(parameter_classes(graph)) == 5
    found = find_repeated_layers(graph, 5)
    assert found is not None and found.layers == 5
    assert any(r.descending for r in found.regions) and any(not r.descending for r in found.regions)  # backward
    one, two = shorten(graph, found, 1), shorten(graph, found, 2)
    for short, kept in ((one, {"0"}), (two, {"0", "1"})):
        verify(short)
        layers = {v.name.split(".")[2] for v in short.inputs if ".blocks." in v.name}
        assert layers == kept
        assert len(short.outputs) == len(short.inputs) - 1  # new parameters and state; the batch is read only
        assert donated_inputs(short) == {v.name for v in short.params}  # those of the layers cut are gone
    # every op of a layer is in a region: the model grows by one layer's ops per layer
    assert len(graph.ops) == len(one.ops) + 4 * (len(two.ops) - len(one.ops))
    assert found.ops_per_layer == len(two.ops) - len(one.ops)


def test_models_without_repeats_are_not_cut() -> None:
    assert find_repeated_layers(_stack(2, 8, adam=False), 2) is None  # too few layers to tell
    graph = _stack(4, 8, adam=False)
    assert find_repeated_layers(graph, 3) is None  # not three copies of anything
    with pytest.raises(ValueError, match="keep must be"):
        found = find_repeated_layers(graph, 4)
        assert found is not None
        shorten(graph, found, 4)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(8, 10), width=st.sampled_from([8, 16]), adam=st.booleans(), t=st.sampled_from([2, 4]),
       data=st.data())
def test_probe_scores_layouts_as_the_whole_model(layers: int, width: int, adam: bool, t: int, data: Any) -> None:
    """A layout's seconds and peak memory on the whole model are those extrapolated from its first
    three layers and its first four, for any layout of the tied classes (each op costed alone: with fused
    kernels the first and last layers' kernels differ from the middle ones'; the GPT test below).
    The peak is read at the ops both cuts share, extrapolated: on these tiny stacks, where a
    collective's buffer is as large as a layer's activations, it can be a quarter over; on the
    zoo's GPT (below) it is exact to 1%. It never falls under the longer cut's."""
    graph = _stack(layers, width, adam)
    device, ring = _costed(graph, t, fusion="none")
    classes = parameter_classes(graph)
    probe = LayerProbe.of(graph, classes)
    assert probe is not None and probe.layers == layers
    splits = []
    for cls in classes:
        axis = data.draw(st.sampled_from([None, *cls.axes(t)]))
        splits += [(n, axis) for n in cls.names] if axis is not None else []
    layout = TensorLayout(t, tuple(splits))
    whole, cut = score_layout(graph, layout, device, ring), probe.score(layout, device, ring)
    assert (whole is None) == (cut is None)
    if whole is not None and cut is not None:
        assert cut.seconds == pytest.approx(whole.seconds, rel=1e-9)
        assert cut.peak >= max(s.peak for s in (score_layout(probe.longer, restricted_layout(layout, probe.longer), device,
                                                              ring),) if s is not None)


def test_gpt_layouts_are_searched_on_two_layers() -> None:
    """The zoo's mixed-precision GPT (casts, forward, backward, Adam: seven regions) is searched on
    its first three layers and four, and the layout found scores the same on the whole model."""
    graph = lower_gpt(GptConfig(8, 32, 2, 16, 2, 64))
    device, ring = _costed(graph, 2)
    found = find_repeated_layers(graph, 8)
    assert found is not None and len(found.regions) >= 4
    said: list[str] = []
    choice = choose_layout(graph, 2, device, ring, progress=said.append)
    assert any("8 repeated layers" in s for s in said)
    whole = score_layout(graph, choice.layout, device, ring)
    assert whole is not None and whole.seconds == pytest.approx(choice.score.seconds, rel=1e-3)
    assert whole.peak == pytest.approx(choice.score.peak, rel=0.01)
    # a search started from this layout (the next degree's is) keeps it where it scores better
    # than every parameter whole, even when cut after that one layout
    assert choice.layout.splits and len(choice.picks) == len(parameter_classes(graph))
    carried = choose_layout(graph, 2, device, ring, max_evaluations=1, start=choice.picks)
    assert carried.layout == choice.layout and carried.picks == choice.picks and carried.evaluations == 1


def test_layouts_overflow_where_micro_batches_cannot_help() -> None:
    """A layout's overflow is its rank's peak at the most micro-batches (one sample each: the
    walk `ReplicaMemory` predicts replicas by, at m = batch), over the device's memory; its peak
    the one-batch peak. So a device between the two has no overflow, and the search then
    ranks layouts by seconds."""
    graph = lower_gpt(GptConfig(2, 32, 2, 16, 4, 64))
    device, ring = _costed(graph, 2)
    layout = choose_layout(graph, 2, device, ring).layout
    rank = tensor_shard(graph, layout, ring)
    memory = ReplicaMemory.of(rank, graph)
    assert memory is not None
    one_batch, least = memory.predicted_peak(Strategy(1, 1)), memory.predicted_peak(Strategy(1, 4))
    assert least < one_batch
    for capacity, overflow in ((least / 2, least - least / 2), ((least + one_batch) / 2, 0.0)):
        score = score_layout(graph, layout, dataclasses.replace(device, memory=capacity), ring)
        assert score is not None
        assert score.overflow == pytest.approx(overflow, rel=1e-9)
        assert score.peak == pytest.approx(one_batch, rel=1e-9)
