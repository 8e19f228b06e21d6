"""Parse `.pir` text (grammar in `grammar/pesto.lark`) into a Graph.

Two syntax layers share one semantic layer (`_Semantics`), so both build identical graphs and
raise identical semantic errors:

- the reference parser: Lark's LALR parser over `pesto.lark`, with positions propagated. It
  defines the language and produces every syntax error message (what was expected, with a caret);
- a fast path: a recursive-descent parser over the *same* terminal regexps (read from the Lark
  grammar), about ten times faster, for large graphs. On any syntax error it defers to Lark,
  which reports it. Tests check that both parsers agree on examples and random graphs.

Forward references are resolved when a graph's `}` is read, so the verifier (not the parser)
reports a use before definition, with both places named.
"""

from __future__ import annotations

import bisect
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
from pesto_ir.gc_pause import gc_paused
from pesto_ir.ir import Graph, Location, Op, Value
from pesto_ir.loader import MAX_NESTING, ArgumentError, brief, finite, nesting_error, read_source_text, too_deep
from pesto_ir.types import DTYPES, KEY_IMPLS, BlobType, TensorType, Type, key_dtype

# What the user is told was expected, per grammar terminal.
_TERMINAL_WORDS: dict[str, str] = {
    "AT_NAME": "a name like @main",
    "VALUE": "a value like %x",
    "TYPE": "a type like f32[2,3] or key<threefry2x32>[2]",
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

_NAMED_VALUES: dict[str, Attr] = {
    "true": BoolAttr(True), "false": BoolAttr(False), "none": NoneAttr(),
    "inf": FloatAttr(float("inf")), "nan": FloatAttr(float("nan")),
}
_BYTE_ATTRS = ("memory", "activation", "workspace")  # op attributes counting bytes
_TYPE_RE = re.compile(r"([a-z][a-z0-9]*)(?:<([A-Za-z0-9_]+)>)?\[([0-9, ]*)\]")
_BYTES_RE = re.compile(r"([0-9.]+)([A-Za-z]+)")


@lru_cache(maxsize=1)
def _grammar() -> str:
    return resources.files("pesto_ir.grammar").joinpath("pesto.lark").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(_grammar(), parser="lalr", lexer="contextual", propagate_positions=True,
                maybe_placeholders=True)


def _unquote(text: str) -> str:
    return json.loads(text) if text.startswith('"') else text


# ====================================================================== semantics (shared)

@dataclass
class _OpRecord:
    label: Any  # a token (lark Token or _Tok) or None
    results: list[Any]
    opcode: Any
    operands: list[Any]
    attrs: dict[str, Attr]
    types: list[Type]
    type_toks: list[Any]
    loc: Location | None


@dataclass
class _Ret:
    values: list[Any] = field(default_factory=list)


class _Semantics:
    """Builds IR from tokens; tokens have `.type`, `.line`, `.column` and `str()`."""

    def __init__(self, filename: str, text: str) -> None:
        self.filename = filename
        self.text = text
        self._types: dict[str, Type] = {}

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
        return Location(_unquote(str(file)), int(str(line)), int(str(col)) if col is not None else 0)

    def op_record(self, label: Any, results: list[Any], opcode: Any, operands: list[Any],
                  attrs: dict[str, Attr], type_toks: list[Any], loc: Location | None) -> _OpRecord:
        if len(type_toks) != len(results):
            where = type_toks[0] if type_toks else opcode
            raise self.fail(where, f"op '{opcode}' has {len(results)} result(s) but {len(type_toks)} type(s)")
        if not results and label is None:
            raise self.fail(opcode, f"op '{opcode}' has no results, so it needs a name: @name {opcode}(...)")
        self._check_costs(label or results[0], opcode, attrs)
        return _OpRecord(label, results, opcode, operands, attrs, [self.type_of(t) for t in type_toks],
                         type_toks, loc)

    def _check_costs(self, name_tok: Any, opcode: Any, attrs: dict[str, Attr]) -> None:
        """`cost` is seconds (or a dict of seconds per device), the byte counts whole numbers: all
        finite and not negative, as in `pesto-graph/1` (the planners would fail on them much later)."""
        where = f"op '{_unquote(str(name_tok)[1:])}'"
        cost = attrs.get("cost")
        entries = cost.entries if isinstance(cost, DictAttr) else [("", cost)] if cost is not None else []
        for key, a in entries:
            v = finite(a.value) if isinstance(a, (IntAttr, FloatAttr, DurationAttr)) else None
            if v is None or v < 0:
                what = f"cost[{key!r}]" if key else "cost"
                shown = str(a.value) if isinstance(a, DurationAttr) else str(a)
                raise self.fail(opcode, f"{where}: {what} must be a non-negative number of seconds, "
                                        f"got {brief(shown)}")
        for key in _BYTE_ATTRS:
            a = attrs.get(key)
            if a is None:
                continue
            v = finite(a.value) if isinstance(a, (IntAttr, FloatAttr, BytesAttr)) else None
            if v is None or v < 0 or v != int(v):
                raise self.fail(opcode, f"{where}: {key} must be a whole non-negative number of bytes, "
                                        f"got {brief(str(a))}")

    def add_entry(self, out: dict[str, Attr], key_tok: Any, value: Attr) -> None:
        key = _unquote(str(key_tok))
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
            return StringAttr(_unquote(text))
        if kind == "DURATION":
            unit = text[-2:] if text[-2:] in ("ns", "us", "ms") else "s"
            return DurationAttr(parse_duration(text[: -len(unit)], unit))
        if kind == "BYTES":
            return BytesAttr(self._bytes(tok, text))
        if kind == "TYPE":
            return TypeAttr(self.type_of(tok))
        if kind == "AT_NAME":
            return DeviceAttr(_unquote(text[1:]))
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
        if "." not in number:
            return int(number) * unit
        n = float(number) * unit
        if n != int(n):
            raise self.fail(tok, f"{text} is not a whole number of bytes")
        return int(n)

    def graph(self, name_tok: Any, inputs: list[tuple[bool, Any, Type]], attrs: dict[str, Attr] | None,
              body: list[_OpRecord | _Ret]) -> Graph:
        graph = Graph(_unquote(str(name_tok)[1:]))
        graph.pos = Location(self.filename, name_tok.line or 0, name_tok.column or 0)
        graph.source_text = self.text
        values: dict[str, Value] = {}
        for param, tok, typ in inputs:
            name = _unquote(str(tok)[1:])
            if name in values:
                raise self.fail(tok, f"duplicate value name %{name}")
            v = graph.add_input(name, typ, param=param)
            v.pos = Location(self.filename, tok.line or 0, tok.column or 0)
            values[name] = v
        if attrs:
            graph.attrs.update(attrs)
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
            op.set_operands([self._lookup(t, values) for t in rec.operands])
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
        op = Op(name, str(rec.opcode), (), rec.types, None, result_names, rec.loc)
        op.attrs = rec.attrs
        op.pos = Location(self.filename, rec.opcode.line or 0, rec.opcode.column or 0)
        graph.append(op)
        for r, t in zip(op.results, rec.results):
            r.pos = Location(self.filename, t.line or 0, t.column or 0)
            values[r.name] = r
        return op

    def _lookup(self, tok: Any, values: dict[str, Value]) -> Value:
        name = _unquote(str(tok)[1:])
        v = values.get(name)
        if v is None:
            raise self.fail(tok, f"use of undefined value %{name}")
        return v


# ====================================================================== reference parser (Lark)

class _LarkBuilder(Transformer):  # type: ignore[type-arg]
    """Adapts Lark's parse tree to `_Semantics`, rule by rule."""

    def __init__(self, sem: _Semantics) -> None:
        super().__init__(visit_tokens=False)
        self.sem = sem

    def start(self, children: list[Any]) -> Graph:
        return children[0]

    def input(self, children: list[Token]) -> tuple[bool, Token, Type]:
        return len(children) == 3, children[-2], self.sem.type_of(children[-1])

    def results(self, children: list[Token]) -> list[Token]:
        return children

    def location(self, children: list[Token | None]) -> Location:
        return self.sem.location(*children)

    def op(self, children: list[Any]) -> _OpRecord:
        label, opcode, loc = None, None, None
        results: list[Token] = []
        operands: list[Token] = []
        types: list[Token] = []
        attrs: dict[str, Attr] = {}
        for c in children:
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
        return self.sem.op_record(label, results, opcode, operands, attrs, types, loc)

    def ret(self, children: list[Token | None]) -> _Ret:
        return _Ret([c for c in children[1:] if c is not None])

    def attr_dict(self, children: list[Any]) -> dict[str, Attr]:
        out: dict[str, Attr] = {}
        for entry in children:
            if entry is not None:
                self.sem.add_entry(out, *entry)
        return out

    def entry(self, children: list[Any]) -> tuple[Token, Attr]:
        return children[0], self._attr(children[1])

    def list(self, children: list[Any]) -> ListAttr:
        return ListAttr(tuple(self._attr(c) for c in children if c is not None))

    def _attr(self, c: Any) -> Attr:
        if isinstance(c, Attr):
            return c
        if isinstance(c, dict):
            return DictAttr(tuple(c.items()))
        if isinstance(c, Graph):
            return GraphAttr(c)
        return self.sem.scalar(c)

    def graph(self, children: list[Any]) -> Graph:
        inputs = [c for c in children[1:] if isinstance(c, tuple)]
        attrs = next((c for c in children[1:] if isinstance(c, dict)), None)
        body = [c for c in children[1:] if isinstance(c, (_OpRecord, _Ret))]
        return self.sem.graph(children[0], inputs, attrs, body)


def _parse_with_lark(text: str, filename: str) -> Graph:
    too_deep_error = nesting_error(text, filename)  # the fast path counts nesting as it goes
    if too_deep_error is not None:
        raise too_deep_error
    try:
        tree = _lark().parse(text)
        return _LarkBuilder(_Semantics(filename, text)).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, (ParseError, RecursionError)):
            raise e.orig_exc from None
        raise
    except UnexpectedInput as e:
        raise _syntax_error(e, filename, text) from None


