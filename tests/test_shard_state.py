"""Sharded optimizer state (ZeRO-1, `passes/rewrite/shard_state.py`): each data-parallel replica holds and
updates 1/d of the optimizer state. The rewrite is checked on its own (what becomes a block, a
reduce-scatter, an all-gather), for memory (the plan's peaks), in the search (`optimizer-state=auto`
shards only where the whole state gives no plan) and end to end against `jax.jit` (the executable
and the emitted module)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pesto_ir
from pesto_ir.backends.python_emit import emit_python
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.jax import lower_function
from pesto_ir.ir.types import TensorType
from pesto_ir.ir.verifier import verify
from pesto_ir.passes.microbatch import MicrobatchPass
from pesto_ir.passes.rewrite.rebatch import rebatch
from pesto_ir.passes.rewrite.shard_state import shard_optimizer_state
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import read_plan_attrs
from pesto_ir.util.errors import PestoError

BATCH = 16
RTOL, ATOL = 2e-5, 2e-6


def _loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] - y) ** 2)


def adam_step(params: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
    """An Adam-like step (two moments, no bias correction): the state the rewrite shards."""
    m, v = state
    value, g = jax.value_and_grad(_loss)(params, x, y)
    m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
    v = jax.tree_util.tree_map(lambda v, g: 0.99 * v + 0.01 * g * g, v, g)
    params = jax.tree_util.tree_map(lambda p, m, v: p - 0.01 * m / (jnp.sqrt(v) + 1e-8), params, m, v)
    return params, (m, v), value


def mlp_adam(width: int = 24, inputs: int = 12) -> tuple[Any, Any, jax.Array, jax.Array]:
    k = jax.random.split(jax.random.key(0), 4)
    params = {"w1": 0.3 * jax.random.normal(k[0], (inputs, width)), "b1": jnp.zeros(width),
              "w2": 0.3 * jax.random.normal(k[1], (width, 4))}
    state = (jax.tree_util.tree_map(jnp.zeros_like, params),
             jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.01), params))
    x = jax.random.normal(k[2], (BATCH, inputs))
    return params, state, x, jnp.sin(x[:, :4])


def _close(got: Any, want: Any) -> None:
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)


def _replica_graph(d: int, m: int = 1, width: int = 24) -> pesto_ir.Graph:
    params, state, x, y = mlp_adam(width)
    graph = lower_function(adam_step, params, state, x, y, param_argnums=(0, 1)).graph
    return rebatch(graph, m, d)


# ---------------------------------------------------------------- the rewrite

def test_state_becomes_blocks_gradients_reduce_scatter_and_new_parameters_are_gathered() -> None:
    graph = _replica_graph(d=2)
    whole = {v.name: v.type for v in graph.inputs}
    done = shard_optimizer_state(graph, 2)
    verify(graph)
    state = [v for v in graph.inputs if v.name.startswith("state")]
    assert state and set(done.inputs) == {v.name for v in state}
    for v in state:  # each replica holds 1/2 of every moment, along the axis recorded
        axis = done.inputs[v.name]
        assert isinstance(v.type, TensorType) and v.type.shape[axis] * 2 == whole[v.name].shape[axis]  # type: ignore[union-attr]
    params = [v for v in graph.inputs if v.name.startswith("params")]
    assert all(v.type == whole[v.name] for v in params)  # the forward pass reads them whole
    opcodes = [op.opcode for op in graph.ops]
    # every gradient is scattered where it was all-reduced: the weights' through a transpose, the
    # bias's through a reshape and a sum over an axis of size 1
    assert opcodes.count("reduce_scatter") == 3 and "all_reduce" in opcodes  # the loss's stays
    # every new parameter is put back together once; the new moments stay sharded
    assert opcodes.count("all_gather") == len(params)
    gathered = {op.result.name for op in graph.ops if op.opcode == "all_gather"}
    outputs = graph.outputs
    assert {v.name for v in outputs[:len(params)]} == gathered
    sharded_out = graph.attrs["sharded_outputs"].value
    assert sorted(int(k) for k in sharded_out) == list(range(len(params), 3 * len(params)))


def test_state_of_an_axis_that_does_not_split_stays_whole() -> None:
    """Width 5 over 2 replicas: the bias moments [5] have no axis of even size and stay whole; the
    weights' moments ([12, 5], [5, 4]) split along their first even axis."""
    graph = _replica_graph(d=2, width=5)
    done = shard_optimizer_state(graph, 2)
    verify(graph)
    assert all("b1" not in name for name in done.inputs)
    assert any("b1" in name for name in done.kept) and all("splits into 2" in why for why in done.kept.values())
    assert {name.split(".")[-1] for name in done.inputs} == {"w1", "w2"}


