"""Pipelines from strings, verification after each pass, IR dumps, timings, failure reports."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import pytest

from pesto_ir import Graph, ParseError, PassError, TensorType, parse
from pesto_ir.passes import PASSES
from pesto_ir.passes.verify import VerifyPass
from pesto_ir.passmanager import Pass, PassContext, PassManager, Pipeline
from pesto_ir.util.loader import ArgumentError

TEXT = "graph @g(%x: f32[2]) {\n  %y = neg(%x) : f32[2]\n  return %y\n}\n"


@dataclass(frozen=True)
class RenameOutputs(Pass):
    """A test pass with options of each type."""

    name = "rename-outputs"
    prefix: str = "out"
    times: int = 1
    scale: float = 1.0
    loud: bool = False

    def run(self, graph: Graph, ctx: PassContext) -> None:
        for op in graph.ops:
            op.set("renamed", self.prefix * self.times)


@dataclass(frozen=True)
class BreakIR(Pass):
    """Makes the IR invalid: the verifier after it must catch that."""

    name = "break-ir"

    def run(self, graph: Graph, ctx: PassContext) -> None:
        op = graph.ops[0]
        op.results[0].type = TensorType("f32", (3,))


@pytest.fixture(autouse=True)
def _register(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PASSES, RenameOutputs.name, RenameOutputs)
    monkeypatch.setitem(PASSES, BreakIR.name, BreakIR)


@pytest.mark.parametrize("text", [
    "verify",
    "verify,verify",
    "rename-outputs{prefix=z times=3 scale=0.5 loud=true},verify",
    "rename-outputs{times=1}",  # an explicit default prints back too
])
def test_pipeline_prints_back_as_written(text: str) -> None:
    assert str(Pipeline.parse(text)) == text


def test_pipeline_options_are_typed() -> None:
    (p,) = Pipeline.parse("rename-outputs{prefix=z times=3 scale=0.5 loud=true}").passes
    assert p == RenameOutputs(prefix="z", times=3, scale=0.5, loud=True)


@pytest.mark.parametrize("text, col, message", [
    ("verify,nosuch", 8, "unknown pass 'nosuch'"),
    ("rename-outputs{color=red}", 16, "unknown option 'color' for pass 'rename-outputs'"),
    ("rename-outputs{times=many}", 22, "bad value for option 'times': expected an integer, got 'many'"),
    ("rename-outputs{loud=maybe}", 21, "bad value for option 'loud': expected true or false"),
    ("verify verify", 8, "expected ',' between passes"),
    ("rename-outputs{times}", 21, "expected '=' after option 'times'"),
])
def test_pipeline_errors_point_at_the_token(text: str, col: int, message: str) -> None:
    with pytest.raises(ParseError) as info:
        Pipeline.parse(text)
    err = info.value
    assert err.span.col == col
    assert message in err.message
    caret_line = err.format().splitlines()[2]
    assert caret_line.index("^") - 2 == col - 1


def test_verifier_runs_after_each_pass_and_failure_names_the_pass() -> None:
    g = parse(TEXT)
    with pytest.raises(PassError) as info:
        PassManager("verify,rename-outputs,break-ir,verify").run(g, PassContext(quiet=True))
    assert info.value.headline == "error in pass break-ir (after verify, rename-outputs)"
    assert str(info.value).startswith("error in pass break-ir (after verify, rename-outputs): ")
    assert "result %y is f32[3] but neg gives f32[2]" in str(info.value), "str() keeps the reason"
    assert "result %y is f32[3] but neg gives f32[2]" in info.value.format()
    assert info.value.format().startswith("error in pass break-ir (after verify, rename-outputs):\n")


def test_no_verify_skips_verification() -> None:
    g = PassManager("break-ir", verify_each=False).run(parse(TEXT), PassContext(quiet=True))
    assert g.ops[0].results[0].type == TensorType("f32", (3,))


def test_print_ir_after_all_and_time_passes() -> None:
    out = io.StringIO()
    PassManager([VerifyPass(), RenameOutputs()], print_ir_after_all=True, time_passes=True, out=out).run(
        parse(TEXT), PassContext(quiet=True))
    text = out.getvalue()
    assert text.count("// ----- IR after") == 2
    assert "// ----- IR after rename-outputs -----\ngraph @g" in text
    assert "Pass execution timing report" in text and "rename-outputs" in text


@pytest.mark.parametrize("call, message", [
    (lambda: PassManager(None), r"PassManager\(\) takes a pipeline: .* not NoneType"),
    (lambda: PassManager([1]), r"PassManager\(\) takes a pipeline: .* not list holding int"),
    (lambda: PassContext(cluster="x"), r"PassContext\(cluster=...\) takes a Cluster or None, not str"),
    (lambda: PassContext(seed=-1), r"PassContext\(seed=...\) must be a whole number from 0 to 2147483647, not -1"),
    (lambda: PassContext(quiet="yes"), r"PassContext\(quiet=...\) takes True or False, not 'yes'"),
    (lambda: PassContext(log=3), r"PassContext\(log=...\) takes a text stream, not int"),
    (lambda: PassManager("dce").run("x"), r"PassManager.run\(\) takes a Graph"),
    (lambda: PassManager("dce").run(parse("graph @g(%x: f32[2]) {\n  return %x\n}\n"), 5),
     r"PassManager.run\(\) takes a PassContext or None as ctx, not int"),
])
def test_api_misuse_is_an_argument_error_that_says_what_is_taken(call: Any, message: str) -> None:
    """They were TypeError ('NoneType' object is not iterable) and AttributeError ('int' object has
    no attribute 'log'), or were taken (a cluster named 'x')."""
    with pytest.raises(ArgumentError, match=message):
        call()
