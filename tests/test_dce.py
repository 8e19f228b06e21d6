"""Dead code: the `dce` pass on Pesto IR, and the JAX frontend's DCE before lowering."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import pesto_ir
from pesto_ir.frontends.jax import lower
from pesto_ir.passmanager import PassContext, PassManager

MSR = Path(__file__).resolve().parents[1] / "graphs" / "msr" / "bert24_training_layer.json"

TEXT = """graph @g(%x: f32[4], %w: f32[4]) {
  %a = mul(%x, %w) : f32[4]
  %dead1 = exp(%x) : f32[4]
  %dead2 = neg(%dead1) : f32[4]
  %b = add(%a, %x) : f32[4]
  return %b
}
"""

AFTER = """graph @g(%x: f32[4], %w: f32[4]) {
  %a = mul(%x, %w) : f32[4]
  %b = add(%a, %x) : f32[4]
  return %b
}
"""


def run_dce(graph: pesto_ir.Graph) -> pesto_ir.Graph:
    return PassManager("dce").run(graph, PassContext(quiet=True))


def test_dce_removes_chains_of_unread_ops_and_keeps_the_rest() -> None:
    assert str(run_dce(pesto_ir.parse(TEXT))) == AFTER


def test_dce_keeps_effects_and_outputs() -> None:
    text = TEXT.replace("%dead2 = neg(%dead1) : f32[4]", "%dead2 = debug_print(%dead1) : f32[4]")
    out = run_dce(pesto_ir.parse(text))
    assert [op.name for op in out.ops] == ["a", "dead1", "dead2", "b"]


def test_dce_leaves_a_cost_graph_alone() -> None:
    graph = pesto_ir.load(MSR)
    before = len(graph.ops)
    assert len(run_dce(graph).ops) == before == 64


def test_lowering_drops_work_whose_results_nothing_uses() -> None:
    """A random key made and dropped (flax's RNN default carry) and a dead sine: neither is
    lowered, so the step lowers, and runs under parallelize with jax.jit's numbers."""
    def step(w: jax.Array, x: jax.Array) -> jax.Array:
        jax.random.key(0)  # traced, never used
        jnp.sin(x)
        return jnp.tanh(x @ w)

    w, x = jnp.ones((3, 2)), jnp.arange(12.0).reshape(4, 3) / 10
    graph = lower(step, w, x)
    assert [op.opcode for op in graph.ops] == ["dot_general", "tanh"]
    assert [v.name for v in graph.inputs] == ["w", "x"]
    run = pesto_ir.parallelize(step, devices=jax.devices()[:2], autotune=False)
    np.testing.assert_allclose(np.asarray(run(w, x)), np.asarray(jax.jit(step)(w, x)), rtol=1e-6)
