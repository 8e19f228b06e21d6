"""What the readers of model files share (source text, nesting limits, error spans, argument errors),
and writing outputs whole or not at all. `parse` and `load` live in `pesto_ir.frontends`, which
builds on this module."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from pesto_ir.util.errors import ParseError, PestoError, SourceSpan


class ArgumentError(PestoError, TypeError, ValueError):
    """A function of the API was called with an argument it cannot take (a wrong type or an
    unknown name); also a TypeError and a ValueError, as Python's own would be."""


def read_source_text(path: str | os.PathLike[str]) -> str:
    """A model file's text; an unreadable or non-UTF-8 file is a ParseError naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ParseError(f"cannot read file: {e.strerror}", SourceSpan(str(path), 1, 1)) from None
    except UnicodeDecodeError as e:
        raise ParseError(f"file is not UTF-8 text ({e.reason} at byte {e.start})",
                         SourceSpan(str(path), 1, 1)) from None


def decode_json(text: str, filename: str) -> Any:
    """The JSON value of a file's text; what cannot be read is a ParseError at its place."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(f"invalid JSON: {e.msg}", SourceSpan(filename, e.lineno, e.colno, text)) from None
    except RecursionError:
        raise too_deep(text, filename) from None
    except ValueError:  # an integer literal longer than Python converts (4300 digits)
        found = re.search(r"\d{4300,}", text)
        span = span_at(filename, text, found.start()) if found else SourceSpan(filename, 1, 1)
        raise ParseError("a number has more digits than can be read (4300 at most)", span) from None
    _refuse_lone_surrogates(data, text, filename)
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _refuse_lone_surrogates(data: Any, text: str, filename: str) -> None:
    """JSON may escape half of a UTF-16 pair (\\ud800) alone; such a name is not text, and writing
    it out (a .pir file, a plan) failed after all the work. Refused at the first such escape."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        found = _SURROGATE_ESCAPE.search(text)
        span = span_at(filename, text, found.start()) if found else SourceSpan(filename, 1, 1)
        raise ParseError("a string escapes a lone surrogate (\\ud800-\\udfff), which is not text", span) from None


# The longest any time that enters may be, in seconds (11.6 days): an op's cost, a latency, a time
# limit. Beside an op of 1e12 s a float cannot tell a 1 ms op from 0.98 ms (the plan's validator
# refused the times it computed), and a limit of 1e300 s overflowed a solver's deadline.
MAX_SECONDS = 1e6


MAX_SEED = 2 ** 31 - 1  # CP-SAT and CBC take 32-bit seeds


def seed_problem(seed: object) -> str | None:
    """Why `seed` is no seed (None when it is one): a whole number from 0 to `MAX_SEED` (CP-SAT
    refused 2147483648 with a four-line binding error)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        return f"must be a whole number from 0 to {MAX_SEED}, not {seed!r}"
    return None


def finite(x: Any) -> float | None:
    """`x` as a float when it is a real number (not a boolean) that a float holds finitely, else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        v = float(x)
    except OverflowError:  # an int with hundreds of digits
        return None
    return v if math.isfinite(v) else None


def brief(text: str) -> str:
    """`text` cut short, for messages about values that may be huge (a 400-digit number)."""
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


# Lists, dicts and nested graphs may nest this deep: far beyond real models, and well within what
# Python's recursion allows the parsers, the verifier and the printer.
MAX_NESTING = 100
# What nests: [ and {, outside strings, `//` comments and `.pir` types (f32[2,3]).
# A type starts a word (the lookbehind): trying one at every letter of a long word was quadratic.
_BRACKETS = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|(?<![a-z0-9])[a-z][a-z0-9]*+\[[0-9, ]*\]|[\[\]{}]')


def nesting_error(text: str, filename: str, limit: int = MAX_NESTING) -> ParseError | None:
    """The error for a text nested more than `limit` deep, at the first bracket past it; else None."""
    depth = 0
    for m in _BRACKETS.finditer(text):
        c = m.group()
        if c in ("[", "{"):
            depth += 1
            if depth > limit:
                return ParseError(f"nesting deeper than {limit} levels of lists and dicts",
                                  span_at(filename, text, m.start()))
        elif c in ("]", "}"):
            depth -= 1
    return None


def too_deep(text: str, filename: str) -> ParseError:
    """The error to give for a RecursionError met while reading `text`."""
    return nesting_error(text, filename) or ParseError("nesting deeper than Python can parse here",
                                                       SourceSpan(filename, 1, 1))


def span_at(filename: str, text: str, offset: int) -> SourceSpan:
    """The position of character `offset` of `text` (with no excerpt when its line is very long)."""
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    short = (end if end >= 0 else len(text)) - start <= 200
    return SourceSpan(filename, text.count("\n", 0, offset) + 1, offset - start + 1, text if short else None)


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file.

    A symbolic link stays a link: the file it points to is written. A path that is neither a
    regular file nor a folder (`/dev/null`, a FIFO) is written in place: renaming over it would
    replace the device or pipe with a plain file."""
    target = Path(os.path.realpath(path))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if target.exists() and not target.is_file() and not target.is_dir():
        try:
            with open(target, "wb") as f:
                f.write(payload)
        except OSError as e:
            e.filename, e.filename2 = str(path), None
            raise
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    except OSError as e:
        e.filename = str(path)  # the user's path, not the hidden temporary file's
        raise
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file ordinary permissions
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            e.filename, e.filename2 = str(path), None
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
