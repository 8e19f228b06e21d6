"""Typed, immutable attribute values.

Every attribute an op carries (primitive parameters, and what passes add: `cost`, `memory`,
`device`, `start`, `group`, ...) is one of these classes, so that it prints to `.pir` and parses
back to an equal value. `to_attr` converts plain Python values; `.value` converts back.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pesto_ir.ir.types import DTYPES, Type

if TYPE_CHECKING:
    from pesto_ir.ir.graph import Graph


class Attr:
    """Base of every attribute value."""

    __slots__ = ()

    @property
    def value(self) -> Any:
        """The plain Python value (lists become tuples, durations seconds, bytes ints)."""
        return self


@dataclass(frozen=True, slots=True)
class IntAttr(Attr):
    v: int

    @property
    def value(self) -> int:
        return self.v

    def __str__(self) -> str:
        return str(self.v)


@dataclass(frozen=True, slots=True)
class FloatAttr(Attr):
    v: float

    @property
    def value(self) -> float:
        return self.v

    def __eq__(self, other: object) -> bool:  # nan equals nan, so round trips compare equal
        return isinstance(other, FloatAttr) and (
            self.v == other.v or (math.isnan(self.v) and math.isnan(other.v))
        )

    def __hash__(self) -> int:
        return hash(("f", repr(self.v)))

    def __str__(self) -> str:
        return _float_str(self.v)


@dataclass(frozen=True, slots=True)
class BoolAttr(Attr):
    v: bool

    @property
    def value(self) -> bool:
        return self.v

    def __str__(self) -> str:
        return "true" if self.v else "false"


@dataclass(frozen=True, slots=True)
class NoneAttr(Attr):
    @property
    def value(self) -> None:
        return None

    def __str__(self) -> str:
        return "none"


@dataclass(frozen=True, slots=True)
class StringAttr(Attr):
    v: str

    @property
    def value(self) -> str:
        return self.v

    def __str__(self) -> str:
        return quote(self.v)


@dataclass(frozen=True, slots=True)
class DtypeAttr(Attr):
    """An element type, printed bare: `f32`."""

    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")

    @property
    def value(self) -> str:
        return self.dtype

    def __str__(self) -> str:
        return self.dtype


@dataclass(frozen=True, slots=True)
class TypeAttr(Attr):
    """A value type as an attribute: `f32[64,784]`."""

    type: Type

    @property
    def value(self) -> Type:
        return self.type

    def __str__(self) -> str:
        return str(self.type)


@dataclass(frozen=True, slots=True)
class DurationAttr(Attr):
    """A time in seconds, printed with a unit: `2.5ms`, `0.00014s`."""

    seconds: float

    @property
    def value(self) -> float:
        return self.seconds

    def __str__(self) -> str:
        return format_duration(self.seconds)


@dataclass(frozen=True, slots=True)
class BytesAttr(Attr):
    """A size in bytes, printed with a binary unit when exact: `4MiB`, `1000B`."""

    n: int

    @property
    def value(self) -> int:
        return self.n

    def __str__(self) -> str:
        return format_bytes(self.n)


@dataclass(frozen=True, slots=True)
class DeviceAttr(Attr):
    """A device name: `@gpu0`."""

    name: str

    @property
    def value(self) -> str:
        return self.name

    def __str__(self) -> str:
        return "@" + format_name(self.name)


@dataclass(frozen=True, slots=True)
class ListAttr(Attr):
    items: tuple[Attr, ...]

    @property
    def value(self) -> tuple[Any, ...]:
        return tuple(a.value for a in self.items)

    def __str__(self) -> str:
        return "[" + ", ".join(map(str, self.items)) + "]"


@dataclass(frozen=True, slots=True)
class DictAttr(Attr):
    """Ordered string-keyed entries: `{h100 = 1ms, cpu = 20ms}`."""

    entries: tuple[tuple[str, Attr], ...]

    @property
    def value(self) -> dict[str, Any]:
        return {k: a.value for k, a in self.entries}

    def get(self, key: str) -> Attr | None:
        for k, a in self.entries:
            if k == key:
                return a
        return None

    def __str__(self) -> str:
        return "{" + ", ".join(f"{format_key(k)} = {a}" for k, a in self.entries) + "}"


@dataclass(frozen=True, slots=True, eq=False)
class GraphAttr(Attr):
    """A nested graph (the body of `scan`, `while`, `cond`); compared by structure."""

    graph: Graph

    @property
    def value(self) -> Graph:
        return self.graph

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GraphAttr) and self.graph.structural_key() == other.graph.structural_key()

    def __hash__(self) -> int:
        return hash(self.graph.name)

    def __str__(self) -> str:
        return str(self.graph)  # the graph's `.pir` text


# ---------------------------------------------------------------- conversion

def to_attr(x: Any) -> Attr:
    """Wrap a plain Python value. Floats stay floats; use DurationAttr/BytesAttr for units."""
    if isinstance(x, Attr):
        return x
    if x is None:
        return NoneAttr()
    if isinstance(x, bool):
        return BoolAttr(x)
    if isinstance(x, int):
        return IntAttr(x)
    if isinstance(x, float):
        return FloatAttr(x)
    if isinstance(x, str):
        return StringAttr(x)
    if isinstance(x, Type):
        return TypeAttr(x)
    if isinstance(x, (list, tuple)):
        return ListAttr(tuple(to_attr(i) for i in x))
    if isinstance(x, dict):
        return DictAttr(tuple((str(k), to_attr(v)) for k, v in x.items()))
    # numpy scalars
    if hasattr(x, "item") and hasattr(x, "dtype") and getattr(x, "shape", None) == ():
        return to_attr(x.item())
    raise TypeError(f"cannot make an attribute of {type(x).__name__}: {x!r}")


# ---------------------------------------------------------------- number formats

_DURATION_UNITS: tuple[tuple[str, float], ...] = (("s", 1.0), ("ms", 1e3), ("us", 1e6), ("ns", 1e9))
DURATION_SCALE: dict[str, float] = dict(_DURATION_UNITS)
BYTE_UNITS: dict[str, int] = {
    "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}


def _float_str(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def parse_duration(number: str, unit: str) -> float:
    """Inverse of `format_duration`: divide by the unit's scale (exact for printed values)."""
    return float(number) / DURATION_SCALE[unit]


