"""`verify`: check the IR explicitly (the pass manager also verifies after every pass)."""

from __future__ import annotations

from dataclasses import dataclass

from pesto_ir.ir import Graph
from pesto_ir.passmanager import Pass, PassContext
from pesto_ir.verifier import verify


@dataclass(frozen=True)
class VerifyPass(Pass):
    name = "verify"

    def run(self, graph: Graph, ctx: PassContext) -> None:
        verify(graph)
