"""The stages a pipeline cuts a training step into: placement units, their kinds and owners, and
the cut of the forward units into contiguous runs.

Placement units are colocate groups (an op without `colocate` is its own unit), taken in
forward order: by the first of their forward ops in `graph.ops` that reads another op (a weight
node, which a cost graph's topological order puts first, does not say where its group computes).
Each op is

- backward: `backward = true` (cost graphs) or "transpose(" in its `scope` (JAX);
- other: not backward, and either downstream of a backward op (the optimizer update, gradient
  sums) or read only by other ops (the update's constants and its reads of optimizer state);
- forward: the rest (the model's forward pass, the loss);
- and, whatever the above, constant when it is computed from literals alone (a mask, a zero
  buffer, the loss' cotangent seed; tensor graphs only).

A unit of constants is a constant unit; a unit of forward ops that read parameters and no
activation (`weight_only_ops`: a JAX step's casts of its f32 master weights to bf16, which it makes
for every layer before the first, their broadcasts, weight transposes), read by other units, is a
source unit; else a unit is a forward unit if it holds a forward op, else a backward unit if it
holds a backward op (a weight gradient's copies and their sums), else an other unit. A cost graph
has no source units: it has no graph inputs to tell its weights from its data. Every unit
takes the stage of an owning forward unit (`unit_owners`): a backward unit the latest forward
unit it reads directly, else the earliest owner among its producers; an other unit the latest
owner among its producers; a constant or source unit, or one with no owned producer, the
earliest owner among its consumers (else the first forward unit). Cut as forward units in graph order, every cast of a 16-stage GPT
went to the first stage, which then held every layer's f32 weights (alpa-gpt-39B's published
layout: 56.5 GiB on the first device, at most 15.4 on the others). The forward units are cut
into S non-empty contiguous runs minimising the largest stage's cost, a forward unit weighing the
cost of every unit it owns on the stage's device: bisection on the bottleneck with a greedy fill,
which is exact for contiguous cuts. So the stage costs are the real per-device totals.
"""

from __future__ import annotations

from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import summed_costs
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.ir.types import TensorType
from pesto_ir.passes.placement.common import colocation_units, is_backward
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError

FORWARD, BACKWARD, OTHER, CONSTANT, SOURCE = "forward", "backward", "other", "constant", "source"
BISECTIONS = 60


@dataclass
class Stages:
    """Where the pipeline cut the graph: each unit's ops, kind and stage; each stage's cost."""

    units: list[list[Op]]
    kinds: list[str]
    stage: list[int]  # per unit
    costs: list[float]  # per stage: seconds of every op placed there, on its device

    def stage_of(self) -> dict[str, int]:
        return {op.name: s for ops, s in zip(self.units, self.stage) for op in ops}


def op_kinds(graph: Graph) -> dict[str, str]:
    """Each op's kind (module docstring): the optimizer side is what the backward pass feeds and
    what only feeds it, so that the update of a layer's weights stays out of the forward order."""
    kind: dict[str, str] = {}
    tainted: set[str] = set()
    for op in graph.ops:
        if any(p.name in tainted for p in op.producers()) or is_backward(op):
            tainted.add(op.name)
        kind[op.name] = BACKWARD if is_backward(op) else OTHER if op.name in tainted else FORWARD
    outputs = {id(v) for v in graph.outputs}
    for op in reversed(graph.ops):
        users = op.consumers()
        if kind[op.name] == FORWARD and users and not any(id(r) in outputs for r in op.results) \
                and all(kind[u.name] == OTHER for u in users):
            kind[op.name] = OTHER
    return kind


def constant_ops(graph: Graph) -> set[str]:
    """Ops computed from literals alone (no graph input upstream, tensor results): a mask, a
    zero-filled buffer, the loss' cotangent seed. Each belongs next to its readers, not at its
    place in graph order. Cost graphs (blob values) have none: their sources are layers."""
    const: set[str] = set()
    for op in graph.ops:
        if all(isinstance(r.type, TensorType) for r in op.results) and \
                all(v.owner is not None and v.owner.name in const for v in op.operands):
            const.add(op.name)
    return const


def placement_units(graph: Graph, op_kind: dict[str, str]) -> list[list[Op]]:
    """Colocate groups (an op without one alone), in forward order: by the first of their forward
    ops (else of their ops) that reads another op. Ops that read none (weights, in cost graphs
    whose topological order puts every source first) say nothing about where a unit computes."""
    index = {op.name: i for i, op in enumerate(graph.ops)}

    def position(ops: list[Op]) -> tuple[int, int]:
        forward = [op for op in ops if op_kind[op.name] == FORWARD] or ops
        reading = [op for op in forward if op.producers()]
        return (index[(reading or forward)[0].name], index[ops[0].name])

    return sorted(colocation_units(graph.ops), key=position)


