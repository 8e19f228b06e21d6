"""`pesto-compile model.py:make_step`: a JAX step named on the command line, lowered by the JAX
frontend; every mistake in the file or in what `make_step()` returns is one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pesto_ir
from pesto_ir.cli import main
from pesto_ir.frontends.jax_script import ScriptError, is_script, split_spec

EXAMPLE = Path(__file__).parent.parent / "examples" / "jax_mlp_step.py"

STEP = '''
import jax, jax.numpy as jnp

def step(w, x):
    loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
    return w - 0.1 * g, loss

W = jax.ShapeDtypeStruct((8, 4), jnp.float32)
X = jax.ShapeDtypeStruct((16, 8), jnp.float32)
'''


def _model(tmp_path: Path, body: str, name: str = "model.py") -> str:
    path = tmp_path / name
    path.write_text(STEP + body)
    return str(path)


def test_specs_name_the_file_and_the_function() -> None:
    assert split_spec("a/model.py:make") == ("a/model.py", "make")
    assert split_spec("model.py") == ("model.py", "make_step")
    assert split_spec("c:/x.pir") == ("c:/x.pir", "make_step")
    assert is_script("model.py:make_step") and is_script("model.py") and not is_script("model.pir")


def test_the_example_compiles_on_four_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.json"
    assert main([f"{EXAMPLE}:make_step", "--devices", "4", "--algo", "m-etf", "--plan-json", str(plan)]) == 0
    doc = json.loads(plan.read_text())
    assert doc["graph"] == "train_step" and len(doc["devices"]) == 4
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("answer: step time ")


@pytest.mark.parametrize("body", [
    "def make_step():\n    return step, (W, X), 0\n",
    "def make_step():\n    return step, [W, X], [0]\n",
    "def make_step():\n    return {'step': step, 'args': (W, X), 'param_argnums': [0]}\n",
    "from dataclasses import dataclass\n@dataclass\nclass S:\n    fn: object\n    args: tuple\n    param_argnums: tuple = (0,)\n"
    "def make_step():\n    return S(step, (W, X))\n",
])
def test_every_return_shape_lowers_the_same_graph(tmp_path: Path, body: str) -> None:
    graph = pesto_ir.load(_model(tmp_path, body) + ":make_step")
    assert graph.name == "step"
    # argument 0 is the parameter in every shape: the batch is x alone, split along its axis 0
    assert [(k, v.value) for k, v in graph.attrs["batch_inputs"].entries] == [("x", 0)]


@pytest.mark.parametrize("body, spec, expected", [
    ("def make_step():\n    return 42\n", ":make_step", "returned a value of type int"),
    ("def make_step():\n    return step, (W, X), 0, 1\n", "", "returned a tuple of 4"),
    ("def make_step():\n    return {'fn': step, 'args': W}\n", "", "must be a tuple or list"),
    ("def make_step():\n    return {'fn': 3, 'args': (W, X)}\n", "", "not a function"),
    ("def make_step():\n    return {'fn': step, 'args': (W, X), 'params': 0}\n", "", "unknown field(s) 'params'"),
    ("def make_step():\n    return step, (W, X), 5\n", "", "param_argnums 5 is out of range"),
    ("def make_step():\n    return step, (W,)\n", "", "tracing the step of make_step() raised TypeError"),
    ("def make_step():\n    raise ValueError('no data')\n", "", ":11:5: error: make_step() raised ValueError: no data"),
    ("def make_step(:\n", "", "error: syntax error"),
    ("raise RuntimeError('at import')\n", "", ":10:1: error: importing it raised RuntimeError: at import"),
    ("def make_step():\n    return step, (W, X)\n", ":other", "no function 'other' in"),
    ("make_step = 3\n", "", "is of type int, not a function"),
])
def test_mistakes_are_one_error_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str,
                                                     spec: str, expected: str) -> None:
    path = _model(tmp_path, body)
    assert main([path + spec, "--devices", "2", "--algo", "m-etf", "-q"]) == 1
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_a_missing_file_is_refused_before_importing_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.py") + ":make_step", "-q"]) == 1
    err = capsys.readouterr().err
    assert "missing.py:1:1: error: cannot read file" in err
    with pytest.raises(ScriptError, match="not a Python function name"):
        pesto_ir.load(str(EXAMPLE) + ":make-step")
