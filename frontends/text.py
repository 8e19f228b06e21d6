"""Parse `.pir` text (grammar in `grammar/pesto.lark`) into a Graph.

Lark's LALR parser runs with the builder as an inline transformer, so no parse tree is kept:
each op becomes an `_OpRecord` as soon as it reduces, and each graph is assembled (names
resolved, forward references allowed so the verifier can report them) when its `}` is read.
Every error is a `ParseError` pointing at the offending token with a caret.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from pesto_ir.attributes import (
    BYTE_UNITS,
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
    parse_duration,
)
from pesto_ir.errors import ParseError, SourceSpan
from pesto_ir.ir import Graph, Location, Op, Value
from pesto_ir.types import DTYPES, BlobType, TensorType, Type

# What the user is told was expected, per grammar terminal.
_TERMINAL_WORDS: dict[str, str] = {
    "AT_NAME": "a name like @main",
    "VALUE": "a value like %x",
    "TYPE": "a type like f32[2,3]",
    "OPCODE": "an opcode",
    "IDENT": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "DURATION": "a duration like 2ms",
    "BYTES": "a size like 4MiB",
    "STRING": "a string",
    "PARAM": "'param'",
    "RETURN": "'return'",
    "LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "GRAPH": "'graph'", "ATTRIBUTES": "'attributes'",
    "LOC": "'loc'", "$END": "end of input",
}


@lru_cache(maxsize=1)
def _grammar() -> str:
    return resources.files("pesto_ir.grammar").joinpath("pesto.lark").read_text(encoding="utf-8")


def _unquote(text: str) -> str:
    return json.loads(text) if text.startswith('"') else text


@dataclass
class _OpRecord:
    label: Token | None
    results: list[Token]
    opcode: Token
    operands: list[Token]
    attrs: dict[str, Attr]
    types: list[Token]
    loc: Location | None


@dataclass
class _Ret:
    values: list[Token] = field(default_factory=list)


class _Builder(Transformer):  # type: ignore[type-arg]
    """Turns reductions straight into IR pieces (used inline by the LALR parser)."""

    def __init__(self, filename: str, text: str) -> None:
        super().__init__(visit_tokens=False)
        self.filename = filename
        self.text = text

    # -- helpers
    def span(self, tok: Token, width: int | None = None) -> SourceSpan:
        return SourceSpan(self.filename, tok.line or 0, tok.column or 0, self.text,
                          width if width is not None else len(str(tok)))

    def fail(self, tok: Token, message: str) -> ParseError:
        return ParseError(message, self.span(tok))

    def type_of(self, tok: Token) -> Type:
        m = re.fullmatch(r"([a-z][a-z0-9]*)\[([0-9, ]*)\]", str(tok))
        assert m is not None  # the TYPE terminal guarantees this shape
        dtype, dims_text = m.group(1), m.group(2).replace(" ", "")
        dims = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
        if dtype == "blob":
            if len(dims) != 1:
                raise self.fail(tok, "a blob type has exactly one size, in bytes: blob[1024]")
            return BlobType(dims[0])
        if dtype not in DTYPES:
            raise self.fail(tok, f"unknown element type '{dtype}' (known: {', '.join(DTYPES)}, blob)")
        return TensorType(dtype, dims)

    # -- rules
    def start(self, children: list[Any]) -> Graph:
        return children[0]

    def input(self, children: list[Token]) -> tuple[bool, Token, Type]:
        param = len(children) == 3
        return param, children[-2], self.type_of(children[-1])

    def results(self, children: list[Token]) -> list[Token]:
        return children

    def location(self, children: list[Token | None]) -> Location:
        file, line, col = children
        return Location(_unquote(str(file)), int(line), int(col) if col is not None else 0)

    def op(self, children: list[Any]) -> _OpRecord:
        label: Token | None = None
        results: list[Token] = []
        operands: list[Token] = []
        types: list[Token] = []
        attrs: dict[str, Attr] = {}
        loc: Location | None = None
        opcode: Token | None = None
        for c in children:
            if c is None:
                continue
            if isinstance(c, Token):
                if c.type == "AT_NAME":
                    label = c
                elif c.type == "OPCODE":
                    opcode = c
                elif c.type == "VALUE":
                    operands.append(c)
                elif c.type == "TYPE":
                    types.append(c)
            elif isinstance(c, list):
                results = c
            elif isinstance(c, dict):
                attrs = c
            elif isinstance(c, Location):
                loc = c
        assert opcode is not None
        if len(types) != len(results):
            where = types[0] if types else opcode
            raise self.fail(where, f"op '{opcode}' has {len(results)} result(s) but {len(types)} type(s)")
        if not results and label is None:
            raise self.fail(opcode, f"op '{opcode}' has no results, so it needs a name: @name {opcode}(...)")
        return _OpRecord(label, results, opcode, operands, attrs, types, loc)

    def ret(self, children: list[Token | None]) -> _Ret:
        return _Ret([c for c in children[1:] if c is not None])

    def attr_dict(self, children: list[Any]) -> dict[str, Attr]:
        out: dict[str, Attr] = {}
        for entry in children:
            if entry is None:
                continue
            key_tok, value = entry
            key = _unquote(str(key_tok))
            if key in out:
                raise self.fail(key_tok, f"duplicate attribute '{key}'")
            out[key] = value
        return out

    def entry(self, children: list[Any]) -> tuple[Token, Attr]:
        return children[0], self.attr(children[1])

    def list(self, children: list[Any]) -> ListAttr:
        return ListAttr(tuple(self.attr(c) for c in children if c is not None))

    def attr(self, c: Any) -> Attr:
        if isinstance(c, Attr):
            return c
        if isinstance(c, dict):
            return DictAttr(tuple(c.items()))
        if isinstance(c, Graph):
            return GraphAttr(c)
        tok: Token = c
        text = str(tok)
        kind = tok.type
        if kind == "INT":
            return IntAttr(int(text))
        if kind == "FLOAT":
            return FloatAttr(float(text))
        if kind == "STRING":
            return StringAttr(_unquote(text))
        if kind == "DURATION":
            m = re.fullmatch(r"(.*?)(ns|us|ms|s)", text)
            assert m is not None
            return DurationAttr(parse_duration(m.group(1), m.group(2)))
        if kind == "BYTES":
            m = re.fullmatch(r"([0-9.]+)([A-Za-z]+)", text)
            assert m is not None
            n = float(m.group(1)) * BYTE_UNITS[m.group(2)] if "." in m.group(1) else int(m.group(1)) * BYTE_UNITS[m.group(2)]
            if n != int(n):
                raise self.fail(tok, f"{text} is not a whole number of bytes")
            return BytesAttr(int(n))
        if kind == "TYPE":
            return TypeAttr(self.type_of(tok))
        if kind == "AT_NAME":
            return DeviceAttr(_unquote(text[1:]))
        # IDENT
        named = {"true": BoolAttr(True), "false": BoolAttr(False), "none": NoneAttr(),
                 "inf": FloatAttr(float("inf")), "nan": FloatAttr(float("nan"))}
        if text in named:
            return named[text]
        if text in DTYPES:
            return DtypeAttr(text)
        raise self.fail(tok, f"unknown attribute value '{text}' (strings are quoted: \"{text}\")")

    def graph(self, children: list[Any]) -> Graph:
        name_tok: Token = children[0]
        graph = Graph(_unquote(str(name_tok)[1:]))
        graph.pos = Location(self.filename, name_tok.line or 0, name_tok.column or 0)
        graph.source_text = self.text
        values: dict[str, Value] = {}
        body: list[Any] = []
        for c in children[1:]:
            if c is None:
                continue
            if isinstance(c, tuple):
                param, tok, typ = c
                name = _unquote(str(tok)[1:])
                if name in values:
                    raise self.fail(tok, f"duplicate value name %{name}")
                v = graph.add_input(name, typ, param=param)
                v.pos = Location(self.filename, tok.line or 0, tok.column or 0)
                values[name] = v
            elif isinstance(c, dict):
                graph.attrs.update(c)
            else:
                body.append(c)
        # First create every op (so operands may refer forward), then wire operands.
        pending: list[tuple[Op, _OpRecord]] = []
        ret: _Ret | None = None
        for rec in body:
            if isinstance(rec, _Ret):
                if ret is not None:
                    raise self.fail(rec.values[0] if rec.values else name_tok, "a graph has one return")
                ret = rec
                continue
            if ret is not None:
                raise self.fail(rec.opcode, "op after 'return'")
            pending.append((self._make_op(graph, rec, values), rec))
        for op, rec in pending:
            op.set_operands(self._lookup(t, values) for t in rec.operands)
        if ret is not None:
            graph.set_outputs(self._lookup(t, values) for t in ret.values)
        return graph

    def _make_op(self, graph: Graph, rec: _OpRecord, values: dict[str, Value]) -> Op:
        result_names = [_unquote(str(t)[1:]) for t in rec.results]
        for t, n in zip(rec.results, result_names):
            if n in values:
                raise self.fail(t, f"duplicate value name %{n}")
        name = _unquote(str(rec.label)[1:]) if rec.label is not None else result_names[0]
        if graph.has_op(name):
            raise self.fail(rec.label or rec.results[0], f"duplicate op name '{name}'")
        op = Op(name, str(rec.opcode), (), [self.type_of(t) for t in rec.types], rec.attrs,
                result_names, rec.loc)
        op.pos = Location(self.filename, rec.opcode.line or 0, rec.opcode.column or 0)
        graph.append(op)
        for r, t in zip(op.results, rec.results):
            r.pos = Location(self.filename, t.line or 0, t.column or 0)
            values[r.name] = r
        return op

    def _lookup(self, tok: Token, values: dict[str, Value]) -> Value:
        name = _unquote(str(tok)[1:])
        v = values.get(name)
        if v is None:
            raise self.fail(tok, f"use of undefined value %{name}")
        return v


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(_grammar(), parser="lalr", lexer="contextual", propagate_positions=True,
                maybe_placeholders=True)


def parse(text: str, filename: str = "<string>") -> Graph:
    """Parse `.pir` text into a Graph (not yet verified; see `pesto_ir.verify`)."""
    try:
        tree = _lark().parse(text)
        return _Builder(filename, text).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, ParseError):
            raise e.orig_exc from None
        raise
    except UnexpectedInput as e:
        raise _syntax_error(e, filename, text) from None


def parse_file(path: str | Path) -> Graph:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ParseError(f"cannot read file: {e.strerror}", SourceSpan(str(path), 1, 1)) from None
    except UnicodeDecodeError as e:
        raise ParseError(f"file is not UTF-8 text ({e.reason} at byte {e.start})",
                         SourceSpan(str(path), 1, 1)) from None
    return parse(text, str(path))


def _syntax_error(e: UnexpectedInput, filename: str, text: str) -> ParseError:
    line, col = e.line if e.line and e.line > 0 else 1, e.column if e.column and e.column > 0 else 1
    if isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if e.pos_in_stream is not None and e.pos_in_stream < len(text) else "?"
        message = f"unexpected character {ch!r}"
        expected = e.allowed
        width = 1
    elif isinstance(e, UnexpectedEOF):
        lines = text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        message = "unexpected end of input"
        expected = e.expected
        width = 1
    else:
        assert isinstance(e, UnexpectedToken)
        tok = e.token
        message = "unexpected end of input" if tok.type == "$END" else f"unexpected '{tok}'"
        expected = e.accepts or e.expected
        width = len(str(tok)) if tok.type != "$END" else 1
        if tok.type == "$END":
            lines = text.splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
    words = sorted({_TERMINAL_WORDS.get(t, t) for t in (expected or ())})
    hint = f"expected {', '.join(words)}" if words else None
    return ParseError(message, SourceSpan(filename, line, col, text, width), hint)
