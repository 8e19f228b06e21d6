"""The rows of the LLM zoo (`bench/llm_zoo.py`): GPT models at the sizes people train, each with the
cluster and the layout it was published with.

Two published suites:

* **Alpa's GPT weak-scaling suite** (Zheng et al., OSDI 2022), on AWS p3.16xlarge nodes: 8 V100
  16 GB with NVLink per node, 25 Gb/s between nodes; seq 1024, vocab 51200, global batch 1024. The
  model sizes are `gpt_specs` of alpa-projects/alpa `benchmark/alpa/suite_manual_gpt.py`; the
  plans are the solutions Alpa's search found for p3.16xlarge, `perf_test_suite` of
  `benchmark/alpa/suite_auto_gpt.py` (`get_solution_case(model, num_micro_batches,
  num_auto_layers, forward_stage_layer_ids, sub_physical_mesh_shapes, sub_logical_mesh_shapes,
  autosharding options)`): the stages are the pipeline (PP), each stage's logical mesh (a, b)
  with `force_batch_dim_to_mesh_dim: 0` is a-way data parallelism (DP) by b-way operator
  parallelism (TP); a mesh without that option is left to Alpa's intra-op search. The suite
  rematerializes every layer (its `fixed_params`, (FM, Remat, RS) = (False, True, True)), and so
  do these rows: each block is `jax.checkpoint`ed (`bench/llm_models.py`).
* **Megatron-Core's H100 weak-scaling table** (NVIDIA/Megatron-LM README, "Training Speed and
  Scalability": seq 4096, vocab 131072, MFU 41% for the smallest model to 47-48% for the
  largest): the sizes and the tensor (TP) and pipeline (PP) degrees as issue 42 lists them; the
  rest of the GPUs are data-parallel replicas. The sizes count an output layer apart from the
  token embedding (7.1B = 12 x 30 x 4096^2 + 2 x 131072 x 4096), so these rows untie them. One data-parallel group and a few replicas are
  simulated (8-32 H100 80 GB, 8 per node with NVLink, InfiniBand between nodes). Megatron trains
  these with fused flash attention (Transformer Engine), which never holds an attention layer's
  seq x seq scores: it recomputes them in the backward pass, as Megatron's selective recomputation
  does too. These rows do the same: each attention core (scores, softmax, the product with v) is
  `jax.checkpoint`ed, so the forward pass keeps only q, k and v, and the backward pass recomputes
  the scores (flash attention's recomputation, at the graph's costs, not a fused kernel's).
  Megatron's tensor-parallel layers run with sequence parallelism (Megatron-SP), and its
  distributed optimizer shards the optimizer state across the data-parallel replicas, so 70B
  (TP8 x PP2) is simulated with two replicas: with one, no replica shares the f32 weights and
  Adam state, which alone fill 65 GiB of each device's 80 (as they would Megatron's).

A row's `published` layout is the published (DP, TP, PP, micro-batches of the published global
batch). Planning 128 micro-batches of a 24-layer GPT is a graph of 1.2 million ops, so a row simulates
fewer: `simulated` keeps the published DP, TP, PP and micro-batch size and takes fewer micro-batches
per step (its global batch is `simulated.dp * simulated.microbatches * micro_batch`), which the
row says. MFU does not depend on the batch to first order; the pipeline's fill and drain are a
larger share of a step of fewer micro-batches, and the optimizer update too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bench.zoo_jax_models import GptConfig
from pesto_ir.cluster.model import Cluster

ALPA_SOURCE = "alpa-projects/alpa benchmark/alpa/suite_auto_gpt.py perf_test_suite"
ALPA_SIZES = "alpa-projects/alpa benchmark/alpa/suite_manual_gpt.py gpt_specs"
MEGATRON_SOURCE = "NVIDIA/Megatron-LM README, Training Speed and Scalability (model table), as issue 42 lists it"
GIB = 2**30


@dataclass(frozen=True)
class Layout:
    """A parallel layout: data-parallel replicas x tensor-parallel ranks x pipeline stages, and the
    micro-batches each replica's share of the global batch is split into."""

    dp: int
    tp: int
    pp: int
    microbatches: int

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        return f"DP{self.dp} TP{self.tp} PP{self.pp} m{self.microbatches}"


