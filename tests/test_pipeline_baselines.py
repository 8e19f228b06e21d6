"""The fixed-schedule pipeline baselines (GPipe, 1F1B) of `passes/placement/pipeline/schedules.py`.

Checked against what the schedules promise, independently of how the module computes them:
valid plans (the one validator), colocate groups whole, stages contiguous in forward order, each
stage running its micro-batch slots in the schedule's order, GPipe faster with more micro-batches
on a pipeline-friendly graph, and 1F1B holding no more memory than GPipe.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import layered_graphs, v100s

import pesto_ir
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import is_backward
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.pipeline.interleaved import interleaved_cut, interleaved_layouts
from pesto_ir.passes.placement.pipeline.priorities import stage_slots
from pesto_ir.passes.placement.pipeline.schedules import (
    EAGER,
    INTERLEAVED,
    PIPELINE_SCHEDULES,
    SCHEDULES,
    PipelineGraph,
    pipeline_plan,
)
from pesto_ir.passes.rewrite.rebatch import rebatch
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.validate import validate_plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError

OPTIONS = PlaceOptions(quiet=True)




# ---------------------------------------------------------------- independent checks

def stage_index(plan: Plan, cluster: Cluster, op: str) -> int:
    return cluster.names.index(plan.ops[op].device)


def check_groups_whole(graph: Graph, plan: Plan) -> None:
    devices: dict[str, set[str]] = defaultdict(set)
    for op in graph.ops:
        if op.get("colocate") is not None:
            devices[str(op.get("colocate"))].add(plan.ops[op.name].device)
    split = {g: d for g, d in devices.items() if len(d) > 1}
    assert not split, f"colocate groups on several devices: {split}"


def check_contiguous_stages(graph: Graph, plan: Plan, cluster: Cluster) -> None:
    """Forward ops (not backward, nothing backward upstream; in a micro-batched graph, those of the
    micro-batches), in graph order, never go back to an earlier stage, and every stage has some."""
    after_backward: set[str] = set()
    for op in graph.ops:
        if is_backward(op) or any(p.name in after_backward for p in op.producers()):
            after_backward.add(op.name)
    stages = [stage_index(plan, cluster, op.name) for op in graph.ops if op.name not in after_backward
              and (op.get("microbatch") is not None or "microbatched" not in graph.attrs)]
    drops = [(a, b) for a, b in zip(stages, stages[1:]) if b < a]
    assert not drops, f"forward order goes back a stage: {drops[:5]}"
    assert set(stages) == set(range(len(cluster))), f"stages used: {sorted(set(stages))}"


def slot_sequence(graph: Graph, plan: Plan, device: str) -> list[tuple[str, int]]:
    """The (phase, micro-batch) slots the device ran, in time order, repeats merged; ops that take
    no time are left out (their order among ties says nothing)."""
    ops = [op for op in graph.ops if plan.ops[op.name].device == device and op.get("microbatch") is not None
           and plan.ops[op.name].end > plan.ops[op.name].start]
    ops.sort(key=lambda op: plan.ops[op.name].start)
    out: list[tuple[str, int]] = []
    for op in ops:
        slot = ("B" if is_backward(op) else "F", int(op.get("microbatch")))
        if not out or out[-1] != slot:
            out.append(slot)
    return out


def check_slot_order(graph: Graph, plan: Plan, cluster: Cluster, schedule: str, m: int) -> None:
    for s, d in enumerate(cluster.names):
        ran = slot_sequence(graph, plan, d)
        want = [slot for slot in stage_slots(schedule, s, len(cluster), m) if slot in set(ran)]
        assert ran == want, f"{schedule} stage {s} ran {ran}, the schedule says {want}"


def check_plan_ok(graph: Graph, cluster: Cluster, plan: Plan) -> None:
    assert validate_plan(graph, cluster, plan) == []
    assert plan.peak_memory is not None
    check_groups_whole(graph, plan)
    if plan.algorithm != INTERLEAVED:  # chunks of units go round the devices
        check_contiguous_stages(graph, plan, cluster)


# ---------------------------------------------------------------- stage slots

def test_stage_slots_are_the_textbook_schedules() -> None:
    assert stage_slots("gpipe", 0, 4, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    assert stage_slots("1f1b", 3, 4, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert stage_slots("1f1b", 0, 4, 6) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1),
                                            ("F", 5), ("B", 2), ("B", 3), ("B", 4), ("B", 5)]
    assert stage_slots("1f1b", 0, 4, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]  # warm-up capped at m
    for s in range(4):
        for m in (1, 3, 8):
            slots = stage_slots("1f1b", s, 4, m)
            assert sorted(slots) == sorted(stage_slots("gpipe", s, 4, m))
            in_flight = max(sum(1 for p, _ in slots[:k] if p == "F") - sum(1 for p, _ in slots[:k] if p == "B")
                            for k in range(len(slots) + 1))
            assert in_flight == min(4 - s, m)  # 1F1B holds at most S - s micro-batches' activations


# ---------------------------------------------------------------- bert24 (MSR cost graph)

@pytest.mark.parametrize("m", [1, 4, 8])
@pytest.mark.parametrize("schedule", PIPELINE_SCHEDULES)
def test_bert24_plans_are_valid_pipelines(bert24: Graph, schedule: str, m: int) -> None:
    cluster = v100s(4)
    graph = rebatch(bert24, m)
    plan = pipeline_plan(graph, cluster, schedule, OPTIONS)
    check_plan_ok(graph, cluster, plan)
    assert plan.algorithm == schedule
    assert any(n.startswith(f"{schedule}: 4 stages, {m} micro-batch") for n in plan.notes), plan.notes


def test_bert24_gpipe_gets_faster_with_more_microbatches(bert24: Graph) -> None:
    cluster = v100s(4)
    spans = [pipeline_plan(rebatch(bert24, m), cluster, "gpipe", OPTIONS).makespan for m in (1, 4, 8)]
    assert spans[0] > spans[1] > spans[2], spans
    total = sum(pesto_ir.cost.lookup.op_cost(op, cluster.devices[0]) for op in bert24.ops)
    assert spans[2] < 0.4 * total  # 4 stages overlap: far below running the step on one device


@pytest.mark.parametrize("n_devices", [4, 6])
def test_bert24_1f1b_starts_backward_before_the_last_forward(bert24: Graph, n_devices: int) -> None:
    cluster, m = v100s(n_devices), 8
    graph = rebatch(bert24, m)
    plans = {s: pipeline_plan(graph, cluster, s, OPTIONS) for s in SCHEDULES}
    for d in cluster.names:
        for schedule, plan in plans.items():
            on = [op for op in graph.ops if plan.ops[op.name].device == d and op.get("microbatch") is not None]
            first_b0 = min(plan.ops[op.name].start for op in on if is_backward(op) and op.get("microbatch") == 0)
            last_f = max(plan.ops[op.name].start for op in on if not is_backward(op) and op.get("microbatch") == m - 1)
            if schedule == "1f1b":
                assert first_b0 < last_f, f"1f1b on {d}: micro-batch 0's backward waits for the last forward"
            else:
                assert first_b0 >= last_f, f"gpipe on {d}: a backward starts before the last forward"


@pytest.mark.slow
def test_eager_beats_both_fixed_schedules_where_backward_chains_run_forward(resnet50_layer: Graph) -> None:
    """The MSR ResNet-50 layer graph's backward chain runs from the first layer to the last and
    reads no forward value, so a stage's backward work does not wait for the later stages. GPipe
    and 1F1B still run each stage's slots in their textbook order; the eager schedule of the same
    stages runs whatever is ready. At 6 stages and 8 micro-batches: 112.2 ms against 126.6 (GPipe)
    and 127.4 (1F1B)."""
    cluster, step = v100s(6), rebatch(resnet50_layer, 8)
    plans = {s: pipeline_plan(step, cluster, s, OPTIONS) for s in PIPELINE_SCHEDULES}
    check_plan_ok(step, cluster, plans[EAGER])
    assert all(plans[EAGER].ops[n].device == plans["gpipe"].ops[n].device for n in plans["gpipe"].ops)  # same stages
    assert plans[EAGER].makespan < 0.95 * min(plans[s].makespan for s in SCHEDULES), \
        {s: p.makespan for s, p in plans.items()}


# ---------------------------------------------------------------- interleaved layouts

def test_interleaved_cut_goes_round_the_devices() -> None:
    equal = [[1.0] * 3 for _ in range(6)]  # six units of 1 s on any of three devices
    assert interleaved_cut(equal, [0, 1, 2], 2, 1.1) == [0, 1, 2, 0, 1, 2]
    assert interleaved_cut(equal, [0, 1, 2, 2, 1, 0], 2, 1.1) == [0, 1, 2, 2, 1, 0]
    assert interleaved_cut(equal, [0, 1, 2], 1, 1.1) == [0, 0, 1, 1, 2, 2]  # one chunk each: contiguous


def test_interleaved_cut_keeps_each_device_within_the_slack() -> None:
    assert interleaved_cut([[w] * 2 for w in (4.0, 1.0, 1.0, 1.0, 1.0)], [0, 1], 1, 1.0) == [0, 1, 1, 1, 1]
    assert interleaved_cut([[5.0] * 2, [5.0] * 2, [1.0] * 2], [0, 1], 1, 1.0) is None  # 6 s > 5.5 s anywhere
    assert interleaved_cut([[7.0] * 2, [1.0] * 2, [4.0] * 2], [0, 1], 1, 1.0) is None  # the first item too
    assert interleaved_cut([[0.0] * 2] * 3, [0, 1], 2, 1.1) == [0, 0, 0]  # no work: one chunk


def test_interleaved_layouts_are_distinct_up_to_renaming_alike_devices() -> None:
    equal = [[1.0] * 3 for _ in range(6)]
    alike = interleaved_layouts(equal, 3, alike=True)
    assert [devices for _, devices in alike] == [[0, 0, 1, 1, 2, 2], [0, 1, 2, 0, 1, 2], [0, 1, 2, 2, 1, 0]]
    assert [label for label, _ in alike] == ["3 chunks in round-robin order", "6 chunks in round-robin order",
                                             "5 chunks in snake order"]
    named = interleaved_layouts(equal, 3)  # devices that differ: filled from the end is another layout
    assert ("3 chunks in round-robin order from the end", [2, 2, 1, 1, 0, 0]) in named


def test_interleaved_backward_units_stay_with_their_layers() -> None:
    """Backward ops in units of their own (as in JAX steps) go with the run of layers they
    differentiate, not by device number: the layouts' real stage costs keep within the cut's
    slack. (Moved by device numbers, a round-robin layout over 3 devices put 28.4 of 37.2 ms of
    work on the last device.)"""
    from pesto_ir.frontends.json_graph import graph_from_json
    from pesto_ir.passes.placement.pipeline.stages import pipeline_units

    nodes, edges = [], []
    for i in range(12):
        nodes += [{"id": f"f{i}", "cost": 1e-3}, {"id": f"b{i}", "cost": 2e-3, "backward": True},
                  {"id": f"u{i}", "cost": 1e-4, "per_sample": False}]
        edges += [{"src": f"f{i}", "dst": f"b{i}", "bytes": 4096}, {"src": f"b{i}", "dst": f"u{i}", "bytes": 4096}]
        if i:
            edges += [{"src": f"f{i - 1}", "dst": f"f{i}", "bytes": 4096},
                      {"src": f"b{i}", "dst": f"b{i - 1}", "bytes": 4096}]
    step = rebatch(graph_from_json({"format": "pesto-graph/1", "name": "apart", "nodes": nodes, "edges": edges}), 8)
    cluster = v100s(3)
    units = pipeline_units(step, cluster)
    layouts = interleaved_layouts(units.weights(), 3, alike=True)
    assert any(int(label.split()[0]) > 3 for label, _ in layouts)
    for label, stage in layouts:
        costs = units.stages(step, stage, 3).costs
        assert max(costs) <= 1.25 * sum(costs) / 3 * (1 + 1e-9), (label, costs)
    plan = pipeline_plan(step, cluster, INTERLEAVED, OPTIONS)
    check_plan_ok(step, cluster, plan)


def test_bert24_interleaved_beats_contiguous_stages(bert24: Graph) -> None:
    """24 equal layers over 6 devices: contiguous stages hold 4 or 5 layers each (1.15 x the mean)
    and wait for the pipeline to fill and drain; layers dealt round the devices balance them and
    put every device's work early and late in the step. At 16 micro-batches: 1.141 x the bound
    against 1.309 (GPipe), 1.324 (eager)."""
    cluster = v100s(6)
    step = rebatch(bert24, 16)
    plans = {s: pipeline_plan(step, cluster, s, OPTIONS) for s in PIPELINE_SCHEDULES}
    plan = plans[INTERLEAVED]
    check_plan_ok(step, cluster, plan)
    assert plan.algorithm == INTERLEAVED and "chunks in" in plan.notes[-1]
    forward = [stage_index(plan, cluster, op.name) for op in step.ops
               if op.get("microbatch") == 0 and not is_backward(op) and op.producers()]
    runs = 1 + sum(1 for a, b in zip(forward, forward[1:]) if a != b)
    assert runs > len(cluster)  # some device holds several chunks
    assert plan.makespan < 0.9 * min(p.makespan for s, p in plans.items() if s != INTERLEAVED), \
        {s: p.makespan for s, p in plans.items()}


def test_interleaved_search_stops_at_its_deadline(gnmt_layer: Graph) -> None:
    """GNMT-8 over 6 devices: chunks of whole layers cannot balance the devices, moving the units
    at their edges can; with its deadline past, the search makes no move and keeps the fastest
    layout as cut (not justified), a valid (slower) plan; a deadline far off changes nothing."""

    step = rebatch(gnmt_layer, 4)
    cluster = v100s(6)
    moved = pipeline_plan(step, cluster, INTERLEAVED, OPTIONS)
    assert "units moved" in moved.notes[-1]
    cut = pipeline_plan(step, cluster, INTERLEAVED, OPTIONS, until=work.now())
    check_plan_ok(step, cluster, cut)
    assert "units moved" not in cut.notes[-1] and cut.makespan > moved.makespan
    later = pipeline_plan(step, cluster, INTERLEAVED, OPTIONS, until=work.now() + 3600)
    assert later.makespan == moved.makespan and later.notes == moved.notes
    eager = pipeline_plan(step, cluster, EAGER, OPTIONS)
    unjustified = pipeline_plan(step, cluster, EAGER, OPTIONS, until=work.now())
    check_plan_ok(step, cluster, unjustified)
    assert unjustified.makespan >= eager.makespan


def test_schedules_of_one_graph_share_its_units(gnmt_layer: Graph) -> None:
    """A `PipelineGraph` worked out once gives every schedule the plan it gives alone, and refuses
    another graph."""
    step = rebatch(gnmt_layer, 4)
    cluster = v100s(4)
    shared = PipelineGraph(step, cluster)
    for schedule in PIPELINE_SCHEDULES:
        alone = pipeline_plan(step, cluster, schedule, OPTIONS)
        together = pipeline_plan(step, cluster, schedule, OPTIONS, pipeline=shared)
        assert together.makespan == alone.makespan and together.ops == alone.ops, schedule
    with pytest.raises(ValueError, match="another graph"):
        pipeline_plan(rebatch(gnmt_layer, 2), cluster, "gpipe", OPTIONS, pipeline=shared)


def test_bert24_refused_with_more_stages_than_layers(bert24: Graph) -> None:
    with pytest.raises(PestoError, match="fewer than the 40 pipeline stages"):
        pipeline_plan(bert24, v100s(40), "gpipe", OPTIONS)
    with pytest.raises(PestoError, match="unknown pipeline schedule"):
        pipeline_plan(bert24, v100s(2), "zb-h1", OPTIONS)


# ---------------------------------------------------------------- a JAX-lowered GPT

@pytest.fixture(scope="module")
def gpt() -> Graph:
    """A 4-layer GPT training step (Adam), roofline-costed and rewritten into 8 micro-batches. The
    zoo's quick GPT has a batch of 2 and one layer, too small to pipeline over 4 stages."""
    zoo_jax = pytest.importorskip("bench.zoo_jax")
    from pesto_ir.frontends.jax import lower
    from pesto_ir.passmanager import PassContext, PassManager

    model = zoo_jax._gpt(zoo_jax.GptConfig(layers=4, d_model=64, heads=4, seq=32, batch=8, vocab=128))
    state = tuple(model.params for _ in range(zoo_jax.ADAM.slots))
    step = zoo_jax._train_step("gpt_pipeline", model.loss, zoo_jax.ADAM)
    graph = lower(step, model.params, state, *model.batch, param_argnums=(0, 1))
    graph = PassManager("annotate-costs{model=roofline}").run(
        graph, PassContext(cluster=Cluster.homogeneous(1, "h100"), quiet=True))
    return rebatch(graph, 8)


