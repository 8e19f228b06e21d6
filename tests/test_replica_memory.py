"""The screening's memory prediction for one-device replicas (`passes/placement/search/replica_memory.py`):
which values carry the batch (as the micro-batch rewrite decides it), the walk's peak against a
one-device list schedule's, how sharding and micro-batches scale it, and which variant of a
strategy the screening starts from."""

from __future__ import annotations

import functools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bench.zoo_jax import lower_model
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.text import parse
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.pipeline.schedules import PipelineGraph, pipeline_plan
from pesto_ir.passes.placement.search.replica_memory import SKIP_MARGIN, ReplicaMemory, variant_to_screen
from pesto_ir.passes.placement.search.strategies import batch_size
from pesto_ir.passes.rewrite.batch_axes import per_sample_values
from pesto_ir.passes.rewrite.rebatch import rebatch
from pesto_ir.passes.rewrite.replicas import ONE_BATCH, Strategy, replica_graph
from pesto_ir.passes.rewrite.tensor_shard import tensor_shard
from pesto_ir.passes.sharding.choose import choose_layout
from pesto_ir.passmanager import PassContext, PassError, PassManager
from pesto_ir.schedule.memory import peak_bytes
from pesto_ir.schedule.plan import read_plan_attrs

MODELS = ("mlp", "resnet", "gpt", "lstm_seq2seq", "multitower")


@functools.cache
def _costed(name: str) -> Graph:
    graph = lower_model(name, "quick")
    return PassManager("annotate-costs{model=roofline}").run(
        graph, PassContext(cluster=Cluster.homogeneous(1, "h100"), quiet=True))


@pytest.mark.parametrize("name", MODELS)
def test_per_sample_values_are_what_the_rewrite_copies(name: str) -> None:
    """An op is copied per micro-batch exactly where it reads a per-sample value, and every op
    with a per-sample result is copied (an op summing over the batch reads per-sample values and
    gives a whole one)."""
    graph = lower_model(name, "quick")
    sample = per_sample_values(graph)
    reads = {op.name for op in graph.ops if any(id(v) in sample for v in op.operands)}
    gives = {op.name for op in graph.ops if any(id(r) in sample for r in op.results)}
    opcodes = {op.name: op.opcode for op in graph.ops}
    copied = {op.name[:-len(".mb0")] for op in rebatch(graph, 2).ops
              if op.name.endswith(".mb0") and opcodes.get(op.name[:-len(".mb0")]) == op.opcode}
    assert reads == copied
    assert gives <= copied and gives  # the models' batches reach some op


@pytest.mark.parametrize("name", MODELS)
def test_one_batch_prediction_is_the_one_device_list_schedule_peak(name: str) -> None:
    """On one device every list scheduler runs the ops in graph order, which the walk follows."""
    graph = _costed(name)
    memory = ReplicaMemory.of(graph)
    assert memory is not None
    for algo in ("m-topo", "m-etf"):
        plan = read_plan_attrs(PassManager(f"place{{algo={algo}}}").run(
            graph.clone(), PassContext(cluster=Cluster.homogeneous(1, "h100"), quiet=True)))
        assert plan is not None and plan.peak_memory
        assert memory.predicted_peak(ONE_BATCH) == pytest.approx(max(plan.peak_memory.values()), rel=1e-9)


def _variants(d: int, m: int) -> list[Strategy]:
    s = Strategy(d, m)
    return [s, s.sharded(), s.fully_sharded()] if d > 1 else [s]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from((1, 2, 4, 8)), st.sampled_from((1, 2, 4, 8)))
