"""Frontends: `.pir` text (`text`), cost-graph JSON (`json_graph`), JAX functions (`jax`); and
`parse`/`load`, which read a model whatever its format (`pesto_ir.parse`, `pesto_ir.load`)."""

from __future__ import annotations

import os
from pathlib import Path

from pesto_ir.frontends.jax_script import is_script
from pesto_ir.frontends.json_graph import load_json_graph
from pesto_ir.ir.graph import Graph
from pesto_ir.util.loader import ArgumentError


def parse(text: str, filename: str = "<string>", engine: str = "fast") -> Graph:
    """Parse `.pir` text into a Graph (call `verify` to check it).

    `engine="lark"` runs only the reference Lark parser; the default fast path gives the same graph.
    """
    from pesto_ir.frontends.text import parse as parse_text  # start-up: Lark

    return parse_text(text, filename, engine)


def load(path: str | os.PathLike[str]) -> Graph:
    """Load a `.pir` file, a `pesto-graph/1` JSON file, or a JAX step `model.py:make_step` (lowered
    from what `make_step()` returns: `frontends/jax_script.py`), chosen by extension."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"load() takes a file path (a str or a pathlib.Path), got {type(path).__name__}")
    if is_script(path):
        from pesto_ir.frontends.jax_script import load_script  # start-up: JAX, once the step is lowered

        return load_script(path)
    p = Path(path)
    if p.suffix == ".json":
        return load_json_graph(p)
    from pesto_ir.frontends.text import parse_file  # start-up: Lark

    return parse_file(p)


__all__ = ["load", "parse"]