def test_parameters_computed_on_elementwise_before_the_forward_pass_are_not_state() -> None:
    """`s * 2` is elementwise on the parameter's shape, but leads to the forward pass (a broadcast):
    `s` stays whole, while its moments, which only the update reads, are sharded."""
    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((jnp.tanh(x @ p["w"]) * (p["s"] * 2.0) - y) ** 2)

    def step(params: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
        value, g = jax.value_and_grad(loss)(params, x, y)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, state, g)
        return jax.tree_util.tree_map(lambda p, m: p - 0.1 * m, params, m), m, value

    params = {"w": jnp.ones((6, 4)), "s": jnp.ones(4)}
    graph = rebatch(lower_function(step, params, params, jnp.ones((8, 6)), jnp.ones((8, 4)),
                                   param_argnums=(0, 1)).graph, 1, 2)
    done = shard_optimizer_state(graph, 2)
    verify(graph)
    assert sorted(done.inputs) == ["state.s", "state.w"]
    assert "params.s" not in done.kept  # not state at all: never a candidate


def test_a_step_without_optimizer_state_is_refused_with_a_reason() -> None:
    def sgd(w: jax.Array, x: jax.Array) -> Any:
        value, g = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * g, value

    graph = lower_function(sgd, jnp.ones((4, 2)), jnp.ones((8, 4)), param_argnums=(0,)).graph
    with pytest.raises(PestoError, match="has no optimizer state to shard"):
        MicrobatchPass(microbatches=1, data_parallel=2, optimizer_state="sharded").run(graph, PassContext(quiet=True))


def test_sharding_needs_replicas_and_a_known_setting() -> None:
    graph = lower_function(adam_step, *mlp_adam(), param_argnums=(0, 1)).graph
    with pytest.raises(PestoError) as caught:
        PassManager("annotate-costs{model=roofline},place{algo=m-etf data-parallel=1 optimizer-state=sharded}",
                    verify_each=False).run(graph, PassContext(cluster=Cluster.homogeneous(2, "cpu"), quiet=True))
    assert "nothing to split it across" in str(caught.value.__cause__)
    with pytest.raises(PestoError, match="optimizer-state must be"):
        MicrobatchPass(optimizer_state="zero")


# ---------------------------------------------------------------- plans and memory

def _placed(d: int, state: str, memory: float | None = None, microbatches: str = "1") -> pesto_ir.Graph:
    graph = lower_function(adam_step, *mlp_adam(64), param_argnums=(0, 1)).graph
    cluster = Cluster.homogeneous(d, "cpu", memory=memory)
    return PassManager(f"annotate-costs{{model=roofline}},place{{algo=m-etf data-parallel={d} "
                       f"microbatches={microbatches} optimizer-state={state}}},expand",
                       verify_each=False).run(graph, PassContext(cluster=cluster, quiet=True))


def test_a_sharded_plan_holds_less_per_device_and_lists_its_collectives() -> None:
    whole, sharded = read_plan_attrs(_placed(4, "replicated")), read_plan_attrs(_placed(4, "sharded"))
    assert whole is not None and sharded is not None
    assert whole.parallelism is not None and whole.parallelism.optimizer_state == "replicated"
    assert sharded.parallelism is not None and sharded.parallelism.optimizer_state == "sharded"
    assert sharded.to_json()["parallelism"]["optimizer_state"] == "sharded"
    assert "optimizer_state" not in whole.to_json()["parallelism"]  # plans without it read as before
    assert whole.peak_memory is not None and sharded.peak_memory is not None
    # the moments of the two weights (12x64 and 64x4 floats, two of each) drop to a quarter
    moments = 2 * 4 * (12 * 64 + 64 * 4 + 64)
    assert max(sharded.peak_memory.values()) <= max(whole.peak_memory.values()) - moments * 3 // 4 + 4096
    kinds = {c.kind for c in sharded.collectives}
    assert {"reduce_scatter", "all_gather"} <= kinds
    assert all(len(c.devices) == 4 for c in sharded.collectives)


