"""The strategies the hybrid search tries, and a candidate for each.

A strategy is d data-parallel replicas of m micro-batches, their optimizer state whole on every
replica or sharded across them (`passes/rewrite/replicas.py`). Which strategies a graph and a
cluster allow, and how the `data-parallel` and `microbatches` options read, is decided here, apart
from how the search screens them (`screening.py`) and refines the best (`hybrid.py`), which both
carry a strategy's replica graph and plan in a `Candidate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.types import BlobType
from pesto_ir.passes.placement.pipeline.schedules import PipelineGraph
from pesto_ir.passes.rewrite.batch_axes import MicrobatchError, batch_spec
from pesto_ir.passes.rewrite.rebatch import MAX_MICROBATCHES
from pesto_ir.passes.rewrite.replicas import Strategy
from pesto_ir.passes.sharding.choose import Option, tensor_layout
from pesto_ir.schedule.plan import Plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError, first_reason

AUTO_MICROBATCHES = (1, 2, 4, 8, 16, 32)  # what `microbatches=auto` tries
MAX_AUTO_TENSOR_PARALLEL = 8  # `tensor-parallel=auto` tries groups up to one host of 8 devices
OPTIMIZER_STATE_CHOICES = ("auto", "replicated", "sharded")  # `optimizer-state` and `parameters`: see `strategies`


@dataclass
class Candidate:
    """A strategy, its replica graph and its best plan so far (or why it has none)."""

    strategy: Strategy
    graph: Graph | None = None  # the graph `plan` is of
    source: Graph | None = None  # the replica graph as rewritten (before all-reduces are bucketed)
    plan: Plan | None = None
    why_not: str = ""
    engine: str = ""
    pipeline: PipelineGraph | None = None  # `source` over replica 0's devices, for its pipeline schedules
    unfit: bool = False  # no plan of it fits in memory, by the memory floor (`screening.cannot_fit`)
    over: bool = False  # predicted over 1.2 x its devices' memory however sharded (`variant_to_screen`): not built


def strategies(graph: Graph, cluster: Cluster, data_parallel: int | None, microbatches: int | None,
               optimizer_state: str = "auto", tensor_parallel: int | None = 1,
               progress: Callable[[str], None] | None = None, parameters: str = "auto",
               until: float | None = None) -> list[Strategy]:
    """The strategies to try: the fixed ones, or every d dividing the devices and m in
    `AUTO_MICROBATCHES` (both dividing the batch where the graph has one); with `optimizer_state`
    "sharded", the state of d > 1 replicas sharded across them (`auto` shards it where the whole
    state gives no plan, `screening.screen`, and for one-device replicas where that is faster,
    `screening._screen_replicas`); with `parameters` "sharded", the parameters too (FSDP; `auto` shards
them where sharding the state alone gives no plan, `screening.screen`). With `tensor_parallel` t > 1 (None: every t dividing the devices
    up to `MAX_AUTO_TENSOR_PARALLEL`, and 1), each t's layout is chosen first
    (`passes/sharding/choose.py`, the degrees sharing the time up to `until`) and its replicas (d
    dividing k/t) shard each rank's blocks of the state (and of the parameters) across them as
    `optimizer_state` and `parameters` say. The degrees are searched from the largest, which
    has half the time (on a model too large for a device it is the one that fits), and each
    degree's search starts from the layout the degree before it chose."""
    replicas = _replica_strategies(graph, cluster, data_parallel, microbatches, optimizer_state, parameters)
    out = list(replicas)
    k = len(cluster)
    ts = [tensor_parallel] if tensor_parallel is not None else \
        [1, *(t for t in range(2, min(k, MAX_AUTO_TENSOR_PARALLEL) + 1) if k % t == 0)]
    if ts == [1]:
        return out
    if tensor_parallel not in (None, 1):
        out = []
    failed: list[str] = []
    degrees = sorted((t for t in ts if t > 1), reverse=True)
    start: tuple[Option, ...] = ()  # the last degree's layout, the next one's start
    for n, t in enumerate(degrees):  # the largest degree first, with half the time: then an equal share each
        part = 2 if n == 0 and len(degrees) > 1 else len(degrees) - n
        share = None if until is None else work.now() + (until - work.now()) / part
        try:
            choice = tensor_layout(graph, cluster, t, progress, fixed=tensor_parallel is not None, until=share,
                                   start=start)
        except PestoError as e:
            if tensor_parallel is not None:
                raise
            failed.append(first_reason(e))
            continue
        layout, start = choice.layout, choice.picks
        out += [dataclasses.replace(s, tensor=layout) for s in replicas if (k // s.data_parallel) % t == 0]
    if not out and data_parallel is not None and tensor_parallel is not None:
        raise PestoError(f"data-parallel {data_parallel} x tensor-parallel {tensor_parallel} does not divide the "
                         f"{k} devices")
    return out


def _replica_strategies(graph: Graph, cluster: Cluster, data_parallel: int | None, microbatches: int | None,
                        optimizer_state: str, parameters: str) -> list[Strategy]:
    """Every d x m the options and the batch allow, the state (and with `parameters` "sharded" the
    parameters too) sharded across replicas where there are several and the options say so."""
    k = len(cluster)
    ds = [data_parallel] if data_parallel is not None else [d for d in range(1, k + 1) if k % d == 0]
    if data_parallel is None and _cost_only(graph) and not any(op.get("param_bytes") for op in graph.ops):
        ds = [1]  # no gradient bytes to all-reduce: no replicas (`rebatch` says so when asked for them)
    ms = [microbatches] if microbatches is not None else list(AUTO_MICROBATCHES)
    batch = batch_size(graph)
    out = []
    for d in ds:
        for m in ms:
            if batch is not None and batch % (d * m) and (data_parallel is None or microbatches is None):
                continue
            strategy = Strategy(d, m, "sharded" if optimizer_state == "sharded" and d > 1 else "replicated")
            out.append(strategy.fully_sharded() if parameters == "sharded" and d > 1 else strategy)
    return out


def _cost_only(graph: Graph) -> bool:
    return all(isinstance(v.type, BlobType) for op in graph.ops for v in op.results)


def batch_size(graph: Graph) -> int | None:
    """The graph's batch size, or None where it has none (a cost graph, or no batch axis found)."""
    if _cost_only(graph):
        return None
    try:
        return batch_spec(graph).size
    except MicrobatchError:
        return None


def parse_degree(text: str | None, what: str) -> int | None:
    """An option's value: None for `auto`, else a whole number in range."""
    if text is None or text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise PestoError(f"{what} must be a whole number or auto, not {text!r}") from None
    if not 1 <= value <= MAX_MICROBATCHES:
        raise PestoError(f"{what} must be from 1 to {MAX_MICROBATCHES}, not {value}")
    return value