# ====================================================================== fast path

class _Tok:
    """A token of the fast path: kind, text and offset; line and column computed on demand."""

    __slots__ = ("type", "value", "pos", "_lines")

    def __init__(self, type: str, value: str, pos: int, lines: list[int]) -> None:
        self.type = type
        self.value = value
        self.pos = pos
        self._lines = lines

    @property
    def line(self) -> int:
        return bisect.bisect_right(self._lines, self.pos) + 1

    @property
    def column(self) -> int:
        i = bisect.bisect_right(self._lines, self.pos)
        return self.pos - (self._lines[i - 1] if i > 0 else -1)

    def __str__(self) -> str:
        return self.value


class _Syntax(Exception):
    """The fast path met something it does not accept; Lark will explain."""


_PUNCT = {",": "COMMA", "(": "LPAR", ")": "RPAR", "{": "LBRACE", "}": "RBRACE", "[": "LSQB",
          "]": "RSQB", ":": "COLON", "=": "EQUAL"}
_PUNCT_KINDS = frozenset(_PUNCT.values())
_OPENING = frozenset({"LSQB", "LBRACE"})
_CLOSING = frozenset({"RSQB", "RBRACE"})


@lru_cache(maxsize=1)
def _token_regex() -> re.Pattern[str]:
    """One alternation of the grammar's own terminal regexps, longest-match order preserved,
    each token preceded by the whitespace and comments the grammar ignores. Any other
    character is an ERR token, so consecutive matches cover the text without gaps."""
    terms = {t.name: t.pattern.to_regexp() for t in _lark().terminals}
    order = ["DURATION", "BYTES", "FLOAT", "INT", "TYPE", "AT_NAME", "VALUE", "STRING"]
    parts = [f"(?P<{name}>{terms[name]})" for name in order]
    parts.append(f"(?P<WORD>{terms['OPCODE']})")
    parts.extend(f"(?P<{name}>{re.escape(char)})" for char, name in _PUNCT.items())
    parts.append(r"(?P<ERR>\S)")
    parts.append(r"(?P<EOF>\Z)")  # trailing blanks match too: a failed match retried at each of them was quadratic
    # atomic: never backtrack into the skipped space (a nested `(?:[ \t..]+)*` was exponential on
    # a long run of blanks with no token after it)
    skip = f"(?>(?:{terms['WS']}|{terms['COMMENT']})*)"
    return re.compile(f"{skip}(?:{'|'.join(parts)})")


