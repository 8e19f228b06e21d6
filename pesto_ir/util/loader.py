"""What the readers of model files share (reading input files, nesting limits, error spans, argument
errors), and writing outputs whole or not at all. `parse` and `load` live in `pesto_ir.frontends`,
which builds on this module."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from pesto_ir.util.errors import ParseError, PestoError, SourceSpan
from pesto_ir.util.units import human_bytes


class ArgumentError(PestoError, TypeError, ValueError):
    """A function of the API was called with an argument it cannot take (a wrong type or an
    unknown name); also a TypeError and a ValueError, as Python's own would be."""


# ------------------------------------------------------------------ reading input files


@dataclass(frozen=True)
class SizeLimit:
    """How large one kind of text input may be. Inputs are read whole into memory: a file past its
    limit is a mistaken path (a disk image, a log), and reading it would only exhaust memory."""

    what: str  # the kind of input, for the message: "a model"
    max_bytes: int


# A million-op model or plan is about 150 MB of text; 512 devices with every link spelt out, 25 MB.
SOURCE_LIMIT = SizeLimit("a model or plan", 256 * 2**20)
CLUSTER_LIMIT = SizeLimit("a cluster file", 64 * 2**20)


class UnreadableFile(PestoError):
    """A path that names no text file to read: missing or unreadable, a folder, a FIFO or a device,
    a symbolic link loop, larger than its kind of input may be, or not UTF-8. The message names
    the file as the caller's `noun` does ("file", "cluster file")."""


