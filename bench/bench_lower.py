"""How long the JAX frontend takes, on a ResNet-50-like training step and a synthetic chain.

Prints one row per program: jaxpr equations (counted through every nested jaxpr), ops in the
lowered graph (nested bodies included), and the seconds spent tracing (`jax.make_jaxpr`),
lowering (jaxpr -> Graph, the frontend's own work), verifying, printing and parsing back. Each
time is the best of `--repeat` runs. The frontend's goal is 1 s to lower 10k equations.

    python bench/bench_lower.py
    python bench/bench_lower.py --repeat 5 --synthetic 20000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import pesto_ir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.zoo_jax` when run as a script
from bench.zoo_jax import bottleneck  # noqa: E402
from pesto_ir.frontends.jax import lower_jaxpr, sub_jaxprs

F32 = jnp.float32


def _spec(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ---------------------------------------------------------------- ResNet-50 in plain lax

STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (width, blocks, first stride)


def _conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    return lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _bn(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    mean = x.mean(axis=(0, 1, 2))
    var = ((x - mean) ** 2).mean(axis=(0, 1, 2))
    return (x - mean) * lax.rsqrt(var + 1e-5) * p["gamma"] + p["beta"]


def _conv_bn(p: dict[str, Any], x: jax.Array, stride: int = 1, relu: bool = True) -> jax.Array:
    y = _bn(_conv(x, p["w"], stride), p["bn"])
    return jax.nn.relu(y) if relu else y


def _resnet50(params: dict[str, Any], x: jax.Array) -> jax.Array:
    y = _conv_bn(params["stem"], x, 2)
    y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    for stage, (_, _, stride) in zip(params["stages"], STAGES):
        for i, block in enumerate(stage):
            y = bottleneck(block, y, stride if i == 0 else 1, _conv_bn)
    return y.mean(axis=(1, 2)) @ params["fc"]["w"] + params["fc"]["b"]


def _conv_bn_spec(k: int, c_in: int, c_out: int) -> dict[str, Any]:
    return {"w": _spec(k, k, c_in, c_out), "bn": {"gamma": _spec(c_out), "beta": _spec(c_out)}}


def resnet50_params(classes: int = 1000) -> dict[str, Any]:
    """Abstract parameters (shapes only): tracing needs no real arrays."""
    stages, c_in = [], 64
    for width, blocks, _ in STAGES:
        stage = []
        for i in range(blocks):
            block = {"a": _conv_bn_spec(1, c_in, width), "b": _conv_bn_spec(3, width, width),
                     "c": _conv_bn_spec(1, width, 4 * width)}
            if i == 0:
                block["proj"] = _conv_bn_spec(1, c_in, 4 * width)
            stage.append(block)
            c_in = 4 * width
        stages.append(stage)
    return {"stem": _conv_bn_spec(7, 3, 64), "stages": stages, "fc": {"w": _spec(2048, classes), "b": _spec(classes)}}


def resnet50_train_step(params: dict[str, Any], x: jax.Array, labels: jax.Array) -> Any:
    def loss(params: dict[str, Any]) -> jax.Array:
        logp = jax.nn.log_softmax(_resnet50(params, x))
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), value


# ---------------------------------------------------------------- a synthetic chain

def synthetic(n: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """`n` equations, one primitive each: elementwise ops, with a matmul every 16th step."""
    unary = (lax.sin, lax.tanh, lax.exp, lax.neg, lax.abs, lax.logistic)

    def fn(x: jax.Array, y: jax.Array) -> jax.Array:
        for i in range(n):
            if i % 16 == 15:
                x = lax.dot_general(x, y, (((1,), (0,)), ((), ())))
            elif i % 4 == 3:
                x = lax.add(x, y) if i % 8 == 3 else lax.mul(x, y)
            else:
                x = unary[i % len(unary)](x)
        return x

    return fn


# ---------------------------------------------------------------- measuring

def count_eqns(jaxpr: Any) -> int:
    return sum(1 + sum(count_eqns(j) for j in sub_jaxprs(e.params)) for e in jaxpr.eqns)


def count_ops(graph: pesto_ir.Graph) -> int:
    return sum(1 + sum(count_ops(g) for g in op.subgraphs()) for op in graph.ops)


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def measure(name: str, fn: Callable[..., Any], args: tuple[Any, ...], repeat: int) -> dict[str, Any]:
    # a fresh wrapper each time: make_jaxpr caches traces by function
    t_trace, closed = best_of(repeat, lambda: jax.make_jaxpr(lambda *a: fn(*a))(*args))
    t_lower, (graph, _) = best_of(repeat, lambda: lower_jaxpr(closed, name))
    t_verify, _ = best_of(repeat, lambda: pesto_ir.verify(graph))
    t_print, text = best_of(repeat, lambda: str(graph))
    t_parse, _ = best_of(repeat, lambda: pesto_ir.parse(text))
    eqns = count_eqns(closed.jaxpr)
    return {"program": name, "eqns": eqns, "ops": count_ops(graph), "trace": t_trace, "lower": t_lower,
            "verify": t_verify, "print": t_print, "parse": t_parse, "lower_10k": t_lower * 10_000 / eqns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--synthetic", type=int, default=10_000, help="equations in the synthetic chain")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()

    rows = [
        measure("resnet50_train_step", resnet50_train_step,
                (resnet50_params(), _spec(args.batch, 224, 224, 3),
                 jax.ShapeDtypeStruct((args.batch,), jnp.int32)), args.repeat),
        measure(f"synthetic_{args.synthetic}", synthetic(args.synthetic), (_spec(16, 16), _spec(16, 16)),
                args.repeat),
    ]
    head = f"{'program':<22}{'eqns':>8}{'ops':>8}{'trace s':>10}{'lower s':>10}{'verify s':>10}" \
           f"{'print s':>10}{'parse s':>10}{'lower/10k eqns s':>18}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['program']:<22}{r['eqns']:>8}{r['ops']:>8}{r['trace']:>10.3f}{r['lower']:>10.3f}"
              f"{r['verify']:>10.3f}{r['print']:>10.3f}{r['parse']:>10.3f}{r['lower_10k']:>18.3f}")


if __name__ == "__main__":
    main()