@pytest.mark.parametrize("n, winner", [(1024, "replicated"), (4096, "sharded")])
def test_auto_keeps_the_faster_state_for_one_device_replicas(n: int, winner: str) -> None:
    """With room for everything, one-device replicas are screened with the state whole and sharded,
    and the faster is kept: on 4 H100s, the whole state for an n x n layer of n = 1024 (the
    reduce-scatters and all-gathers add ring latency that the smaller update does not repay),
    sharded for n = 4096 (each replica updates a quarter of 4 x 64 MiB of weights and moments)."""
    s = jax.ShapeDtypeStruct
    params = {"w1": s((n, n), jnp.float32), "b1": s((n,), jnp.float32), "w2": s((n, 4), jnp.float32)}
    graph = lower_function(adam_step, params, (params, params), s((16, n), jnp.float32), s((16, 4), jnp.float32),
                           param_argnums=(0, 1)).graph

    def plan(state: str, microbatches: str = "1") -> Any:
        placed = PassManager(f"annotate-costs{{model=roofline}},place{{algo=m-etf data-parallel=4 "
                             f"microbatches={microbatches} optimizer-state={state}}},expand", verify_each=False).run(
            graph.clone(), PassContext(cluster=Cluster.homogeneous(4, "h100"), quiet=True))
        found = read_plan_attrs(placed)
        assert found is not None and found.parallelism is not None
        return found

    roomy, whole, sharded = plan("auto", "auto"), plan("replicated"), plan("sharded")
    faster = min((whole, sharded), key=lambda p: p.makespan)
    assert faster.parallelism.optimizer_state == winner
    assert roomy.makespan <= faster.makespan * (1 + 1e-9)
    assert roomy.parallelism.optimizer_state == winner


def test_auto_shards_the_state_where_the_whole_state_does_not_fit() -> None:
    """With device memory between the sharded and the replicated plans' peaks, the search shards it."""
    whole = read_plan_attrs(_placed(2, "replicated"))
    sharded = read_plan_attrs(_placed(2, "sharded"))
    assert whole is not None and sharded is not None and whole.peak_memory and sharded.peak_memory
    between = (max(whole.peak_memory.values()) + max(sharded.peak_memory.values())) / 2
    with pytest.raises(PestoError):
        _placed(2, "replicated", memory=between)
    for microbatches in ("auto", "1"):  # screened, and a fixed strategy (not screened)
        tight = read_plan_attrs(_placed(2, "auto", memory=between, microbatches=microbatches))
        assert tight is not None and tight.parallelism is not None
        assert tight.parallelism.optimizer_state == "sharded"
        why = ("the whole optimizer state gives no plan", "d=2 m=1 is predicted to peak at")
        assert any(w in note for note in tight.notes for w in why), tight.notes


def test_reports_name_the_sharded_state_and_each_collective_kind() -> None:
    import json

    from pesto_ir.backends.gantt import collective_labels, collectives_of, gantt_image, parallelism_line
    from pesto_ir.backends.trace import trace_json_text
    from pesto_ir.schedule.report import format_summary, summarize

    placed = _placed(2, "sharded")
    plan = read_plan_attrs(placed)
    assert plan is not None
    summary = format_summary(summarize(placed, plan))
    assert "optimizer state sharded across the replicas" in summary
    assert re.search(r"\d+ reduce-scatters? of", summary) and re.search(r"\d+ all-gathers? of", summary)
    events = json.loads(trace_json_text(plan, placed))["traceEvents"]
    kinds = {e["args"]["opcode"] for e in events if e.get("cat") == "collective"}
    assert kinds == {"all_reduce", "reduce_scatter", "all_gather"}
    assert gantt_image(plan, placed, "svg")  # draws every kind
    by_op = collectives_of(plan, placed)
    scatter = next(n for n, c in by_op.items() if c.kind == "reduce_scatter")
    assert collective_labels(by_op, [scatter])[0].startswith("reduce-scatter ")
    assert "optimizer state sharded" in (parallelism_line(plan) or "")


