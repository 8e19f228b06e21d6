"""Read a model from disk whatever its format, and write outputs whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pesto_ir.ir import Graph


def parse(text: str, filename: str = "<string>", engine: str = "fast") -> Graph:
    """Parse `.pir` text into a Graph (call `verify` to check it).

    `engine="lark"` runs only the reference Lark parser; the default fast path gives the same graph.
    """
    from pesto_ir.frontends.text import parse as parse_text

    return parse_text(text, filename, engine)


def load(path: str | os.PathLike[str]) -> Graph:
    """Load a `.pir` file or a `pesto-graph/1` JSON file, chosen by extension."""
    p = Path(path)
    if p.suffix == ".json":
        from pesto_ir.frontends.json_graph import load_json_graph

        return load_json_graph(p)
    from pesto_ir.frontends.text import parse_file

    return parse_file(p)


def read_source_text(path: str | os.PathLike[str]) -> str:
    """A model file's text; an unreadable or non-UTF-8 file is a ParseError naming it."""
    from pesto_ir.errors import ParseError, SourceSpan

    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ParseError(f"cannot read file: {e.strerror}", SourceSpan(str(path), 1, 1)) from None
    except UnicodeDecodeError as e:
        raise ParseError(f"file is not UTF-8 text ({e.reason} at byte {e.start})",
                         SourceSpan(str(path), 1, 1)) from None


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file ordinary permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
