"""`verify`: check the IR explicitly (the pass manager also verifies after every pass)."""

from __future__ import annotations

from dataclasses import dataclass

from pesto_ir.ir.graph import Graph
from pesto_ir.ir.verifier import verify
from pesto_ir.passmanager import Pass, PassContext


@dataclass(frozen=True)
class VerifyPass(Pass):
    name = "verify"

    def run(self, graph: Graph, ctx: PassContext) -> None:
        verify(graph)