@dataclass(frozen=True)
class Machine:
    """A training cluster: nodes of `per_node` devices of one kind, NVLink inside (the kind's
    link), `host_link` (latency s, bandwidth B/s) between nodes."""

    name: str
    kind: str
    memory: float  # bytes per device
    host_link: tuple[float, float]
    per_node: int = 8

    def cluster(self, n: int, memory: float | None = None) -> Cluster:
        """n devices (one node's worth or whole nodes); `memory` overrides the devices' memory."""
        memory = self.memory if memory is None else memory
        if n <= self.per_node:
            return Cluster.homogeneous(n, self.kind, memory=memory)
        return Cluster.homogeneous(n, self.kind, memory=memory, devices_per_host=self.per_node,
                                   host_link=self.host_link)


# p3.16xlarge: 8 x V100 16 GB (SXM2, NVLink), 25 Gb/s Ethernet between instances
P3 = Machine("p3.16xlarge (8 x V100 16 GB, NVLink; 25 Gb/s between nodes)", "v100", 16 * GIB, (5e-5, 25e9 / 8))
# DGX H100: 8 x H100 80 GB (NVLink), 8 x 400 Gb/s InfiniBand NDR per node (one per GPU)
DGX_H100 = Machine("DGX H100 (8 x H100 80 GB, NVLink; 8 x 400 Gb/s InfiniBand between nodes)", "h100", 80 * GIB,
                   (2e-5, 400e9 / 8))


