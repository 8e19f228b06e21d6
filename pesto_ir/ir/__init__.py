"""The graph IR: a `Graph` of `Op`s over `Value`s (`graph`), their types and attributes, the verifier,
the printer, the shape rules the verifier checks, one record per opcode (`opdefs`) and the
analysis annotations' keys (`annotations`). The public names are re-exported here."""

from pesto_ir.ir.graph import Graph, Location, Op, Value

__all__ = ["Graph", "Location", "Op", "Value"]
