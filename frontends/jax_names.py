"""Names and source locations of the ops the JAX lowering (`frontends/jax.py`) makes.

Names come from pytree paths and function names, made bare and unique per graph; an op's location
is its equation's user frame, read from JAX's public one-line summary.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pesto_ir.ir.graph import Location

_summarize: Callable[..., str] | None
try:  # public in jax.extend since 0.4.3x; without it ops simply carry no location
    from jax.extend.source_info_util import summarize as _summarize
except ImportError:  # pragma: no cover
    _summarize = None

_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.$\-]+")


def sanitize_name(text: str, default: str) -> str:
    """A readable bare name from a pytree path (`p['w'][0]` -> `p.w.0`) or a function name."""
    text = _BAD_NAME_CHARS.sub(".", text.replace("'", "").replace('"', ""))
    text = re.sub(r"\.{2,}", ".", text).strip(".")
    return text or default


class FreshNames:
    """Fresh names per graph: the hint itself, then `hint.1`, `hint.2`, ... (linear, not quadratic)."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.next: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        if hint not in self.used:
            self.used.add(hint)
            return hint
        i = self.next.get(hint, 1)
        while f"{hint}.{i}" in self.used:
            i += 1
        self.next[hint] = i + 1
        name = f"{hint}.{i}"
        self.used.add(name)
        return name


def arg_names(jaxpr: Any, n: int) -> list[str]:
    info = getattr(jaxpr, "debug_info", None)
    names = getattr(info, "arg_names", None) if info is not None else None
    if not names or len(names) != n:
        return ["arg"] * n
    return [sanitize_name(a or "", "arg") for a in names]


def function_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return sanitize_name(name.replace("<lambda>", "lambda"), "main")


_SUMMARY = re.compile(r"^(?P<file>.*?):(?P<line>\d+)(?::(?P<col>\d+))? \([^()]*\)$")


def source_location(source_info: Any) -> Location | None:
    """The user's frame of an equation, from JAX's public one-line summary `file:line:col (fn)`."""
    if _summarize is None:
        return None
    m = _SUMMARY.match(_summarize(source_info))
    if m is None:
        return None
    col = m.group("col")
    return Location(m.group("file"), int(m.group("line")), int(col) + 1 if col is not None else 0)