def test_gpt_1f1b_holds_less_memory_than_gpipe(gpt: Graph) -> None:
    cluster = Cluster.homogeneous(4, "h100")
    plans = {s: pipeline_plan(gpt, cluster, s, OPTIONS) for s in SCHEDULES}
    for plan in plans.values():
        check_plan_ok(gpt, cluster, plan)
    gpipe, one = plans["gpipe"].peak_memory, plans["1f1b"].peak_memory
    assert gpipe is not None and one is not None
    for d in cluster.names:
        assert one[d] <= gpipe[d], f"{d}: 1f1b {one[d]} > gpipe {gpipe[d]} bytes"
    assert max(one.values()) < max(gpipe.values())


@pytest.mark.slow
def test_gpt_eager_plan_is_a_valid_pipeline_no_slower_than_the_fixed_ones(gpt: Graph) -> None:
    """On a JAX training step (backward reads the forward pass) the eager schedule keeps the
    stages, passes the validator (memory included) and is not slower than GPipe or 1F1B here."""
    cluster = Cluster.homogeneous(4, "h100")
    plans = {s: pipeline_plan(gpt, cluster, s, OPTIONS) for s in PIPELINE_SCHEDULES}
    check_plan_ok(gpt, cluster, plans[EAGER])
    assert plans[EAGER].makespan <= min(plans[s].makespan for s in SCHEDULES) * (1 + 1e-9), \
        {s: p.makespan for s, p in plans.items()}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_gpt_stages_run_their_slots_in_schedule_order(gpt: Graph, schedule: str) -> None:
    cluster = Cluster.homogeneous(4, "h100")
    plan = pipeline_plan(gpt, cluster, schedule, OPTIONS)
    check_slot_order(gpt, plan, cluster, schedule, 8)


