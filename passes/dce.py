"""`dce`: remove ops whose results nothing reads.

Traced programs carry work they drop (a library's default value it never uses, a rewrite's
leftovers), and every op placed is costed, scheduled and held in memory as if it ran. An op stays
when it has no results or an effect (`EFFECTFUL`: a debug print, a host callback), or when a
graph output is among its results. A graph that returns nothing (a cost graph: its sinks are its
work) is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from pesto_ir.ir.graph import Graph, Op
from pesto_ir.passmanager import Pass, PassContext

EFFECTFUL = frozenset({"debug_print", "debug_callback", "io_callback", "callback"})


def dead_code_elimination(graph: Graph, only: set[str] | None = None) -> int:
    """Remove the dead ops of `graph` (last first, so chains go too), or of those named in `only`;
    how many were removed."""
    outputs = {id(v) for v in graph.outputs}
    removed = 0
    for op in reversed(list(graph.ops)):
        if (only is None or op.name in only) and _dead(op, outputs):
            graph.erase(op)
            removed += 1
    return removed


def _dead(op: Op, outputs: set[int]) -> bool:
    if not op.results or op.opcode in EFFECTFUL:
        return False
    return not any(r.uses or id(r) in outputs for r in op.results)


@dataclass(frozen=True)
class DcePass(Pass):
    """Remove ops whose results nothing reads."""

    name = "dce"

    def run(self, graph: Graph, ctx: PassContext) -> None:
        if graph.ops and not graph.outputs:
            ctx.progress("dce: the graph returns nothing (a cost graph's sinks are its work): nothing removed")
            return
        removed = dead_code_elimination(graph)
        ctx.progress(f"dce: removed {removed} of {removed + len(graph.ops)} ops")