# ---------------------------------------------------------------- running it

@pytest.mark.parametrize("d, m, inputs", [(2, 1, 12), (4, 1, 12), (2, 2, 12), (2, 1, 13)])
def test_sharded_replicas_give_jit_s_steps(d: int, m: int, inputs: int) -> None:
    """With 13 inputs, w1 [13, 24] splits along its second axis and w2 [24, 4] along its first: the
    bucket of their reduce-scatters splits each operand along its own axis."""
    params, state, x, y = mlp_adam(inputs=inputs)
    run = pesto_ir.parallelize(adam_step, devices=jax.devices()[:d], param_argnums=(0, 1), data_parallel=d,
                               microbatches=m, optimizer_state="sharded", autotune=False)
    got = want = (params, state)
    for _ in range(2):  # the second step reads the state the first gave back
        *got, got_loss = run(*got, x, y)
        *want, want_loss = jax.jit(adam_step)(*want, x, y)
        _close((got, got_loss), (want, want_loss))
    par = run.plan.parallelism
    assert par is not None and par.optimizer_state == "sharded" and par.data_parallel == d
    scatters = [op for op in run.graph.ops if op.opcode == "reduce_scatter"]
    assert scatters
    if inputs == 13:
        assert any(len(set(op.get("axes"))) > 1 for op in scatters)


def test_the_emitted_module_runs_a_sharded_plan_like_jit(tmp_path: Path) -> None:
    params, state, x, y = mlp_adam()
    lowered = lower_function(adam_step, params, state, x, y, param_argnums=(0, 1))
    placed = PassManager("annotate-costs{model=roofline},place{algo=m-etf data-parallel=2 microbatches=1 "
                         "optimizer-state=sharded},expand", verify_each=False).run(
        lowered.graph, PassContext(cluster=Cluster.homogeneous(2, "cpu"), quiet=True))
    source = emit_python(placed)
    assert "lax.psum_scatter(" in source and "lax.all_gather(" in source
    path = tmp_path / "adam_sharded_plan.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    outs = module.run(*lowered.flat_inputs(params, state, x, y), devices=jax.devices()[:2])
    _close(jax.tree_util.tree_unflatten(lowered.out_tree, outs), jax.jit(adam_step)(params, state, x, y))


# ---------------------------------------------------------------- contract: shapes and the validator

LATENCY, BANDWIDTH = 1e-5, 1e9
CLUSTER2 = Cluster.homogeneous(2, "v100", memory=1 << 20, latency=LATENCY, bandwidth=BANDWIDTH)
PHASE = 1 * (LATENCY + (1024 / 2) / BANDWIDTH)  # one ring phase over 2 devices of a 1 KiB value


def sharded_graph(rs_cost: float = PHASE, ag_cost: float = PHASE, sharded: bool = True) -> pesto_ir.Graph:
    """grad -> reduce_scatter -> momentum update on blocks -> all_gather: a sharded SGD-momentum step."""
    attrs = 'sharded_inputs = {m = 0}, sharded_outputs = {"1" = 0}, ' if sharded else ""
    return pesto_ir.parse(f"""
graph @z(%x: f32[256], param %w: f32[256], param %m: f32[128]) attributes {{{attrs}microbatched = {{data_parallel = 2, microbatches = 1}}}} {{
  %grad = mul(%x, %w) {{cost = 1ms}} : f32[256]
  %g = reduce_scatter(%grad) {{reduction = "sum", replicas = 2, axes = [0], cost = {rs_cost!r}}} : f32[128]
  %m_new = add(%m, %g) {{cost = 1ms}} : f32[128]
  %w_b = replica_slice(%w) {{replicas = 2, axis = 0, cost = 1us}} : f32[128]
  %w_upd = sub(%w_b, %m_new) {{cost = 1ms}} : f32[128]
  %w_new = all_gather(%w_upd) {{replicas = 2, axes = [0], cost = {ag_cost!r}}} : f32[256]
  return %w_new, %m_new
}}
""")


