"""Donated inputs (`ir.graph.donated_inputs`): recorded by lowering from `donate_argnums`, kept by
`.pir` text, checked by the verifier; the memory model's use of them is tested in test_memory.py."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import pytest

from pesto_ir import parse
from pesto_ir.frontends.jax import lower
from pesto_ir.ir.graph import donate_inputs, donated_inputs
from pesto_ir.ir.verifier import verify
from pesto_ir.util.errors import PestoError, VerifyError

TEXT = """graph @step(param %w: f32[4], %x: f32[4]) attributes {donated = ["w"]} {
  %y = mul(%w, %x) : f32[4]
  return %y
}"""


def test_pir_text_keeps_the_donated_inputs() -> None:
    g = parse(TEXT)
    assert donated_inputs(g) == {"w"}
    again = parse(str(g))
    assert donated_inputs(again) == {"w"} and str(again) == str(g)
    assert donated_inputs(g.clone()) == {"w"}


@pytest.mark.parametrize(("attr", "message"), [
    ('["v"]', "attribute 'donated' names %v, which is not an input"),
    ('["w", "w"]', "attribute 'donated' names %w twice"),
    ('"w"', "attribute 'donated' must be a list of input names"),
    ("[1]", "attribute 'donated' must be a list of input names"),
])
def test_the_verifier_refuses_a_donated_attribute_that_names_no_input(attr: str, message: str) -> None:
    with pytest.raises(VerifyError, match=message) as e:
        verify(parse(TEXT.replace('["w"]', attr), filename="step.pir"))
    assert "step.pir:1:" in str(e.value)  # where the graph is


def test_donate_inputs_adds_to_what_is_recorded_and_refuses_unknown_names() -> None:
    g = parse(TEXT.replace(' attributes {donated = ["w"]}', ""))
    assert donated_inputs(g) == frozenset()
    donate_inputs(g, ["x"])
    donate_inputs(g, ["w"])
    assert donated_inputs(g) == {"w", "x"}
    assert str(g).count('donated = ["w", "x"]') == 1  # in input order
    with pytest.raises(ValueError, match="has no input"):
        donate_inputs(g, ["nope"])


def _step(params: dict[str, Any], x: Any) -> Any:
    new = {k: v - 0.1 * x.sum() for k, v in params.items()}
    return new, (params["a"] * x).sum()


def test_lowering_records_the_leaves_of_the_donated_arguments() -> None:
    params = {"a": jnp.ones(3), "b": jnp.ones(2)}
    x = jnp.ones(3)
    g = lower(_step, params, x, param_argnums=0, donate_argnums=(0,))
    assert donated_inputs(g) == {v.name for v in g.params} and len(g.params) == 2
    assert donated_inputs(lower(_step, params, x, param_argnums=0)) == frozenset()
    assert donated_inputs(lower(_step, params, x, donate_argnums=1)) == {g.inputs[-1].name}


@pytest.mark.parametrize(("nums", "message"), [
    (2, r"donate_argnums \[2\] out of range for 2 positional argument"),
    ((True,), "donate_argnums must be a position or a list of positions"),
    ("0", "donate_argnums must be a position or a list of positions"),
    ((0.5,), "donate_argnums must be a position or a list of positions"),
])
def test_bad_donate_argnums_are_refused(nums: Any, message: str) -> None:
    with pytest.raises(PestoError, match=message):
        lower(_step, {"a": jnp.ones(3)}, jnp.ones(3), donate_argnums=nums)
