"""Readable times and sizes for reports and messages: `3.10 ms`, `1.5 GiB`."""

from __future__ import annotations


def human_time(seconds: float, digits: int = 3) -> str:
    """`digits` significant digits in a readable unit: `3.1 ms`."""
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("us", 1e6)):
        if abs(seconds) * scale >= 1:
            return f"{seconds * scale:.{digits}g} {unit}"
    return f"{seconds * 1e9:.{digits}g} ns"


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"
