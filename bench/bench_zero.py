"""Sharded optimizer state (ZeRO-1) against replicated state, side by side in one run.

Simulated: every JAX zoo model at full size on k datasheet H100s (the suite's cluster), pure data
parallelism (d = k one-device replicas, `single` placement, collectives bucketed): the step with the
optimizer state replicated and sharded (`passes/rewrite/shard_state.py`), each replica's peak memory, the
optimizer state each holds, and the ratios.

Measured (`--measure`, on this machine's JAX devices): a small Adam step run by `parallelize` with
d replicas, replicated and sharded, timed side by side (median of `--steps` steps after a warm-up),
each step's results checked against `jax.jit`.

    python3 bench/bench_zero.py                  # simulated, k = 4 and 8
    python3 bench/bench_zero.py --measure        # and timed on 4 CPU devices
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from bench.zoo import jax_cluster, jax_model  # noqa: E402
from bench.zoo_jax import MODELS  # noqa: E402
from pesto_ir.ir.graph import Graph  # noqa: E402
from pesto_ir.passes.place import place_graph  # noqa: E402
from pesto_ir.passes.placement.options import PlaceOptions  # noqa: E402
from pesto_ir.passes.rewrite.replicas import Strategy, bucketed, replica_graph, replica_groups, sub_cluster  # noqa: E402
from pesto_ir.schedule.plan import Plan  # noqa: E402
from pesto_ir.util.errors import PestoError  # noqa: E402
from pesto_ir.util.units import human_bytes  # noqa: E402

STATES = ("replicated", "sharded")


def data_parallel(graph: Graph, k: int, state: str) -> tuple[Graph, Plan]:
    """d = k one-device replicas of `graph`, placed and bucketed as the suite's `dp` baseline."""
    cluster = jax_cluster(k)
    strategy = Strategy(k, 1, state)
    replica = replica_graph(graph, cluster, strategy)
    sub = sub_cluster(cluster, replica_groups(cluster, k)[0])
    plan = place_graph(replica, sub, "single", PlaceOptions(time_limit=60.0, quiet=True))
    return bucketed(replica, cluster, plan, strategy)


def state_bytes(graph: Graph) -> int:
    """Bytes of optimizer state one replica holds: `param` inputs no forward op reads (the zoo's
    steps take the parameters first, then one copy of them per optimizer slot)."""
    sharded = graph.attrs.get("sharded_inputs")
    names = set(sharded.value) if sharded is not None else set()
    return sum(v.type.nbytes for v in graph.inputs if v.name in names or v.name.startswith("opt_state"))


def simulated(models: list[str], ks: list[int]) -> list[str]:
    lines = ["| model | k | step replicated (ms) | step sharded (ms) | sharded / replicated | peak replicated | "
             "peak sharded | state held, replicated | state held, sharded |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    for name in models:
        graph = jax_model(name, "full").build()
        for k in ks:
            cells: dict[str, tuple[Plan, Graph] | str] = {}
            for state in STATES:
                try:
                    replica, plan = data_parallel(graph, k, state)
                    cells[state] = (plan, replica)
                except PestoError as e:
                    first = str(e).splitlines()[0]
                    cells[state] = "no optimizer state" if "no optimizer state" in first else first[:60]
            lines.append(_row(name, k, cells))
            print(lines[-1], flush=True)
    return lines


def _row(name: str, k: int, cells: dict[str, Any]) -> str:
    def step(state: str) -> str:
        c = cells[state]
        return f"{c[0].makespan * 1e3:.4g}" if isinstance(c, tuple) else f"— ({c})"

    def peak(state: str) -> str:
        c = cells[state]
        return human_bytes(max(c[0].peak_memory.values())) if isinstance(c, tuple) and c[0].peak_memory else "—"

    def held(state: str) -> str:
        c = cells[state]
        return human_bytes(state_bytes(c[1])) if isinstance(c, tuple) else "—"

    both = all(isinstance(cells[s], tuple) for s in STATES)
    ratio = f"{cells['sharded'][0].makespan / cells['replicated'][0].makespan:.3f}" if both else "—"
    return (f"| jax_{name} | {k} | {step('replicated')} | {step('sharded')} | {ratio} | {peak('replicated')} | "
            f"{peak('sharded')} | {held('replicated')} | {held('sharded')} |")


def measured(d: int, steps: int) -> list[str]:
    """An Adam MLP step under parallelize with d replicas, replicated and sharded, timed side by side."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pesto_ir
    from bench.zoo_jax_layers import ADAM, _train_step

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    step = _train_step("adam_mlp", loss, ADAM)  # the zoo's Adam

    k = jax.random.split(jax.random.key(0), 3)
    params = {"w1": 0.05 * jax.random.normal(k[0], (512, 2048)), "b1": jnp.zeros(2048),
              "w2": 0.05 * jax.random.normal(k[1], (2048, 512))}
    state = (jax.tree_util.tree_map(jnp.zeros_like, params), jax.tree_util.tree_map(jnp.zeros_like, params))
    x = jax.random.normal(k[2], (64, 512))
    y = jnp.tanh(x)
    want = jax.jit(step)(params, state, x, y)
    lines = [f"Adam MLP 512-2048-512, batch 64, {d} replicas on {jax.devices()[0].platform} devices; "
             f"median of {steps} steps, side by side:", "",
             "| optimizer state | simulated step | measured step | max abs diff from jax.jit |",
             "|---|---:|---:|---:|"]
    runs = {s: pesto_ir.parallelize(step, devices=jax.devices()[:d], param_argnums=(0, 1), data_parallel=d,
                                    microbatches=1, optimizer_state=s, algo="single", autotune=False)
            for s in STATES}
    diffs = {}
    for s, run in runs.items():
        got = run(params, state, x, y)  # compiles
        diffs[s] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                       for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)))
    times: dict[str, list[float]] = {s: [] for s in STATES}
    for _ in range(steps):  # alternate, so that both see the same machine
        for s, run in runs.items():
            started = time.perf_counter()
            jax.block_until_ready(run(params, state, x, y))
            times[s].append(time.perf_counter() - started)
    for s, run in runs.items():
        lines.append(f"| {s} | {run.plan.makespan * 1e3:.3g} ms | {statistics.median(times[s]) * 1e3:.3g} ms | "
                     f"{diffs[s]:.2g} |")
    return lines


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--k", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--measure", action="store_true", help="also time an Adam step on this machine's devices")
    ap.add_argument("--replicas", type=int, default=4, help="replicas of the measured step (default 4)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant (default 20)")
    args = ap.parse_args(argv)
    if any(k < 2 for k in args.k) or args.replicas < 2 or args.steps < 1:
        ap.error("--k and --replicas need at least 2 devices, --steps at least 1")
    simulated(args.models, args.k)
    if args.measure:
        print("\n" + "\n".join(measured(args.replicas, args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