def test_prediction_never_grows_with_replicas_micro_batches_or_sharding(name: str, d: int, m: int) -> None:
    memory = ReplicaMemory.of(_costed(name))
    assert memory is not None
    peak = memory.predicted_peak
    floor = float(memory.held[:, 0].max())  # whole bytes: nothing divides them
    for s in _variants(d, m):
        assert floor <= peak(s) <= peak(ONE_BATCH)
        assert peak(Strategy(2 * d, m, s.optimizer_state, parameters=s.parameters)) <= peak(s)
        assert peak(Strategy(d, 2 * m, s.optimizer_state, parameters=s.parameters)) <= peak(s)
    ladder = [peak(s) for s in _variants(d, m)]
    assert ladder == sorted(ladder, reverse=True)


def test_the_screening_starts_from_the_least_sharded_variant_predicted_to_fit() -> None:
    memory = ReplicaMemory.of(_costed("gpt"))
    assert memory is not None
    s = Strategy(2, 1)
    whole, state, params = (memory.predicted_peak(v) for v in _variants(2, 1))
    assert whole > state > params

    assert variant_to_screen(memory, s, whole, shard=True, fsdp=True) == (s, "")
    chosen, why = variant_to_screen(memory, s, (whole + state) / 2, shard=True, fsdp=True)
    assert chosen == s.sharded() and why.startswith("d=2 m=1 is predicted to peak at")
    chosen, why = variant_to_screen(memory, s, (state + params) / 2, shard=True, fsdp=True)
    assert chosen == s.fully_sharded() and "d=2 m=1 state sharded is predicted" in why
    # not allowed to shard: the strategy itself, skipped only past the margin
    assert variant_to_screen(memory, s, whole / (SKIP_MARGIN * 1.01), shard=False, fsdp=False)[0] is None
    assert variant_to_screen(memory, s, whole / SKIP_MARGIN, shard=False, fsdp=False) == (s, "")
    # over its memory even fully sharded, but within the margin: screened (the walk is a prediction)
    assert variant_to_screen(memory, s, params * 0.99, shard=True, fsdp=True)[0] == s.fully_sharded()
    chosen, why = variant_to_screen(memory, s, params / (SKIP_MARGIN * 1.01), shard=True, fsdp=True)
    assert chosen is None and why.startswith("not screened: d=2 m=1 params sharded is predicted to peak at")


def test_a_graph_without_a_batch_has_no_prediction() -> None:
    graph = parse("graph @g(param %a: f32[4]) {\n  %b = neg(%a) : f32[4]\n  return %b\n}\n")
    assert ReplicaMemory.of(graph) is None


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(("mlp", "gpt", "resnet")), st.sampled_from((1, 2)), st.sampled_from((1, 2)),
       st.sampled_from(("replicated", "sharded")), st.sampled_from(("m-topo", "m-etf")))
def test_the_floor_is_under_the_peak_of_every_plan(name: str, d: int, m: int, state: str, algo: str) -> None:
    """`floor` is a bound, not a guess: the strategy's replica graph placed over its devices by a
    list scheduler never peaks under it."""
    graph = _costed(name)
    memory = ReplicaMemory.of(graph)
    assert memory is not None
    strategy = Strategy(d, m, state if d > 1 else "replicated")
    devices = 4 // d
    assume(batch_size(graph) % (d * m) == 0)  # type: ignore[operator]
    replica = replica_graph(graph, Cluster.homogeneous(4, "h100"), strategy)
    plan = read_plan_attrs(PassManager(f"place{{algo={algo}}}").run(
        replica, PassContext(cluster=Cluster.homogeneous(devices, "h100"), quiet=True)))
    assert plan is not None and plan.peak_memory
    assert memory.floor(strategy, devices) <= max(plan.peak_memory.values())
    assert memory.floor(strategy, 1) >= memory.floor(strategy, devices)