def read_text_file(path: str | os.PathLike[str], limit: SizeLimit, noun: str = "file") -> str:
    """The UTF-8 text of the regular file at `path` (line ends read as text mode reads them), or an
    `UnreadableFile` saying why not. Checked on the open file, so a file swapped after a check is
    still checked, and never more than `limit` read."""
    with _open_text_file(path, limit, noun) as f:
        data = f.read(limit.max_bytes + 1)
    if len(data) > limit.max_bytes:  # it grew after it was opened
        raise UnreadableFile(_too_large(noun, limit))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableFile(f"{noun} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def check_text_file(path: str | os.PathLike[str], limit: SizeLimit, noun: str = "file") -> None:
    """Refuse now what `read_text_file` would refuse before reading a byte: a command checks its
    file arguments before any work, not at the pass that reads them."""
    with _open_text_file(path, limit, noun):
        pass


def read_source_text(path: str | os.PathLike[str], limit: SizeLimit = SOURCE_LIMIT) -> str:
    """A model's (or plan's) text; what cannot be read is a ParseError naming the file."""
    try:
        return read_text_file(path, limit)
    except UnreadableFile as e:
        raise ParseError(str(e), SourceSpan(str(path), 1, 1)) from None


def check_source_file(path: str | os.PathLike[str], limit: SizeLimit = SOURCE_LIMIT) -> None:
    """`check_text_file` with `read_source_text`'s error: the same message before work as at reading."""
    try:
        check_text_file(path, limit)
    except UnreadableFile as e:
        raise ParseError(str(e), SourceSpan(str(path), 1, 1)) from None


# What a path names when it is not a regular file, for the message.
_NOT_A_FILE = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _open_text_file(path: str | os.PathLike[str], limit: SizeLimit, noun: str) -> BinaryIO:
    """`path` open for reading once it is known to be a regular file within `limit`. Opened without
    blocking: a FIFO that nobody writes would hang `open`, and /dev/zero would be read until memory
    runs out; both are refused by what the open file is."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        why = "it is a symbolic link loop" if e.errno == errno.ELOOP else e.strerror
        raise UnreadableFile(f"cannot read {noun}: {why}") from None
    try:
        info = os.fstat(fd)
        what = next((what for test, what in _NOT_A_FILE if test(info.st_mode)), None)
        if what is not None:
            raise UnreadableFile(f"cannot read {noun}: it is {what}, not a regular file")
        if info.st_size > limit.max_bytes:
            raise UnreadableFile(_too_large(noun, limit, info.st_size))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _too_large(noun: str, limit: SizeLimit, size: int | None = None) -> str:
    """The message for a file past `limit`: of `size` bytes, or grown past it while read (None)."""
    larger = f"it is {human_bytes(size)}, more" if size is not None else "it grew to more"
    return (f"cannot read {noun}: {larger} than {limit.what} may be "
            f"({human_bytes(limit.max_bytes)}, as it is read whole)")


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


# ------------------------------------------------------------------ writing outputs


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file (see
    `AtomicWrites`, which writes several files together)."""
    with AtomicWrites() as writes:
        writes.stage(path, data)
        writes.commit()


def check_writable(path: str | os.PathLike[str]) -> None:
    """Make and remove a file where `path` will be written, as `AtomicWrites` will: a folder that
    takes no new file fails now, not after the work. An OSError naming `path` when it cannot."""
    with AtomicWrites() as writes:
        writes.stage(path, b"")


class AtomicWrites:
    """Files written together, whole or not at all: `stage` writes each to a temporary file beside
    it (`.NAME.RANDOM.tmp`), `commit` renames them all into place. Leaving the `with` block before
    `commit` is done (an error, Ctrl-C, or SIGTERM as `pesto-compile` takes it) removes every
    temporary file left: each is listed before it is made, so no moment of an interrupt escapes.

    A symbolic link stays a link: the file it points to is written. A path that is neither a
    regular file nor a folder (`/dev/null`, a FIFO) is written in place at `commit`, first:
    renaming over it would replace the device or pipe with a plain file. OSErrors name the path
    as given, not the hidden temporary file."""

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path, str]] = []  # (temporary file, target, the path as given)
        self._in_place: list[tuple[Path, bytes, str]] = []

    def __enter__(self) -> AtomicWrites:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        for tmp, _, _ in self._staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass  # never made, or already renamed
        self._staged.clear()

    def stage(self, path: str | os.PathLike[str], data: str | bytes) -> None:
        """Write `data` for `path`, to be put in place by `commit`."""
        payload = data.encode("utf-8") if isinstance(data, str) else data
        with _naming(path):
            target = Path(os.path.realpath(path))
            try:
                mode: int | None = os.stat(path).st_mode  # a symbolic link loop fails here, by name
            except FileNotFoundError:
                mode = None
            if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
                # opened by the path as given: /dev/fd/N of a shell's `>(cmd)` has no real path
                self._in_place.append((Path(path), payload, str(path)))
                return
            with os.fdopen(self._create(target, str(path)), "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())

    def commit(self) -> None:
        """Write the devices and FIFOs, then rename every staged file into place."""
        for target, payload, path in self._in_place:
            with _naming(path):
                _write_in_place(target, payload)
        self._in_place.clear()
        while self._staged:
            tmp, target, path = self._staged[0]
            with _naming(path):
                os.replace(tmp, target)
            self._staged.pop(0)

    def _create(self, target: Path, path: str) -> int:
        """A new temporary file beside `target`, open for writing with the permissions of a new file."""
        while True:
            tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
            self._staged.append((tmp, target, path))  # listed first: removed whenever the block is left
            try:
                return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            except FileExistsError:  # another writer's file, not ours to remove: another name
                self._staged.pop()
            except OSError:
                self._staged.pop()
                raise


# How long a FIFO output waits for its reader (`cat pipe` started just after the command).
FIFO_READER_SECONDS = 5.0


def _write_in_place(target: Path, payload: bytes) -> None:
    """Write a device or FIFO as it is. Opened without blocking: a FIFO that nobody reads would
    block `open` for good; it is given `FIFO_READER_SECONDS` for a reader to come, then refused."""
    waited_until = time.monotonic() + FIFO_READER_SECONDS
    while True:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            break
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: a FIFO with no reader yet
                raise
            if time.monotonic() > waited_until:
                raise OSError(errno.ENXIO, f"it is a FIFO (named pipe) that nothing read within "
                                           f"{FIFO_READER_SECONDS:g} s") from None
            time.sleep(0.01)
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)


@contextmanager
def _naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """OSErrors raised inside name `path` as the user gave it."""
    try:
        yield
    except OSError as e:
        e.filename, e.filename2 = str(path), None
        raise