_TRAILING = re.compile(r"(?:\s|//[^\n]*)*")


@lru_cache(maxsize=1)
def _ident_regex() -> re.Pattern[str]:
    """Words are lexed with the (wider) OPCODE terminal; where the grammar wants an IDENT, check it."""
    return re.compile(next(t.pattern.to_regexp() for t in _lark().terminals if t.name == "IDENT"))


class _FastParser:
    """Recursive descent over pre-lexed tokens, mirroring `pesto.lark` rule by rule."""

    def __init__(self, text: str, sem: _Semantics) -> None:
        self.sem = sem
        self.text = text
        self.lines = [m.start() for m in re.finditer("\n", text)]
        kinds: list[str] = []
        spans: list[tuple[int, int]] = []
        end = 0
        depth = 0  # stop lexing at the first bad character or bracket too deep: Lark's path reports it
        for m in _token_regex().finditer(text):  # without reading the rest (5 MB of '[' took 10 s)
            kind = m.lastgroup
            assert kind is not None
            if kind == "EOF":
                end = len(text)
                break
            if kind in _OPENING:
                depth += 1
                if depth > MAX_NESTING:
                    raise _Syntax()
            elif kind in _CLOSING:
                depth -= 1
            elif kind == "ERR":
                raise _Syntax()
            span = m.span(kind)
            kinds.append(kind)
            spans.append(span)
            end = span[1]
        if _TRAILING.match(text, end).end() != len(text):
            raise _Syntax()
        kinds.append("$END")
        spans.append((len(text), len(text)))  # so the end can be read as a token like any other
        self.kinds = kinds
        self.spans = spans
        self.i = 0
        self.depth = 0  # of [ and { (as `nesting_error` counts them for Lark)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _Syntax()  # Lark's path reports it

    def tok(self, i: int) -> _Tok:
        start, stop = self.spans[i]
        return _Tok(self.kinds[i], self.text[start:stop], start, self.lines)

    # -- token helpers
    def peek(self) -> str:
        return self.kinds[self.i]

    def take(self, kind: str) -> _Tok:
        if self.kinds[self.i] != kind:
            raise _Syntax()
        self.i += 1
        return self.tok(self.i - 1)

    def expect(self, kind: str) -> None:
        if self.kinds[self.i] != kind:
            raise _Syntax()
        self.i += 1

    def is_word(self, i: int, text: str) -> bool:
        if self.kinds[i] != "WORD":
            return False
        start, stop = self.spans[i]
        return self.text[start:stop] == text

    def word(self, text: str) -> bool:
        """Consume the keyword `text` if it is next."""
        if self.is_word(self.i, text):
            self.i += 1
            return True
        return False

    def skip(self, kind: str) -> bool:
        if self.kinds[self.i] == kind:
            self.i += 1
            return True
        return False

    # -- rules
    def parse(self) -> Graph:
        if not self.word("graph"):
            raise _Syntax()
        g = self.graph()
        if self.peek() != "$END":
            raise _Syntax()
        return g

    def graph(self) -> Graph:
        name = self.take("AT_NAME")
        self.expect("LPAR")
        inputs: list[tuple[bool, Any, Type]] = []
        if self.peek() != "RPAR":
            inputs.append(self.input())
            while self.skip("COMMA"):
                inputs.append(self.input())
        self.expect("RPAR")
        attrs = self.attr_dict() if self.word("attributes") else None
        self.expect("LBRACE")
        self.enter()
        body: list[_OpRecord | _Ret] = []
        while not self.skip("RBRACE"):
            body.append(self.statement())
        self.depth -= 1
        return self.sem.graph(name, inputs, attrs, body)

    def input(self) -> tuple[bool, Any, Type]:
        param = self.word("param")
        value = self.take("VALUE")
        self.expect("COLON")
        return param, value, self.sem.type_of(self.take("TYPE"))

    def statement(self) -> _OpRecord | _Ret:
        if self.word("return"):
            values = []
            if self.peek() == "VALUE":
                values.append(self.take("VALUE"))
                while self.skip("COMMA"):
                    values.append(self.take("VALUE"))
            return _Ret(values)
        label = self.take("AT_NAME") if self.peek() == "AT_NAME" else None
        results: list[_Tok] = []
        if self.peek() == "VALUE":
            results.append(self.take("VALUE"))
            while self.skip("COMMA"):
                results.append(self.take("VALUE"))
            self.expect("EQUAL")
        opcode = self.take("WORD")
        self.expect("LPAR")
        operands: list[_Tok] = []
        if self.peek() == "VALUE":
            operands.append(self.take("VALUE"))
            while self.skip("COMMA"):
                operands.append(self.take("VALUE"))
        self.expect("RPAR")
        attrs = self.attr_dict() if self.peek() == "LBRACE" else {}
        types: list[_Tok] = []
        if self.skip("COLON"):
            types.append(self.take("TYPE"))
            while self.skip("COMMA"):
                types.append(self.take("TYPE"))
        loc = None
        if self.is_word(self.i, "loc") and self.kinds[self.i + 1] == "LPAR":
            self.i += 2
            file = self.take("STRING")
            self.expect("COLON")
            line = self.take("INT")
            col = self.take("INT") if self.skip("COLON") else None
            self.expect("RPAR")
            loc = self.sem.location(file, line, col)
        opcode.type = "OPCODE"
        return self.sem.op_record(label, results, opcode, operands, attrs, types, loc)

    def attr_dict(self) -> dict[str, Attr]:
        self.expect("LBRACE")
        self.enter()
        out: dict[str, Attr] = {}
        if self.skip("RBRACE"):
            self.depth -= 1
            return out
        while True:
            kind = self.kinds[self.i]
            key = self.tok(self.i)
            if kind == "STRING" or (kind == "WORD" and _ident_regex().fullmatch(key.value)):
                self.i += 1
            else:
                raise _Syntax()
            self.expect("EQUAL")
            self.sem.add_entry(out, key, self.value())
            if self.skip("RBRACE"):
                self.depth -= 1
                return out
            self.expect("COMMA")

    def value(self) -> Attr:
        kind = self.kinds[self.i]
        if kind == "LSQB":
            self.i += 1
            self.enter()
            items: list[Attr] = []
            if not self.skip("RSQB"):
                items.append(self.value())
                while self.skip("COMMA"):
                    items.append(self.value())
                self.expect("RSQB")
            self.depth -= 1
            return ListAttr(tuple(items))
        if kind == "LBRACE":
            return DictAttr(tuple(self.attr_dict().items()))
        if kind == "$END" or kind in _PUNCT_KINDS:
            raise _Syntax()
        tok = self.tok(self.i)
        self.i += 1
        if kind == "WORD":
            if tok.value == "graph" and self.peek() == "AT_NAME":
                return GraphAttr(self.graph())
            if not _ident_regex().fullmatch(tok.value):
                raise _Syntax()
            tok.type = "IDENT"
        return self.sem.scalar(tok)


