"""Micro-benchmarks of Pesto IR's hot paths, for pytest-benchmark; each is also a test.

One benchmark per hot path, on a workload of realistic size:

* lowering: the JAX frontend on a ResNet-50 training step (`lower`, tracing included; and
  `lower_jaxpr`, the frontend's own work on an already traced jaxpr);
* the `.pir` text format: parsing and printing a generated graph of 15k ops;
* coarsening the 2012-op MSR graph `bert_l-12_training_op` to 200 groups, and its quotient graph;
* placement: m-ETF on that graph, and re-simulating the m-ETF plan;
* the JAX backend: building the executable of an m-ETF plan of an MLP training step on 4 CPU
  devices (XLA compiles every segment there), its first call, and a steady-state step.

pyproject's pytest options include `--benchmark-disable`, so a plain run calls every workload once
and checks its result (a smoke test, well under 30 s); `--benchmark-enable` times them, in this
process (`-n 0`: pytest-benchmark does not time under pytest-xdist's workers)::

    python3 -m pytest bench/micro                                  # smoke test
    python3 -m pytest bench/micro -n 0 --benchmark-enable          # the benchmark table
    python3 -m pytest bench/micro -n 0 --benchmark-enable -k "parse or print"

Regression tracking: save a baseline (under `.benchmarks/`, one folder per machine and Python),
then compare later runs against it, or two saved runs with each other::

    python3 -m pytest bench/micro -n 0 --benchmark-enable --benchmark-autosave     # saves 0001_...json
    python3 -m pytest bench/micro -n 0 --benchmark-enable --benchmark-compare      # vs the latest saved
    python3 -m pytest bench/micro -n 0 --benchmark-enable --benchmark-compare=0001 \\
        --benchmark-compare-fail=min:25%                                           # fail on a slowdown
    pytest-benchmark compare 0001 0002 --group-by=group                            # two saved runs

On a shared machine wall times are noisy: compare `min` rather than `mean`, with a generous margin.
The MSR graphs are read from `graphs/msr` in the repository.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pesto_ir
from pesto_ir.backends.jax import Executable, build
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_memory
from pesto_ir.frontends.jax import LoweredFunction, lower, lower_function, lower_jaxpr
from pesto_ir.ir.attributes import StringAttr
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passes.rewrite.coarse_graph import quotient_graph
from pesto_ir.passes.rewrite.grouping import coarsen_groups
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.simulate import simulate
from pesto_ir.schedule.validate import check_plan

BENCH_DIR = Path(__file__).resolve().parents[1]
MSR_DIR = Path(__file__).resolve().parents[2] / "graphs" / "msr"
BERT = "bert_l-12_training_op.json"
TEXT_OPS = 15_000
COARSEN_TARGET = 200
RESNET_BATCH = 8
RESNET_CONVS = 3 * 53 - 1  # forward, weight gradient, input gradient (none for the stem's input)
MLP_SIZES = (784, 512, 512, 10)
MLP_BATCH = 128
MLP_DEVICES = 4


def _bench_module(stem: str) -> ModuleType:
    """`bench/<stem>.py`, imported from its path (whether or not `bench` is a package)."""
    name = f"_pesto_micro_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{stem}.py")
        assert spec is not None and spec.loader is not None, f"cannot import {BENCH_DIR / stem}.py"
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _msr_cluster() -> Cluster:
    """4 V100s of 16 GiB, 50 GB/s links: the MSR graphs' usual target."""
    return Cluster.homogeneous(4, "v100", memory=17185374208, latency=1e-5, bandwidth=50e9)


def _load_msr(name: str) -> pesto_ir.Graph:
    return pesto_ir.load(MSR_DIR / name)


# ---------------------------------------------------------------- lowering (JAX frontend)

@pytest.fixture(scope="module")
def resnet50() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The ResNet-50 training step of bench/bench_lower.py and abstract arguments (shapes only)."""
    bl = _bench_module("bench_lower")
    args = (bl.resnet50_params(), jax.ShapeDtypeStruct((RESNET_BATCH, 224, 224, 3), jnp.float32),
            jax.ShapeDtypeStruct((RESNET_BATCH,), jnp.int32))
    return bl.resnet50_train_step, args


def _check_resnet50(graph: pesto_ir.Graph, args: tuple[Any, ...]) -> None:
    leaves = len(jax.tree_util.tree_leaves(args))
    params = len(jax.tree_util.tree_leaves(args[0]))
    assert len(graph.inputs) == leaves
    assert len(graph.outputs) == params + 1  # new parameters and the loss
    assert len(graph.ops) > 3000
    assert Counter(op.opcode for op in graph.ops)["conv_general_dilated"] == RESNET_CONVS


@pytest.mark.benchmark(group="lower")
def test_lower_resnet50_train_step(benchmark: Any, resnet50: tuple[Callable[..., Any], tuple[Any, ...]]) -> None:
    """`lower`: trace (a fresh wrapper each round: JAX caches traces by function), lower, verify."""
    fn, args = resnet50

    def run() -> pesto_ir.Graph:
        return lower(lambda *a: fn(*a), *args, param_argnums=0)

    graph = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=0)
    _check_resnet50(graph, args)
    assert len(graph.params) == len(jax.tree_util.tree_leaves(args[0]))


@pytest.mark.benchmark(group="lower")
def test_lower_jaxpr_resnet50(benchmark: Any, resnet50: tuple[Callable[..., Any], tuple[Any, ...]]) -> None:
    """`lower_jaxpr`: the frontend's own work, jaxpr -> Graph, on a jaxpr traced once."""
    fn, args = resnet50
    closed = jax.make_jaxpr(fn)(*args)
    graph, consts = benchmark(lower_jaxpr, closed, "resnet50")
    _check_resnet50(graph, args)
    pesto_ir.verify(graph)