def sharded_plan(graph: pesto_ir.Graph, state: str = "sharded") -> Any:
    from pesto_ir.schedule.plan import Parallelism, collectives_for
    from pesto_ir.schedule.simulate import simulate

    names = [op.name for op in graph.ops]
    plan = simulate(graph, CLUSTER2, dict.fromkeys(names, "gpu0"), {"gpu0": names, "gpu1": []}, "hand")
    plan.parallelism = Parallelism(2, 1, (("gpu0",), ("gpu1",)), state)
    plan.collectives = collectives_for(graph, plan)
    return plan


def test_reduce_scatters_and_all_gathers_last_one_ring_phase_of_their_whole_value() -> None:
    from pesto_ir.schedule.validate import validate_plan

    graph = sharded_graph()
    plan = sharded_plan(graph)
    assert validate_plan(graph, CLUSTER2, plan) == []  # one phase is enough: half an all-reduce
    assert {(c.kind, c.nbytes) for c in plan.collectives} == {("reduce_scatter", 1024), ("all_gather", 1024)}
    short = sharded_graph(rs_cost=PHASE / 2, ag_cost=PHASE / 2)
    assert validate_plan(short, CLUSTER2, sharded_plan(short)) == [
        f"op 'g' runs {PHASE / 2:.6g}s on gpu0 but its ring reduce-scatter of 1024 bytes over gpu0, gpu1 takes "
        f"{PHASE:.6g}s",
        f"op 'w_new' runs {PHASE / 2:.6g}s on gpu0 but its ring all-gather of 1024 bytes over gpu0, gpu1 takes "
        f"{PHASE:.6g}s"]


def test_the_validator_checks_kinds_and_the_state_the_plan_claims() -> None:
    from pesto_ir.schedule.validate import validate_plan

    graph = sharded_graph()
    plan = sharded_plan(graph)
    plan.collectives[0].kind = "all_reduce"
    assert validate_plan(graph, CLUSTER2, plan) == ["the collective of op 'g' is an all_reduce, not a reduce_scatter"]
    assert validate_plan(graph, CLUSTER2, sharded_plan(graph, "replicated")) == [
        "the plan's optimizer state is replicated but the graph holds it in blocks (sharded_inputs)"]
    whole = sharded_graph(sharded=False)
    assert validate_plan(whole, CLUSTER2, sharded_plan(whole)) == [
        "the plan's optimizer state is sharded but the graph holds it whole (no sharded_inputs)"]


@pytest.mark.parametrize("op, error", [
    ('reduce_scatter(%a) {reduction = "sum", replicas = 2, axes = [0, 1]} : f32[3,4]',
     "axes must list one axis per operand"),
    ('reduce_scatter(%a) {reduction = "sum", replicas = 4, axes = [0]} : f32[3,4]',
     "axis 0 of f32[6,4] does not split into 4 equal blocks"),
    ('reduce_scatter(%a) {reduction = "mean", replicas = 2, axes = [0]} : f32[3,4]', "reduction must be one of"),
    ("all_gather(%a) {replicas = 2, axes = [2]} : f32[6,8]", "each of axes must be an axis of f32[6,4]"),
    ("replica_slice(%a) {replicas = 3, axis = 1} : f32[6,1]", "axis 1 of f32[6,4] does not split into 3"),
    ("replica_slice(%a) {replicas = 2, axis = 0} : f32[6,4]", "f32[3,4]"),
])
def test_shape_rules_of_the_sharding_ops(op: str, error: str) -> None:
    text = f"graph @g(%a: f32[6,4]) {{\n  %b = {op}\n  return %b\n}}\n"
    with pytest.raises(PestoError, match=re.escape(error)):
        verify(pesto_ir.parse(text))