# ====================================================================== entry points

ENGINES = ("fast", "lark")


def parse(text: str, filename: str = "<string>", engine: str = "fast") -> Graph:
    """Parse `.pir` text into a Graph (not yet verified; see `pesto_ir.verify`).

    `engine="lark"` uses only the reference parser (the fast path gives the same graph).
    """
    if not isinstance(text, str):
        hint = ("decode bytes first: data.decode('utf-8')" if isinstance(text, (bytes, bytearray))
                else "to read a file, use pesto_ir.load(path)")
        raise ArgumentError(f"parse() takes the .pir text as a str, got {type(text).__name__} ({hint})")
    if not isinstance(filename, str):
        raise ArgumentError(f"parse() takes the file name as a str, got {type(filename).__name__}")
    if engine not in ENGINES:
        raise ArgumentError(f"unknown parser engine {engine!r} (known: {', '.join(ENGINES)})")
    try:
        if engine == "lark":
            return _parse_with_lark(text, filename)
        try:
            with gc_paused():
                return _FastParser(text, _Semantics(filename, text)).parse()
        except (_Syntax, ParseError):
            # Lark reports errors: the precise syntax error, or the same semantic error found in
            # the same order as the reference parser finds it.
            return _parse_with_lark(text, filename)
    except RecursionError:
        raise too_deep(text, filename) from None


def parse_file(path: str | Path) -> Graph:
    return parse(read_source_text(path), str(path))


def _syntax_error(e: UnexpectedInput, filename: str, text: str) -> ParseError:
    line, col = e.line if e.line and e.line > 0 else 1, e.column if e.column and e.column > 0 else 1
    width = 1
    if isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if e.pos_in_stream is not None and e.pos_in_stream < len(text) else "?"
        message = f"unexpected character {ch!r}"
        expected = e.allowed
    elif isinstance(e, UnexpectedEOF):
        message, expected = "unexpected end of input", e.expected
        line, col = _end_position(text)
    else:
        assert isinstance(e, UnexpectedToken)
        tok = e.token
        expected = e.accepts or e.expected
        if tok.type == "$END":
            message = "unexpected end of input"
            line, col = _end_position(text)
        else:
            message, width = f"unexpected '{tok}'", len(str(tok))
    words = sorted({_TERMINAL_WORDS.get(t, t) for t in (expected or ())})
    hint = f"expected {', '.join(words)}" if words else None
    return ParseError(message, SourceSpan(filename, line, col, text, width), hint)


def _end_position(text: str) -> tuple[int, int]:
    lines = text.splitlines() or [""]
    return len(lines), len(lines[-1]) + 1

