"""Pesto IR: place and schedule DNN computations across accelerators.

The public surface: the IR (`Graph`, `Op`, `Value`, types, attributes), `parse`/`load` and
`str(graph)` for the `.pir` text format, `verify`, the machine model (`Cluster`), the pass manager (`PassManager`, `PassContext`), plans
(`Plan`), and `parallelize` (a
jit-like wrapper that runs a JAX function across devices as planned).
"""

# The built-in passes register with the pass manager on import, so that `PassManager("annotate-costs,place")`
# knows them whichever module the user imported it from (the pass manager does not import them).
from pesto_ir import passes as _passes  # noqa: F401
from pesto_ir.cluster import Cluster
from pesto_ir.frontends import load, parse
from pesto_ir.ir.attributes import (
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
from pesto_ir.ir.graph import Graph, Location, Op, Value
from pesto_ir.ir.printer import print_graph
from pesto_ir.ir.types import BlobType, TensorType, Type
from pesto_ir.ir.verifier import verify
from pesto_ir.parallel.wrapper import parallelize
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import Plan
from pesto_ir.util.errors import Diagnostic, ParseError, PassError, PestoError, VerifyError
from pesto_ir.util.version import __version__

__all__ = [
    "Attr", "BoolAttr", "BytesAttr", "DeviceAttr", "DictAttr", "DtypeAttr", "DurationAttr", "FloatAttr",
    "GraphAttr", "IntAttr", "ListAttr", "NoneAttr", "StringAttr", "TypeAttr", "to_attr",
    "Diagnostic", "ParseError", "PassError", "PestoError", "VerifyError",
    "Graph", "Location", "Op", "Value", "load", "parse", "parallelize", "print_graph",
    "BlobType", "TensorType", "Type", "verify", "Cluster", "PassContext", "PassManager", "Plan", "__version__",
]
