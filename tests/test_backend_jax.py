"""The JAX backend, `parallelize` and the Python emitter on 8 CPU devices.

For the frontend's models (builders imported from test_jax_frontend), plans from several
algorithms on 2 and 4 devices must compute what `jax.jit` computes, every op's result must sit on
the device its plan gave it, cross-device copies must be transfers of the plan, parameters must
stay on their devices across steps, and the emitted Python must run and agree, hybrid plans
(data-parallel replicas x micro-batches, models from test_replicas) included. Segments are
compiled at XLA's lowest optimisation level to keep the file fast; the training test uses the
defaults.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_jax_frontend import (
    _batch_norm,
    _conv,
    _dense,
    _lstm,
    _lstm_params,
    _normal,
    _transformer_block,
    _transformer_params,
)
from test_replicas import MODELS as REPLICA_MODELS
from test_replicas import check_steps

import pesto_ir
from pesto_ir.backends.jax import BackendError, Executable, build
from pesto_ir.backends.python_emit import emit_python
from pesto_ir.backends.schedule import ScheduleError, dispatch_order, schedule
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.jax import LoweredFunction, lower_function
from pesto_ir.ir.graph import donated_inputs
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import read_plan_attrs
from pesto_ir.util.errors import PestoError

FAST = {"xla_backend_optimization_level": 0}


# ---------------------------------------------------------------- models: (fn, args, param_argnums)

def _mlp_adam() -> tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]:
    optax = pytest.importorskip("optax")
    params = {"l1": _dense(1, 8, 16), "l2": _dense(2, 16, 4)}
    opt = optax.adam(1e-2)

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h = jax.nn.relu(x @ p["l1"]["w"] + p["l1"]["b"])
        return optax.softmax_cross_entropy_with_integer_labels(h @ p["l2"]["w"] + p["l2"]["b"], y).mean()

    def train_step(p: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, state = opt.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    return train_step, (params, opt.init(params), _normal(3, (6, 8)), jnp.arange(6) % 4), (0, 1)


def _cnn_sgd() -> tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]:
    params = {"c1": _normal(10, (3, 3, 3, 4), 0.3), "g1": jnp.ones(4), "b1": jnp.zeros(4),
              "head": _dense(12, 4, 3)}

    def loss(p: Any, x: jax.Array, labels: jax.Array) -> jax.Array:
        h = jax.nn.relu(_batch_norm(_conv(x, p["c1"]), p["g1"], p["b1"]))
        h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID").mean(axis=(1, 2))
        logp = jax.nn.log_softmax(h @ p["head"]["w"] + p["head"]["b"])
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()

    def train_step(p: Any, x: jax.Array, labels: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(p, x, labels)
        return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads), value

    return train_step, (params, _normal(13, (2, 6, 6, 3)), jnp.array([0, 2])), (0,)


def _transformer_grad() -> tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]:
    def loss(p: Any, x: jax.Array) -> Any:
        return jax.value_and_grad(lambda p: (_transformer_block(p, x) ** 2).mean())(p)

    return loss, (_transformer_params(), _normal(27, (6, 8))), (0,)


def _lstm_grad() -> tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]:
    return jax.value_and_grad(_lstm), (_lstm_params(), _normal(32, (5, 3))), (0,)


def _cond_while() -> tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]:
    def model(x: jax.Array, k: jax.Array) -> Any:
        y = lax.cond(x.sum() > 0, lambda v: jnp.sin(v) * 2.0, lambda v: jnp.cos(v) - 1.0, x)
        w = lax.fori_loop(0, 3, lambda i, c: c * 0.5 + i, x)
        n = lax.while_loop(lambda s: s[0] < k, lambda s: (s[0] + 1, s[1] * 1.5), (0, y))[1]
        return jnp.tanh(y) @ w.T, n

    return model, (jnp.linspace(-1.0, 2.0, 12).reshape(3, 4), jnp.int32(3)), ()


def _flax_mlp() -> tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]:
    nn = pytest.importorskip("flax.linen")
    net = nn.Sequential([nn.Dense(8), nn.gelu, nn.Dense(2)])
    x = _normal(40, (4, 3))
    variables = net.init(jax.random.PRNGKey(0), x)

    def loss(v: Any, x: jax.Array) -> Any:
        return jax.value_and_grad(lambda v: (net.apply(v, x) ** 2).mean())(v)

    return loss, (variables, x), (0,)


def _equinox_mlp() -> tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]:
    eqx = pytest.importorskip("equinox")
    params, static = eqx.partition(eqx.nn.MLP(3, 2, 6, 2, key=jax.random.PRNGKey(1)), eqx.is_array)

    def loss(p: Any, x: jax.Array) -> Any:
        return jax.value_and_grad(lambda p: (jax.vmap(eqx.combine(p, static))(x) ** 2).mean())(p)

    return loss, (params, _normal(41, (4, 3))), (0,)


MODELS: dict[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]]] = {
    "mlp_adam": _mlp_adam, "cnn": _cnn_sgd, "transformer": _transformer_grad, "lstm": _lstm_grad,
    "cond_while": _cond_while, "flax": _flax_mlp, "equinox": _equinox_mlp,
}


# ---------------------------------------------------------------- helpers

def _allclose(a: Any, b: Any, tol: float = 1e-5) -> None:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=tol, atol=tol)


def _placed(name: str, algo: str, k: int) -> tuple[LoweredFunction, pesto_ir.Graph, tuple[Any, ...], Callable[..., Any]]:
    fn, args, argnums = MODELS[name]()
    lowered = lower_function(fn, *args, param_argnums=argnums)
    cluster = Cluster.from_jax_devices(jax.devices()[:k])
    graph = PassManager(f"annotate-costs{{model=roofline}},coarsen,place{{algo={algo}}},expand,simulate").run(
        lowered.graph, PassContext(cluster=cluster, quiet=True))
    return lowered, graph, args, fn


def _check_placement(exe: Executable, made_on: dict[tuple[str, str], Any]) -> None:
    """Every array is on the JAX device of its plan device; every op ran on its plan device."""
    for (_, device), jax_device in made_on.items():
        assert jax_device == exe.devices[device]
    computed = {name for (name, device) in made_on}
    for op in exe.schedule.graph.ops:
        device = str(op.get("device"))
        for r in op.results:
            if r.name in computed:
                assert (r.name, device) in made_on, (op.name, device)


def _check_transfers_follow_plan(exe: Executable) -> None:
    """Results cross devices only where the plan has a transfer of their op to that device."""
    plan = read_plan_attrs(exe.schedule.graph)
    planned = {(t.src, t.to) for t in plan.transfers}
    state_deliveries = {(id(exe.schedule.graph.outputs[k]), exe.schedule.input_home[exe.schedule.graph.inputs[i]])
                        for k, i in exe.schedule.state_map.items()}
    for m in exe.transfers:
        if m.src_op is not None and (id(m.value), m.dst) not in state_deliveries:
            assert (m.src_op, m.dst) in planned, (m.src_op, m.src, m.dst)


# ---------------------------------------------------------------- the executable

CASES = [
    ("mlp_adam", "m-etf", 4), ("mlp_adam", "m-topo", 2), ("mlp_adam", "random", 2), ("mlp_adam", "expert", 4),
    ("cnn", "m-etf", 2), ("cnn", "expert", 4), ("transformer", "random", 2), ("transformer", "m-topo", 4),
    ("lstm", "m-etf", 4), ("cond_while", "random", 4), ("flax", "expert", 2), ("equinox", "m-etf", 2),
]


@pytest.mark.parametrize(("model", "algo", "k"), CASES, ids=[f"{m}-{a}-{k}" for m, a, k in CASES])
def test_plans_run_across_devices_like_jit(model: str, algo: str, k: int) -> None:
    lowered, graph, args, fn = _placed(model, algo, k)
    exe = build(graph, jax.devices()[:k], constants=lowered.consts, compiler_options=FAST)
    flat = lowered.flat_inputs(*args)[:exe.num_inputs]
    outs, made_on = exe.run_traced(*flat)
    want = jax.jit(fn)(*args)
    _allclose(jax.tree_util.tree_unflatten(lowered.out_tree, outs), want, 1e-4)
    _allclose(jax.tree_util.tree_unflatten(lowered.out_tree, exe(*flat)), want, 1e-4)
    _check_placement(exe, made_on)
    _check_transfers_follow_plan(exe)
    used = {str(op.get("device")) for op in graph.ops}
    assert {s.segment.device for s in exe.segments} <= used
    if len(used) > 1:
        assert len({s.segment.device for s in exe.segments}) > 1


def test_segments_keep_each_devices_plan_order_and_dependencies() -> None:
    _, graph, _, _ = _placed("mlp_adam", "m-etf", 4)
    sched = schedule(graph)
    order = dispatch_order(graph)
    position = {id(op): i for i, op in enumerate(order)}
    plan = read_plan_attrs(graph)
    done: set[int] = set()
    for seg in sched.segments:
        assert all(str(op.get("device")) == seg.device for op in seg.planned_ops)
        assert [position[id(op)] for op in seg.planned_ops] == sorted(position[id(op)] for op in seg.planned_ops)
        for op in seg.planned_ops:
            for p in op.producers():  # a producer outside the segment ran in an earlier one (or is recomputed)
                assert id(p) in done or any(p is q for q in seg.ops) or not p.operands
            done.add(id(op))
    for device in plan.devices:
        mine = [op.name for seg in sched.segments if seg.device == device for op in seg.planned_ops]
        assert mine == [n for n in plan.device_order(device) if n in set(mine)]
    # lazy closing never cuts more often than the plan switches devices along the dispatch order
    switches = 1 + sum(1 for a, b in zip(order, order[1:]) if a.get("device") != b.get("device"))
    assert len(sched.segments) <= switches


def test_single_device_plan_is_one_segment_without_transfers() -> None:
    lowered, graph, args, fn = _placed("cnn", "single", 4)
    exe = build(graph, jax.devices()[:4], constants=lowered.consts, compiler_options=FAST)
    assert exe.num_segments == 1 and exe.transfers == []
    _allclose(jax.tree_util.tree_unflatten(lowered.out_tree, exe(*lowered.flat_inputs(*args))), jax.jit(fn)(*args), 1e-4)


def test_device_dict_and_errors() -> None:
    lowered, graph, args, _ = _placed("cond_while", "m-topo", 2)
    a, b = jax.devices()[5:7]
    exe = build(graph, {"cpu0": a, "cpu1": b}, compiler_options=FAST)
    assert {s.device for s in exe.segments} <= {a, b}
    with pytest.raises(BackendError, match="the plan has 2 device"):
        build(graph, jax.devices()[:3])
    with pytest.raises(BackendError, match="no JAX device given for plan device"):
        build(graph, {"cpu0": a})
    with pytest.raises(BackendError, match="takes 2 input"):
        exe(*lowered.flat_inputs(*args), 1.0)
    with pytest.raises(ScheduleError, match="is not placed"):
        build(lower_function(lambda x: x + 1, jnp.ones(2)).graph, jax.devices()[:1])


# ---------------------------------------------------------------- parallelize and training

def test_training_20_steps_match_jit_and_params_stay_on_their_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    fn, (params, state, x, y), _ = _mlp_adam()
    step = pesto_ir.parallelize(fn, devices=jax.devices()[4:8], param_argnums=(0, 1), autotune=False)
    jitted = jax.jit(fn)
    p1, s1, p2, s2 = params, state, params, state
    p1, s1, l1 = step(p1, s1, x, y)
    p2, s2, l2 = jitted(p2, s2, x, y)
    exe = step.executable
    homes = exe.input_devices()
    assert exe.num_segments > 1 and len({d.id for d in homes}) > 1
    assert {d.id for d in homes} <= {4, 5, 6, 7}

    real_put = jax.device_put
    puts: list[Any] = []

    def counting_put(x: Any, *a: Any, **k: Any) -> Any:
        puts.append(x)
        return real_put(x, *a, **k)

    monkeypatch.setattr(jax, "device_put", counting_put)
    x_home = real_put(x, homes[-2])
    y_home = real_put(y, homes[-1])
    for i in range(19):
        leaves = jax.tree_util.tree_leaves((p1, s1))
        assert [a.devices() for a in leaves] == [{d} for d in homes[:len(leaves)]]
        puts.clear()
        p1, s1, l1 = step(p1, s1, x_home, y_home)
        p2, s2, l2 = jitted(p2, s2, x, y)
        assert len(puts) == len(exe.transfers), i  # the plan's transfers, no input placement
        _allclose(l1, l2, 1e-5)
        _allclose(p1, p2, 1e-5)
    assert float(l1) < float(jitted(params, state, x, y)[2])
    assert step.cache_size == 1 and step.plan.algorithm == "m-etf"
    assert sum(len(s.donated) for s in exe.segments) > 0


def test_parallelize_caches_by_signature_and_reports_its_plan() -> None:
    step = pesto_ir.parallelize(lambda a, b: (jnp.sin(a) @ b, a.sum()), devices=jax.devices()[:2],
                                algo="expert", compiler_options=FAST, autotune=False)
    with pytest.raises(PestoError, match="has not been called"):
        _ = step.plan
    a, b = _normal(1, (4, 3)), _normal(2, (3, 5))
    _allclose(step(a, b), (jnp.sin(a) @ b, a.sum()))
    step(a + 1, b)
    assert step.cache_size == 1
    step(a[:2], b)
    assert step.cache_size == 2
    assert step.plan.algorithm == "expert" and set(step.plan.devices) == {"cpu0", "cpu1"}
    assert read_plan_attrs(step.graph) is not None
    with pytest.raises(PestoError, match="unknown placement algorithm 'nope'"):
        pesto_ir.parallelize(jnp.sin, algo="nope")


def test_donated_inputs_and_resident_constants() -> None:
    table = np.arange(12.0, dtype=np.float32).reshape(4, 3)

    def update(w: jax.Array, x: jax.Array) -> Any:
        h = jnp.tanh(x @ w)
        return w - 0.1 * (x.T @ h), (h @ table.T).sum() + jnp.cos(h).sum()

    step = pesto_ir.parallelize(update, devices=jax.devices()[2:4], algo="m-topo", param_argnums=(0,),
                                donate_argnums=(0,), compiler_options=FAST, autotune=False)
    w, x = _normal(5, (3, 3)), _normal(6, (4, 3))
    want = jax.jit(update)(w, x)
    w_home = jax.device_put(w, step.compile(w, x).executable.input_devices()[0])
    got = step(w_home, x)
    _allclose(got, want)
    assert w_home.is_deleted()  # the caller gave it up: its buffer became the new w
    assert donated_inputs(step.graph) == {step.graph.inputs[0].name}  # and the plan's memory frees it
    assert len(step.last.lowered.consts) == 1  # the table: placed once when built, never moved per step
    assert all(m.value.owner is not None or m.value.name != step.graph.inputs[-1].name for m in step.executable.transfers)
    _allclose(step(got[0], x), jax.jit(update)(*want[:1], x))


# ---------------------------------------------------------------- emitted Python

@pytest.mark.parametrize(("model", "algo", "k"), [("lstm", "expert", 2), ("cond_while", "m-topo", 2),
                                                   ("cnn", "expert", 2)])
def test_emitted_python_runs_and_matches(model: str, algo: str, k: int, tmp_path: Path) -> None:
    lowered, graph, args, fn = _placed(model, algo, k)
    source = emit_python(graph)
    path = tmp_path / f"{model}_plan.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"emitted_{model}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    outs = module.run(*lowered.flat_inputs(*args), devices=jax.devices()[:k])
    _allclose(jax.tree_util.tree_unflatten(lowered.out_tree, outs), jax.jit(fn)(*args), 1e-4)
    sched = schedule(graph)
    assert source.count("= _jitted(") == len(sched.segments)
    assert source.count("jax.device_put(") == len(sched.moves) + 1  # + the one in the _to helper
    assert "import pesto_ir" not in source and "from pesto_ir" not in source
    some_op = sched.segments[0].planned_ops[0]
    assert f"# {some_op.name}: {some_op.opcode}(" in source


# ---------------------------------------------------------------- emitted Python of hybrid plans

def _load_module(source: str, path: Path) -> Any:
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _hybrid(name: str, d: int, m: int) -> tuple[LoweredFunction, pesto_ir.Graph]:
    """A test_replicas model placed as d replicas of m micro-batches on a 4-device cluster (shared:
    emitting reads the placed graph, never changes it)."""
    step, params, x, y = REPLICA_MODELS[name]()
    lowered = lower_function(step, params, x, y, param_argnums=(0,))
    placed = PassManager(f"annotate-costs{{model=roofline}},place{{algo=m-topo data-parallel={d} microbatches={m}}},"
                         "expand", verify_each=False).run(lowered.graph,
                                                          PassContext(cluster=Cluster.homogeneous(4, "cpu"), quiet=True))
    return lowered, placed


@pytest.mark.parametrize(("name", "d", "m"), [("mlp", 2, 2), pytest.param("cnn", 2, 2, marks=pytest.mark.slow), ("mlp", 4, 1)])
def test_emitted_python_runs_hybrid_plans_like_jit(name: str, d: int, m: int, tmp_path: Path) -> None:
    """Every replica runs: each segment a shard_map over the mesh of mirrored devices, psums for the
    all-reduces; two steps give jax.jit's, the new parameters replicated over the d replicas."""
    lowered, placed = _hybrid(name, d, m)
    par = read_plan_attrs(placed).parallelism
    assert par is not None and (par.data_parallel, par.microbatches) == (d, m)
    source = emit_python(placed)
    module = _load_module(source, tmp_path / f"{name}_{d}x{m}_plan.py")
    step, params, x, y = REPLICA_MODELS[name]()

    def run(p: Any, x: jax.Array, y: jax.Array) -> Any:
        outs = module.run(*lowered.flat_inputs(p, x, y), devices=jax.devices()[:4])
        return jax.tree_util.tree_unflatten(lowered.out_tree, outs)

    check_steps(run, step, params, x, y, d)
    assert module.REPLICAS == par.replicas and module.INPUTS[-1][1] == tuple(y.shape)  # the whole batch
    assert source.count("= _jitted_over(seg") == len(schedule(placed).segments)
    assert "lax.psum(" in source
    assert "import pesto_ir" not in source and "from pesto_ir" not in source