# ---------------------------------------------------------------- review cases

def test_new_state_computed_from_the_parameter_stays_sharded() -> None:
    """Weight decay folded into the gradient (`m = 0.9 m + g + wd w`): the new moment is computed
    from the parameter, but it is the moment's next value, so it keeps its blocks; the new weight
    is gathered."""
    def step(w: jax.Array, m: jax.Array, x: jax.Array) -> Any:
        value, g = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
        m = 0.9 * m + g + 1e-2 * w
        return w - 0.1 * m, m, value

    w, x = 0.1 * jnp.ones((6, 4)), jnp.ones((8, 6))
    graph = rebatch(lower_function(step, w, w, x, param_argnums=(0, 1)).graph, 1, 2)
    done = shard_optimizer_state(graph, 2)
    verify(graph)
    assert list(done.inputs) == ["m"]
    assert graph.attrs["sharded_outputs"].value == {"1": 0}
    assert graph.outputs[0].owner is not None and graph.outputs[0].owner.opcode == "all_gather"
    run = pesto_ir.parallelize(step, devices=jax.devices()[:2], param_argnums=(0, 1), data_parallel=2,
                               microbatches=1, optimizer_state="sharded", autotune=False)
    _close(run(w, w, x), jax.jit(step)(w, w, x))


def test_auto_keeps_the_real_error_of_a_fixed_strategy_without_state() -> None:
    """Under `optimizer-state=auto` a fixed strategy that fails is retried sharded only when the step
    has state; otherwise (and when the retry fails too) its own error is the one reported."""
    def sgd(w: jax.Array, x: jax.Array) -> Any:
        value, g = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * g, value

    graph = lower_function(sgd, jnp.ones((64, 64)), jnp.ones((16, 64)), param_argnums=(0,)).graph
    causes = []
    for state in ("auto", "replicated"):
        with pytest.raises(PestoError) as caught:
            PassManager(f"annotate-costs{{model=roofline}},place{{algo=m-etf data-parallel=2 microbatches=1 "
                        f"optimizer-state={state}}}", verify_each=False).run(
                graph.clone(), PassContext(cluster=Cluster.homogeneous(2, "cpu", memory=20_000), quiet=True))
        causes.append(str(caught.value.__cause__))
    assert causes[0] == causes[1] and "fits on no device" in causes[0]


def test_autotune_with_sharded_state_still_times_plain_jit() -> None:
    params, state, x, y = mlp_adam()
    run = pesto_ir.parallelize(adam_step, devices=jax.devices()[:2], param_argnums=(0, 1), data_parallel=2,
                               microbatches=1, optimizer_state="sharded", autotune=True, autotune_steps=1)
    _close(run(params, state, x, y), jax.jit(adam_step)(params, state, x, y))
    candidates = {c.name: c for c in run.last.candidates}
    assert candidates["jit"].measured is not None, candidates["jit"]  # planned on one device, timed


def test_small_collectives_around_a_large_one_share_a_bucket() -> None:
    from pesto_ir.passes.rewrite.collective_buckets import buckets
    from pesto_ir.schedule.simulate import simulate

    graph = pesto_ir.parse("""
graph @b(%x: f32[64], %y: f32[1024], %z: f32[64]) {
  %a = all_reduce(%x) {reduction = "sum", replicas = 2, cost = 1us} : f32[64]
  %big = all_reduce(%y) {reduction = "sum", replicas = 2, cost = 1us} : f32[1024]
  %c = all_reduce(%z) {reduction = "sum", replicas = 2, cost = 1us} : f32[64]
  return %a, %big, %c
}
""")
    names = [op.name for op in graph.ops]
    plan = simulate(graph, CLUSTER2, dict.fromkeys(names, "gpu0"), {"gpu0": names, "gpu1": []}, "hand")
    assert [[op.name for op in b] for b in buckets(graph, plan, limit=4096)] == [["a", "c"]]
    assert [[op.name for op in b] for b in buckets(graph, plan, limit=8192)] == [["a", "big", "c"]]