def test_gpt_optimizer_update_stays_with_its_layer(gpt: Graph) -> None:
    """The update of a weight (the ops outside the traced loss, which carry no `scope`) runs on a
    stage that reads the weight in its micro-batches, so optimizer state is not gathered on one
    device."""
    cluster = Cluster.homogeneous(4, "h100")
    plan = pipeline_plan(gpt, cluster, "1f1b", OPTIONS)
    readers: dict[str, set[str]] = defaultdict(set)
    for op in gpt.ops:
        for v in op.operands:
            if v.owner is None and v.param and op.get("microbatch") is not None:
                readers[v.name].add(plan.ops[op.name].device)
    checked = 0
    for v in gpt.params:
        for user in v.users():
            if v.name in readers and user.get("microbatch") is None and "scope" not in user.attrs:
                assert plan.ops[user.name].device in readers[v.name], (v.name, user.name)
                checked += 1
    assert checked >= 10


# ---------------------------------------------------------------- random layered cost graphs

@st.composite
def layered_steps(draw: st.DrawFn) -> tuple[Graph, int, int]:
    """A random layered training step (`strategies.layered_graphs`), micro-batched."""
    graph, layers = draw(layered_graphs())
    m = draw(st.integers(1, 5))
    return rebatch(graph, m), layers, m


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered_steps(), st.integers(1, 4), st.sampled_from(PIPELINE_SCHEDULES))
def test_random_layered_steps(step: tuple[Graph, int, int], n_devices: int, schedule: str) -> None:
    graph, layers, m = step
    cluster = Cluster.homogeneous(n_devices, "v100", latency=1e-6, bandwidth=1e10)
    if layers < n_devices:
        with pytest.raises(PestoError, match="fewer than the"):
            pipeline_plan(graph, cluster, schedule, OPTIONS)
        return
    plan = pipeline_plan(graph, cluster, schedule, OPTIONS)
    check_plan_ok(graph, cluster, plan)
    if schedule in SCHEDULES:
        check_slot_order(graph, plan, cluster, schedule, m)
    for op in graph.ops:  # a layer's update runs where its gradient is summed
        if op.name.startswith("u"):
            grad = f"b{op.name[1:]}" + (".mb0" if m > 1 else "")
            assert plan.ops[op.name].device == plan.ops[grad].device
    work = sum(pesto_ir.cost.lookup.op_cost(op, cluster.devices[0]) for op in graph.ops)
    assert plan.makespan >= work / n_devices * (1 - 1e-9)


