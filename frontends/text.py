"""Parse `.pir` text (grammar in `grammar/pesto.lark`) into a Graph.

Two syntax layers share one semantic layer (`Semantics`, `frontends/text_semantics.py`), so both
build identical graphs and raise identical semantic errors:

- the reference parser: Lark's LALR parser over `pesto.lark`, with positions propagated. It
  defines the language and produces every syntax error message (what was expected, with a caret);
- a fast path (`frontends/text_fast.py`): a recursive-descent parser over the *same* terminal
  regexps (read from the Lark grammar), about ten times faster, for large graphs. On any syntax
  error it defers to Lark, which reports it. Tests check that both parsers agree on examples and random graphs.

Forward references are resolved when a graph's `}` is read, so the verifier (not the parser)
reports a use before definition, with both places named.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection
from pathlib import Path
from typing import Any

from lark import Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from pesto_ir.frontends.text_fast import FastParser, FastPathRefusal
from pesto_ir.frontends.text_semantics import OpRecord, ReturnRecord, Semantics, lark_parser
from pesto_ir.ir.attributes import Attr, DictAttr, GraphAttr, ListAttr
from pesto_ir.ir.graph import Graph, Location
from pesto_ir.ir.types import Type
from pesto_ir.util.errors import ParseError, SourceSpan
from pesto_ir.util.gc_pause import gc_paused
from pesto_ir.util.loader import ArgumentError, nesting_error, read_source_text, too_deep

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

# ====================================================================== reference parser (Lark)

class _LarkBuilder(Transformer[Token, Graph]):
    """Adapts Lark's parse tree to `Semantics`, rule by rule."""

    def __init__(self, sem: Semantics) -> None:
        super().__init__(visit_tokens=False)
        self.sem = sem

    def start(self, children: list[Graph]) -> Graph:
        return children[0]

    def input(self, children: list[Token]) -> tuple[bool, Token, Type]:
        return len(children) == 3, children[-2], self.sem.type_of(children[-1])

    def results(self, children: list[Token]) -> list[Token]:
        return children

    def location(self, children: list[Token | None]) -> Location:
        return self.sem.location(*children)

    def op(self, children: list[Any]) -> OpRecord:
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

    def ret(self, children: list[Token | None]) -> ReturnRecord:
        return ReturnRecord([c for c in children[1:] if c is not None])

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

    def graph(self, children: builtins.list[Any]) -> Graph:  # builtins: `list` is the rule above
        inputs = [c for c in children[1:] if isinstance(c, tuple)]
        attrs = next((c for c in children[1:] if isinstance(c, dict)), None)
        body = [c for c in children[1:] if isinstance(c, (OpRecord, ReturnRecord))]
        return self.sem.graph(children[0], inputs, attrs, body)


def _parse_with_lark(text: str, filename: str) -> Graph:
    too_deep_error = nesting_error(text, filename)  # the fast path counts nesting as it goes
    if too_deep_error is not None:
        raise too_deep_error
    try:
        tree = lark_parser().parse(text)
        return _LarkBuilder(Semantics(filename, text)).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, (ParseError, RecursionError)):
            raise e.orig_exc from None
        raise
    except UnexpectedInput as e:
        raise _syntax_error(e, filename, text) from None


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
                return FastParser(text, Semantics(filename, text)).parse()
        except (FastPathRefusal, ParseError):
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
    expected: Collection[str] | None
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
