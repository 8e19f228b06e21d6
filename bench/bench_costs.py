"""Profiled costs against reality: simulated single-device makespan vs a measured `jax.jit` step.

For each model (JAX functions lowered with `pesto_ir.frontends.jax.lower`), on one CPU device:

* `jit step`: the time of the whole function under `jax.jit` (one executable);
* `per op`: `annotate-costs{model=profile},simulate` on a one-device cluster: each op timed alone
  (dispatch overhead subtracted), the makespan is their sum;
* `per segment`: the graph cut into segments XLA would fuse (each dot/conv/control-flow op alone,
  the runs of cheap ops between them together), each segment timed as one executable;
* `roofline`: `annotate-costs{model=roofline}` with the built-in `cpu` kind's datasheet figures.

Goal: the simulated makespan within 20% of the jit step. Run:

    python3 bench/bench_costs.py [--runs 21] [--stat median|min] [--clock cpu|wall] [--models mlp,cnn,transformer]

By default runs are timed by process CPU time with XLA held to one thread (`--clock cpu`): on a
machine other processes share, wall times of the same executable vary by 2x, CPU times by a few %.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from pesto_ir.cluster import Cluster
from pesto_ir.ir import Graph, Op
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.plan import read_plan_attrs
from pesto_ir.profile import Profiler, call_time

# One XLA thread when timing by CPU clock: then CPU time is the step's time on a quiet machine.
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

# Ops XLA (on the CPU) runs as their own kernels; everything between them fuses into loops.
SEGMENT_BREAKERS = frozenset({"dot_general", "conv_general_dilated", "scan", "while", "cond",
                              "reduce_window_max", "reduce_window_sum", "select_and_scatter_add"})


# ---------------------------------------------------------------- models

def _init(key: Any, shape: tuple[int, ...]) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.random.normal(key, shape, jnp.float32) * (1.0 / shape[0]) ** 0.5


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

    def step(params: Any, x: Any, y: Any) -> Any:
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    return step, (params, x, y)


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

    def step(params: Any, x: Any, y: Any) -> Any:
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    return step, (params, x, y)


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


MODELS: dict[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]] = {
    "mlp": mlp_model, "cnn": cnn_model, "transformer": transformer_model,
}


# ---------------------------------------------------------------- measurements

def jit_step_time(fn: Callable[..., Any], args: tuple[Any, ...], runs: int, stat: str, clock: str) -> float:
    import jax

    return call_time(jax.jit(fn), args, runs, warmup=3, stat=stat, clock=clock)


def segments(graph: Graph) -> list[list[Op]]:
    """Graph-order runs of ops: each breaker op alone, the ops between breakers together."""
    out: list[list[Op]] = []
    current: list[Op] = []
    for op in graph.ops:
        if op.opcode in SEGMENT_BREAKERS:
            if current:
                out.append(current)
            out.append([op])
            current = []
        else:
            current.append(op)
    if current:
        out.append(current)
    return out


def per_op_makespan(graph: Graph, cluster: Cluster, runs: int, stat: str, clock: str) -> float:
    ctx = PassContext(cluster=cluster, quiet=True)
    pipeline = f"annotate-costs{{model=profile runs={runs} stat={stat} clock={clock} cache=false}},simulate"
    placed = PassManager(pipeline).run(graph, ctx)
    plan = read_plan_attrs(placed)
    assert plan is not None
    return plan.makespan


def roofline_makespan(graph: Graph, cluster: Cluster) -> float:
    placed = PassManager("annotate-costs{model=roofline},simulate").run(graph, PassContext(cluster=cluster, quiet=True))
    plan = read_plan_attrs(placed)
    assert plan is not None
    return plan.makespan


def per_segment_makespan(graph: Graph, device: Any, runs: int, stat: str, clock: str) -> tuple[float, int]:
    profiler = Profiler(runs=runs, cache=False, stat=stat, clock=clock)
    segs = segments(graph)
    return sum(profiler.time_ops(s, device) for s in segs), len(segs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=21, help="timed runs per measurement (median kept)")
    ap.add_argument("--stat", default="median", choices=("median", "min"),
                    help="how runs become one time (min is steadier on a shared machine)")
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"),
                    help="cpu: process CPU time with XLA on one thread (steady on a shared machine); "
                         "wall: wall time with XLA's default threads")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    args = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.clock == "cpu":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_XLA).strip()
    import jax

    from pesto_ir.frontends.jax import lower

    device = jax.devices()[0]
    cluster = Cluster.from_jax_devices([device])
    print(f"device: {device.device_kind} ({device.platform}), jax {jax.__version__}, "
          f"{os.cpu_count()} cores, {args.stat} of {args.runs} runs by {args.clock} clock, "
          f"load average {os.getloadavg()[0]:.2f}")
    header = f"{'model':<12} {'ops':>5} {'segs':>5} {'jit step':>10} {'per op':>10} {'ratio':>6} " \
             f"{'per seg':>10} {'ratio':>6} {'roofline':>10} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        fn, example = MODELS[name]()
        t0 = time.perf_counter()
        graph = lower(fn, *example)
        step = jit_step_time(fn, example, args.runs, args.stat, args.clock)
        op_span = per_op_makespan(graph, cluster, args.runs, args.stat, args.clock)
        seg_span, n_segs = per_segment_makespan(lower(fn, *example), device, args.runs, args.stat, args.clock)
        roof = roofline_makespan(lower(fn, *example), cluster)
        print(f"{name:<12} {len(graph.ops):>5} {n_segs:>5} {step * 1e3:>8.3f}ms {op_span * 1e3:>8.3f}ms "
              f"{op_span / step:>6.2f} {seg_span * 1e3:>8.3f}ms {seg_span / step:>6.2f} "
              f"{roof * 1e3:>8.3f}ms {roof / step:>6.2f}"
              f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
    print("ratio = simulated makespan / measured jit step (goal: 0.8 to 1.2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
