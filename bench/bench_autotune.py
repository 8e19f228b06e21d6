"""Plans chosen by measuring: `parallelize(autotune=True)` against `jax.jit`, model by model.

For each model (the backend benchmark's models, the zoo's JAX models at their quick size and the
training steps of `tests/test_replicas.py`), on
K CPU devices:

* `jit`: `jax.jit(fn)` on device 0, a training loop feeding its new parameters back;
* `autotuned`: `pesto_ir.parallelize(fn, devices=K devices, autotune=True)`: the plan (m-ETF),
  plain jax.jit on device 0 and data parallelism over the K devices are timed on the first call,
  and the fastest runs; its steady step is timed side by side with `jit` (repetitions alternate, each at least `MIN_REPETITION_SECONDS` long).

`jit again` is a second `jax.jit` of the step timed the same way: its ratio to `jit` is how much
two identical executables differ on this machine (on steps under 0.1 ms, up to 10%).

The goal is a ratio autotuned / jit of at most 1.10 on every model: on devices that share this
machine's two cores splitting a step cannot win, and autotuning must notice and keep one device.
The second table gives every candidate's simulated and measured step (what the cost model
predicted for the cluster it was given, and what these devices did).

    python3 bench/bench_autotune.py [--k 4] [--reps 9] [--calls 10] [--models mlp,cnn,zoo:gpt,...]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_backend import MODELS, Loop, Model, _fed_back, _setup, side_by_side  # noqa: E402

MIN_REPETITION_SECONDS = 0.05  # a repetition of fewer calls than this takes is timer and scheduler noise
TEST_MODELS = ("mlp", "gpt", "cnn", "tagger", "pick")  # tests/test_replicas.py's MODELS
ZOO_MODELS = ("mlp", "resnet", "inception", "gpt", "gpt24", "lstm_seq2seq", "multitower")


def zoo_model(name: str) -> Model:
    """A zoo training step at its quick size, with random parameters and batch."""
    import jax
    import jax.numpy as jnp

    from bench import zoo_jax

    entry = zoo_jax._entry(name, "quick")
    model = entry.build(entry.configs["quick"])
    leaves, treedef = jax.tree_util.tree_flatten(model.params)
    keys = jax.random.split(jax.random.key(0), len(leaves) + 1)
    params = treedef.unflatten([0.1 * jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves)])
    state = tuple(jax.tree_util.tree_map(jnp.zeros_like, params) for _ in range(entry.optimizer.slots))
    batch = jax.tree_util.tree_map(lambda s: jax.random.normal(keys[-1], s.shape, s.dtype)
                                   if jnp.issubdtype(s.dtype, jnp.floating) else jnp.zeros(s.shape, s.dtype),
                                   tuple(model.batch))  # a batch element may be a tuple (multitower's towers)
    step = zoo_jax._train_step("step", model.loss, entry.optimizer)  # "step": fed back like a training loop
    return step, (params, state, *batch), (0, 1)


def test_model(name: str) -> Model:
    """A training step of `tests/test_replicas.py` (an MLP, two GPT blocks, a CNN, ...) and its inputs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_replicas import MODELS as TESTS

    step, params, x, y = TESTS[name]()
    return step, (params, x, y), (0,)


def build(name: str) -> Model:
    if name.startswith("zoo:"):
        return zoo_model(name.removeprefix("zoo:"))
    if name.startswith("test:"):
        return test_model(name.removeprefix("test:"))
    return MODELS[name]()


def bench_model(name: str, k: int, reps: int, calls: int) -> tuple[dict[str, Any], str]:
    import jax

    import pesto_ir

    fn, args, argnums = build(name)
    t0 = time.perf_counter()
    tuned = pesto_ir.parallelize(fn, devices=jax.devices()[:k], param_argnums=argnums, autotune=True)
    tuned(*args)
    first = time.perf_counter() - t0
    fed = _fed_back(fn, argnums)
    # a second jax.jit of the same step, timed alike: how far two identical executables differ here
    loops = [Loop(jax.jit(fn), args, fed), Loop(tuned, args, fed), Loop(jax.jit(fn), args, fed)]
    rough = side_by_side(loops, 1, calls, time.perf_counter)[0]
    calls = max(calls, math.ceil(MIN_REPETITION_SECONDS / rough))  # sub-millisecond steps: enough calls per repetition
    t_jit, t_tuned, t_again = side_by_side(loops, reps, calls, time.perf_counter, statistics.median)
    return ({"model": name, "ops": len(tuned.last.lowered.graph.ops), "jit": t_jit, "tuned": t_tuned,
             "ratio": t_tuned / t_jit, "noise": t_again / t_jit, "chosen": tuned.last.chosen, "first": first},
            tuned.report())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join([*MODELS, *(f"zoo:{m}" for m in ZOO_MODELS),
                                                  *(f"test:{m}" for m in TEST_MODELS)]))
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--calls", type=int, default=10, help="calls per repetition")
    opts = ap.parse_args(argv)
    _setup(opts.k, "wall")
    names = [m.strip() for m in opts.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS and m.removeprefix("zoo:") not in ZOO_MODELS
               and m.removeprefix("test:") not in TEST_MODELS]
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}, "
              f"{', '.join('zoo:' + m for m in ZOO_MODELS)}, {', '.join('test:' + m for m in TEST_MODELS)}",
              file=sys.stderr)
        return 2
    print(f"wall time per step, median of {opts.reps} x {opts.calls} calls, side by side, on {opts.k} CPU devices\n")
    print("| model | ops | jit (ms) | autotuned (ms) | ratio | jit again / jit | chosen | first call (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    reports = []
    for name in names:
        r, table = bench_model(name, opts.k, opts.reps, opts.calls)
        reports.append((name, table))
        print(f"| {r['model']} | {r['ops']} | {r['jit'] * 1e3:.3f} | {r['tuned'] * 1e3:.3f} | {r['ratio']:.3f} "
              f"| {r['noise']:.3f} | {r['chosen']} | {r['first']:.1f} |", flush=True)
    for name, table in reports:
        print(f"\n{name}:\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
