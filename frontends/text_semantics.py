"""What both `.pir` parsers (`frontends/text.py`) share: the grammar, `grammar/pesto.lark`, loaded
once, and the semantic layer (`Semantics`) that builds the Graph from tokens of either parser, so
that both build identical graphs and raise identical semantic errors.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from lark import Lark

from pesto_ir.ir.attributes import (
    BYTE_UNITS,
    Attr,
    BoolAttr,
    BytesAttr,
    DeviceAttr,
    DictAttr,
    DtypeAttr,
    DurationAttr,
    FloatAttr,
    IntAttr,
    NoneAttr,
    StringAttr,
    TypeAttr,
    parse_duration,
)
from pesto_ir.ir.graph import Graph, Location, Op, Value
from pesto_ir.ir.types import DTYPES, KEY_IMPLS, BlobType, TensorType, Type, key_dtype
from pesto_ir.util.errors import ParseError, SourceSpan
from pesto_ir.util.loader import MAX_SECONDS, brief, finite

_NAMED_VALUES: dict[str, Attr] = {
    "true": BoolAttr(True), "false": BoolAttr(False), "none": NoneAttr(),
    "inf": FloatAttr(float("inf")), "nan": FloatAttr(float("nan")),
}
_BYTE_ATTRS = ("memory", "activation", "workspace")  # op attributes counting bytes
_TYPE_RE = re.compile(r"([a-z][a-z0-9]*)(?:<([A-Za-z0-9_]+)>)?\[([0-9, ]*)\]")
_BYTES_RE = re.compile(r"([0-9.]+)([A-Za-z]+)")


@lru_cache(maxsize=1)
def grammar_text() -> str:
    return resources.files("pesto_ir.grammar").joinpath("pesto.lark").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def lark_parser() -> Lark:
    return Lark(grammar_text(), parser="lalr", lexer="contextual", propagate_positions=True,
                maybe_placeholders=True)


def unquote(text: str) -> str:
    return json.loads(text) if text.startswith('"') else text


@dataclass
class OpRecord:
    label: Any  # a token (lark Token or FastToken) or None
    results: list[Any]
    opcode: Any
    operands: list[Any]
    attrs: dict[str, Attr]
    types: list[Type]
    type_toks: list[Any]
    loc: Location | None


@dataclass
class ReturnRecord:
    values: list[Any] = field(default_factory=list)


class Semantics:
    """Builds IR from tokens; tokens have `.type`, `.line`, `.column` and `str()`."""

    def __init__(self, filename: str, text: str) -> None:
        self.filename = filename
        self.text = text
        self._types: dict[str, Type] = {}

    def unquoted(self, tok: Any, text: str) -> str:
        """A name or string as written (quoted or bare), refused at `tok` when it escapes a lone
        surrogate (\\ud800-\\udfff): no file or terminal can take that text back out."""
        value = unquote(text)
        if any("\ud800" <= c <= "\udfff" for c in value):
            raise self.fail(tok, f"{brief(text)} escapes a lone surrogate (\\ud800-\\udfff), which is not text")
        return value

    def _whole(self, tok: Any) -> int:
        """A line or column number of a `loc(...)`."""
        try:
            return int(str(tok))
        except ValueError:  # more digits than Python converts (4300)
            raise self.fail(tok, f"{brief(str(tok))} has more digits than a line or column number") from None

    def fail(self, tok: Any, message: str) -> ParseError:
        return ParseError(message, SourceSpan(self.filename, tok.line or 0, tok.column or 0, self.text,
                                              len(str(tok))))

    def type_of(self, tok: Any) -> Type:
        text = str(tok)
        t = self._types.get(text)
        if t is None:
            t = self._types[text] = self._parse_type(tok, text)
        return t

    def _parse_type(self, tok: Any, text: str) -> Type:
        m = _TYPE_RE.fullmatch(text)
        assert m is not None  # the TYPE terminal guarantees this shape
        dtype, impl, dims_text = m.group(1), m.group(2), m.group(3).replace(" ", "")
        try:
            dims = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
        except ValueError:
            raise self.fail(tok, f"malformed shape in type '{text}'") from None
        if impl is not None or dtype == "key":
            return self._key_type(tok, text, dtype, impl, dims)
        if dtype == "blob":
            if len(dims) != 1:
                raise self.fail(tok, "a blob type has exactly one size, in bytes: blob[1024]")
            return BlobType(dims[0])
        if dtype not in DTYPES:
            raise self.fail(tok, f"unknown element type '{dtype}' (known: {', '.join(DTYPES)}, blob, key<impl>)")
        return TensorType(dtype, dims)

    def _key_type(self, tok: Any, text: str, dtype: str, impl: str | None, dims: tuple[int, ...]) -> Type:
        """`key<impl>[shape]`: an array of typed PRNG keys of a known implementation."""
        known = ", ".join(KEY_IMPLS)
        if dtype != "key":
            raise self.fail(tok, f"only key types name an implementation in <...>: key<threefry2x32>[2], "
                                 f"not '{text}'")
        if impl is None:
            raise self.fail(tok, f"a key type names its PRNG implementation: key<threefry2x32>[2] (known: {known})")
        if impl not in KEY_IMPLS:
            raise self.fail(tok, f"unknown PRNG implementation '{impl}' in type '{text}' (known: {known})")
        return TensorType(key_dtype(impl), dims)

    def location(self, file: Any, line: Any, col: Any | None) -> Location:
        return Location(self.unquoted(file, str(file)), self._whole(line), self._whole(col) if col is not None else 0)

    def op_record(self, label: Any, results: list[Any], opcode: Any, operands: list[Any],
                  attrs: dict[str, Attr], type_toks: list[Any], loc: Location | None) -> OpRecord:
        if len(type_toks) != len(results):
            where = type_toks[0] if type_toks else opcode
            raise self.fail(where, f"op '{opcode}' has {len(results)} result(s) but {len(type_toks)} type(s)")
        if not results and label is None:
            raise self.fail(opcode, f"op '{opcode}' has no results, so it needs a name: @name {opcode}(...)")
        self._check_costs(label or results[0], opcode, attrs)
        return OpRecord(label, results, opcode, operands, attrs, [self.type_of(t) for t in type_toks],
                         type_toks, loc)

    def _check_costs(self, name_tok: Any, opcode: Any, attrs: dict[str, Attr]) -> None:
        """`cost` is seconds (or a dict of seconds per device), the byte counts whole numbers: all
        finite and not negative, as in `pesto-graph/1` (the planners would fail on them much later)."""
        where = f"op '{self.unquoted(name_tok, str(name_tok)[1:])}'"
        cost = attrs.get("cost")
        entries = cost.entries if isinstance(cost, DictAttr) else [("", cost)] if cost is not None else []
        for key, a in entries:
            v = finite(a.value) if isinstance(a, (IntAttr, FloatAttr, DurationAttr)) else None
            if v is None or v < 0:
                what = f"cost[{key!r}]" if key else "cost"
                shown = str(a.value) if isinstance(a, DurationAttr) else str(a)
                raise self.fail(opcode, f"{where}: {what} must be a non-negative number of seconds, "
                                        f"got {brief(shown)}")
            if v > MAX_SECONDS:
                what = f"cost[{key!r}]" if key else "cost"
                raise self.fail(opcode, f"{where}: {what} {v:g} s is more than an op may take ({MAX_SECONDS:g} s)")
        for key in _BYTE_ATTRS:
            b = attrs.get(key)
            if b is None:
                continue
            v = finite(b.value) if isinstance(b, (IntAttr, FloatAttr, BytesAttr)) else None
            if v is None or v < 0 or v != int(v):
                raise self.fail(opcode, f"{where}: {key} must be a whole non-negative number of bytes, "
                                        f"got {brief(str(b))}")

    def add_entry(self, out: dict[str, Attr], key_tok: Any, value: Attr) -> None:
        key = self.unquoted(key_tok, str(key_tok))
        if key in out:
            raise self.fail(key_tok, f"duplicate attribute '{key}'")
        out[key] = value

    def scalar(self, tok: Any) -> Attr:
        """The attribute a single value token stands for."""
        text = str(tok)
        kind = tok.type
        if kind == "INT":
            try:
                return IntAttr(int(text))
            except ValueError:  # more digits than Python converts (4300)
                raise self.fail(tok, f"integer {brief(text)} has more digits than can be read") from None
        if kind == "FLOAT":
            return FloatAttr(float(text))
        if kind == "STRING":
            return StringAttr(self.unquoted(tok, text))
        if kind == "DURATION":
            unit = text[-2:] if text[-2:] in ("ns", "us", "ms") else "s"
            return DurationAttr(parse_duration(text[: -len(unit)], unit))
        if kind == "BYTES":
            return BytesAttr(self._bytes(tok, text))
        if kind == "TYPE":
            return TypeAttr(self.type_of(tok))
        if kind == "AT_NAME":
            return DeviceAttr(self.unquoted(tok, text[1:]))
        named = _NAMED_VALUES.get(text)
        if named is not None:
            return named
        if text in DTYPES:
            return DtypeAttr(text)
        raise self.fail(tok, f"unknown attribute value '{text}' (strings are quoted: \"{text}\")")

    def _bytes(self, tok: Any, text: str) -> int:
        m = _BYTES_RE.fullmatch(text)
        assert m is not None
        number, unit = m.group(1), BYTE_UNITS[m.group(2)]
        try:
            if "." not in number:
                return int(number) * unit
            n = float(number) * unit
            if n != int(n):
                raise self.fail(tok, f"{text} is not a whole number of bytes")
            return int(n)
        except (ValueError, OverflowError):  # more digits than Python converts, or past a float
            raise self.fail(tok, f"{brief(text)} is more bytes than can be read") from None

    def graph(self, name_tok: Any, inputs: list[tuple[bool, Any, Type]], attrs: dict[str, Attr] | None,
              body: list[OpRecord | ReturnRecord]) -> Graph:
        graph = Graph(self.unquoted(name_tok, str(name_tok)[1:]))
        graph.pos = Location(self.filename, name_tok.line or 0, name_tok.column or 0)
        graph.source_text = self.text
        values: dict[str, Value] = {}
        for param, tok, typ in inputs:
            name = self.unquoted(tok, str(tok)[1:])
            if name in values:
                raise self.fail(tok, f"duplicate value name %{name}")
            v = graph.add_input(name, typ, param=param)
            v.pos = Location(self.filename, tok.line or 0, tok.column or 0)
            values[name] = v
        if attrs:
            graph.attrs.update(attrs)
        # First create every op (so operands may refer forward), then wire operands.
        pending: list[tuple[Op, OpRecord]] = []
        ret: ReturnRecord | None = None
        for rec in body:
            if isinstance(rec, ReturnRecord):
                if ret is not None:
                    raise self.fail(rec.values[0] if rec.values else name_tok, "a graph has one return")
                ret = rec
                continue
            if ret is not None:
                raise self.fail(rec.opcode, "op after 'return'")
            pending.append((self._make_op(graph, rec, values), rec))
        for op, rec in pending:
            op.set_operands([self._lookup(t, values) for t in rec.operands])
        if ret is not None:
            graph.set_outputs(self._lookup(t, values) for t in ret.values)
        return graph

    def _make_op(self, graph: Graph, rec: OpRecord, values: dict[str, Value]) -> Op:
        result_names = [self.unquoted(t, str(t)[1:]) for t in rec.results]
        for t, n in zip(rec.results, result_names):
            if n in values:
                raise self.fail(t, f"duplicate value name %{n}")
        name = self.unquoted(rec.label, str(rec.label)[1:]) if rec.label is not None else result_names[0]
        if graph.has_op(name):
            raise self.fail(rec.label or rec.results[0], f"duplicate op name '{name}'")
        op = Op(name, str(rec.opcode), (), rec.types, None, result_names, rec.loc)
        op.attrs = rec.attrs
        op.pos = Location(self.filename, rec.opcode.line or 0, rec.opcode.column or 0)
        graph.append(op)
        for r, t in zip(op.results, rec.results):
            r.pos = Location(self.filename, t.line or 0, t.column or 0)
            values[r.name] = r
        return op

    def _lookup(self, tok: Any, values: dict[str, Value]) -> Value:
        name = self.unquoted(tok, str(tok)[1:])
        v = values.get(name)
        if v is None:
            raise self.fail(tok, f"use of undefined value %{name}")
        return v
