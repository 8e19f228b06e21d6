"""The fast path of the `.pir` parser (`frontends/text.py`): recursive descent over the grammar's own
terminal regexps, about ten times faster than Lark on large graphs. It accepts what the grammar
accepts and raises `FastPathRefusal` on anything else, for the reference parser to report.
"""

from __future__ import annotations

import bisect
import re
from functools import lru_cache
from typing import Any

from pesto_ir.frontends.text_semantics import OpRecord, ReturnRecord, Semantics, lark_parser
from pesto_ir.ir.attributes import Attr, DictAttr, GraphAttr, ListAttr
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.types import Type
from pesto_ir.util.loader import MAX_NESTING


class FastToken:
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


class FastPathRefusal(Exception):
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
    terms = {t.name: t.pattern.to_regexp() for t in lark_parser().terminals}
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
    return re.compile(next(t.pattern.to_regexp() for t in lark_parser().terminals if t.name == "IDENT"))


class FastParser:
    """Recursive descent over pre-lexed tokens, mirroring `pesto.lark` rule by rule."""

    def __init__(self, text: str, sem: Semantics) -> None:
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
                    raise FastPathRefusal()
            elif kind in _CLOSING:
                depth -= 1
            elif kind == "ERR":
                raise FastPathRefusal()
            span = m.span(kind)
            kinds.append(kind)
            spans.append(span)
            end = span[1]
        trailing = _TRAILING.match(text, end)
        assert trailing is not None  # the pattern matches the empty string
        if trailing.end() != len(text):
            raise FastPathRefusal()
        kinds.append("$END")
        spans.append((len(text), len(text)))  # so the end can be read as a token like any other
        self.kinds = kinds
        self.spans = spans
        self.i = 0
        self.depth = 0  # of [ and { (as `nesting_error` counts them for Lark)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise FastPathRefusal()  # Lark's path reports it

    def tok(self, i: int) -> FastToken:
        start, stop = self.spans[i]
        return FastToken(self.kinds[i], self.text[start:stop], start, self.lines)

    # -- token helpers
    def peek(self) -> str:
        return self.kinds[self.i]

    def take(self, kind: str) -> FastToken:
        if self.kinds[self.i] != kind:
            raise FastPathRefusal()
        self.i += 1
        return self.tok(self.i - 1)

    def expect(self, kind: str) -> None:
        if self.kinds[self.i] != kind:
            raise FastPathRefusal()
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
            raise FastPathRefusal()
        g = self.graph()
        if self.peek() != "$END":
            raise FastPathRefusal()
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
        body: list[OpRecord | ReturnRecord] = []
        while not self.skip("RBRACE"):
            body.append(self.statement())
        self.depth -= 1
        return self.sem.graph(name, inputs, attrs, body)

    def input(self) -> tuple[bool, Any, Type]:
        param = self.word("param")
        value = self.take("VALUE")
        self.expect("COLON")
        return param, value, self.sem.type_of(self.take("TYPE"))

    def statement(self) -> OpRecord | ReturnRecord:
        if self.word("return"):
            return ReturnRecord(self.value_list())
        label = self.take("AT_NAME") if self.peek() == "AT_NAME" else None
        results = self.value_list()
        if results:
            self.expect("EQUAL")
        opcode = self.take("WORD")
        self.expect("LPAR")
        operands = self.value_list()
        self.expect("RPAR")
        attrs = self.attr_dict() if self.peek() == "LBRACE" else {}
        types: list[FastToken] = []
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

    def value_list(self) -> list[FastToken]:
        """A comma-separated list of values, `%a, %b`: empty when no value is next."""
        values: list[FastToken] = []
        if self.peek() == "VALUE":
            values.append(self.take("VALUE"))
            while self.skip("COMMA"):
                values.append(self.take("VALUE"))
        return values

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
                raise FastPathRefusal()
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
            raise FastPathRefusal()
        tok = self.tok(self.i)
        self.i += 1
        if kind == "WORD":
            if tok.value == "graph" and self.peek() == "AT_NAME":
                return GraphAttr(self.graph())
            if not _ident_regex().fullmatch(tok.value):
                raise FastPathRefusal()
            tok.type = "IDENT"
        return self.sem.scalar(tok)
