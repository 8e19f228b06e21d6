"""What a user gets by default: `parallelize(fn, devices=...)` with default options against `jax.jit`.

For each model (the backend benchmark's models, the zoo's JAX models at their quick size and the
training steps of `tests/test_replicas.py`), on
K CPU devices:

* `jit`: `jax.jit(fn)` on device 0, a training loop feeding its new parameters back;
* `default`: `pesto_ir.parallelize(fn, devices=K devices, param_argnums=...)` and nothing else:
  by default (`autotune="auto"`) the plan (m-ETF), plain jax.jit on device 0 and data parallelism
  over the K devices are timed on the first call, and the fastest runs; its steady step is timed
  side by side with `jit` (repetitions alternate, each at least `MIN_REPETITION_SECONDS` long).

`first call` is the default's first call (lowering, planning and building the plan, then
autotuning: building the other candidates and timing them all; then the step), with the autotuning
part of it, next to `jit first call`, jax.jit's own (tracing and compiling), timed before it.

`jit again` is a second `jax.jit` of the step timed the same way: its ratio to `jit` is how much
two identical executables differ on this machine (on steps under 0.1 ms, up to 10%).

The goal is a ratio default / jit of at most 1.10 on every model: on devices that share this
machine's two cores splitting a step cannot win, and autotuning must notice and keep one device.
The second table gives every candidate's simulated and measured step (what the cost model
predicted for the cluster it was given, and what these devices did).

    python3 bench/bench_autotune.py [--k 4] [--reps 9] [--calls 10] [--stat min|median] [--models mlp,cnn,zoo:gpt,...]

Each figure is the fastest repetition by default (`--stat min`): on a machine that other jobs share,
they only ever add time to a repetition, so the fastest is the step's own time, for jax.jit and the
default alike; `--stat median` takes the median instead. The rounds rotate which loop runs first.
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

GOAL = 1.10  # default / jit, every model
STAT = {"min": min, "median": statistics.median}  # over repetitions
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


def bench_model(name: str, k: int, reps: int, calls: int, stat: str = "min") -> tuple[dict[str, Any], str]:
    import jax

    import pesto_ir

    fn, args, argnums = build(name)
    t0 = time.perf_counter()
    jax.block_until_ready(jax.jit(fn)(*args))
    jit_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    tuned = pesto_ir.parallelize(fn, devices=jax.devices()[:k], param_argnums=argnums)  # the defaults
    jax.block_until_ready(tuned(*args))
    first = time.perf_counter() - t0
    fed = _fed_back(fn, argnums)
    # a second jax.jit of the same step, timed alike: how far two identical executables differ here
    loops = [Loop(jax.jit(fn), args, fed), Loop(tuned, args, fed), Loop(jax.jit(fn), args, fed)]
    rough = side_by_side(loops, 1, calls, time.perf_counter)[0]
    calls = max(calls, math.ceil(MIN_REPETITION_SECONDS / rough))  # sub-millisecond steps: enough calls per repetition
    t_jit, t_tuned, t_again = side_by_side(loops, reps, calls, time.perf_counter, STAT[stat], rotate=True)
    return ({"model": name, "ops": len(tuned.last.lowered.graph.ops), "jit": t_jit, "tuned": t_tuned,
             "ratio": t_tuned / t_jit, "noise": t_again / t_jit, "chosen": tuned.last.chosen, "first": first,
             "jit_first": jit_first, "tuning": tuned.last.seconds.get("autotune", 0.0)},
            tuned.report())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join([*MODELS, *(f"zoo:{m}" for m in ZOO_MODELS),
                                                  *(f"test:{m}" for m in TEST_MODELS)]))
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--calls", type=int, default=10, help="calls per repetition")
    ap.add_argument("--stat", choices=sorted(STAT), default="min",
                    help="over the repetitions: min (default: other processes only ever add time) or median")
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
    print(f"wall time per step, {opts.stat} of {opts.reps} x {opts.calls} calls, side by side (each round in "
          f"turn starting with another), on {opts.k} CPU devices\n")
    print("| model | ops | jit (ms) | default (ms) | ratio | jit again / jit | chosen | first call (s) | "
          "of which autotuning (s) | jit first call (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    reports, ratios = [], []
    for name in names:
        r, table = bench_model(name, opts.k, opts.reps, opts.calls, opts.stat)
        reports.append((name, table))
        ratios.append(r["ratio"])
        print(f"| {r['model']} | {r['ops']} | {r['jit'] * 1e3:.3f} | {r['tuned'] * 1e3:.3f} | {r['ratio']:.3f} "
              f"| {r['noise']:.3f} | {r['chosen']} | {r['first']:.1f} | {r['tuning']:.1f} | {r['jit_first']:.1f} |",
              flush=True)
    worst = max(ratios)
    print(f"\nworst ratio default / jit {worst:.3f} (goal <= {GOAL}): {'met' if worst <= GOAL else 'NOT met'}; "
          f"geometric mean {math.exp(statistics.mean(map(math.log, ratios))):.3f}")
    root = str(Path(__file__).resolve().parent.parent) + "/"
    for name, table in reports:  # source locations in the checkout, relative to it
        print(f"\n{name}:\n\n{table.replace(root, '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