def test_emitted_python_puts_per_sample_outputs_back_together(tmp_path: Path) -> None:
    """An output with a batch axis (rows along axis 1 here) is every replica's rows, in order."""
    def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        value, grad = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * grad, value, jnp.tanh(x @ w).T

    w, x = jnp.ones((5, 3)) * 0.1, jnp.arange(80, dtype=jnp.float32).reshape(16, 5) / 50
    graph = lower_function(step, w, x, param_argnums=(0,)).graph
    placed = PassManager("annotate-costs{model=roofline},place{algo=m-topo data-parallel=2 microbatches=2},expand",
                         verify_each=False).run(graph, PassContext(cluster=Cluster.homogeneous(4, "cpu"), quiet=True))
    source = emit_python(placed)
    assert "join_rows(" in source.split("def run(")[1]
    got = _load_module(source, tmp_path / "per_sample_plan.py").run(w, x, devices=jax.devices()[:4])
    for a, b in zip(got, jax.jit(step)(w, x)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


def test_emitted_hybrid_module_says_which_devices_it_needs(tmp_path: Path) -> None:
    lowered, placed = _hybrid("mlp", 2, 2)
    module = _load_module(emit_python(placed), tmp_path / "mlp_plan.py")
    devices = ", ".join(module.DEVICES)
    assert len(module.DEVICES) == 4 and "needs\n4 devices" in module.__doc__
    assert "(replica 0: cpu0, cpu1; replica 1: cpu2, cpu3)" in module.__doc__
    step, params, x, y = REPLICA_MODELS["mlp"]()
    with pytest.raises(ValueError) as info:
        module.run(*lowered.flat_inputs(params, x, y), devices=jax.devices()[:2])
    assert str(info.value).startswith(f"this plan runs 2 data-parallel replicas on 4 devices, given in the order "
                                      f"{devices} (replica 0: cpu0, cpu1; replica 1: cpu2, cpu3), got 2;")
