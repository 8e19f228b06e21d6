"""Costs against reality: simulated single-device step vs a measured `jax.jit` step, and our
FLOPs and bytes vs XLA's own `cost_analysis()` of the compiled step.

For each model (JAX functions lowered with `pesto_ir.frontends.jax.lower`), on one CPU device:

* `jit step`: the time of the whole function under `jax.jit` (one executable);
* `per op`: `annotate-costs{model=profile fusion=none},simulate` on a one-device cluster: each op
  timed alone (dispatch overhead subtracted), the makespan is their sum;
* `per kernel`: `annotate-costs{model=profile fusion=xla}`: the kernels XLA would fuse the graph
  into (`pesto_ir.cost.fusion`), each timed as one executable;
* `roof none`, `roof xla`: `annotate-costs{model=roofline}` with the built-in `cpu` kind's
  datasheet figures, every op its own kernel, and fused kernels;
* `roof cal` (with `--cluster FILE`, e.g. the file `python -m bench.calibrate` writes): fused
  kernels on the calibrated figures (launch overhead, efficiency and setup per op family); one
  column per file when `--cluster` is given several times. `--no-profile` leaves out `per op`
  and `per kernel`.

Then, per model, our FLOPs and bytes (fused and unfused) next to XLA's `cost_analysis()`, and with
`--families` each step's thunk time per op family measured inside the step
(`bench/step_trace.py`) next to the simulated time per family.

Goal: the simulated step within 20% of the jit step. Run:

    python3 bench/bench_costs.py [--runs 21] [--stat median|min] [--clock cpu|wall] [--models mlp,cnn,...]
                                 [--cluster calibrated-cpu.json ...] [--processes 3] [--no-profile]
                                 [--families]
    python3 bench/bench_costs.py --zoo    # the zoo's full-size steps on one H100, fusion=none vs xla

By default runs are timed by process CPU time with XLA held to one core (`--clock cpu`): on a
machine other processes share, wall times of the same executable vary by 2x, CPU times by a few %.
Each jit step is timed in `--processes` fresh processes and their median kept: on this machine the
same step runs at one of two speeds, steady within a process, by the process it lands in.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.zoo_jax` when run as a script

from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.host import describe, elsewhere_note, machine_of
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.jaxrt.timing import call_time, hold_xla_to_one_core
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import read_plan_attrs

# ---------------------------------------------------------------- models

def _init(key: Any, shape: tuple[int, ...]) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.random.normal(key, shape, jnp.float32) * (1.0 / shape[0]) ** 0.5


def _sgd_step(loss: Callable[..., Any]) -> Callable[..., Any]:
    """A plain SGD step (learning rate 0.1) on `loss(params, x, y)`."""
    import jax

    def step(params: Any, x: Any, y: Any) -> Any:
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    return step


def mlp_model() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """SGD step of a 784-1024-1024-10 ReLU MLP, softmax cross-entropy, batch 256."""
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    params = [(_init(ks[0], (784, 1024)), jnp.zeros(1024)), (_init(ks[1], (1024, 1024)), jnp.zeros(1024)),
              (_init(ks[2], (1024, 10)), jnp.zeros(10))]
    x = jax.random.normal(ks[3], (256, 784))
    y = jax.nn.one_hot(jnp.arange(256) % 10, 10)

    def loss(params: Any, x: Any, y: Any) -> Any:
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = params[-1]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(h @ w + b) * y, axis=-1))

    return _sgd_step(loss), (params, x, y)


def cnn_model() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """SGD step of a small NHWC conv net on 32x32x3 images, batch 32: two conv+ReLU+maxpool, dense."""
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(jax.random.PRNGKey(1), 4)
    params = (_init(ks[0], (3, 3, 3, 32)), _init(ks[1], (3, 3, 32, 64)), _init(ks[2], (8 * 8 * 64, 10)))
    x = jax.random.normal(ks[3], (32, 32, 32, 3))
    y = jax.nn.one_hot(jnp.arange(32) % 10, 10)
    dn = ("NHWC", "HWIO", "NHWC")

    def pool(h: Any) -> Any:
        return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def loss(params: Any, x: Any, y: Any) -> Any:
        w1, w2, w3 = params
        h = pool(jax.nn.relu(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn)))
        h = pool(jax.nn.relu(jax.lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn)))
        logits = h.reshape(h.shape[0], -1) @ w3
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, axis=-1))

    return _sgd_step(loss), (params, x, y)


def transformer_model() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Forward pass of one pre-norm transformer block: 8 heads, d=512, MLP 2048, batch 4 x 256 tokens."""
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(jax.random.PRNGKey(2), 6)
    d, f, h = 512, 2048, 8
    params = (_init(ks[0], (d, 3 * d)), _init(ks[1], (d, d)), _init(ks[2], (d, f)), _init(ks[3], (f, d)))
    x = jax.random.normal(ks[4], (4, 256, d))

    def norm(t: Any) -> Any:
        mu = t.mean(-1, keepdims=True)
        return (t - mu) * jax.lax.rsqrt(((t - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

    def block(params: Any, x: Any) -> Any:
        wqkv, wo, w1, w2 = params
        b, s, _ = x.shape
        q, k, v = jnp.split(norm(x) @ wqkv, 3, axis=-1)
        q, k, v = (t.reshape(b, s, h, d // h).transpose(0, 2, 1, 3) for t in (q, k, v))
        att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / (d // h) ** 0.5, axis=-1)
        x = x + (att @ v).transpose(0, 2, 1, 3).reshape(b, s, d) @ wo
        return x + jax.nn.gelu(norm(x) @ w1) @ w2

    return block, (params, x)


def zoo_model(name: str, config: Any) -> Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]:
    """A zoo training step (`bench/zoo_jax.py`) at a reduced size that runs in ms on a CPU."""

    def build() -> tuple[Callable[..., Any], tuple[Any, ...]]:
        from bench.zoo_jax import concrete_arguments, step_at

        step, spec = step_at(name, config, f"{name}_reduced")
        return step, concrete_arguments(spec)

    return build


def _zoo_configs() -> dict[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]]:
    from bench.zoo_jax import GptConfig, ResNetConfig

    return {"zoo_gpt": zoo_model("gpt", GptConfig(2, 256, 4, 128, 4, 2048)),
            "zoo_resnet": zoo_model("resnet", ResNetConfig(((16, 1, 1), (32, 1, 2)), 16, 32, 8, 10))}


MODELS: dict[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]] = {
    "mlp": mlp_model, "cnn": cnn_model, "transformer": transformer_model, **_zoo_configs(),
}


# ---------------------------------------------------------------- measurements

def jit_step_time(fn: Callable[..., Any], args: tuple[Any, ...], runs: int, stat: str, clock: str) -> float:
    import jax

    return call_time(jax.jit(fn), args, runs, warmup=3, stat=stat, clock=clock)


def step_in_processes(name: str, processes: int, runs: int, stat: str, clock: str) -> float:
    """The median over `processes` fresh processes of `name`'s jit step time (each the `stat` of
    `runs`). On this machine a step's time depends on the process it runs in: six processes
    timed the reduced ResNet's step at 5.7, 3.7, 5.7, 5.7, 4.0 and 3.7 ms, and again within
    each at 5.5-5.8 or 3.3-4.0 ms."""
    times = []
    for _ in range(processes):
        done = subprocess.run([sys.executable, __file__, "--step-of", name, "--runs", str(runs), "--stat", stat,
                               "--clock", clock], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"bench_costs: timing {name}'s step in a fresh process failed:\n{done.stderr[-2000:]}")
        times.append(float(done.stdout.split()[-1]))
    return statistics.median(times)


def makespan(graph: Graph, cluster: Cluster, pipeline: str) -> float:
    placed = PassManager(f"{pipeline},simulate").run(graph, PassContext(cluster=cluster, quiet=True))
    plan = read_plan_attrs(placed)
    assert plan is not None
    return plan.makespan


def profiled(fusion: str, runs: int, stat: str, clock: str) -> str:
    return f"annotate-costs{{model=profile fusion={fusion} runs={runs} stat={stat} clock={clock} cache=false}}"


def xla_cost(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[float, float]:
    """FLOPs and bytes accessed of the compiled `jax.jit` program, as XLA counts them."""
    import jax

    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0]
    return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


def our_cost(graph: Graph) -> tuple[int, int, int]:
    """FLOPs, fused bytes and unfused bytes of the graph by the roofline rules."""
    from pesto_ir.cost.fusion import fusion_groups, group_work
    from pesto_ir.cost.roofline import op_work

    groups = fusion_groups(graph)
    return (sum(group_work(g).flops for g in groups), sum(group_work(g).bytes for g in groups),
            sum(op_work(op).bytes for op in graph.ops))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=21, help="timed runs per measurement (median kept)")
    ap.add_argument("--stat", default="median", choices=("median", "min"),
                    help="how runs become one time (min is steadier on a shared machine)")
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"),
                    help="cpu: process CPU time with XLA on one core (steady on a shared machine); "
                         "wall: wall time with XLA's default threads")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--cluster", action="append", default=[],
                    help="a pesto-cluster/1 file with calibrated figures (bench.calibrate) for `roof cal`; given "
                         "several times, one column per file, all against the same measured steps")
    ap.add_argument("--no-profile", action="store_true",
                    help="leave out the `per op` and `per kernel` columns (timing every op and kernel alone: "
                         "most of the run's time)")
    ap.add_argument("--zoo", action="store_true",
                    help="only the zoo's full-size steps on one datasheet H100: roofline with fusion=none and xla")
    ap.add_argument("--processes", type=int, default=3,
                    help="fresh processes each jit step is timed in, the median kept (default 3): a step's time "
                         "depends on the process it runs in")
    ap.add_argument("--families", action="store_true",
                    help="also each step's time per op family measured inside the step (a profiler trace, "
                         "bench/step_trace.py) next to the simulated time per family")
    ap.add_argument("--step-of", metavar="MODEL", help=argparse.SUPPRESS)  # one process of --processes
    args = ap.parse_args()
    if args.zoo:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        print(zoo_table())
        return 0
    names = [args.step_of] if args.step_of else [n for n in args.models.split(",") if n]
    if not names:
        ap.error(f"--models names no model (models: {', '.join(MODELS)})")
    unknown = [n for n in names if n not in MODELS]
    if unknown or args.runs < 1 or args.processes < 1:
        ap.error(f"unknown model(s) {', '.join(unknown)} (models: {', '.join(MODELS)})" if unknown
                 else "--runs and --processes must be at least 1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.clock == "cpu":  # before JAX's CPU backend starts (the first jax.devices())
        hold_xla_to_one_core()
    if args.step_of:
        fn, example = MODELS[args.step_of]()
        print(jit_step_time(fn, example, args.runs, args.stat, args.clock))
        return 0
    import jax

    from pesto_ir.frontends.jax import lower

    device = jax.devices()[0]
    cluster = Cluster.from_jax_devices([device])
    try:
        calibrated = [_calibrated(path, cluster) for path in args.cluster]
    except ClusterError as e:
        ap.error(f"--cluster: {e}")
    print(f"device: {describe(machine_of(device))}, {args.stat} of {args.runs} runs by {args.clock} clock"
          + (f" in each of {args.processes} processes (their median)" if args.processes > 1 else "") + ", "
          f"load average {os.getloadavg()[0]:.2f}")
    cal_names = ["roof cal"] if len(calibrated) == 1 else [f"roof cal {i + 1}" for i in range(len(calibrated))]
    for column, path, cal in zip(cal_names, args.cluster, calibrated):
        print(f"{column}: calibrated figures from {path}, "
              + (f"measured on {describe(cal.calibrated_on)}" if cal.calibrated_on else "which does not say where they were measured"))
        elsewhere = elsewhere_note(cal.calibrated_on, machine_of(device), "  these figures")
        if elsewhere:
            print(elsewhere)
    profiles = () if args.no_profile else ("none", "xla")
    columns = (["jit step"] + [{"none": "per op", "xla": "per kernel"}[f] for f in profiles] + ["roof none", "roof xla"]
               + cal_names[:len(calibrated)])
    header = f"{'model':<12} {'ops':>5} {'kernels':>7} " + " ".join(f"{c:>15}" for c in columns)
    print(header)
    print("-" * len(header))
    costs = []
    for name in names:
        fn, example = MODELS[name]()
        t0 = time.perf_counter()
        graph = lower(fn, *example)
        step = (jit_step_time(fn, example, args.runs, args.stat, args.clock) if args.processes == 1
                else step_in_processes(name, args.processes, args.runs, args.stat, args.clock))
        spans = [makespan(lower(fn, *example), cluster, profiled(f, args.runs, args.stat, args.clock))
                 for f in profiles]
        spans += [makespan(lower(fn, *example), cluster, f"annotate-costs{{model=roofline fusion={f}}}")
                  for f in ("none", "xla")]
        spans += [makespan(lower(fn, *example), c, "annotate-costs{model=roofline fusion=xla}") for c in calibrated]
        from pesto_ir.cost.fusion import fusion_groups

        cells = [f"{step * 1e3:>9.3f}ms     "] + [f"{s * 1e3:>9.3f}ms {s / step:>4.2f}" for s in spans]
        print(f"{name:<12} {len(graph.ops):>5} {len(fusion_groups(graph)):>7} " + " ".join(cells)
              + f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
        costs.append((name, xla_cost(fn, example), our_cost(graph)))
    print("ratio = simulated step / measured jit step (goal: 0.8 to 1.2)\n")
    print(f"{'model':<12} {'XLA GFLOP':>10} {'ours':>8} {'ratio':>6} {'XLA MB':>9} {'fused MB':>9} {'ratio':>6} "
          f"{'unfused MB':>10} {'ratio':>6}")
    for name, (xf, xb), (f, fb, ub) in costs:
        print(f"{name:<12} {xf / 1e9:>10.3f} {f / 1e9:>8.3f} {f / xf if xf else 0:>6.2f} {xb / 1e6:>9.1f} "
              f"{fb / 1e6:>9.1f} {fb / xb if xb else 0:>6.2f} {ub / 1e6:>10.1f} {ub / xb if xb else 0:>6.2f}")
    print("XLA: compiled.cost_analysis() of the whole jax.jit step; ours: the roofline rules, bytes of the "
          "fused kernels (what enters and leaves each) and of every op alone")
    if args.families:
        print()
        print(family_table(names, [cluster.devices[0], *(c.devices[0] for c in calibrated)],
                           ["roof xla", *cal_names[:len(calibrated)]], args.runs))
    return 0


def family_table(names: list[str], devices: list[Any], columns: list[str], runs: int) -> str:
    """Per model and op family (a gradient family in its forward family, as a trace tells them):
    the thunks' milliseconds per step measured inside the jitted step, and each device's simulated
    milliseconds of the kernels of that family (roofline on its figures, launches and setups
    included) with their ratio to the measured."""
    from bench.step_trace import family_times, forward_family
    from pesto_ir.cost.fusion import fusion_groups, group_work, runs_a_kernel
    from pesto_ir.cost.roofline import work_time
    from pesto_ir.frontends.jax import lower

    head = f"{'model':<12} {'family':<12} {'thunks':>6} {'in step':>10} {'kernels':>7} " + " ".join(
        f"{c:>16}" for c in columns)
    lines = [head, "-" * len(head)]
    for name in names:
        fn, example = MODELS[name]()
        measured = family_times(fn, example, runs)
        simulated: dict[str, list[float]] = {}
        kernels: dict[str, int] = {}
        for g in fusion_groups(lower(fn, *example)):
            if not runs_a_kernel(g):
                continue
            family = forward_family(g.family)
            kernels[family] = kernels.get(family, 0) + 1
            times = simulated.setdefault(family, [0.0] * len(devices))
            for i, d in enumerate(devices):
                times[i] += work_time(group_work(g), d, g.family)
        for family in sorted(set(simulated) | set(measured.seconds), key=lambda f: -measured.seconds.get(f, 0.0)):
            got = measured.seconds.get(family, 0.0)
            cells = [f"{t * 1e3:>9.3f}ms" + (f" {t / got:>5.2f}" if got > 0 else "      ")
                     for t in simulated.get(family, [0.0] * len(devices))]
            lines.append(f"{name:<12} {family:<12} {measured.thunks.get(family, 0):>6} {got * 1e3:>8.3f}ms "
                         f"{kernels.get(family, 0):>7} " + " ".join(cells))
        lines.append(f"{name:<12} {'(all)':<12} {sum(measured.thunks.values()):>6} "
                     f"{sum(measured.seconds.values()) * 1e3:>8.3f}ms {sum(kernels.values()):>7}")
    lines.append("in step: the thunks of each family, per step (jax.profiler.trace, mean of the traced runs); "
                 "ratio = simulated / in step")
    return "\n".join(lines)


def zoo_table() -> str:
    """The benchmark zoo's JAX steps at full size on one datasheet H100 (as `python -m bench` costs
    them), memory not counted: the roofline step with every op its own kernel and with fused kernels."""
    from bench.zoo import jax_cluster
    from bench.zoo_jax import MODELS as ZOO_MODELS
    from bench.zoo_jax import lower_model
    from pesto_ir.cost.fusion import fusion_groups

    lines = ["| model | ops | kernels | fusion=none ms | fusion=xla ms | xla / none |", "|---|---:|---:|---:|---:|---:|"]
    for name in ZOO_MODELS:
        one = jax_cluster(1).with_memory(float("inf"))  # gpt24 does not fit one device: time only
        graph = lower_model(name)
        spans = [makespan(graph.clone(), one, f"annotate-costs{{model=roofline fusion={f}}}") for f in ("none", "xla")]
        lines.append(f"| jax_{name} | {len(graph.ops)} | {len(fusion_groups(graph))} | {spans[0] * 1e3:.2f} | "
                     f"{spans[1] * 1e3:.2f} | {spans[1] / spans[0]:.2f} |")
    return "\n".join(lines)


def _calibrated(path: str, local: Cluster) -> Cluster:
    """A one-device cluster with the first device of the calibrated file, named like the local one."""
    import dataclasses

    whole = Cluster.load(path)
    return Cluster([dataclasses.replace(whole.devices[0], name=local.devices[0].name)], calibrated_on=whole.calibrated_on)


if __name__ == "__main__":
    sys.exit(main())
