"""The .pir text format: golden round trips of the examples, golden error messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import pesto_ir
from pesto_ir import BlobType, Graph, TensorType, parse, verify
from pesto_ir.cli import main
from pesto_ir.ir.attributes import BytesAttr, DeviceAttr, DurationAttr, format_duration

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.pir"))
GOLDEN = Path(__file__).resolve().parent / "golden"
ERROR_CASES = sorted((GOLDEN / "errors").glob("*.pir"))
UPDATE = bool(os.environ.get("PESTO_UPDATE_GOLDEN"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_prints_as_golden(path: Path) -> None:
    golden = GOLDEN / "roundtrip" / path.name
    text = str(pesto_ir.load(path))
    if UPDATE:
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_round_trips_exactly(path: Path) -> None:
    g = pesto_ir.load(path)
    verify(g)
    text = str(g)
    again = parse(text)
    assert again.structurally_equal(g)
    assert str(again) == text  # a fixed point after one round


@pytest.mark.parametrize("path", ERROR_CASES, ids=lambda p: p.stem)
def test_error_message_is_golden(path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(path.parent)
    assert main([path.name, "-q"]) == 1
    err = capsys.readouterr().err
    expected = path.with_suffix(".expected")
    if UPDATE:
        expected.write_text(err)
    assert err == expected.read_text()
    assert "Traceback" not in err


def test_every_pass_added_attribute_round_trips() -> None:
    g = Graph("placed")
    x = g.add_input("x", TensorType("f32", (4, 4)), param=True)
    op = g.add_op("neg", [x], [TensorType("f32", (4, 4))], name="n")
    op.attrs.update({"cost": DurationAttr(1.25e-3), "memory": BytesAttr(3 << 20), "device": DeviceAttr("gpu1"),
                     "start": DurationAttr(0.0), "end": DurationAttr(0.00125), "group": pesto_ir.to_attr("g3")})
    op.set("per_kind", {"h100": DurationAttr(1e-3), "cpu": DurationAttr(2e-2)})
    blob = g.add_op("opaque", [op.result], [BlobType(10)], name="b")
    g.set_outputs([blob.result])
    text = str(g)
    assert "device = @gpu1" in text and "memory = 3MiB" in text and "cost = 1.25ms" in text
    again = parse(text)
    assert again.structurally_equal(g)
    assert again.op("n").get("cost") == 1.25e-3


@pytest.mark.parametrize("seconds", [0.0, 1e-9, 3e-7, 0.00014, 0.002, 0.1 + 0.2, 1.5, 12345.678, 1 / 3, 5e-324, 1e300])
def test_durations_print_exactly(seconds: float) -> None:
    text = format_duration(seconds)
    g = parse(f"graph @g() {{\n  @n noop() {{t = {text}}}\n}}\n")
    assert g.op("n").get("t") == seconds


def test_quoted_names_and_unicode_strings() -> None:
    g = Graph("weird name")
    v = g.add_input("in put", TensorType("f32", ()))
    op = g.add_op("neg", [v], [TensorType("f32", ())], name="gpu_0/res 2", result_names=["out/0"])
    op.set("label", 'quote " and ünïcode\n')
    g.set_outputs([op.result])
    again = parse(str(g))
    assert again.structurally_equal(g)


def test_nested_graph_attribute_round_trips() -> None:
    text = (
        "graph @outer(%x: f32[3]) {\n"
        "  %y = scan(%x) {body = graph @body(%c: f32[3]) {\n"
        "      %d = neg(%c) : f32[3]\n"
        "      return %d\n"
        "    }, length = 4} : f32[3]\n"
        "  return %y\n"
        "}\n"
    )
    g = parse(text)
    verify(g)
    assert str(g) == text
    assert g.op("y").subgraphs()[0].op("d").opcode == "neg"


def test_comments_and_forward_references_are_accepted_then_verified() -> None:
    g = parse("// header\ngraph @g(%x: f32[2]) {  // trailing\n  %y = neg(%x) : f32[2] // why\n  return %y\n}\n")
    verify(g)
    assert [op.name for op in g.ops] == ["y"]
