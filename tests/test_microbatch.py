"""The micro-batch / data-parallel rewrite (passes/microbatch.py): exact values, golden text,
refusals, and valid hybrid plans on random graphs."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pesto_ir
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost
from pesto_ir.ir.graph import Graph
from pesto_ir.jaxrt.interpreter import Interpreter, evaluate
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passes.rewrite.batch_axes import MicrobatchError, batch_spec
from pesto_ir.passes.rewrite.rebatch import rebatch
from pesto_ir.passes.rewrite.replicas import Strategy, as_hybrid, replica_graph, replica_groups, sub_cluster
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import Plan, read_plan_attrs
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util import work
from pesto_ir.util.errors import PassError, PestoError
from tests.strategies import graph_docs, roomy_memory

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "mlp_train_step.pir"
GOLDEN = Path(__file__).resolve().parent / "golden" / "rewrite"
UPDATE = bool(os.environ.get("PESTO_UPDATE_GOLDEN"))


def inputs_for(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    """Well-conditioned values: small positive floats (Adam's second moment stays positive) and
    token ids 0/1 (inside every vocabulary)."""
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        t = v.type
        if t.dtype.startswith(("i", "u")):
            out.append(rng.integers(0, 2, t.shape).astype(t.numpy_dtype))
        else:
            out.append(rng.uniform(0.01, 0.1, t.shape).astype(t.numpy_dtype))
    return out


def assert_close(expected: list[Any], got: list[Any]) -> None:
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=1e-6 * (np.max(np.abs(a)) + 1e-30))


def run_replicas(graph: Graph, inputs: list[np.ndarray], d: int) -> list[list[Any]]:
    """Every replica of a data-parallel graph in lockstep, each on its shard of the batch, the
    all-reduces summing (or maxing) across them: what the sharded executable computes."""
    spec_axes = {name: axis for name, axis in (batch_spec_axes(graph)).items()}
    interp = Interpreter(graph)
    envs: list[dict[Any, Any]] = []
    for r in range(d):
        env = {}
        for v, x in zip(graph.inputs, inputs):
            axis = spec_axes.get(v.name)
            if axis is not None:
                n = x.shape[axis] // d
                x = np.take(x, range(r * n, (r + 1) * n), axis=axis)
            env[v] = x
        envs.append(env)
    for op in graph.ops:
        if op.opcode == "all_reduce":
            combine = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op.get("reduction")]
            for v, res in zip(op.operands, op.results):
                total = np.asarray(envs[0][v])
                for env in envs[1:]:
                    total = combine(total, np.asarray(env[v]))
                for env in envs:
                    env[res] = total
            continue
        for env in envs:
            env.update(zip(op.results, interp.run_op(op, [env[v] for v in op.operands])))
    return [[env[v] for v in graph.outputs] for env in envs]


def batch_spec_axes(replica: Graph) -> dict[str, int]:
    """The batch axes of the replica graph's inputs (it keeps the source graph's attribute or
    default: every non-param input of rank >= 1 at axis 0)."""
    raw = replica.attrs.get("batch_inputs")
    if raw is not None:
        return dict(raw.value)
    return {v.name: 0 for v in replica.inputs if not v.param and getattr(v.type, "rank", 0) >= 1}


# ---------------------------------------------------------------- exact values

@pytest.mark.parametrize("m", [2, 4, 8])
def test_micro_batched_mlp_step_gives_the_whole_batch_gradient_step(m: int) -> None:
    graph = pesto_ir.load(MLP)
    args = inputs_for(graph)
    rewritten = rebatch(graph, m)
    assert_close(evaluate(graph, *args), evaluate(rewritten, *args))
    assert {op.get("microbatch") for op in rewritten.ops if "microbatch" in op.attrs} == set(range(m))


@pytest.mark.parametrize("d,m", [(2, 1), (2, 2), (4, 2)])
def test_data_parallel_replicas_all_reduce_to_the_whole_batch_step(d: int, m: int) -> None:
    graph = pesto_ir.load(MLP)
    args = inputs_for(graph, seed=1)
    expected = evaluate(graph, *args)
    replica = rebatch(graph, m, d, all_reduce_cost=lambda n: 1e-6)
    assert sum(op.opcode == "all_reduce" for op in replica.ops) == 5  # the loss' sum and four gradients
    for outputs in run_replicas(replica, args, d):
        assert_close(expected, outputs)


@pytest.mark.parametrize("name", ["mlp", "resnet", "gpt", "lstm_seq2seq"])
@pytest.mark.slow
def test_zoo_steps_micro_batch_exactly(name: str) -> None:
    from bench import zoo_jax

    graph = zoo_jax.lower_model(name, "quick")
    args = inputs_for(graph)
    assert_close(evaluate(graph, *args), evaluate(rebatch(graph, 2), *args))


@pytest.mark.parametrize("name", ["resnet", "multitower"])
@pytest.mark.slow
def test_zoo_replicas_give_the_whole_batch_step(name: str) -> None:
    """Batch norm's statistics are reductions over the batch: all-reduced, they are the whole
    batch's, as with jax.jit over a batch-sharded mesh; a mean's cotangent (made from no batch
    input, the same on every row) is sliced alike on every replica."""
    from bench import zoo_jax

    graph = zoo_jax.lower_model(name, "quick")
    args = inputs_for(graph, seed=2)
    replica = rebatch(graph, 1, 2, all_reduce_cost=lambda n: 1e-6)
    for outputs in run_replicas(replica, args, 2):
        assert_close(evaluate(graph, *args), outputs)


# ---------------------------------------------------------------- text

def test_rewritten_step_prints_as_golden() -> None:
    text = str(rebatch(pesto_ir.load(MLP), 2, 2, all_reduce_cost=lambda n: 2e-5 + n / 4.5e11))
    golden = GOLDEN / "mlp_train_step.d2m2.pir"
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()
    assert str(pesto_ir.parse(text)) == text  # and it parses back to itself


# ---------------------------------------------------------------- refusals

def test_a_batch_that_does_not_split_is_refused() -> None:
    with pytest.raises(MicrobatchError, match="batch of 64 does not split into 3 equal parts"):
        rebatch(pesto_ir.load(MLP), 3)


def test_an_op_that_mixes_samples_is_refused_with_its_name_and_place() -> None:
    text = """graph @g(%x: f32[8,4]) {
  %c = cumsum(%x) {axis = 0, reverse = false} : f32[8,4]
  return %c
}
"""
    with pytest.raises(MicrobatchError, match=r"op 'c' = cumsum \(.*:2.*\): it scans along the batch axis"):
        rebatch(pesto_ir.parse(text, "mix.pir"), 2)


def test_batch_inputs_attribute_chooses_the_axis() -> None:
    text = """graph @g(%x: f32[3,8], param %w: f32[3]) attributes {batch_inputs = {x = 1}} {
  %s = reduce_sum(%x) {axes = [1]} : f32[3]
  %y = mul(%s, %w) : f32[3]
  return %y
}
"""
    graph = pesto_ir.parse(text)
    assert batch_spec(graph).axes == {"x": 1}
    args = [np.arange(24, dtype=np.float32).reshape(3, 8), np.ones(3, np.float32)]
    assert_close(evaluate(graph, *args), evaluate(rebatch(graph, 4), *args))


def test_cost_graph_data_parallelism_needs_param_bytes() -> None:
    doc = {"format": "pesto-graph/1", "name": "g", "nodes": [{"id": "a", "cost": 1e-3}, {"id": "b", "cost": 1e-3}],
           "edges": [{"src": "a", "dst": "b", "bytes": 100}]}
    graph = pesto_ir.frontends.json_graph.graph_from_json(doc)
    with pytest.raises(MicrobatchError, match="no node declares param_bytes"):
        rebatch(graph, 1, 2)


def test_degrees_are_checked() -> None:
    graph = pesto_ir.load(MLP)
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(MicrobatchError, match="microbatches must be a whole number"):
            rebatch(graph, bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- cost graphs and plans

@st.composite
def hybrid_problems(draw: st.DrawFn) -> tuple[Graph, Cluster, Strategy]:
    doc = draw(graph_docs(max_ops=8, per_kind_costs=False))
    for node in doc["nodes"]:
        if draw(st.booleans()):
            node["param_bytes"] = draw(st.sampled_from((4, 1000, 10**6)))
    if not any("param_bytes" in n for n in doc["nodes"]):
        doc["nodes"][0]["param_bytes"] = 1000
    graph = pesto_ir.frontends.json_graph.graph_from_json(doc)
    d = draw(st.sampled_from((1, 2, 4)))
    per = draw(st.sampled_from((1, 2)))
    m = draw(st.sampled_from((1, 2, 3, 8)))
    cluster = Cluster.homogeneous(d * per, "v100", latency=1e-5, bandwidth=5e10)
    return graph, cluster.with_memory(roomy_memory(graph) * 2 + 10**7), Strategy(d, m)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(hybrid_problems(), st.sampled_from(("m-etf", "m-sct", "m-topo")))
def test_hybrid_plans_of_random_graphs_are_valid(problem: tuple[Graph, Cluster, Strategy], algo: str) -> None:
    graph, cluster, strategy = problem
    replica = replica_graph(graph, cluster, strategy)
    sub = sub_cluster(cluster, replica_groups(cluster, strategy.data_parallel)[0])
    plan = as_hybrid(replica, cluster, check_plan(replica, sub, ALGORITHMS[algo].run(replica, sub, PlaceOptions())), strategy)
    assert plan.parallelism is not None and plan.parallelism.microbatches == strategy.microbatches
    assert set(plan.peak_memory or {}) == set(cluster.names)
    if strategy == Strategy(1, 1):
        return
    # the work is the whole batch's: copies share the op's cost, colocated
    dev = cluster.devices[0]
    work = sum(op_cost(op, dev) for op in graph.ops)
    copies = sum(op_cost(op, dev) for op in replica.ops if "microbatch" in op.attrs)
    assert copies * strategy.data_parallel == pytest.approx(work, rel=1e-9, abs=1e-15)
    for op in replica.ops:
        if "microbatch" in op.attrs:
            assert plan.ops[op.name].device == plan.ops[f"{op.name.rsplit('.mb', 1)[0]}.mb0"].device
    if strategy.data_parallel > 1:
        assert len(plan.collectives) == sum(op.opcode == "all_reduce" for op in replica.ops) > 0


def hybrid_run(pipeline: str, k: int = 4) -> tuple[Graph, Plan]:
    """The MLP step through `pipeline` on k H100s: the graph it leaves and its hybrid plan."""
    out = PassManager(pipeline).run(pesto_ir.load(MLP), PassContext(cluster=Cluster.homogeneous(k, "h100"), quiet=True))
    plan = read_plan_attrs(out)
    assert plan is not None and plan.parallelism is not None
    return out, plan


def test_place_pass_with_fixed_degrees_records_a_hybrid_plan() -> None:
    out, plan = hybrid_run("annotate-costs,place{algo=m-etf data-parallel=2 microbatches=2}")
    assert (plan.parallelism.data_parallel, plan.parallelism.microbatches) == (2, 2)
    assert plan.parallelism.replicas == (("gpu0", "gpu1"), ("gpu2", "gpu3"))
    assert out.attrs["microbatched"].value == {"data_parallel": 2, "microbatches": 2}
    round_trip = pesto_ir.schedule.plan.Plan.from_json(plan.to_json())
    assert round_trip.parallelism == plan.parallelism and len(round_trip.collectives) == len(plan.collectives)


def test_place_auto_keeps_the_fastest_strategy_and_says_what_it_tried() -> None:
    graph = pesto_ir.load(MLP)
    ctx = PassContext(cluster=Cluster.homogeneous(2, "h100"), quiet=True)
    out = PassManager("annotate-costs,place{algo=auto time-limit=4}").run(graph, ctx)
    plan = read_plan_attrs(out)
    assert plan is not None
    note = next(n for n in plan.notes if n.startswith("hybrid search"))
    assert "d=1 m=1" in note and "d=2 m=1" in note
    times = [float(t) for t in __import__("re").findall(r"d=\d+ m=\d+ ([\d.]+) us", note)]
    chosen = plan.makespan * 1e6
    assert times and chosen <= min(times) * (1 + 1e-3)


def test_screening_a_pipeline_keeps_its_eager_schedule_where_faster(resnet50_layer: Graph) -> None:
    """The MSR ResNet-50 layer graph at k = 6, m = 8: the eager schedule of the pipeline's stages
    takes 112 ms where GPipe takes 127; screened together, the candidate keeps the eager plan."""
    from pesto_ir.passes.placement.pipeline.schedules import EAGER
    from pesto_ir.passes.placement.search.screening import screen
    from pesto_ir.passes.placement.search.strategies import Candidate

    cluster = Cluster.homogeneous(6, "v100", memory=16 * 2**30, latency=1e-5, bandwidth=50e9)
    found = screen(resnet50_layer, cluster, Candidate(Strategy(1, 8)), PlaceOptions(quiet=True),
                   lambda *a: pytest.fail("no heuristics here"), ("gpipe", EAGER))
    assert found.plan is not None and found.engine == EAGER
    assert found.plan.makespan < 0.95 * pipeline_plan_of(found.source, cluster, "gpipe").makespan


def pipeline_plan_of(graph: Graph | None, cluster: Cluster, schedule: str) -> Plan:
    from pesto_ir.passes.placement.pipeline.schedules import pipeline_plan

    assert graph is not None
    return pipeline_plan(graph, cluster, schedule, PlaceOptions(quiet=True))


@pytest.mark.slow
def test_place_auto_screens_the_eager_schedule_of_its_pipelines(resnet50_layer: Graph) -> None:
    """The search runs the eager schedule with the first fixed schedule it builds on a replica
    graph: on the ResNet-50 layer graph at k = 6 it chooses m = 32, 87.7 ms, where 1F1B takes 91.5.
    (The 32-micro-batch graph is too large to refine, and the search ends within seconds: the
    generous limit keeps a slow machine from cutting the screening short.)"""
    cluster = Cluster.homogeneous(6, "v100", memory=16 * 2**30, latency=1e-5, bandwidth=50e9)
    ctx = PassContext(cluster=cluster, quiet=True)
    plan = read_plan_attrs(PassManager("place{algo=auto data-parallel=1 microbatches=auto time-limit=60}")
                           .run(resnet50_layer, ctx))
    assert plan is not None and plan.parallelism is not None
    step = replica_graph(resnet50_layer, cluster, Strategy(1, plan.parallelism.microbatches))
    fixed = min(pipeline_plan_of(step, cluster, s).makespan for s in ("gpipe", "1f1b"))
    assert plan.makespan < fixed, (plan.parallelism, plan.makespan, fixed)


@pytest.mark.parametrize("seconds_left", [0.05, 60.0])
def test_screening_keeps_time_to_refine_the_one_batch_plan_that_leads(resnet50_layer: Graph,
                                                                       seconds_left: float) -> None:
    """With the one-batch plan screened and fastest, and only `REFINE_RESERVE` and a little more
    left, the pipeline model (guessed at 0.18 s: 708 ops) is not built: the time goes to refining
    that plan. With time, it is."""
    from pesto_ir.passes.placement.search.screening import REFINE_RESERVE, _screen_pipelines, screen
    from pesto_ir.passes.placement.search.screening_rates import Rates, ScreeningTimes
    from pesto_ir.passes.placement.search.strategies import Candidate
    from pesto_ir.passes.rewrite.replicas import ONE_BATCH

    cluster = Cluster.homogeneous(4, "v100", memory=16 * 2**30, latency=1e-5, bandwidth=50e9)
    options = PlaceOptions(quiet=True)
    def m_etf(g: Graph, c: Cluster, o: PlaceOptions) -> Plan:
        return check_plan(g, c, ALGORITHMS["m-etf"].run(g, c, o))

    one_batch = screen(resnet50_layer, cluster, Candidate(ONE_BATCH), options, m_etf)
    assert one_batch.plan is not None, one_batch.why_not
    hard = work.now() + REFINE_RESERVE + seconds_left
    tried = _screen_pipelines(resnet50_layer, cluster, [Strategy(1, 2), Strategy(1, 4)], options, m_etf,
                              times=ScreeningTimes(hard, hard), stop=hard, last=True, before=[one_batch], log=options,
                              rates=Rates())
    kept = ["kept for refining the one-batch plan" in (c.why_not or "") for c in tried]
    assert kept == [seconds_left < 1] * 2, [c.why_not for c in tried]


def test_build_cost_counts_each_schedule_run() -> None:
    from pesto_ir.passes.placement.pipeline.schedules import (
        JUSTIFIED_LAYOUTS,
        JUSTIFY_WORTH,
        LAYOUT_WORTH,
        SIMULATED_LAYOUTS,
    )
    from pesto_ir.passes.placement.search.screening_rates import BuildCost
    from pesto_ir.passes.placement.search.strategies import Candidate

    cost = BuildCost(rewrite=1e-4, ops_per_microbatch=10, once_ops=5)
    c = Candidate(Strategy(1, 4))  # not built: 5 + 4 x 10 ops to rewrite, then simulate
    assert cost.estimate(c, ("gpipe",)) == pytest.approx(45 * 1e-4 + 45 * 2e-4)
    # the eager schedule is simulated and justified (one round, cut short by a deadline)
    eager = LAYOUT_WORTH + JUSTIFY_WORTH
    assert cost.estimate(c, ("gpipe", "eager")) == pytest.approx(45 * 1e-4 + (1 + eager) * 45 * 2e-4)
    c.source = pesto_ir.load(MLP)
    n = len(c.source.ops)
    cost.learn(c, 0.1 * (1 + eager), True, ("gpipe", "eager"))  # 0.1 s a simulation of a fixed schedule
    assert cost.estimate(c, ("1f1b",)) == pytest.approx(0.1)
    assert cost.estimate(c, ("heuristics",)) == pytest.approx(0.3)
    # the interleaved layouts: each simulated, the fastest justified, as a deadline cuts them short
    assert cost.estimate(c, ("interleaved",)) == \
        pytest.approx(0.1 * (SIMULATED_LAYOUTS * LAYOUT_WORTH + JUSTIFIED_LAYOUTS * JUSTIFY_WORTH))
    cost.learn(c, 1.0 + 1e-4 * n, False, ("gpipe",))  # with the rewrite: that part is not the schedule's
    assert cost.estimate(c, ("gpipe",)) == pytest.approx(1.0)


def test_eager_schedules_run_as_far_as_the_time_left_allows() -> None:
    """After the fixed schedule timed a graph: both eager schedules if they fit, the interleaved
    layouts first (usually the faster), else those alone, else the eager schedule of the fixed
    stages, else none; each counted as a deadline cuts it short (one justification round). Once
    one has run, the other runs if it still fits."""

    from pesto_ir.passes.placement.pipeline.schedules import EAGER, INTERLEAVED, schedule_worth
    from pesto_ir.passes.placement.search.screening import _eager_schedules_that_fit
    from pesto_ir.passes.placement.search.screening_rates import BuildCost
    from pesto_ir.passes.placement.search.strategies import Candidate

    c = Candidate(Strategy(1, 4))
    c.source = pesto_ir.load(MLP)
    cost = BuildCost(rewrite=1e-4, schedule=1.0 / len(c.source.ops))  # a fixed schedule takes 1 s
    eager, interleaved = schedule_worth(EAGER), schedule_worth(INTERLEAVED)
    assert interleaved > eager  # else the order below would not be tested
    for seconds, expected in [(eager + interleaved + 0.5, (INTERLEAVED, EAGER)), (interleaved + 0.25, (INTERLEAVED,)),
                              (eager + 0.25, (EAGER,)), (eager - 0.25, ())]:
        assert _eager_schedules_that_fit(c, cost, work.now() + seconds, [INTERLEAVED, EAGER]) == expected, \
            seconds
    assert _eager_schedules_that_fit(c, cost, work.now() + interleaved + 0.25, [EAGER]) == (EAGER,)
    assert _eager_schedules_that_fit(c, cost, work.now() + interleaved + eager + 0.5, [INTERLEAVED]) == \
        (INTERLEAVED,)
    assert _eager_schedules_that_fit(c, cost, work.now() + 3600, []) == ()


@pytest.mark.parametrize("k,half_wins", [(4, False), (8, True)])
def test_a_pipeline_over_half_the_devices_is_kept_where_faster(gnmt_layer: Graph, k: int, half_wins: bool) -> None:
    """The best pipeline's schedule is tried over the first half of the devices: a plan on fewer
    devices is a plan on all of them, so the search keeps whichever is faster, and the kept plan
    is valid and uses only the devices it says. GNMT's layers over 1 GB/s links: 8 stages send
    more than they gain, 4 do not."""
    from pesto_ir.passes.placement.pipeline.schedules import pipeline_plan
    from pesto_ir.passes.placement.search.screening import _on_fewer_devices
    from pesto_ir.passes.placement.search.screening_rates import BuildCost, Rates
    from pesto_ir.passes.placement.search.strategies import Candidate

    cluster = Cluster.homogeneous(k, "v100", latency=1e-5, bandwidth=1e9)
    strategy = Strategy(1, 4)
    source = rebatch(gnmt_layer, 4)
    whole = as_hybrid(source, cluster, pipeline_plan(source, cluster, "gpipe", PlaceOptions(quiet=True)), strategy)
    half = sub_cluster(cluster, cluster.names[:k // 2])
    alone = as_hybrid(source, cluster, pipeline_plan(source, half, "gpipe", PlaceOptions(quiet=True)), strategy)
    assert (alone.makespan < whole.makespan) == half_wins
    c = Candidate(strategy, graph=source, source=source, plan=whole, engine="gpipe")
    options = PlaceOptions(quiet=True)
    _on_fewer_devices(cluster, c, options, BuildCost(rewrite=1e-6, schedule=1e-7), work.now() + 3600,
                      options, Rates())
    assert c.plan is not None and c.plan.makespan == min(whole.makespan, alone.makespan)
    check_plan(source, cluster, c.plan)
    used = {slot.device for slot in c.plan.ops.values()}
    assert used == set(half.names if alone.makespan < whole.makespan else cluster.names)
    assert c.plan.devices == cluster.names


@pytest.mark.parametrize("options,message", [
    ("microbatches=0", "microbatches must be from 1"),
    ("data-parallel=x", "data-parallel must be a whole number or auto"),
])
def test_place_degree_options_are_checked(options: str, message: str) -> None:
    with pytest.raises(PestoError, match=message):
        PassManager(f"place{{{options}}}")


def test_data_parallel_that_does_not_divide_the_devices_is_refused() -> None:
    graph = pesto_ir.load(MLP)
    ctx = PassContext(cluster=Cluster.homogeneous(4, "h100"), quiet=True)
    with pytest.raises(PassError) as e:
        PassManager("annotate-costs,place{algo=m-etf data-parallel=3 microbatches=1}").run(graph, ctx)
    assert "data-parallel 3 does not divide the 4 devices" in str(e.value.cause)


def test_microbatch_pass_then_place_plans_the_rewritten_replica() -> None:
    out, plan = hybrid_run("microbatch{microbatches=2 data-parallel=2},annotate-costs,place{algo=m-sct}")
    ctx = PassContext(cluster=Cluster.homogeneous(4, "h100"), quiet=True)
    assert (plan.parallelism.data_parallel, plan.parallelism.microbatches) == (2, 2)
    assert {c.op for c in plan.collectives} == {op.name for op in out.ops if op.opcode == "all_reduce"}
    with pytest.raises(PassError) as e:
        PassManager("microbatch{microbatches=2},annotate-costs,place{algo=m-sct microbatches=4}").run(
            pesto_ir.load(MLP), ctx)
    assert "already one replica's micro-batched step" in str(e.value.cause)


def test_when_no_strategy_fits_the_error_lists_each_ones_reason() -> None:
    graph = pesto_ir.load(MLP)
    ctx = PassContext(cluster=Cluster.homogeneous(2, "h100", memory=64 * 2**10), quiet=True)
    with pytest.raises(PassError) as e:
        PassManager("annotate-costs,place{algo=auto time-limit=2}").run(graph, ctx)
    message = str(e.value.cause)  # the memory floor rules every strategy out before any is built
    assert message.startswith("no strategy gave a plan: none can fit in memory; d=1 m=1: not screened: it cannot fit")
    assert "d=2 m=1: " in message and "over the 64 KiB it has" in message


def test_a_clone_prints_the_same_and_changes_alone() -> None:
    graph = rebatch(pesto_ir.load(MLP), 2, 2, all_reduce_cost=lambda n: 1e-5)
    twin = graph.clone()
    assert twin.structurally_equal(graph) and str(twin) == str(graph)
    twin.ops[0].set("label", "changed")
    assert not twin.structurally_equal(graph) and "label" not in graph.ops[0].attrs
    assert all(a is not b for a, b in zip(twin.ops, graph.ops))


# ---------------------------------------------------------------- cases found in review

def _lowered(fn: Any, *args: Any, **kw: Any) -> Graph:
    from pesto_ir.frontends.jax import lower

    return lower(fn, *args, **kw)


def test_replicas_refuse_a_per_sample_value_made_from_no_batch_input() -> None:
    """Every replica runs one graph: rows of a value made without the batch (a position weight
    over the batch) would be replica 0's on all of them, so it is refused; micro-batches alone
    (one replica) slice it exactly."""
    import jax.numpy as jnp

    def loss(w: Any, x: Any) -> Any:
        return jnp.sum(jnp.sum(jnp.tanh(x @ w), 1) * jnp.arange(8.0))

    graph = _lowered(loss, np.ones((3, 2), np.float32), np.ones((8, 3), np.float32), param_argnums=0)
    with pytest.raises(MicrobatchError, match="made from no batch input"):
        rebatch(graph, 1, 2)
    args = inputs_for(graph)
    assert_close(evaluate(graph, *args), evaluate(rebatch(graph, 2), *args))


def test_scatter_with_whole_updates_slices_them_alike() -> None:
    """A histogram of per-sample labels adds whole-batch ones: each micro-batch adds its own rows."""
    import jax.numpy as jnp

    def hist(y: Any, ones: Any) -> Any:
        return jnp.zeros(5).at[y].add(ones)

    graph = _lowered(hist, np.array([0, 1, 1, 4, 2, 2, 2, 3], np.int32), np.ones(8, np.float32),
                     batch_argnums=0)
    args = [np.array([0, 1, 1, 4, 2, 2, 2, 3], np.int32), np.arange(8, dtype=np.float32)]
    assert_close(evaluate(graph, *args), evaluate(rebatch(graph, 2), *args))


@pytest.mark.parametrize("loss", ["take", "optax"])
@pytest.mark.slow
def test_a_window_that_takes_the_batch_whole_splits_with_it(loss: str) -> None:
    """`jnp.take(h, 0, axis=-1)` gathers a window that takes the batch axis whole, and its transpose
    scatter-adds one (optax's integer-label cross-entropy makes both): each copy takes its own rows,
    with slice sizes for them. The cross-entropy's scatter-add is of a mean's cotangent, made from no batch
    input but the same on every row, so replicas slice it alike."""
    import jax
    import jax.numpy as jnp
    import optax

    def error(h: Any, y: Any) -> Any:
        if loss == "take":
            return jnp.mean((jnp.take(h, 0, axis=-1) - y) ** 2)  # h[..., 0] is a slice, this a gather
        return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()

    def step(w: Any, x: Any, y: Any) -> Any:
        value, grad = jax.value_and_grad(lambda w: error(jnp.tanh(x @ w), y))(w)
        return w - 0.1 * grad, value

    y = np.ones((8, 4), np.float32 if loss == "take" else np.int32)
    graph = _lowered(step, np.ones((3, 5), np.float32), np.ones((8, 4, 3), np.float32), y, param_argnums=0)
    args = inputs_for(graph, seed=3)
    expected = evaluate(graph, *args)
    rewritten = rebatch(graph, 4)
    assert_close(expected, evaluate(rewritten, *args))
    assert (2, 4, 1) in {tuple(op.get("slice_sizes")) for op in rewritten.ops if op.opcode == "gather"}
    for outputs in run_replicas(rebatch(graph, 2, 2), args, 2):
        assert_close(expected, outputs)


@pytest.mark.parametrize("pick, message", [
    ("rows", r"op 'gather' = gather \(.*\): it indexes into the batch axis 0"),
    ("window", r"op 'gather' = gather \(.*\): its window takes 3 of the 8 samples along the batch axis 0, not all"),
    ("scatter", r"op 'scatter-add' = scatter-add \(.*\): it indexes into the batch axis 0"),
])
def test_a_window_that_takes_part_of_the_batch_is_refused(pick: str, message: str) -> None:
    """Rows picked by index, a window over some of the samples, or updates added into some rows
    would be the same rows of every micro-batch: refused, with the op and its place."""
    import jax.numpy as jnp
    from jax import lax

    def fwd(w: Any, x: Any) -> Any:
        h = jnp.tanh(x @ w)
        if pick == "rows":
            return h[jnp.array([0, 2])]
        if pick == "scatter":
            return jnp.zeros((16, 3)).at[:8].add(h)
        dims = lax.GatherDimensionNumbers(offset_dims=(0,), collapsed_slice_dims=(1,), start_index_map=(1,))
        return lax.gather(h, jnp.array([1]), dims, slice_sizes=(3, 1))

    graph = _lowered(fwd, np.ones((3, 3), np.float32), np.ones((8, 3), np.float32), param_argnums=0)
    with pytest.raises(pesto_ir.PestoError, match=message):
        rebatch(graph, 2)


def test_a_reshape_that_transposes_first_is_refused() -> None:
    import jax
    import jax.numpy as jnp

    def fwd(w: Any, x: Any) -> Any:
        return jax.lax.reshape(jnp.tanh(x @ w), (12,), dimensions=(1, 0))

    graph = _lowered(fwd, np.ones((3, 3), np.float32), np.ones((4, 3), np.float32), param_argnums=0)
    with pytest.raises(MicrobatchError, match="transposes before it reshapes"):
        rebatch(graph, 2)


def test_copies_of_a_reduction_over_the_batch_share_its_cost() -> None:
    graph = pesto_ir.load(MLP)
    for op in graph.ops:
        op.attrs["cost"] = pesto_ir.ir.attributes.DurationAttr(1e-3)
    replica = rebatch(graph, 4, 2, all_reduce_cost=lambda n: 1e-5)
    assert replica.op("g_w1.mb0").get("cost") == pytest.approx(1e-3 / 8)
    assert replica.op("h_mm.mb3").get("cost") == pytest.approx(1e-3 / 8)


def test_a_strategy_keeps_the_plan_of_a_heuristic_that_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """Screening tries m-ETF and m-SCT on a replica: one failing (out of memory, say) does not
    drop the strategy when the other gives a plan."""
    from pesto_ir.passes.placement.common import PlacementError
    from pesto_ir.passes.placement.heuristics import portfolio

    def fails(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Any:
        raise PlacementError("m-etf: out of memory (for the test)")

    monkeypatch.setitem(portfolio.HEURISTICS, "m-etf", fails)
    _, plan = hybrid_run("annotate-costs,place{algo=auto time-limit=3 data-parallel=2 microbatches=auto}")
    note = next(n for n in plan.notes if n.startswith("hybrid search"))
    assert re.search(r"d=2 m=1 [\d.]+ us", note), note
