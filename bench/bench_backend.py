"""The JAX backend's overhead: a Pesto executable against `jax.jit` of the same function.

For each model, on CPU devices:

* `jit`: one step of `jax.jit(fn)` on device 0 (training steps feed their new parameters and
  optimizer state back, as a training loop does; gradient functions are called on fixed inputs);
* `pesto single`: `pesto_ir.parallelize(fn, devices=[device 0], algo="single")`: the whole graph
  on the same device, i.e. one segment, called through the wrapper (pytree flattening, signature
  lookup, input placement checks); the ratio to `jit` is the backend's overhead (goal <= 1.10);
* `m-etf k=K`: the same function planned by m-ETF on K devices: segments and transfers per step,
  and its step time (on CPU "devices" that share this machine's cores, this shows dispatch and
  copy costs, not a speed-up).

The two single-device columns are measured side by side: repetitions alternate between them and
the median (or `--stat min`) per-step time of each is kept. Run:

    python3 bench/bench_backend.py [--reps 15] [--calls 20] [--k 4] [--clock cpu|wall] [--stat median|min]
                                   [--models mlp,cnn,transformer,lstm,mlp-tiny]

By default time is process CPU time with XLA held to one core (as bench/bench_costs.py does):
on a machine other processes share, wall times of one executable vary by 2x, CPU times by a few %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from pesto_ir.jaxrt.timing import hold_xla_to_one_core


def _setup(k: int, clock: str) -> None:
    """XLA flags must be set before JAX is imported."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={max(k, 1)}"
    if clock == "cpu":
        hold_xla_to_one_core()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


# ---------------------------------------------------------------- models: (fn, args, param_argnums)

Model = tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]  # fn, args, param_argnums (fed back)


def _normal(seed: int, shape: tuple[int, ...], scale: float = 1.0) -> Any:
    import jax.numpy as jnp
    import numpy as np

    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale)