# ---------------------------------------------------------------- the .pir text format

@pytest.fixture(scope="module")
def generated() -> tuple[pesto_ir.Graph, str]:
    """A generated 15k-op graph (bench/bench_text.py) and its text."""
    graph = _bench_module("bench_text").generated_graph(TEXT_OPS)
    return graph, str(graph)


@pytest.mark.benchmark(group="text")
def test_parse_pir(benchmark: Any, generated: tuple[pesto_ir.Graph, str]) -> None:
    """`pesto_ir.parse` of 15k ops; the parsed graph prints back to the same text."""
    _, text = generated
    parsed = benchmark.pedantic(pesto_ir.parse, args=(text,), rounds=4, iterations=1)
    assert len(parsed.ops) == TEXT_OPS
    pesto_ir.verify(parsed)
    assert str(parsed) == text


@pytest.mark.benchmark(group="text")
def test_print_pir(benchmark: Any, generated: tuple[pesto_ir.Graph, str]) -> None:
    """`pesto_ir.print_graph` of 15k ops: one line per op, the same text every time."""
    graph, text = generated
    printed = benchmark(pesto_ir.print_graph, graph)
    assert printed == text
    lines = printed.splitlines()
    assert lines[0].startswith("graph @generated(") and lines[-2].lstrip().startswith("return ")
    assert len(lines) == TEXT_OPS + 3


# ---------------------------------------------------------------- coarsening

@pytest.mark.benchmark(group="coarsen")
def test_coarsen_groups_bert(benchmark: Any) -> None:
    """`coarsen_groups` of bert_l-12 training (2012 ops) to 200 groups on 4 V100s."""
    graph, cluster = _load_msr(BERT), _msr_cluster()
    groups = benchmark(coarsen_groups, graph, COARSEN_TARGET, cluster)
    assert len(groups) == len(graph.ops)
    assert 1 < len(set(groups)) <= COARSEN_TARGET
    assert all("group" not in op.attrs for op in graph.ops)  # the function only reads the graph


@pytest.mark.benchmark(group="coarsen")
def test_quotient_graph_bert(benchmark: Any) -> None:
    """`quotient_graph` of bert_l-12 training grouped by `coarsen_groups`: a verified (acyclic) DAG."""
    graph, cluster = _load_msr(BERT), _msr_cluster()
    for op, g in zip(graph.ops, coarsen_groups(graph, COARSEN_TARGET, cluster)):
        op.attrs["group"] = StringAttr(g)
    coarse, members = benchmark(quotient_graph, graph, cluster)
    pesto_ir.verify(coarse, "quotient of bert_l-12")  # definition before use: the quotient is acyclic
    assert [op.name for op in coarse.ops] == list(members)
    assert sorted(n for names in members.values() for n in names) == sorted(op.name for op in graph.ops)
    assert sum(op_memory(op) for op in coarse.ops) == sum(op_memory(op) for op in graph.ops)


# ---------------------------------------------------------------- placement and simulation

@pytest.fixture(scope="module")
def bert_metf() -> tuple[pesto_ir.Graph, Cluster, Plan]:
    """bert_l-12 training, the cluster, and its m-ETF plan (computed once)."""
    graph, cluster = _load_msr(BERT), _msr_cluster()
    plan = check_plan(graph, cluster, ALGORITHMS["m-etf"].run(graph, cluster, PlaceOptions(quiet=True)))
    return graph, cluster, plan


@pytest.mark.benchmark(group="place")
def test_place_m_etf_bert(benchmark: Any, bert_metf: tuple[pesto_ir.Graph, Cluster, Plan]) -> None:
    """m-ETF on bert_l-12 training (2012 ops, 4 devices): a valid plan, above the lower bound."""
    graph, cluster, first = bert_metf
    plan = benchmark(ALGORITHMS["m-etf"].run, graph, cluster, PlaceOptions(quiet=True))
    check_plan(graph, cluster, plan)
    assert len(plan.ops) == len(graph.ops)
    assert len({s.device for s in plan.ops.values()}) > 1
    assert plan.makespan >= lower_bound(graph, cluster) * (1 - 1e-9)
    assert plan.makespan == pytest.approx(first.makespan)  # deterministic


