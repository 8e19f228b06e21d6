"""`annotate-costs{model=given|roofline|profile|auto}`: put each op's time and memory in the IR.

- `given`: the costs are already on the ops (cost graphs, hand-written `.pir`); check that every op
  has one, for every device of the cluster, so no placement reads a silent 0.
- `roofline`: FLOPs and bytes from shapes (`pesto_ir.cost.roofline`), timed on each device's figures.
- `auto`: `given` when every op has a cost, else `roofline` (for pipelines that take both cost
  graphs and models written without costs). `roofline` and `profile` replace costs already on ops
  and warn that they do.
- `profile`: each op run with `jax.jit` on a real JAX device of each kind (`pesto_ir.jaxrt.profile`),
  median (`stat=min`: minimum) of `runs` timed calls after `warmup`, cached on disk.

`roofline` and `profile` write `cost` (one duration when every device is alike, else a dict keyed by
device kind, or by device name when one kind has several speeds), `flops` and `bytes_accessed`.

With `fusion=xla` (their default) they cost the kernels XLA fuses the graph into
(`pesto_ir.cost.fusion`), not each op alone: a kernel's roofline time (or, with `profile`, its ops run
as one executable) is shared among its ops in proportion to their unfused roofline times, its
bytes are charged to the ops that read them from or write them to memory, and every op gets a
`fusion` label naming its kernel (coarsening merges a kernel first). `fusion=none` costs every op
as a kernel of its own, as before. On the zoo the fused bytes match XLA's own `cost_analysis()`
within 5% on the MLP and GPT steps, where each op alone counts 1.6-1.9x (bench/bench_costs.py).
They write no `memory`: a JAX graph's memory is in its types (`pesto_ir.schedule.memory`). Its inputs are
the resident bytes (parameters, optimizer state, the batch: arguments held for the whole step on
every device that reads them), its op results the activations (held from their op's start until
their last reader is done), so a rematerialised (`checkpoint`) forward, whose backward recomputes
instead of reading it, frees early by itself. A `memory` already on an op (resident bytes a user
gave) is kept.

Collectives (`all_reduce`) are not computation: neither roofline nor profile times them. Their
`cost` is the ring all-reduce time over their replicas' devices, which the data-parallel rewrite
writes; every model keeps it. One without a cost gets 0 (and 0 FLOPs): with one replica it is the
identity, and with more the plan validator holds its slot to the ring time anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.fusion import FusionGroup, fusion_groups, group_time, kernel_bytes, shared_out
from pesto_ir.cost.lookup import CostError, op_cost
from pesto_ir.cost.roofline import COLLECTIVES, NO_KERNEL, WORK_RULES, op_time, op_work
from pesto_ir.ir.attributes import Attr, BytesAttr, DictAttr, DurationAttr, IntAttr, StringAttr
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.jaxrt.profile import Profiler
from pesto_ir.passmanager import Pass, PassContext
from pesto_ir.util.errors import PestoError

MAX_LISTED = 10
FUSION_MODES = ("xla", "none")


def _listed(problems: list[str]) -> str:
    more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return "\n  " + "\n  ".join(problems[:MAX_LISTED]) + more


# ---------------------------------------------------------------- cost keys

def cost_keys(cluster: Cluster, figures: Callable[[Device], tuple[object, ...]]) -> dict[str, Device] | None:
    """Representative device per cost key, or None when one cost fits every device.

    Devices alike in `figures` share a cost. Keys are device kinds when each kind has one set of
    figures, else device names (`op_cost` looks a key up by name first, then by kind).
    """
    distinct = {figures(d) for d in cluster.devices}
    if len(distinct) == 1:
        return None
    per_kind: dict[str, set[tuple[object, ...]]] = {}
    for d in cluster.devices:
        per_kind.setdefault(d.kind, set()).add(figures(d))
    if all(len(f) == 1 for f in per_kind.values()):
        firsts: dict[str, Device] = {}
        for d in cluster.devices:
            firsts.setdefault(d.kind, d)
        return firsts
    return {d.name: d for d in cluster.devices}


def cost_attr(times: dict[str, float] | float) -> Attr:
    if isinstance(times, dict):
        return DictAttr(tuple((k, DurationAttr(t)) for k, t in times.items()))
    return DurationAttr(times)


def _roofline_figures(d: Device) -> tuple[object, ...]:
    return (d.kind, d.peak_flops, d.mem_bandwidth)


def _kind_only(d: Device) -> tuple[object, ...]:
    return (d.kind,)


def annotate_times(graph: Graph, cluster: Cluster, figures: Callable[[Device], tuple[object, ...]],
                   time_of: Callable[[Op, Device], float]) -> None:
    """Write `cost` on every op: `time_of(op, device)` for one device per distinct cost key.
    A collective keeps the cost it has (the ring time the data-parallel rewrite set), else gets 0."""
    keys = cost_keys(cluster, figures)
    for op in graph.ops:
        if op.opcode in COLLECTIVES:
            if "cost" not in op.attrs:
                op.attrs["cost"] = cost_attr(0.0)
            continue
        if keys is None:
            op.attrs["cost"] = cost_attr(time_of(op, cluster.devices[0]))
        else:
            op.attrs["cost"] = cost_attr({k: time_of(op, d) for k, d in keys.items()})


# ---------------------------------------------------------------- work

def annotate_work(graph: Graph, kernels: list[FusionGroup] | None = None) -> None:
    """`flops` and `bytes_accessed` on every op; with the fused `kernels`, the bytes an op moves
    within its kernel (intermediates stay in registers: `pesto_ir.cost.fusion.kernel_bytes`)."""
    moved = {name: b for group in kernels or () for name, b in kernel_bytes(group).items()}
    for op in graph.ops:
        work = op_work(op)
        op.attrs["flops"] = IntAttr(work.flops)
        op.attrs["bytes_accessed"] = BytesAttr(moved.get(op.name, work.bytes))


# ---------------------------------------------------------------- the models

def check_given(graph: Graph, cluster: Cluster | None) -> None:
    """Every op has a finite, non-negative cost for every device of the cluster."""
    problems: list[str] = []
    for op in graph.ops:
        if "cost" not in op.attrs:
            problems.append(f"op '{op.name}' ({op.where()}) has no cost")
            continue
        for d in cluster.devices if cluster is not None else ():
            try:
                t = op_cost(op, d)
            except CostError as e:
                problems.append(str(e))
                break
            except (TypeError, ValueError):
                problems.append(f"op '{op.name}' ({op.where()}): cost {op.attrs['cost']} is not a time")
                break
            if not math.isfinite(t) or t < 0:
                problems.append(f"op '{op.name}' ({op.where()}): cost {t} s on {d.name} is not a finite, "
                                "non-negative time")
                break
    if problems:
        raise CostError(f"{len(problems)} op(s) lack a usable cost (model=given reads costs already on the ops; "
                        "use annotate-costs{model=roofline} or {model=profile} to compute them):" + _listed(problems))


def _given(p: AnnotateCostsPass, graph: Graph, cluster: Cluster | None, ctx: PassContext) -> None:
    check_given(graph, cluster)


def _roofline(p: AnnotateCostsPass, graph: Graph, cluster: Cluster | None, ctx: PassContext) -> None:
    cluster = cluster or Cluster.from_jax_devices()
    _warn_replaced(graph, "roofline", ctx)
    for opcode in guessed_opcodes(graph):
        ctx.progress(f"warning: annotate-costs: '{opcode}' is not a JAX primitive and has no roofline rule: its ops "
                     "are costed as elementwise over their results; give their cost (model=given) if that is wrong")
    if p.fusion == "xla":
        fused = _FusedTimes(graph, group_time)
        annotate_times(graph, cluster, _roofline_figures, fused)
        annotate_work(graph, fused.groups)
    else:
        annotate_times(graph, cluster, _roofline_figures, op_time)
        annotate_work(graph)
    ctx.progress(f"annotate-costs: roofline costs for {len(graph.ops)} ops{_fusion_note(graph, p.fusion)} on "
                 f"{_kinds(cluster)}{_collective_note(graph)}")


class _FusedTimes:
    """`time_of(op, device)` for `annotate_times`: each op's share of its fused kernel's time,
    computed once per device; every op gets a `fusion` label naming its kernel."""

    def __init__(self, graph: Graph, seconds: Callable[[FusionGroup, Device], float]) -> None:
        self.seconds = seconds
        self.groups = fusion_groups(graph)
        self.per_device: dict[str, dict[str, float]] = {}
        for i, group in enumerate(self.groups):
            for op in group.ops:
                op.attrs["fusion"] = StringAttr(f"f{i}")

    def __call__(self, op: Op, device: Device) -> float:
        if device.name not in self.per_device:
            times: dict[str, float] = {}
            for group in self.groups:
                times.update(shared_out(group, self.seconds(group, device), device))
            self.per_device[device.name] = times
        return self.per_device[device.name][op.name]


def _fusion_note(graph: Graph, fusion: str) -> str:
    if fusion != "xla":
        return " (each op its own kernel)"
    kernels = len({op.attrs["fusion"] for op in graph.ops if "fusion" in op.attrs})
    return f" fused into {kernels} kernels as XLA would"


def _warn_replaced(graph: Graph, model: str, ctx: PassContext) -> None:
    """Costs already on ops (hand-written, or model=auto with some ops lacking one) are replaced: say so."""
    given = [op for op in graph.ops if "cost" in op.attrs and op.opcode not in COLLECTIVES]
    if given:
        op = given[0]
        ctx.progress(f"warning: annotate-costs: {model} costs replace the costs already on {len(given)} op(s), e.g. "
                     f"'{op.name}' ({op.where()}, cost = {op.attrs['cost']}); model=given keeps them, and needs "
                     "one on every op")


def guessed_opcodes(graph: Graph) -> list[str]:
    """Opcodes the roofline model can only guess at: no rule of their own and no JAX primitive of
    that name (whose elementwise default would be right), once each, nested bodies included."""
    from pesto_ir.jaxrt.params import lookup_primitive  # start-up: JAX

    seen: set[str] = set()
    out: list[str] = []
    stack = [graph]
    while stack:
        g = stack.pop()
        for op in g.ops:
            stack.extend(op.subgraphs())
            if (op.opcode in seen or op.opcode in WORK_RULES or op.opcode in NO_KERNEL or op.opcode in COLLECTIVES
                    or op.subgraphs()):
                continue
            seen.add(op.opcode)
            try:
                lookup_primitive(op.opcode)
            except PestoError:
                out.append(op.opcode)
    return sorted(out)


def _profile(p: AnnotateCostsPass, graph: Graph, cluster: Cluster | None, ctx: PassContext) -> None:
    cluster = cluster or Cluster.from_jax_devices()
    _warn_replaced(graph, "profiled", ctx)
    profiler = Profiler(runs=p.runs, warmup=p.warmup, cache=p.cache, progress=ctx.progress, stat=p.stat,
                        clock=p.clock)
    if p.fusion == "xla":
        fused = _FusedTimes(graph, profiler.time_group_on_kind)
        annotate_times(graph, cluster, _kind_only, fused)
        annotate_work(graph, fused.groups)
    else:
        annotate_times(graph, cluster, _kind_only, profiler.time_on_kind)
        annotate_work(graph)
    ctx.progress(f"annotate-costs: profiled {len(graph.ops)} ops{_fusion_note(graph, p.fusion)} "
                 f"({profiler.measured} measured, {profiler.cached} from cache) on {_kinds(cluster)}"
                 f"{_collective_note(graph)}")


def _collective_note(graph: Graph) -> str:
    n = sum(op.opcode in COLLECTIVES for op in graph.ops)
    if not n:
        return ""
    return (f"; {n} collective op(s) keep their cost (communication: the ring's time, "
            "not a roofline or profiled kernel time)")


def _kinds(cluster: Cluster) -> str:
    kinds = sorted({d.kind for d in cluster.devices})
    return ", ".join(kinds)


def _auto(p: AnnotateCostsPass, graph: Graph, cluster: Cluster | None, ctx: PassContext) -> None:
    if all("cost" in op.attrs for op in graph.ops):
        _given(p, graph, cluster, ctx)
    else:
        _roofline(p, graph, cluster, ctx)


MODELS: dict[str, Callable[[AnnotateCostsPass, Graph, Cluster | None, PassContext], None]] = {
    "given": _given,
    "roofline": _roofline,
    "profile": _profile,
    "auto": _auto,
}


@dataclass(frozen=True)
class AnnotateCostsPass(Pass):
    name: ClassVar[str] = "annotate-costs"
    model: str = "auto"
    runs: int = 5  # profile: timed runs per op (the median is kept)
    warmup: int = 2  # profile: untimed runs first (compilation, caches)
    cache: bool = True  # profile: reuse and store measurements on disk
    stat: str = "median"  # profile: median of the runs, or min (steadier on a shared machine)
    clock: str = "wall"  # profile: wall time, or cpu (process CPU time; single-threaded CPU backends only)
    fusion: str = "xla"  # roofline, profile: cost the kernels XLA fuses ops into ("xla"), or every op alone ("none")

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, not '{self.model}'")
        if self.stat not in ("median", "min") or self.clock not in ("wall", "cpu"):
            raise ValueError(f"stat must be median or min and clock wall or cpu, not '{self.stat}', '{self.clock}'")
        if self.fusion not in FUSION_MODES:
            raise ValueError(f"fusion must be one of {', '.join(FUSION_MODES)}, not '{self.fusion}'")
        if self.runs < 1 or self.warmup < 0:
            raise ValueError("runs must be at least 1 and warmup not negative")

    def run(self, graph: Graph, ctx: PassContext) -> None:
        MODELS[self.model](self, graph, ctx.cluster, ctx)
