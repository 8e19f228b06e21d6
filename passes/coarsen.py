"""`coarsen{target=N}`: group ops into at most N coarse nodes (Pesto §3.3, as its public code does it).

Exact placement does not scale to thousands of ops, so ops are merged into coarse nodes first:

1. Colocation groups: each group is contracted first, unless contracting it would close a cycle
   (a path leaves the group and comes back, as from a layer's forward op to its gradient); such
   a group is split back into its ops, which stay colocated through the `colocate` label
   `quotient_graph` gives every coarse node holding a part of a group spread over several nodes.
   With `colocation=whole` a group is contracted as a whole; with `colocation=connected` (the
   default) each of its connected pieces (ops joined by edges inside the group) is. Contracting
   pieces that share no edge gains no locality but glues unrelated work into one block: on the
   MSR training layer graphs, whose forward op and gradient are colocated on parallel chains,
   m-ETF on 4 devices (target 200) gets 1.74 -> 1.14 times the lower bound on
   bert24_training_layer, 1.54 -> 1.09 on gnmt_training, 1.97 -> 1.73 on inceptionv3_training
   and 1.84 -> 1.54 on resnet50_training with connected pieces; no MSR graph gets worse.
2. Rounds of edge contraction: edges sorted heaviest tensor first (edges inside one split group
   before all others), a batch of merges with no shared endpoints per round, each merge only where
   it cannot close a cycle. With longest-path levels `lev` computed at the start of the round,
   u -> v is safe when v has one predecessor, or u one successor, or lev(v) = lev(u) + 1, or
   lev(v) is below the level of every other successor of u; and, as in Pesto's code, merging
   u -> v freezes v's other predecessors at u's level for the rest of the round, which makes a
   whole batch safe together (two merges u1 -> v1, u2 -> v2 with u1 -> v2 and u2 -> v1 would
   otherwise close a cycle).

3. Twice, keeping the grouping whose critical path (of node costs) is shorter: once with the
   edges ordered as in 2., and once ordered first by how much each merge would lengthen the
   critical path (the merged node starts when both parts' inputs are ready and holds back the
   readers of its first part until its second is done). Merges that lengthen it not at all come
   first, heaviest tensor first among them; once every merge lengthens it, at most
   `LENGTHENING_SHARE` of the nodes merge per round, least first, and the levels are measured
   again. On the JAX zoo at 200 groups the coarse bound went from 1.33-1.62 to 1.19-1.32 times
   the fine one (resnet 1.46 -> 1.27, gpt 1.33 -> 1.22, lstm_seq2seq 1.57 -> 1.23; the fused
   kernels alone account for 1.07-1.12), and the one-batch plans of lstm_seq2seq (k = 4) from
   7.91 to 6.93 ms, resnet from 70.2 to 64.9 ms; the heaviest-first grouping still wins on the
   MSR inceptionv3_training_layer (1.20 against 1.40).

4. With `siblings=true`, a third time in the least-lengthening order with merges of siblings too,
   keeping of the three the grouping whose coarse graph has the lowest lower bound
   (`grouped_bound`: the bound `place` reports, transfers at joins included). Siblings are two
   nodes no path joins: two of one longest-path level, or two sinks. Edges alone cannot merge an
   optimizer update with another, only into the backward pass it hangs off, which it then holds
   back; merged with each other where they have slack, they lengthen nothing. A round merges
   edges or siblings, not both, and at most `FREE_SHARE` of the nodes while the merges are free
   by the round's levels. It lowers the JAX zoo's coarse bound (`python3 bench/coarse_bound.py`,
   its `siblings` column: resnet 1.28 -> 1.21 times the fine one, gpt 1.22 -> 1.08 at 4 devices,
   gpt24 1.30 -> 1.14 at 8, lstm_seq2seq 1.25 -> 1.17, inception 1.32 -> 1.30; no MSR training
   graph gets worse), but a lower bound is not a faster plan: `auto`'s one-batch plans
   (`bench/place_row.py ... --coarsen siblings=true`, side by side with the default, 22 s) got
   4-6% faster on gpt (k = 4, 8), gpt24 (8) and inception (8), and 3-8% slower on lstm_seq2seq
   (k = 2, 4, 8), whose expanded coarse plans lost more to the fine schedule's transfers, and 2%
   on multitower (4); `auto` picks one batch on those two. So it is not the default.

Before step 2, ops of one fused kernel (the `fusion` label `annotate-costs{fusion=xla}` writes)
are merged the same way, only along edges inside a kernel: XLA runs them as one kernel, so splitting
them across devices would write out and send what never leaves registers. The memory and class
caps apply; the node cost cap does not (a kernel is one unit of work).

Node cost and memory are summed; a node's cost may not pass a cap (relaxed when it blocks every
merge) and its memory stays under half the smallest device and small enough to pack into the
memory the graph's peak leaves spare, the peak by tensor lifetimes of its ops run one after another
(`memory_cap` in `passes/rewrite/grouping.py` argues why such nodes pack, and the coarse graph
built is checked against it). Counting every byte as held all step instead left nothing spare on
training steps, whose activations do not all live at once: the JAX gpt24 (8,347 ops) holds 596 GiB
that way against a peak of 99 GiB, and on 2 or 4 H100s it was not coarsened at all (now: 200
groups). Merging parts of two different split groups makes them one colocation class, so a
class's cost (at most total / (4 devices)) and memory are capped too, which keeps forced
colocation from swallowing the graph.

The fine graph stays the pipeline's graph: the pass only writes a `group` attribute ("g17") on
every op. `quotient_graph` (`passes/rewrite/coarse_graph.py`) builds the coarse graph placement algorithms solve.

The steps are `passes/rewrite/colocation_groups.py` (1), `passes/rewrite/grouping.py` (2 to 4, fused
kernels, caps) and the graph they contract, `passes/rewrite/contraction.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pesto_ir.ir.attributes import StringAttr
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.rewrite.coarse_graph import CoarsenError
from pesto_ir.passes.rewrite.colocation_groups import COLOCATION_MODES, DEFAULT_COLOCATION
from pesto_ir.passes.rewrite.grouping import coarsen_groups
from pesto_ir.passmanager import Pass, PassContext

# Measured with bench/bench_place.py --targets on the 16 MSR graphs, k = 2 and 4: m-ETF's
# geometric-mean makespan / lower bound is 1.10 / 1.14 at 200 nodes, against 1.14 / 1.16-1.17 at
# 50 and 100 and 1.11 / 1.13 at 400; the MILP (20 s, k = 4, six graphs) does best at 200 too
# (1.19, against 1.24 at 50), while 400 would double its model for little gain.
DEFAULT_TARGET = 200


@dataclass(frozen=True)
class CoarsenPass(Pass):
    """Write a `group` attribute on every op: which coarse node it belongs to."""

    name = "coarsen"
    target: int = DEFAULT_TARGET
    colocation: str = DEFAULT_COLOCATION  # contract each colocation group "whole", or its "connected" pieces
    siblings: bool = False  # also merge nodes no path joins, keeping the grouping of the lowest coarse bound

    def __post_init__(self) -> None:  # checked when the pipeline is built, before any model is loaded
        if isinstance(self.target, bool) or not isinstance(self.target, int) or self.target < 1:
            raise CoarsenError(f"target must be at least 1 (a whole number of groups), got {self.target!r}")
        if self.colocation not in COLOCATION_MODES:
            raise CoarsenError(f"colocation must be one of {', '.join(COLOCATION_MODES)}, got '{self.colocation}'")
        if not isinstance(self.siblings, bool):
            raise CoarsenError(f"siblings must be true or false, got {self.siblings!r}")

    def run(self, graph: Graph, ctx: PassContext) -> None:
        groups = coarsen_groups(graph, self.target, ctx.cluster, self.colocation, self.siblings)
        attrs = {g: StringAttr(g) for g in dict.fromkeys(groups)}  # one (frozen) attribute per group, shared by its ops
        for op, g in zip(graph.ops, groups):
            op.attrs["group"] = attrs[g]
        ctx.progress(f"coarsen: {len(graph.ops)} ops -> {len(attrs)} groups (target {self.target})")