@pytest.mark.benchmark(group="place")
def test_simulate_m_etf_plan_bert(benchmark: Any, bert_metf: tuple[pesto_ir.Graph, Cluster, Plan]) -> None:
    """`simulate` of the m-ETF plan's placement and device orders: the same, valid plan again."""
    graph, cluster, plan = bert_metf
    placement = {name: slot.device for name, slot in plan.ops.items()}
    order = {d: plan.device_order(d) for d in plan.devices}
    sim = benchmark(simulate, graph, cluster, placement, order, "m-etf")
    check_plan(graph, cluster, sim)
    assert {n: s.device for n, s in sim.ops.items()} == placement
    assert sim.makespan == pytest.approx(plan.makespan, rel=1e-9)


# ---------------------------------------------------------------- the JAX backend

@dataclass
class PlacedMLP:
    """An MLP training step lowered, placed by m-ETF on 4 CPU devices, with its inputs and jit's result."""

    lowered: LoweredFunction
    graph: pesto_ir.Graph
    devices: list[Any]
    flat: list[Any]
    want: list[Any]

    def build(self) -> Executable:
        return build(self.graph, self.devices, constants=self.lowered.consts)

    def check(self, outs: list[Any]) -> None:
        assert len(outs) == len(self.want)
        for got, want in zip(outs, self.want):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def _normal(seed: int, shape: tuple[int, ...], scale: float = 1.0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale)


def _mlp_train_step(params: list[dict[str, jax.Array]], x: jax.Array, labels: jax.Array) -> Any:
    """One SGD step of a ReLU MLP with softmax cross-entropy."""

    def loss(params: list[dict[str, jax.Array]]) -> jax.Array:
        h = x
        for layer in params[:-1]:
            h = jax.nn.relu(h @ layer["w"] + layer["b"])
        logits = h @ params[-1]["w"] + params[-1]["b"]
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1).mean()

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads), value


@pytest.fixture(scope="module")
def placed_mlp() -> PlacedMLP:
    if jax.device_count() < MLP_DEVICES:
        pytest.skip(f"needs {MLP_DEVICES} JAX devices (XLA_FLAGS was set before JAX was imported?)")
    params = [{"w": _normal(i, (a, b), 1 / np.sqrt(a)), "b": jnp.zeros(b)}
              for i, (a, b) in enumerate(zip(MLP_SIZES, MLP_SIZES[1:]))]
    x, labels = _normal(9, (MLP_BATCH, MLP_SIZES[0])), jnp.arange(MLP_BATCH) % MLP_SIZES[-1]
    lowered = lower_function(_mlp_train_step, params, x, labels, param_argnums=0)
    devices = jax.devices()[:MLP_DEVICES]
    graph = PassManager("annotate-costs{model=roofline},coarsen,place{algo=m-etf},expand,simulate").run(
        lowered.graph, PassContext(cluster=Cluster.from_jax_devices(devices), quiet=True))
    want = jax.tree_util.tree_leaves(jax.jit(_mlp_train_step)(params, x, labels))
    flat = lowered.flat_inputs(params, x, labels)[:lowered.num_args]
    return PlacedMLP(lowered, graph, devices, flat, want)


@pytest.mark.benchmark(group="backend")
def test_build_executable_mlp(benchmark: Any, placed_mlp: PlacedMLP) -> None:
    """`backends.jax.build` of the placed MLP step: schedule into segments, jit and compile each."""
    exe = benchmark.pedantic(placed_mlp.build, rounds=4, iterations=1)
    used = {str(op.get("device")) for op in placed_mlp.graph.ops}
    assert len(used) > 1
    assert exe.num_segments > 1 and len({s.segment.device for s in exe.segments}) > 1
    assert {s.segment.device for s in exe.segments} <= used
    assert exe.num_inputs == len(placed_mlp.flat)


@pytest.mark.benchmark(group="backend")
def test_first_call_mlp(benchmark: Any, placed_mlp: PlacedMLP) -> None:
    """The first call of a freshly built executable (build already compiled; this is dispatch setup)."""

    def setup() -> tuple[tuple[Executable], dict[str, Any]]:
        return (placed_mlp.build(),), {}

    def first_call(exe: Executable) -> list[Any]:
        return jax.block_until_ready(exe(*placed_mlp.flat))

    outs = benchmark.pedantic(first_call, setup=setup, rounds=3, iterations=1)
    placed_mlp.check(outs)


@pytest.mark.benchmark(group="backend")
def test_step_mlp(benchmark: Any, placed_mlp: PlacedMLP) -> None:
    """A steady-state step: segments and cross-device copies of one call, on the same inputs."""
    exe = placed_mlp.build()
    jax.block_until_ready(exe(*placed_mlp.flat))
    outs = benchmark(lambda: jax.block_until_ready(exe(*placed_mlp.flat)))
    placed_mlp.check(outs)