@dataclass(frozen=True)
class LlmRow:
    """One model at one scale: its dimensions, the cluster, the layout as published and as simulated."""

    name: str
    suite: str  # "alpa" or "megatron"
    model: GptConfig  # the published dimensions; `batch` is the simulated global batch
    machine: Machine
    published: Layout
    published_batch: int | None  # the published global batch (None: not in the source)
    simulated: Layout  # the same DP, TP, PP and micro-batch size; fewer micro-batches
    source: str
    layout_note: str = ""  # how the published layout is approximated, when it is
    published_mfu: str = ""
    tied: bool = True  # the output layer is the token embedding (Alpa's GPT), or its own (Megatron's)
    remat: str = "none"  # what the backward pass recomputes (`llm_models.RECOMPUTE`)

    @property
    def devices(self) -> int:
        return self.simulated.devices

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch per replica (the same published and simulated)."""
        return self.model.batch // (self.simulated.dp * self.simulated.microbatches)

    def batch_note(self) -> str:
        """What the simulated step is, against the published one."""
        sim, mb = self.simulated, self.micro_batch
        shape = f"DP{sim.dp} x {sim.microbatches} micro-batch{'es' if sim.microbatches > 1 else ''} of {mb}"
        if self.published_batch is None and sim.microbatches == self.published.microbatches:
            return f"global batch {self.model.batch} ({shape})"
        if self.model.batch == self.published_batch:
            return f"global batch {self.model.batch} as published ({shape})"
        of = f" of the published {self.published_batch}" if self.published_batch else ""
        return (f"simulated global batch {self.model.batch}{of} ({shape}, instead of "
                f"{self.published.microbatches} micro-batches)")


def _alpa(size: str, hidden: int, layers: int, heads: int, published: Layout, sim_microbatches: int,
          note: str = "") -> LlmRow:
    micro = 1024 // (published.dp * published.microbatches)  # Alpa splits each micro-batch over the DP axis
    sim = dataclasses.replace(published, microbatches=sim_microbatches)
    config = GptConfig(layers, hidden, heads, 1024, sim.dp * sim_microbatches * micro, 51200)
    return LlmRow(f"alpa-gpt-{size}", "alpa", config, P3, published, 1024, sim,
                  f"{ALPA_SOURCE}[{published.devices}]; sizes: {ALPA_SIZES}['{size}']", note, remat="blocks")


def _megatron(size: str, hidden: int, layers: int, heads: int, tp: int, pp: int, dp: int, microbatches: int,
              mfu: str) -> LlmRow:
    layout = Layout(dp, tp, pp, microbatches)
    config = GptConfig(layers, hidden, heads, 4096, dp * microbatches, 131072)  # micro-batch of 1 sequence
    note = (f"TP{tp} PP{pp} as published; DP{dp} simulated (the published run has more replicas), "
            f"micro-batch size 1")
    return LlmRow(f"megatron-gpt-{size}", "megatron", config, DGX_H100, layout, None, layout, MEGATRON_SOURCE,
                  note, mfu, tied=False, remat="attention")


# Alpa's solutions for p3.16xlarge (perf_test_suite), read as (DP, TP, PP, micro-batches):
#   1: 350M, 512 mb, 1 stage, mesh (1,1)                          -> DP1 TP1 PP1 m512
#   2: 760M, 128 mb, 2 stages of (1,1)                            -> DP1 TP1 PP2 m128
#   4: 1.3B, 128 mb, 2 stages, logical (2,1), batch on dim 0      -> DP2 TP1 PP2 m128
#   8: 2.6B, 128 mb, 3 stages of 2, 2 and 4 GPUs ((2,1), (2,1) batch on dim 0, then (4,1) left to the
#      intra-op search)                                           -> approximated as DP2 TP1 PP4 m128
#  16: 6.7B, 64 mb, 2 stages, logical (2,4), batch on dim 0       -> DP2 TP4 PP2 m64
#  32: 15B, 128 mb, 4 stages, logical (2,4), batch on dim 0       -> DP2 TP4 PP4 m128
#  64: 39B, 1024 mb, 16 stages, logical (1,4), batch on dim 0     -> DP1 TP4 PP16 m1024
ALPA_ROWS = (
    _alpa("350M", 1024, 24, 16, Layout(1, 1, 1, 512), 4),
    _alpa("760M", 1536, 24, 16, Layout(1, 1, 2, 128), 4),
    _alpa("1.3B", 2048, 24, 32, Layout(2, 1, 2, 128), 4),
    _alpa("2.6B", 2560, 32, 32, Layout(2, 1, 4, 128), 4,
          "published: 3 stages of 2, 2 and 4 GPUs (layers 0-1, 2-3, 4-7 of 8), the first two DP2, the last a 4x1 "
          "mesh sharded by Alpa's intra-op search; built as 4 stages of DP2 (the same layers per GPU pair)"),
    _alpa("6.7B", 4096, 32, 32, Layout(2, 4, 2, 64), 4),
    _alpa("15B", 5120, 48, 40, Layout(2, 4, 4, 128), 4),
    _alpa("39B", 8192, 48, 64, Layout(1, 4, 16, 1024), 16),
)

MEGATRON_ROWS = (
    _megatron("1.7B", 2048, 24, 16, 1, 1, 8, 1, "41% (the table's smallest model)"),
    _megatron("7.1B", 4096, 30, 32, 2, 1, 4, 1, "41-48% (the table's range)"),
    _megatron("16B", 6144, 32, 48, 4, 1, 2, 1, "41-48% (the table's range)"),
    _megatron("32B", 7168, 48, 56, 8, 1, 2, 1, "41-48% (the table's range)"),
    _megatron("70B", 8192, 84, 64, 8, 2, 2, 4, "47-48% (the table's largest models)"),
)

ROWS: tuple[LlmRow, ...] = (*ALPA_ROWS, *MEGATRON_ROWS)


def quick_row(row: LlmRow) -> LlmRow:
    """`row` in miniature, for smoke runs: every degree at most 2 (so at most 8 devices), 2
    micro-batches where the row has several, and a tiny decoder (d 64, 8 heads, seq 32, vocab 256,
    a layer per stage and at least 2)."""
    sim = row.simulated
    layout = Layout(min(sim.dp, 2), min(sim.tp, 2), min(sim.pp, 2), min(sim.microbatches, 2))
    config = GptConfig(max(2, layout.pp), 64, 8, 32, layout.dp * layout.microbatches * 2, 256)
    return dataclasses.replace(row, name=f"{row.name}-quick", model=config, simulated=layout)


def rows(quick: bool = False) -> list[LlmRow]:
    return [quick_row(r) for r in ROWS] if quick else list(ROWS)