@dataclass
class Units:
    """A graph's placement units as the pipelines see them: each unit's ops and kind, the forward
    unit that owns it (`unit_owners`), the forward units in order, and each unit's cost per device."""

    units: list[list[Op]]
    kinds: list[str]
    owner: list[int]
    forward: list[int]
    cost: list[list[float]]  # per unit, per device of the cluster

    def weights(self) -> list[list[float]]:
        """Per forward unit, in order, the cost of every unit it owns on each device."""
        out = {u: [0.0] * len(self.cost[u]) for u in self.forward}
        for u, f in enumerate(self.owner):
            out[f] = [a + b for a, b in zip(out[f], self.cost[u])]
        return [out[u] for u in self.forward]

    def stages(self, graph: Graph, forward_stage: list[int], n_stages: int) -> Stages:
        """The stages when forward unit i (in order) goes to `forward_stage[i]`: every unit takes
        its owner's run of consecutive forward units on one stage, `backward_flows_back` moves
        backward units to later runs, and each run is on its stage. For contiguous stages the
        runs are the stages; for interleaved ones, where the stages go round, a later run may be
        on an earlier device, and the backward units follow the runs, not the device numbers."""
        run = [0] * len(forward_stage)
        for i in range(1, len(forward_stage)):
            run[i] = run[i - 1] + (forward_stage[i] != forward_stage[i - 1])
        device_of_run = {r: d for r, d in zip(run, forward_stage)}
        of = dict(zip(self.forward, run))
        runs = backward_flows_back(graph, self.units, self.kinds, [of[f] for f in self.owner])
        stage = [device_of_run[r] for r in runs]
        costs = [0.0] * n_stages
        for u, s in enumerate(stage):
            costs[s] += self.cost[u][s]
        return Stages(self.units, self.kinds, stage, costs)


def pipeline_units(graph: Graph, cluster: Cluster) -> Units:
    """The units, their kinds, owners and costs; refuses a graph with fewer forward units than
    devices (a stage would be empty)."""
    work.charge("stages", len(graph.ops))
    op_kind = op_kinds(graph)
    units = placement_units(graph, op_kind)
    const = constant_ops(graph)
    kinds = [CONSTANT if all(op.name in const for op in ops) else _unit_kind(ops, op_kind) for ops in units]
    weight_only = weight_only_ops(graph, const)
    kinds = [SOURCE if k == FORWARD and _is_source(ops, weight_only) else k for ops, k in zip(units, kinds)]
    forward = [u for u, k in enumerate(kinds) if k == FORWARD]
    if len(forward) < len(cluster):
        raise PestoError(f"graph '{graph.name}' has {len(forward)} forward placement unit(s), fewer than the "
                         f"{len(cluster)} pipeline stages: a stage would be empty")
    devices = [cluster.device(n) for n in cluster.names]
    cost = [summed_costs(ops, devices) for ops in units]
    return Units(units, kinds, unit_owners(units, kinds), forward, cost)


def split_stages(graph: Graph, cluster: Cluster, units: Units | None = None) -> Stages:
    """Units, their kinds and stages, and the stage costs, cut into contiguous stages (`units`:
    `pipeline_units(graph, cluster)`, where the caller has them)."""
    units = units or pipeline_units(graph, cluster)
    return units.stages(graph, balanced_cut(units.weights(), len(cluster)), len(cluster))


def backward_flows_back(graph: Graph, units: list[list[Op]], kinds: list[str], stage: list[int]) -> list[int]:
    """Stages where no backward unit feeds a backward unit of a later stage: gradients flow from
    the last stage to the first, and a schedule runs a stage's backward work of a micro-batch in
    one go. A backward unit whose owner rule put it before one of its backward readers (it read no
    forward value of its own layer) moves to that reader's stage."""
    unit_of = {op.name: u for u, ops in enumerate(units) for op in ops}
    stage = list(stage)
    for op in reversed(graph.ops):  # readers before what they read
        u = unit_of[op.name]
        if kinds[u] != BACKWARD:
            continue
        later = [stage[unit_of[c.name]] for c in op.consumers() if kinds[unit_of[c.name]] == BACKWARD]
        if later and max(later) > stage[u]:
            stage[u] = max(later)
    return stage