def mlp_model(hidden: int = 512, batch: int = 128) -> Model:
    """Adam step of a 784-H-H-10 ReLU MLP with softmax cross-entropy."""
    import jax
    import jax.numpy as jnp
    import optax

    sizes = [784, hidden, hidden, 10]
    params = [{"w": _normal(i, (a, b), a ** -0.5), "b": jnp.zeros(b)} for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
    opt = optax.adam(1e-3)

    def loss(p: Any, x: Any, y: Any) -> Any:
        for layer in p[:-1]:
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
        return optax.softmax_cross_entropy_with_integer_labels(x @ p[-1]["w"] + p[-1]["b"], y).mean()

    def step(p: Any, s: Any, x: Any, y: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    return step, (params, opt.init(params), _normal(9, (batch, 784)), jnp.arange(batch) % 10), (0, 1)


def mlp_tiny_model() -> Model:
    """The test suite's MLP size (8-16-4, batch 6): dispatch overhead dominates."""
    import jax
    import jax.numpy as jnp
    import optax

    params = [{"w": _normal(1, (8, 16), 0.3), "b": jnp.zeros(16)}, {"w": _normal(2, (16, 4), 0.3), "b": jnp.zeros(4)}]
    opt = optax.adam(1e-2)

    def step(p: Any, s: Any, x: Any, y: Any) -> Any:
        def loss(p: Any) -> Any:
            h = jax.nn.relu(x @ p[0]["w"] + p[0]["b"])
            return optax.softmax_cross_entropy_with_integer_labels(h @ p[1]["w"] + p[1]["b"], y).mean()

        value, grads = jax.value_and_grad(loss)(p)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    return step, (params, opt.init(params), _normal(3, (6, 8)), jnp.arange(6) % 4), (0, 1)


def cnn_model(batch: int = 32) -> Model:
    """SGD step of a two-conv CNN with batch norm and max-pooling on 32x32x3 images."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def conv(x: Any, w: Any) -> Any:
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def norm(x: Any, g: Any, b: Any) -> Any:
        mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
        return (x - mean) * lax.rsqrt(var + 1e-5) * g + b

    def pool(x: Any) -> Any:
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    params = {"c1": _normal(1, (3, 3, 3, 16), 0.2), "g1": jnp.ones(16), "b1": jnp.zeros(16),
              "c2": _normal(2, (3, 3, 16, 32), 0.1), "g2": jnp.ones(32), "b2": jnp.zeros(32),
              "w": _normal(3, (32, 10), 0.2), "b": jnp.zeros(10)}

    def loss(p: Any, x: Any, y: Any) -> Any:
        h = pool(jax.nn.relu(norm(conv(x, p["c1"]), p["g1"], p["b1"])))
        h = pool(jax.nn.relu(norm(conv(h, p["c2"]), p["g2"], p["b2"]))).mean(axis=(1, 2))
        logp = jax.nn.log_softmax(h @ p["w"] + p["b"])
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

    def step(p: Any, x: Any, y: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - 0.05 * g, p, grads), value

    return step, (params, _normal(4, (batch, 32, 32, 3)), jnp.arange(batch) % 10), (0,)


def transformer_model(t: int = 64, d: int = 128, heads: int = 4) -> Model:
    """Gradient of a pre-norm transformer block (causal attention + GELU MLP), squared-output loss."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    def layer_norm(x: Any, g: Any, b: Any) -> Any:
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * g + b

    def block(p: Any, x: Any) -> Any:
        h = layer_norm(x, p["g1"], p["b1"])
        q, k, v = ((h @ p[n]).reshape(t, heads, d // heads).transpose(1, 0, 2) for n in ("wq", "wk", "wv"))
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), q @ k.transpose(0, 2, 1) / np.sqrt(d // heads), -1e9)
        x = x + (jax.nn.softmax(scores, -1) @ v).transpose(1, 0, 2).reshape(t, d) @ p["wo"]
        h = layer_norm(x, p["g2"], p["b2"])
        return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]

    p = {n: _normal(i, (d, d), d ** -0.5) for i, n in enumerate(("wq", "wk", "wv", "wo"))}
    p |= {"w1": _normal(5, (d, 4 * d), d ** -0.5), "w2": _normal(6, (4 * d, d), (4 * d) ** -0.5),
          "g1": jnp.ones(d), "b1": jnp.zeros(d), "g2": jnp.ones(d), "b2": jnp.zeros(d)}

    def grad(p: Any, x: Any) -> Any:
        return jax.value_and_grad(lambda p: (block(p, x) ** 2).mean())(p)

    return grad, (p, _normal(7, (t, d))), (0,)


def lstm_model(steps: int = 32, n_in: int = 32, hidden: int = 64) -> Model:
    """Gradient of an LSTM over `lax.scan` (the scan and its transpose are single ops)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    p = {"wx": _normal(1, (n_in, 4 * hidden), 0.1), "wh": _normal(2, (hidden, 4 * hidden), 0.1),
         "b": jnp.zeros(4 * hidden)}

    def lstm(p: Any, xs: Any) -> Any:
        def cell(carry: Any, x: Any) -> Any:
            h, c = carry
            i, f, g, o = jnp.split(x @ p["wx"] + h @ p["wh"] + p["b"], 4)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        (h, _), hs = lax.scan(cell, (jnp.zeros(hidden), jnp.zeros(hidden)), xs)
        return (hs ** 2).mean() + h.sum()

    return jax.value_and_grad(lstm), (p, _normal(3, (steps, n_in))), (0,)


MODELS: dict[str, Callable[[], Model]] = {
    "mlp": mlp_model, "cnn": cnn_model, "transformer": transformer_model, "lstm": lstm_model,
    "mlp-tiny": mlp_tiny_model,
}


# ---------------------------------------------------------------- timing

def _clock(kind: str) -> Callable[[], float]:
    return time.process_time if kind == "cpu" else time.perf_counter


class Loop:
    """Calls `fn` as a training loop does: the results for `param_argnums` become the next arguments."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], param_argnums: tuple[int, ...]) -> None:
        self.fn, self.args, self.fed = fn, list(args), param_argnums

    def __call__(self) -> Any:
        out = self.fn(*self.args)
        for j, i in enumerate(self.fed):
            self.args[i] = out[j]
        return out


def side_by_side(fns: list[Callable[[], Any]], reps: int, calls: int, clock: Callable[[], float],
                 stat: Callable[[list[float]], float] = statistics.median, rotate: bool = False) -> list[float]:
    """Seconds per call of each function (`stat` over repetitions), repetitions alternating between
    them; with `rotate`, each round starts one function later, so that none always runs right
    after the same other."""
    import jax

    samples: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        jax.block_until_ready(fn())
    for rep in range(reps):
        shift = rep % len(fns) if rotate else 0
        for i in [*range(shift, len(fns)), *range(shift)]:
            fn = fns[i]
            t0 = clock()
            for _ in range(calls):
                out = fn()
            jax.block_until_ready(out)
            samples[i].append((clock() - t0) / calls)
    return [stat(s) for s in samples]


def _fed_back(fn: Callable[..., Any], argnums: tuple[int, ...]) -> tuple[int, ...]:
    """Training steps (their names say so) feed their new parameters and state back."""
    return argnums if getattr(fn, "__name__", "") == "step" else ()


def bench_model(name: str, k: int, reps: int, calls: int, clock: Callable[[], float],
                stat: Callable[[list[float]], float]) -> dict[str, Any]:
    import jax

    import pesto_ir

    fn, args, argnums = MODELS[name]()
    devices = jax.devices()
    jitted = jax.jit(fn)
    t0 = time.perf_counter()
    # autotune=False: this measures the backend's own executables, not what autotuning would pick
    single = pesto_ir.parallelize(fn, devices=devices[:1], algo="single", param_argnums=argnums, autotune=False)
    single(*args)
    first_call = time.perf_counter() - t0
    spread = pesto_ir.parallelize(fn, devices=devices[:k], algo="m-etf", param_argnums=argnums, autotune=False)
    spread(*args)
    fed = _fed_back(fn, argnums)
    t_jit, t_single = side_by_side([Loop(jitted, args, fed), Loop(single, args, fed)], reps, calls, clock, stat)
    (t_spread,) = side_by_side([Loop(spread, args, fed)], max(3, reps // 3), calls, clock, stat)
    return {
        "model": name, "ops": len(single.graph.ops), "jit": t_jit, "single": t_single, "ratio": t_single / t_jit,
        "segments": single.executable.num_segments, "first_call": first_call,
        "k_segments": spread.executable.num_segments, "k_transfers": len(spread.executable.transfers),
        "k_step": t_spread,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,cnn,transformer,lstm,mlp-tiny")
    ap.add_argument("--k", type=int, default=4, help="devices for the m-ETF column")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20, help="calls per repetition")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="over repetitions; min is steadier when other processes load the machine")
    opts = ap.parse_args(argv)
    _setup(opts.k, opts.clock)
    names = [m.strip() for m in opts.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    clock = _clock(opts.clock)
    stat = min if opts.stat == "min" else statistics.median
    print(f"{opts.clock} time per step, {opts.stat} of {opts.reps} x {opts.calls} calls, side by side; "
          f"m-ETF on {opts.k} CPU devices\n")
    print(f"| model | ops | jit (ms) | pesto single (ms) | ratio | segments | first call (s) "
          f"| m-ETF k={opts.k}: segments | transfers | step (ms) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        r = bench_model(name, opts.k, opts.reps, opts.calls, clock, stat)
        print(f"| {r['model']} | {r['ops']} | {r['jit'] * 1e3:.3f} | {r['single'] * 1e3:.3f} | {r['ratio']:.3f} "
              f"| {r['segments']} | {r['first_call']:.1f} | {r['k_segments']} | {r['k_transfers']} "
              f"| {r['k_step'] * 1e3:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
