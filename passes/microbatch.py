"""`microbatch{microbatches=M data-parallel=D}`: the pass that rewrites the step into one replica's
M micro-batches (the rewrite is `passes/rewrite/rebatch.py`; with D > 1 on a cluster, the replica graph of
`passes/rewrite/replicas.py`, its all-reduces costed as `place` costs them with the same degrees).
"""

from __future__ import annotations

from dataclasses import dataclass

from pesto_ir.ir.graph import Graph
from pesto_ir.passes.rewrite.batch_axes import MicrobatchError
from pesto_ir.passes.rewrite.rebatch import check_degree, rebatch
from pesto_ir.passes.rewrite.replicas import Strategy, replica_graph, shard_state
from pesto_ir.passmanager import Pass, PassContext


@dataclass(frozen=True)
class MicrobatchPass(Pass):
    """Rewrite the step into one replica's micro-batches (costing all-reduces on the context's
    cluster, when it has one, as `place` does with the same degrees)."""

    name = "microbatch"
    microbatches: int = 1
    data_parallel: int = 1
    optimizer_state: str = "replicated"  # or "sharded" across the replicas (passes/rewrite/shard_state.py)

    def __post_init__(self) -> None:
        check_degree(self.microbatches, "microbatches")
        check_degree(self.data_parallel, "data-parallel")
        if self.optimizer_state not in ("replicated", "sharded"):
            raise MicrobatchError(f"optimizer-state must be replicated or sharded, not {self.optimizer_state!r}")

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        strategy = Strategy(self.data_parallel, self.microbatches, self.optimizer_state)
        if ctx.cluster is not None and self.data_parallel > 1:
            out = replica_graph(graph, ctx.cluster, strategy)
        else:
            out = rebatch(graph, self.microbatches, self.data_parallel)
            if self.optimizer_state == "sharded":
                shard_state(out, strategy, None)
        ctx.progress(f"microbatch: {len(graph.ops)} ops -> {len(out.ops)} "
                     f"(data-parallel {self.data_parallel} x {self.microbatches} micro-batches)")
        return out
