"""Property tests of the text format: random graphs round-trip exactly; mutated text fails cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pesto_ir import Graph, Location, ParseError, PestoError, parse, verify
from pesto_ir.ir.attributes import (
    Attr,
    BoolAttr,
    BytesAttr,
    DeviceAttr,
    DictAttr,
    DtypeAttr,
    DurationAttr,
    FloatAttr,
    GraphAttr,
    IntAttr,
    ListAttr,
    NoneAttr,
    StringAttr,
    TypeAttr,
    quote,
)
from pesto_ir.ir.types import DTYPES, KEY_IMPLS, BlobType, TensorType, Type, key_dtype

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.pir"))

names = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.$-]{0,8}", fullmatch=True),
    st.text(min_size=1, max_size=6),  # anything: printed quoted
)
# attributes whose values the parser checks (a cost is a time, sizes are whole bytes): any other name
op_attr_names = names.filter(lambda k: k not in {"cost", "memory", "activation", "workspace"})
types: st.SearchStrategy[Type] = st.one_of(
    st.builds(TensorType, st.sampled_from([*sorted(DTYPES), *(key_dtype(impl) for impl in sorted(KEY_IMPLS))]),
              st.lists(st.integers(0, 64), max_size=4).map(tuple)),
    st.builds(BlobType, st.integers(0, 2**40)),
)
scalars: st.SearchStrategy[Attr] = st.one_of(
    st.builds(IntAttr, st.integers(-(2**70), 2**70)),
    st.builds(FloatAttr, st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(BoolAttr, st.booleans()),
    st.just(NoneAttr()),
    st.builds(StringAttr, st.text(max_size=10)),
    st.builds(DtypeAttr, st.sampled_from(sorted(DTYPES))),
    st.builds(TypeAttr, types),
    st.builds(DurationAttr, st.floats(min_value=0, max_value=1e6, allow_nan=False)),
    st.builds(BytesAttr, st.integers(0, 2**50)),
    st.builds(DeviceAttr, names),
)
attrs: st.SearchStrategy[Attr] = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: ListAttr(tuple(xs))),
        st.dictionaries(names, inner, max_size=3).map(lambda d: DictAttr(tuple(d.items()))),
    ),
    max_leaves=6,
)
opcodes = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,10}", fullmatch=True).filter(lambda s: s != "return")


@st.composite
def graphs(draw: st.DrawFn, depth: int = 0) -> Graph:
    g = Graph(draw(names))
    used: set[str] = set()

    def fresh() -> str:
        n = draw(names.filter(lambda s: s not in used))
        used.add(n)
        return n

    for _ in range(draw(st.integers(0, 3))):
        g.add_input(fresh(), draw(types), param=draw(st.booleans()))
    if draw(st.booleans()):
        g.attrs.update(draw(st.dictionaries(names, attrs, max_size=2)))
    for _ in range(draw(st.integers(0, 6))):
        values = g.inputs + [r for op in g.ops for r in op.results]
        operands = draw(st.lists(st.sampled_from(values), max_size=3)) if values else []
        n_results = draw(st.integers(0, 2))
        result_names = [fresh() for _ in range(n_results)]
        op_name = result_names[0] if result_names and draw(st.booleans()) else fresh()
        op_attrs = draw(st.dictionaries(op_attr_names, attrs, max_size=3))
        if depth == 0 and draw(st.integers(0, 9)) == 0:
            op_attrs["body"] = GraphAttr(draw(graphs(depth=1)))
        loc = draw(st.one_of(st.none(), st.builds(Location, names, st.integers(1, 10**6), st.integers(0, 500))))
        g.add_op(draw(opcodes), operands, [draw(types) for _ in result_names], op_attrs, name=op_name,
                 result_names=result_names, loc=loc)
    values = g.inputs + [r for op in g.ops for r in op.results]
    if values:
        g.set_outputs(draw(st.lists(st.sampled_from(values), max_size=3)))
    return g


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
@pytest.mark.slow
def test_random_graphs_round_trip_exactly(g: Graph) -> None:
    text = str(g)
    again = parse(text)
    assert again.structurally_equal(g)
    assert str(again) == text
    assert parse(text, engine="lark").structurally_equal(g)  # the fast path and Lark agree


@st.composite
def mutated_examples(draw: st.DrawFn) -> tuple[str, str]:
    path = draw(st.sampled_from(EXAMPLES))
    data = bytearray(path.read_bytes())
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["replace", "delete", "insert"]))
        byte = draw(st.sampled_from(list(b"%@{}[](),:=-./\"0123456789 \nabcfx")))
        if kind == "replace":
            data[i] = byte
        elif kind == "delete":
            del data[i]
        else:
            data.insert(i, byte)
    return path.name, data.decode("utf-8", errors="replace")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_examples())
def test_mutated_examples_fail_with_a_location_or_stay_valid(case: tuple[str, str]) -> None:
    name, text = case
    _assert_parsers_agree(text, name)
    try:
        g = parse(text, name)
        verify(g)
    except ParseError as e:
        assert e.span.file == name and e.span.line >= 1 and e.span.col >= 1
        assert e.format().startswith(f"{name}:{e.span.line}:{e.span.col}: error: ")
    except PestoError as e:  # verifier findings: each names a place in the file
        assert f"{name}:" in e.format()
    else:
        assert parse(str(g)).structurally_equal(g)


def _assert_parsers_agree(text: str, name: str) -> None:
    """The fast path accepts exactly what the Lark grammar accepts, with the same result."""
    outcomes = []
    for engine in ("fast", "lark"):
        try:
            outcomes.append(str(parse(text, name, engine=engine)))
        except ParseError as e:
            outcomes.append(e.format())
    assert outcomes[0] == outcomes[1]


@given(st.text())
def test_a_string_is_quoted_as_json_quotes_it(s: str) -> None:
    """The printer's quick path for strings that need no escape writes what json.dumps writes."""
    assert quote(s) == json.dumps(s, ensure_ascii=False)