def test_a_rank_graph_s_walk_is_its_one_device_list_schedule_peak() -> None:
    """The walk of one tensor-parallel rank's graph (`ReplicaMemory.of(rank, source)`), its
    per-sample values found by the one-batch graph's names, is the rank graph's one-device peak,
    and its micro-batches and replicas scale it down as the one-batch walk's do."""
    graph = _costed("gpt")
    rank = tensor_shard(graph, choose_layout(graph, 2, Cluster.homogeneous(2, "h100").devices[0], None).layout)
    memory = ReplicaMemory.of(rank, graph)
    assert memory is not None and ReplicaMemory.of(rank) is None  # the rank's collectives have no batch rule
    plan = read_plan_attrs(PassManager("place{algo=m-topo}").run(
        rank.clone(), PassContext(cluster=Cluster.homogeneous(1, "h100"), quiet=True)))
    assert plan is not None and plan.peak_memory
    assert memory.predicted_peak(ONE_BATCH) == pytest.approx(max(plan.peak_memory.values()), rel=1e-9)
    assert memory.predicted_peak(Strategy(1, 2)) < memory.predicted_peak(ONE_BATCH)


@pytest.mark.parametrize("name", ("gpt", "mlp", "resnet", "lstm_seq2seq"))
@pytest.mark.parametrize("stages", (2, 4))
def test_a_pipeline_s_prediction_errs_under_its_1f1b_peak(name: str, stages: int) -> None:
    """Over `stages` devices a replica (a pipeline's stages), the prediction splits the walk's
    bytes evenly and holds min(stages, m) micro-batches in flight. Real stages are uneven (the
    first holds the embedding, the inputs and its in-flight activations longest), so it errs low:
    on these models 0.34-0.79 of the 1F1B plan's peak. The screening skips what it predicts
    over a device's memory, so a pipeline it skips holds at least that much."""
    graph = _costed(name)
    memory = ReplicaMemory.of(graph)
    assert memory is not None
    cluster = Cluster.homogeneous(stages, "h100")
    replica = replica_graph(graph, cluster, Strategy(1, 2))
    pipeline = PipelineGraph(replica, cluster)
    plan = pipeline_plan(replica, pipeline.cluster, "1f1b", PlaceOptions(), None, pipeline)
    peak = max(nbytes for nbytes, _ in peak_bytes(replica, plan).values())
    predicted = memory.predicted_peak(Strategy(1, 2), stages)
    assert 0.3 * peak < predicted <= peak
    assert predicted < memory.predicted_peak(Strategy(1, 2))  # a stage holds less than the whole replica


def test_where_nothing_can_fit_or_is_predicted_to_the_search_says_so_without_building() -> None:
    """Memory between what the floor allows and what the prediction refuses: one batch (d < k,
    m = 1, screened by the heuristics) cannot fit by the floor, and every other strategy cannot
    either or is predicted over 1.2 x memory however sharded. The search then refuses, naming
    each one's reason, instead of building one from scratch for the full engine."""
    graph = _costed("resnet")
    memory = ReplicaMemory.of(graph)
    assert memory is not None

    def refused(s: Strategy, capacity: float) -> bool:  # as the screening refuses `s` over 2 devices
        widest = s.fully_sharded() if s.data_parallel > 1 else s
        devices = 2 // s.data_parallel
        by_floor = memory.floor(widest, devices) > capacity
        return by_floor or s.microbatches > 1 and memory.predicted_peak(widest, devices) > SKIP_MARGIN * capacity

    candidates = [Strategy(d, m) for d in (1, 2) for m in (1, 2)]
    windows = sorted({memory.floor(s, 2 // s.data_parallel) for s in candidates})
    capacity = next(c * 0.999 for c in windows if all(refused(s, c * 0.999) for s in candidates)
                    and not all(memory.floor(s, 2 // s.data_parallel) > c * 0.999 for s in candidates))
    ctx = PassContext(cluster=Cluster.homogeneous(2, "h100", memory=capacity), quiet=True)
    with pytest.raises(PassError) as e:
        PassManager("place{algo=auto time-limit=5}").run(graph.clone(), ctx)
    message = str(e.value.cause)
    assert message.startswith("no strategy gave a plan: none can fit in memory by the memory floor, or is predicted")
    assert "d=1 m=1: not screened: it cannot fit" in message and "is predicted to peak at" in message