def weight_only_ops(graph: Graph, const: set[str]) -> set[str]:
    """Ops that read parameters (graph inputs marked `param`) and no activation: besides them,
    only literals and other such ops. A cost graph has none: it has no graph inputs, so nothing
    tells its weights from its data (`placement_units` orders them by their readers)."""
    out: set[str] = set()
    for op in graph.ops:
        if op.operands and any(v.owner is None or v.owner.name in out for v in op.operands) and \
                all(v.param if v.owner is None else v.owner.name in out or v.owner.name in const for v in op.operands):
            out.add(op.name)
    return out


def _is_source(ops: list[Op], weight_only: set[str]) -> bool:
    """Whether the unit `ops` reads no activation (`weight_only_ops`) and ops of other units read
    it: where it computes is where its readers are, not its place in graph order."""
    inside = {op.name for op in ops}
    return all(op.name in weight_only for op in ops) and \
        any(c.name not in inside for op in ops for c in op.consumers())


def _unit_kind(ops: list[Op], op_kind: dict[str, str]) -> str:
    found = {op_kind[op.name] for op in ops}
    return FORWARD if FORWARD in found else BACKWARD if BACKWARD in found else OTHER


def unit_owners(units: list[list[Op]], kinds: list[str]) -> list[int]:
    """The forward unit whose stage each unit takes (a forward unit owns itself). Stages grow with
    the forward order, so owners say the stage rule before the cut is known:

    - a backward unit: the latest forward unit it reads directly or that reads what it reads (the
      op it differentiates), else the earliest owner among its producers (the layer whose gradient
      it continues);
    - an other unit: the latest owner among its producers (the update runs where its gradient is);
    - with neither, and constant and source units: the earliest owner among its consumers (a
      constant or a weight's cast joins its first reader; an update term that reads optimizer
      state only, its update), else the first forward unit.
    """
    unit_of = {op.name: u for u, ops in enumerate(units) for op in ops}
    producers = [{unit_of[p.name] for op in ops for p in op.producers()} - {u} for u, ops in enumerate(units)]
    # the forward units that read what a unit reads: a weight gradient (x^T dy) reads the x its
    # forward matmul (x W) read, so it belongs with that matmul even where x was made a stage earlier;
    # not through constants (a literal 0.5 that every layer reads says nothing of where a unit belongs)
    siblings = [{unit_of[c.name] for op in ops for v in op.operands
                 if v.owner is not None and kinds[unit_of[v.owner.name]] != CONSTANT
                 for c in v.users() if kinds[unit_of[c.name]] == FORWARD} - {u} for u, ops in enumerate(units)]
    consumers = [{unit_of[c.name] for op in ops for c in op.consumers()} - {u} for u, ops in enumerate(units)]
    owner = [u if k == FORWARD else -1 for u, k in enumerate(kinds)]
    for _ in range(len(units)):  # a unit may read units that first appear after it: settle to a fixed point
        changed = False
        for u, k in enumerate(kinds):
            if k in (FORWARD, CONSTANT, SOURCE):
                continue
            direct = [v for v in producers[u] | siblings[u] if kinds[v] == FORWARD] if k == BACKWARD else []
            known = [owner[v] for v in producers[u] if owner[v] >= 0]
            found = max(direct) if direct else (min(known) if k == BACKWARD else max(known)) if known else -1
            if found != owner[u]:
                owner[u], changed = found, True
        if not changed:
            break
    first = next(u for u, k in enumerate(kinds) if k == FORWARD)
    for u in reversed(range(len(units))):
        if owner[u] < 0:
            owner[u] = min((owner[v] for v in consumers[u] if owner[v] >= 0), default=first)
    return owner


def balanced_cut(weights: list[list[float]], n_stages: int) -> list[int]:
    """The stage of each item: S non-empty contiguous runs (needs len(weights) >= S) whose largest
    load is smallest. Bisection on the bottleneck T; `_fill(T)` is the greedy that fills each stage
    as far as T allows, which fits whenever any cut does."""
    lo, hi = 0.0, max(sum(w[s] for w in weights) for s in range(n_stages))
    best = _fill(weights, n_stages, hi)
    assert best is not None
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        found = _fill(weights, n_stages, mid)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
        if hi - lo <= 1e-12 * max(hi, 1e-30):
            break
    return best


def _fill(weights: list[list[float]], n_stages: int, limit: float) -> list[int] | None:
    """Each stage takes items while its load stays within `limit`, leaving one item per later stage;
    None when the loads do not fit."""
    n = len(weights)
    out: list[int] = []
    stage, load = 0, 0.0
    for i, w in enumerate(weights):
        if out and stage < n_stages - 1 and (load + w[stage] > limit or n - i == n_stages - 1 - stage):
            stage, load = stage + 1, 0.0
        if load + w[stage] > limit * (1 + 1e-12):
            return None
        out.append(stage)
        load += w[stage]
    return out if stage == n_stages - 1 else None

