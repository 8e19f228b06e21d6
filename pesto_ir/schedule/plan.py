"""A plan: which device runs each op, when, and which tensors cross which links when.

Placement algorithms produce a `Plan`; `write_plan_attrs` records it in the IR (ops get
`device`, `start`, `end`, and `tie` where times leave their order open; the graph gets `plan` and
`transfers`), so a placed graph printed to `.pir` and parsed back is the same plan
(`read_plan_attrs`), and simulated again the same schedule. `to_json` is `pesto-plan/1`.

A transfer moves, once per destination device, the results of one op that ops on that device read.

A hybrid (data-parallel) plan has `parallelism`: the graph is one replica's (already rewritten into
micro-batch copies), placed on the devices of replica 0; replica r runs the same schedule on its
own devices (`replicas[r][i]` mirrors `replicas[0][i]`). Each `all_reduce` op of the graph sums
over the replicas; `collectives` lists each one with the whole group of devices it spans. The
makespan is still the latest op end: one whole step, every micro-batch and all-reduce included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pesto_ir.ir.attributes import Attr, BytesAttr, DeviceAttr, DictAttr, DurationAttr, ListAttr, StringAttr, to_attr
from pesto_ir.ir.graph import Graph, Op
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import brief

PLAN_FORMAT = "pesto-plan/1"
_Key = TypeVar("_Key")
# Relative margin by which one makespan must beat another to count as faster: plans equal up to
# rounding are ties, and a tie keeps the plan held first.
TIE = 1e-12
# Collective ops and the ring phases each takes (`pesto_ir.cluster.model.ring_time`): an all-reduce is a
# reduce-scatter then an all-gather. Reduce-scatters and all-gathers come from sharded optimizer
# state (`passes/rewrite/shard_state.py`).
RING_PHASES: dict[str, int] = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
COLLECTIVE_KINDS = tuple(RING_PHASES)
OPTIMIZER_STATES = ("replicated", "sharded")


@dataclass
class OpSlot:
    device: str
    start: float
    end: float


@dataclass
class Transfer:
    src: str  # producer op name
    src_device: str
    to: str  # destination device
    start: float
    end: float
    nbytes: int = 0


@dataclass(frozen=True)
class Parallelism:
    """Data-parallel replicas of a plan: `replicas[r][i]` is the device of replica r that mirrors
    replica 0's device `replicas[0][i]` (same kind and memory, same ops at the same times).
    `data_parallel` is d, the number of replicas; `microbatches` m, the micro-batches each replica's
    graph was split into. Lists given for `replicas` are kept as tuples."""

    data_parallel: int
    microbatches: int
    replicas: tuple[tuple[str, ...], ...]
    optimizer_state: str = "replicated"  # or "sharded": each replica holds 1/d of it (ZeRO-1)
    # t ranks per replica (`passes/rewrite/tensor_shard.py`): then `replicas` lists every mirror of
    # replica 0's rank-0 devices, list r*t + j being replica r's rank j
    tensor_parallel: int = 1
    # each split input's layout: its partition spec, one entry per axis ("tensor" or None)
    layouts: tuple[tuple[str, tuple[str | None, ...]], ...] = ()
    # inputs split in several equal runs, each split alike (`passes/rewrite/tensor_shard.py`): name -> runs
    interleave: tuple[tuple[str, int], ...] = ()
    parameters: str = "replicated"  # or "sharded": each replica holds 1/d of the parameters too (FSDP)
    # activations between the tensor-parallel layers split along the sequence (Megatron-SP)
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.sequence_parallel, bool):
            raise PestoError(f"parallelism: sequence_parallel must be true or false, "
                             f"not {brief(repr(self.sequence_parallel))}")
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise PestoError("parallelism: sequence_parallel splits activations across tensor-parallel ranks, "
                             "but tensor_parallel is 1")
        if self.parameters not in OPTIMIZER_STATES:
            raise PestoError(f"parallelism: parameters must be one of {', '.join(OPTIMIZER_STATES)}, "
                             f"not {brief(repr(self.parameters))}")
        if self.optimizer_state not in OPTIMIZER_STATES:
            raise PestoError(f"parallelism: optimizer_state must be one of {', '.join(OPTIMIZER_STATES)}, "
                             f"not {brief(repr(self.optimizer_state))}")
        for key in ("data_parallel", "microbatches", "tensor_parallel"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PestoError(f"parallelism: {key} must be a whole number >= 1, not {brief(repr(v))}")
        groups = self.replicas
        if isinstance(groups, str) or not isinstance(groups, Sequence) or any(
                isinstance(g, str) or not isinstance(g, Sequence) for g in groups):
            raise PestoError("parallelism: replicas must be a list of device lists, one per replica, "
                             f"not {brief(repr(groups))}")
        groups = tuple(tuple(g) for g in groups)
        object.__setattr__(self, "replicas", groups)
        if len(groups) != self.mirrors:
            ranks = f" x tensor_parallel {self.tensor_parallel}" if self.tensor_parallel > 1 else ""
            raise PestoError(f"parallelism: data_parallel is {self.data_parallel}{ranks} but {len(groups)} replica "
                             f"device list(s) are given (it needs {self.mirrors})")
        object.__setattr__(self, "layouts", tuple((str(n), tuple(spec)) for n, spec in dict(self.layouts).items()))
        object.__setattr__(self, "interleave", tuple((str(n), int(r)) for n, r in dict(self.interleave).items()))
        for r, g in enumerate(groups):
            if not all(isinstance(d, str) for d in g):
                raise PestoError(f"parallelism: replica {r} must list device names (strings), "
                                 f"not {brief(repr(list(g)))}")
            if len(g) != len(groups[0]):
                raise PestoError(f"parallelism: replica {r} has {len(g)} device(s) but replica 0 has "
                                 f"{len(groups[0])}; every replica mirrors replica 0 device for device")
        if not groups[0]:
            raise PestoError("parallelism: each replica needs at least one device")
        seen: dict[str, int] = {}
        for r, g in enumerate(groups):
            for d in g:
                if d in seen:
                    where = "twice in replica" if seen[d] == r else f"in replicas {seen[d]} and"
                    raise PestoError(f"parallelism: device {d} is {where} {r}; each device belongs to one replica once")
                seen[d] = r

    @property
    def mirrors(self) -> int:
        """How many devices run each of replica 0's devices' schedule: replicas x tensor ranks."""
        return self.data_parallel * self.tensor_parallel

    @property
    def devices(self) -> list[str]:
        """Every device of every replica, replica by replica."""
        return [d for g in self.replicas for d in g]

    def group(self, device: str, axis: str | None = None) -> list[str]:
        """The devices that mirror replica 0's `device`, one per replica (replica 0's first); with
        `axis` ("replica" or "tensor"), only those a collective over that mesh axis spans from it:
        its mirrors in the other replicas, or the other ranks of its tensor-parallel group."""
        try:
            i = self.replicas[0].index(device)
        except ValueError:
            raise PestoError(f"device {device} is not a device of replica 0 "
                             f"({', '.join(self.replicas[0])})") from None
        t = self.tensor_parallel
        lists = self.replicas if axis is None else self.replicas[::t] if axis == "replica" else self.replicas[:t]
        return [g[i] for g in lists]

    def to_json(self) -> dict[str, Any]:
        out = {"data_parallel": self.data_parallel, "microbatches": self.microbatches,
               "replicas": [list(g) for g in self.replicas]}
        if self.optimizer_state != "replicated":  # plans without it read as before
            out["optimizer_state"] = self.optimizer_state
        if self.parameters != "replicated":
            out["parameters"] = self.parameters
        if self.tensor_parallel > 1:
            out["tensor_parallel"] = self.tensor_parallel
            out["layouts"] = {name: list(spec) for name, spec in self.layouts}
            if self.interleave:
                out["interleave"] = dict(self.interleave)
            if self.sequence_parallel:
                out["sequence_parallel"] = True
        return out


@dataclass
class Collective:
    """One collective of a step: `op` is the IR op (in replica 0's graph) that it runs for, `kind`
    its opcode (`COLLECTIVE_KINDS`), `devices` its whole group across replicas, `nbytes` the whole
    value each device works on (`collective_bytes`), `start`/`end` the op's slot (every replica
    runs it then)."""

    op: str
    kind: str
    devices: list[str]
    nbytes: int
    start: float
    end: float

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "kind": self.kind, "devices": list(self.devices), "bytes": self.nbytes,
                "start": self.start, "end": self.end}


@dataclass
class Plan:
    graph: str
    algorithm: str
    devices: list[str]
    ops: dict[str, OpSlot]
    transfers: list[Transfer] = field(default_factory=list)
    lower_bound: float | None = None
    solver: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    peak_memory: dict[str, int] | None = None  # bytes per device at its peak; set by `check_plan`
    parallelism: Parallelism | None = None  # data-parallel replicas (None: one replica)
    collectives: list[Collective] = field(default_factory=list)  # one per all_reduce op
    # collectives merged into buckets: each bucket op's name -> its members' names, in order (read
    # from the graph's bucket ops by `read_plan_attrs`; a start plan needs them to merge them again)
    buckets: dict[str, list[str]] = field(default_factory=dict)
    # the order ops of one device that start and end at the same time ran in, which their times
    # cannot tell (`tie_ranks`): each such op's number, numbered across the plan in the order the
    # ops started; ops that share their times with no other op of their device have none
    ties: dict[str, int] = field(default_factory=dict)
    # The graph whose simulator gave these very times and whose validator passed them, its lower
    # bound the graph's (`lower_bound(graph, cluster)`), where the engine that made the plan says
    # so as it returns it (never written out; `passes/place.py` reads and clears it, and hands the
    # plan to `expand` as timed: `expansion.TimedPlan`)
    timed_on: Any = field(default=None, compare=False, repr=False)

    @property
    def makespan(self) -> float:
        return max((s.end for s in self.ops.values()), default=0.0)

    def device_of(self, op: str) -> str:
        return self.ops[op].device

    def device_order(self, device: str) -> list[str]:
        """Op names on `device` in execution order."""
        names = [n for n, s in self.ops.items() if s.device == device]
        return sorted(names, key=lambda n: (self.ops[n].start, self.ops[n].end))

    # ---------------------------------------------------------------- pesto-plan/1
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "graph": self.graph,
            "algorithm": self.algorithm,
            "makespan": self.makespan,
            "lower_bound": self.lower_bound,
        }
        if self.solver is not None:
            out["solver"] = self.solver
        out["devices"] = list(self.devices)
        out["ops"] = [{"id": n, "device": s.device, "start": s.start, "end": s.end}
                      | ({"tie": self.ties[n]} if n in self.ties else {}) for n, s in self.ops.items()]
        out["transfers"] = [{"src": t.src, "from": t.src_device, "to": t.to, "start": t.start, "end": t.end,
                             "bytes": t.nbytes} for t in self.transfers]
        if self.peak_memory is not None:
            out["peak_memory"] = dict(self.peak_memory)
        if self.parallelism is not None:
            out["parallelism"] = self.parallelism.to_json()
        if self.parallelism is not None or self.collectives:
            out["collectives"] = [c.to_json() for c in self.collectives]
        if self.buckets:
            out["buckets"] = {name: list(members) for name, members in self.buckets.items()}
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @staticmethod
    def from_json(data: Any) -> Plan:
        """A `pesto-plan/1` document as a plan; a field of the wrong shape is a PestoError naming it
        (whether the plan is valid for a graph and cluster is `check_plan`'s to say)."""
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise PestoError(f"not a {PLAN_FORMAT} document (its \"format\" must be \"{PLAN_FORMAT}\")")
        devices = data.get("devices")
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            raise PestoError(f"devices must be a list of device names, not {brief(repr(devices))}")
        ops = {}
        ties: dict[str, int] = {}
        for i, o in enumerate(_objects(data.get("ops"), "ops", "{id, device, start, end}")):
            where = f"ops[{i}]"
            for key in ("id", "device"):
                if not isinstance(o.get(key), str):
                    raise PestoError(f"{where}: {key} must be a string, not {brief(repr(o.get(key)))}")
            if o["id"] in ops:
                raise PestoError(f"{where}: op '{brief(o['id'])}' is placed twice")
            ops[o["id"]] = OpSlot(o["device"], *_span(o, where))
            if "tie" in o:
                ties[o["id"]] = _tie(o["tie"], where)
        transfers = []
        for i, t in enumerate(_objects(data.get("transfers", []), "transfers", "{src, from, to, start, end, bytes}")):
            where = f"transfers[{i}]"
            if t.get("src") not in ops:
                raise PestoError(f"{where}: src must name a placed op, not {brief(repr(t.get('src')))}")
            for key, value in (("from", t.get("from") or ops[t["src"]].device), ("to", t.get("to"))):
                if not isinstance(value, str):
                    raise PestoError(f"{where}: {key} must be a device name, not {brief(repr(value))}")
            if not _whole(t.get("bytes", 0)) or t.get("bytes", 0) < 0:
                raise PestoError(f"{where}: bytes must be a whole number >= 0, not {brief(repr(t.get('bytes')))}")
            transfers.append(Transfer(t["src"], t.get("from") or ops[t["src"]].device, t["to"], *_span(t, where),
                                      int(t.get("bytes", 0))))
        bound, solver, notes = data.get("lower_bound"), data.get("solver"), data.get("notes", [])
        if bound is not None and not _time(bound):
            raise PestoError(f"lower_bound must be a finite number of seconds or null, not {brief(repr(bound))}")
        if solver is not None and not isinstance(solver, dict):
            raise PestoError(f"solver must be an object or null, not {brief(repr(solver))}")
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise PestoError(f"notes must be a list of strings, not {brief(repr(notes))}")
        graph = data.get("graph", "")
        algorithm = data.get("algorithm", "")
        for key, value in (("graph", graph), ("algorithm", algorithm)):
            if not isinstance(value, str):
                raise PestoError(f"{key} must be a string, not {brief(repr(value))}")
        return Plan(graph, algorithm, list(devices), ops, transfers, None if bound is None else float(bound),
                    solver, list(notes), _peaks(data.get("peak_memory")), _parallelism(data.get("parallelism")),
                    _collectives(data.get("collectives")), _buckets(data.get("buckets", {})), ties)


def tie_ranks(started: Mapping[str, OpSlot]) -> dict[str, int]:
    """`Plan.ties` of a schedule given as its ops' slots in the order the ops started.

    Ops of one device that start and end at the same time (ops of no duration) may run in any
    order as far as their times go, but not as far as the schedule goes: which of them runs first
    decides when their results leave on a link, and whether one that was ready earlier waited for
    another (run first, it would start earlier). Their order is recorded for them alone, so that
    re-timing the plan (`simulate.recorded_order`) runs it again. Numbering them across the plan
    in start order, not per device, keeps the numbers in step with the dependencies between
    devices: an op's producer started before it."""
    # Only ops of no duration tie, and between two that tie on a device only ops that tie with them
    # can start: looking at those ops alone keeps this to 3% of a simulation (0.18 of 5.5 ms on
    # bert_l-12_training_op's 2,012 ops, 440 of no duration).
    zero = [(name, slot) for name, slot in started.items() if slot.start == slot.end]
    last: dict[str, tuple[str, float]] = {}  # device -> its op of no duration that started last, and when
    tied: set[str] = set()
    for name, slot in zero:
        before = last.get(slot.device)
        if before is not None and before[1] == slot.start:
            tied.update((before[0], name))
        last[slot.device] = (name, slot.start)
    return {name: i for i, name in enumerate(n for n, _ in zero if n in tied)} if tied else {}


def faster(makespan: float, than: float) -> bool:
    """Whether a plan of `makespan` seconds is faster than one of `than` by more than rounding (`TIE`)."""
    return makespan < than * (1 - TIE)


def _objects(raw: Any, key: str, fields: str) -> list[dict[str, Any]]:
    """`raw`, which must be a list of objects (the plan's `key`)."""
    if not isinstance(raw, list):
        raise PestoError(f"{key} must be a list of {fields} objects, not {brief(repr(raw))}")
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise PestoError(f"{key}[{i}] must be an object {fields}, not {brief(repr(item))}")
    return raw


def _buckets(raw: Any) -> dict[str, list[str]]:
    if not isinstance(raw, dict) or not all(isinstance(m, list) and m and all(isinstance(n, str) for n in m)
                                            for m in raw.values()):
        raise PestoError("buckets must be an object mapping each bucket op to the list of the ops it merged, "
                         f"not {brief(repr(raw))}")
    return {name: list(members) for name, members in raw.items()}


def _span(item: dict[str, Any], where: str) -> tuple[float, float]:
    """An op's or transfer's (start, end): finite seconds, the end not before the start."""
    for key in ("start", "end"):
        if not _time(item.get(key)):
            raise PestoError(f"{where}: {key} must be a finite number of seconds, not {brief(repr(item.get(key)))}")
    if item["end"] < item["start"]:
        raise PestoError(f"{where}: end {item['end']!r} is before start {item['start']!r}")
    return float(item["start"]), float(item["end"])


# ---------------------------------------------------------------- collectives

def collective_bytes(op: Op) -> int:
    """The whole value a collective op works on, per device: an all-reduce's operands, a
    reduce-scatter's operand (before it is split), an all-gather's result (once put together)."""
    return sum(v.type.nbytes for v in (op.results if op.opcode == "all_gather" else op.operands))


def mesh_axis(op: Op) -> str:
    """The mesh axis a collective (or `replica_slice`) works across: its `across` attribute,
    "tensor" for a tensor-parallel group's, else "replica" (data-parallel replicas)."""
    return "tensor" if op.get("across") == "tensor" else "replica"


def collectives_for(graph: Graph, plan: Plan) -> list[Collective]:
    """The `collectives` entries of `plan`: one per collective op of `graph`, spanning the group of
    devices that mirror its device across replicas, over its slot. Placement algorithms call it
    before `check_plan`. [] without `parallelism`; ops not in the plan or not on a device of
    replica 0 are left out (`check_plan` reports them)."""
    par = plan.parallelism
    if par is None:
        return []
    out = []
    for op in graph.ops:
        slot = plan.ops.get(op.name)
        if op.opcode not in RING_PHASES or slot is None or slot.device not in par.replicas[0]:
            continue
        out.append(Collective(op.name, op.opcode, par.group(slot.device, mesh_axis(op)), collective_bytes(op),
                              slot.start, slot.end))
    return out


# ---------------------------------------------------------------- plan <-> IR attributes

def write_plan_attrs(graph: Graph, plan: Plan) -> None:
    """Record `plan` in the IR: per-op device/start/end, and the graph's plan and transfers."""
    device = _Shared[str](DeviceAttr)
    slots, ties = plan.ops, plan.ties
    for op in graph.ops:
        slot = slots.get(op.name)
        attrs = op.attrs
        attrs.pop("tie", None)
        if slot is None:
            for key in ("device", "start", "end"):
                attrs.pop(key, None)
            continue
        attrs["device"] = device(slot.device)
        attrs["start"] = DurationAttr(slot.start)
        attrs["end"] = DurationAttr(slot.end)
        if op.name in ties:
            attrs["tie"] = to_attr(ties[op.name])
    meta: dict[str, Any] = {"algorithm": plan.algorithm,
                            "devices": ListAttr(tuple(DeviceAttr(d) for d in plan.devices)),
                            "makespan": DurationAttr(plan.makespan)}
    if plan.lower_bound is not None:
        meta["lower_bound"] = DurationAttr(plan.lower_bound)
    if plan.solver:
        meta["solver"] = to_attr(plan.solver)
    if plan.notes:
        meta["notes"] = to_attr(list(plan.notes))
    if plan.peak_memory is not None:
        meta["peak_memory"] = DictAttr(tuple((d, BytesAttr(int(b))) for d, b in plan.peak_memory.items()))
    if plan.parallelism is not None:
        par = plan.parallelism
        sharded = tuple((key, StringAttr(value)) for key, value in (("optimizer_state", par.optimizer_state),
                                                                   ("parameters", par.parameters))
                        if value != "replicated")
        ranks = (("tensor_parallel", to_attr(par.tensor_parallel)),
                 ("layouts", to_attr({n: list(spec) for n, spec in par.layouts})),
                 *((("interleave", to_attr(dict(par.interleave))),) if par.interleave else ()),
                 *((("sequence_parallel", to_attr(True)),) if par.sequence_parallel else ())) \
            if par.tensor_parallel > 1 else ()
        meta["parallelism"] = DictAttr((
            ("data_parallel", to_attr(par.data_parallel)), ("microbatches", to_attr(par.microbatches)),
            ("replicas", ListAttr(tuple(ListAttr(tuple(DeviceAttr(d) for d in g)) for g in par.replicas))),
            *sharded, *ranks))
    graph.attrs["plan"] = to_attr(meta)
    size = _Shared[int](to_attr)  # keyed by whole numbers alone: True == 1, but its attribute is not 1's
    graph.attrs["transfers"] = ListAttr(tuple([
        DictAttr((("src", StringAttr(t.src)), ("from", device(t.src_device)), ("to", device(t.to)),
                  ("start", DurationAttr(t.start)), ("end", DurationAttr(t.end)),
                  ("bytes", size(t.nbytes) if type(t.nbytes) is int else to_attr(t.nbytes))))
        for t in plan.transfers]))
    if plan.parallelism is not None or plan.collectives:
        graph.attrs["collectives"] = ListAttr(tuple(
            DictAttr((("op", StringAttr(c.op)), ("kind", StringAttr(c.kind)),
                      ("devices", ListAttr(tuple(DeviceAttr(d) for d in c.devices))),
                      ("bytes", to_attr(c.nbytes)), ("start", DurationAttr(c.start)), ("end", DurationAttr(c.end))))
            for c in plan.collectives))
    else:
        graph.attrs.pop("collectives", None)


class _Shared(Generic[_Key]):
    """`make(key)`, made once per key: attributes are immutable, so the ops and transfers of one
    device (or of one size) can share one (a 50,000-op plan made 150,000 of them)."""

    def __init__(self, make: Callable[[_Key], Attr]) -> None:
        self.make = make
        self.made: dict[_Key, Attr] = {}

    def __call__(self, key: _Key) -> Attr:
        attr = self.made.get(key)
        if attr is None:
            attr = self.made[key] = self.make(key)
        return attr


def read_plan_attrs(graph: Graph) -> Plan | None:
    """The plan recorded in `graph`, or None when it has not been placed."""
    meta = graph.attrs.get("plan")
    if not isinstance(meta, DictAttr):
        return None
    m = meta.value
    ops = {}
    for op in graph.ops:
        attrs = op.attrs
        device = attrs.get("device")
        if device is not None:  # op.get("device"), op.get("start", 0.0), op.get("end", 0.0), each looked up once
            start, end = attrs.get("start"), attrs.get("end")
            ops[op.name] = OpSlot(device.value, float(start.value if start is not None else 0.0),
                                  float(end.value if end is not None else 0.0))
    ties = recorded_ties(graph)
    transfers = [Transfer(t["src"], t["from"], t["to"], float(t["start"]), float(t["end"]), int(t.get("bytes", 0)))
                 for t in graph.attrs["transfers"].value] if "transfers" in graph.attrs else []
    buckets = {op.name: [str(n) for n in _plain(op.attrs["members"].value)]
               for op in graph.ops if op.opcode in RING_PHASES and "members" in op.attrs}
    return Plan(graph.name, str(m.get("algorithm", "")), list(m.get("devices", ())), ops, transfers,
                m.get("lower_bound"), _plain(m.get("solver")), list(m.get("notes", ())),
                _peaks(_plain(m.get("peak_memory"))), _parallelism(_plain(m.get("parallelism"))),
                _collectives(_plain(graph.attrs["collectives"].value) if "collectives" in graph.attrs else None),
                buckets, ties)


def recorded_ties(graph: Graph) -> dict[str, int]:
    """The `tie` attributes of `graph`'s placed ops (`Plan.ties`); one that is not a whole number
    >= 0 is an error naming its op."""
    ties = {}
    for op in graph.ops:
        if "tie" in op.attrs and "device" in op.attrs:
            ties[op.name] = _tie(op.get("tie"), f"op '{op.name}' ({op.where()})")
    return ties


def _tie(value: Any, where: str) -> int:
    """A `tie` (`Plan.ties`) read at `where`: a whole number >= 0, or an error naming it."""
    if not _whole(value) or value < 0:
        raise PestoError(f"{where}: tie must be a whole number >= 0, not {brief(repr(value))}")
    return int(value)


def _peaks(raw: Any) -> dict[str, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0
                                            for b in raw.values()):
        raise PestoError(f"peak_memory must map devices to whole numbers of bytes, not {raw!r}")
    return {str(d): int(b) for d, b in raw.items()}


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _time(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _parallelism(raw: Any) -> Parallelism | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise PestoError("parallelism must be an object {data_parallel, microbatches, replicas}, "
                         f"not {brief(repr(raw))}")
    for key in ("data_parallel", "microbatches", "tensor_parallel"):
        if key in raw or key != "tensor_parallel":
            if not _whole(raw.get(key)) or raw[key] < 1:
                raise PestoError(f"parallelism: {key} must be a whole number >= 1, not {brief(repr(raw.get(key)))}")
    groups = raw.get("replicas")
    if not isinstance(groups, list) or not all(isinstance(g, list) and all(isinstance(d, str) for d in g)
                                               for g in groups):
        raise PestoError(f"parallelism: replicas must be a list of lists of device names, not {brief(repr(groups))}")
    layouts = raw.get("layouts", {})
    if not isinstance(layouts, dict) or not all(
            isinstance(spec, list) and all(a is None or a == "tensor" for a in spec) for spec in layouts.values()):
        raise PestoError("parallelism: layouts must map input names to partition specs (lists of \"tensor\" or "
                         f"null, one per axis), not {brief(repr(layouts))}")
    interleave = raw.get("interleave", {})
    if not isinstance(interleave, dict) or not all(_whole(r) and r >= 1 for r in interleave.values()):
        raise PestoError(f"parallelism: interleave must map input names to whole numbers of runs, "
                         f"not {brief(repr(interleave))}")
    return Parallelism(raw["data_parallel"], raw["microbatches"], tuple(tuple(g) for g in groups),
                       raw.get("optimizer_state", "replicated"), raw.get("tensor_parallel", 1),
                       tuple((n, tuple(spec)) for n, spec in layouts.items()), tuple(interleave.items()),
                       raw.get("parameters", "replicated"), raw.get("sequence_parallel", False))


def _collectives(raw: Any) -> list[Collective]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise PestoError("collectives must be a list of {op, kind, devices, bytes, start, end} objects, "
                         f"not {brief(repr(raw))}")
    out = []
    for i, c in enumerate(raw):
        where = f"collectives[{i}]"
        if not isinstance(c, dict):
            raise PestoError(f"{where} must be an object {{op, kind, devices, bytes, start, end}}, "
                             f"not {brief(repr(c))}")
        if not isinstance(c.get("op"), str):
            raise PestoError(f"{where}: op must be the name of an op (a string), not {brief(repr(c.get('op')))}")
        if c.get("kind") not in COLLECTIVE_KINDS:
            raise PestoError(f"{where}: kind must be one of {', '.join(COLLECTIVE_KINDS)}, "
                             f"not {brief(repr(c.get('kind')))}")
        devices = c.get("devices")
        if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
            raise PestoError(f"{where}: devices must be a non-empty list of device names, not {brief(repr(devices))}")
        if not _whole(c.get("bytes")) or c["bytes"] < 0:
            raise PestoError(f"{where}: bytes must be a whole number >= 0, not {brief(repr(c.get('bytes')))}")
        for key in ("start", "end"):
            if not _time(c.get(key)):
                raise PestoError(f"{where}: {key} must be a finite number of seconds, not {brief(repr(c.get(key)))}")
        out.append(Collective(c["op"], c["kind"], list(devices), int(c["bytes"]), float(c["start"]), float(c["end"])))
    return out


def _plain(x: Any) -> Any:
    if isinstance(x, tuple):
        return [_plain(i) for i in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x