def test_mixed_precision_weights_are_read_on_their_layers_stage_only() -> None:
    """A bf16 step casts every f32 master weight at its start, before the first layer: each cast
    belongs with the layer that reads it, so every weight matrix is read on one stage (its layer's
    forward, backward and update), not also on the first, where every cast used to land (42 of
    this step's 159 parameters were read on two stages; the first of alpa-gpt-39B's 16 stages held
    every layer's f32 weights, 56.5 GiB against 15.4). A bias at a stage boundary may still be
    read on two: its gradient sums the next stage's cotangent, and its update runs there."""
    llm_models = pytest.importorskip("bench.llm_models")
    from bench.zoo_jax_models import GptConfig
    from pesto_ir.passes.placement.pipeline.stages import split_stages
    from pesto_ir.passmanager import PassContext, PassManager

    step = llm_models.lower_gpt(GptConfig(4, 64, 4, 32, 4, 128), "bf16", "gpt_mixed", tied=False)
    cluster = Cluster.homogeneous(4, "h100")
    step = PassManager("annotate-costs{model=roofline}").run(step, PassContext(cluster=cluster, quiet=True))
    casts = [op for op in step.ops if op.opcode == "convert_element_type" and not op.producers()
             and op.operands[0].param]
    assert len(casts) >= 4 * 4, "the step casts each layer's weights"
    stage = split_stages(step, cluster).stage_of()
    read_on = {v.name: {stage[u.name] for u in v.users()} for v in step.inputs if v.param}
    twice = {name: s for name, s in read_on.items() if len(s) > 1}
    assert len(twice) <= len(cluster) - 1 and all(name.endswith((".b", ".bias")) for name in twice), twice
    assert set().union(*(s for name, s in read_on.items() if "blocks." in name)) == set(range(4)), \
        "every stage holds layers"


def test_cost_graphs_have_no_source_units(bert24: Graph) -> None:
    """A cost graph has no graph inputs, so nothing tells its weights from its data: none of its
    ops reads parameters only, and its stages are cut as before (by their readers' order)."""
    from pesto_ir.passes.placement.pipeline.stages import SOURCE, constant_ops, pipeline_units, weight_only_ops

    assert weight_only_ops(bert24, constant_ops(bert24)) == set()
    assert SOURCE not in pipeline_units(bert24, v100s(4)).kinds