def format_duration(seconds: float) -> str:
    """The shortest readable unit whose text parses back to exactly `seconds`."""
    if math.isfinite(seconds) and seconds != 0:
        for unit, scale in _DURATION_UNITS:
            scaled = seconds * scale
            if 1 <= abs(scaled) < 1000:
                text = str(int(scaled)) if scaled.is_integer() else repr(scaled)
                if parse_duration(text, unit) == seconds:
                    return text + unit
    return _float_str(seconds) + "s"


def parse_size(text: str) -> int:
    """A whole, positive number of bytes written `17179869184`, `80e9` or `16GiB` (units of
    `BYTE_UNITS`, a space allowed before the unit); ValueError saying why otherwise."""
    body = text.strip()
    unit = next((u for u in sorted(BYTE_UNITS, key=len, reverse=True) if body.endswith(u)), "B")
    number = body[:-len(unit)].strip() if body.endswith(unit) else body
    try:
        value = float(number) * BYTE_UNITS[unit]
    except ValueError:
        raise ValueError(f"'{text}' is not a size (write bytes, e.g. 17179869184, 80e9 or 16GiB)") from None
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise ValueError(f"'{text}' is not a positive whole number of bytes")
    return int(value)


def format_bytes(n: int) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = BYTE_UNITS[unit]
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


# what `json.dumps(s, ensure_ascii=False)` leaves as it is: all but quotes, backslashes and control
# characters (a 50,000-op graph prints 150,000 strings; most need no escape)
_PLAIN_STRING = re.compile(r'[^"\\\x00-\x1f]*')


def quote(s: str) -> str:
    """`s` as a JSON string literal, as `json.dumps(s, ensure_ascii=False)` writes it."""
    return f'"{s}"' if _PLAIN_STRING.fullmatch(s) else json.dumps(s, ensure_ascii=False)


_BARE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.$-")


def format_name(name: str) -> str:
    """A value/op/graph name, quoted when it has characters a bare name cannot."""
    if name and all(c in _BARE_NAME_CHARS for c in name):
        return name
    return quote(name)


_KEYWORDS = frozenset({"true", "false", "none", "inf", "nan", "graph", "return", "param", "loc"})


def format_key(key: str) -> str:
    """An attribute key: bare when it is an identifier, quoted otherwise."""
    if (
        key
        and (key[0].isalpha() or key[0] == "_")
        and all(c.isalnum() or c == "_" for c in key)
        and key.isascii()
        and key not in _KEYWORDS
        and key not in DTYPES
    ):
        return key
    return quote(key)
