"""Pesto IR: place and schedule DNN computations across accelerators.

The public surface: the IR (`Graph`, `Op`, `Value`, types, attributes), `parse`/`load` and
`str(graph)` for the `.pir` text format, `verify`, the pass manager, and `parallelize` (a
jit-like wrapper that runs a JAX function across devices as planned).
"""

from importlib import metadata as _metadata

# The built-in passes register with the pass manager on import, so that `PassManager("annotate-costs,place")`
# knows them whichever module the user imported it from (the pass manager does not import them).
from pesto_ir import passes as _passes  # noqa: F401
from pesto_ir.attributes import (
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
    to_attr,
)
from pesto_ir.errors import Diagnostic, ParseError, PassError, PestoError, VerifyError
from pesto_ir.frontends import load, parse
from pesto_ir.ir import Graph, Location, Op, Value
from pesto_ir.parallel import parallelize
from pesto_ir.printer import print_graph
from pesto_ir.types import BlobType, TensorType, Type
from pesto_ir.verifier import verify

try:
    __version__ = _metadata.version("pesto-ir")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Attr", "BoolAttr", "BytesAttr", "DeviceAttr", "DictAttr", "DtypeAttr", "DurationAttr", "FloatAttr",
    "GraphAttr", "IntAttr", "ListAttr", "NoneAttr", "StringAttr", "TypeAttr", "to_attr",
    "Diagnostic", "ParseError", "PassError", "PestoError", "VerifyError",
    "Graph", "Location", "Op", "Value", "load", "parse", "parallelize", "print_graph",
    "BlobType", "TensorType", "Type", "verify",
]
