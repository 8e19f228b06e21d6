"""The reference interpreter and the parameter decoder on graphs the JAX frontend did not lower:
hand-written `.pir` that uses JAX primitive names (parameters it leaves out decoded to JAX's
defaults), an opaque opcode it cannot evaluate, and the `run_op` hook of a subclassed interpreter.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import pytest
from test_jax_frontend import _allclose

import pesto_ir
from pesto_ir.frontends.jax import lower
from pesto_ir.jaxrt.interpreter import Interpreter, evaluate
from pesto_ir.jaxrt.params import decode_params, lookup_primitive


def test_interpreter_run_op_hook() -> None:
    class Counting(Interpreter):
        def __init__(self, graph: pesto_ir.Graph) -> None:
            super().__init__(graph)
            self.seen: list[str] = []

        def run_op(self, op: pesto_ir.Op, args: list[Any]) -> list[Any]:
            self.seen.append(op.opcode)
            return super().run_op(op, args)

    g = lower(lambda x, y: jnp.exp(x) * y, jnp.ones(3), jnp.ones(3))
    interp = Counting(g)
    (out,) = interp.run(jnp.ones(3), jnp.full(3, 2.0))
    _allclose(out, jnp.exp(jnp.ones(3)) * 2.0)
    assert interp.seen == ["exp", "mul"]


HAND_WRITTEN = """
graph @step(%x: f32[4,3], param %w: f32[3,2], %k: i32[]) {
  %y = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[4,2]
  %zero = constant() {value = 0.0} : f32[]
  %r = max(%y, %zero) {cost = 2us, device = @gpu0} : f32[4,2]
  %e = exp(%r) : f32[4,2]
  %s = reduce_sum(%e) {axes = [1]} : f32[4]
  %ones = constant() {value = 1.0} : f32[4]
  @loop %i, %acc = while(%k, %s) {cond_nconsts = 0, body_nconsts = 0,
    cond_jaxpr = graph @cond(%i: i32[], %a: f32[4]) {
      %z = constant() {value = 0} : i32[]
      %p = gt(%i, %z) : bool[]
      return %p
    },
    body_jaxpr = graph @body(%i: i32[], %a: f32[4]) {
      %one = constant() {value = 1} : i32[]
      %j = sub(%i, %one) : i32[]
      %h = constant() {value = 0.5} : f32[]
      %b = mul(%a, %h) : f32[4]
      return %j, %b
    }} : i32[], f32[4]
  %out = add(%acc, %ones) : f32[4]
  return %out
}
"""


def test_hand_written_pir_with_jax_primitive_names_evaluates() -> None:
    g = pesto_ir.parse(HAND_WRITTEN)
    pesto_ir.verify(g)
    x = jnp.arange(12.0).reshape(4, 3) / 10
    w = jnp.ones((3, 2))
    (out,) = evaluate(g, x, w, jnp.int32(3))
    want = jnp.exp(jnp.maximum(x @ w, 0)).sum(1) * 0.125 + 1
    _allclose(out, want)


def test_evaluating_an_opaque_opcode_says_which_op() -> None:
    g = pesto_ir.parse("graph @g(%x: f32[2]) {\n  %y = matmul_fused(%x) : f32[2]\n  return %y\n}\n")
    with pytest.raises(pesto_ir.PestoError, match="no JAX primitive named 'matmul_fused'"):
        evaluate(g, jnp.ones(2))


def test_decode_fills_defaults_for_hand_written_ops() -> None:
    dims = pesto_ir.to_attr((((1,), (0,)), ((), ())))
    params = decode_params("dot_general", {"dimension_numbers": dims})
    assert params["dimension_numbers"] == (((1,), (0,)), ((), ()))
    assert params["precision"] is None and params["preferred_element_type"] is None
    assert lookup_primitive("dot_general").name == "dot_general"
    assert lookup_primitive("split").name == "split"
