"""A plan: which device runs each op, when, and which tensors cross which links when.

Placement algorithms produce a `Plan`; `write_plan_attrs` records it in the IR (ops get
`device`, `start`, `end`; the graph gets `plan` and `transfers`), so a placed graph printed to
`.pir` and parsed back is the same plan (`read_plan_attrs`). `to_json` is `pesto-plan/1`.

A transfer moves, once per destination device, the results of one op that ops on that device read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pesto_ir.attributes import BytesAttr, DeviceAttr, DictAttr, DurationAttr, ListAttr, StringAttr, to_attr
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph

PLAN_FORMAT = "pesto-plan/1"


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
        out["ops"] = [{"id": n, "device": s.device, "start": s.start, "end": s.end} for n, s in self.ops.items()]
        out["transfers"] = [{"src": t.src, "from": t.src_device, "to": t.to, "start": t.start, "end": t.end,
                             "bytes": t.nbytes} for t in self.transfers]
        if self.peak_memory is not None:
            out["peak_memory"] = dict(self.peak_memory)
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> Plan:
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise PestoError(f"not a {PLAN_FORMAT} document")
        ops = {o["id"]: OpSlot(o["device"], float(o["start"]), float(o["end"])) for o in data["ops"]}
        transfers = [Transfer(t["src"], t.get("from") or ops[t["src"]].device, t["to"], float(t["start"]),
                              float(t["end"]), int(t.get("bytes", 0))) for t in data.get("transfers", [])]
        return Plan(data.get("graph", ""), data.get("algorithm", ""), list(data["devices"]), ops, transfers,
                    data.get("lower_bound"), data.get("solver"), list(data.get("notes", [])),
                    _peaks(data.get("peak_memory")))


# ---------------------------------------------------------------- plan <-> IR attributes

def write_plan_attrs(graph: Graph, plan: Plan) -> None:
    """Record `plan` in the IR: per-op device/start/end, and the graph's plan and transfers."""
    for op in graph.ops:
        slot = plan.ops.get(op.name)
        if slot is None:
            for key in ("device", "start", "end"):
                op.attrs.pop(key, None)
            continue
        op.attrs["device"] = DeviceAttr(slot.device)
        op.attrs["start"] = DurationAttr(slot.start)
        op.attrs["end"] = DurationAttr(slot.end)
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
    graph.attrs["plan"] = to_attr(meta)
    graph.attrs["transfers"] = ListAttr(tuple(
        DictAttr((("src", StringAttr(t.src)), ("from", DeviceAttr(t.src_device)), ("to", DeviceAttr(t.to)),
                  ("start", DurationAttr(t.start)), ("end", DurationAttr(t.end)), ("bytes", to_attr(t.nbytes))))
        for t in plan.transfers))


def read_plan_attrs(graph: Graph) -> Plan | None:
    """The plan recorded in `graph`, or None when it has not been placed."""
    meta = graph.attrs.get("plan")
    if not isinstance(meta, DictAttr):
        return None
    m = meta.value
    ops = {}
    for op in graph.ops:
        if "device" in op.attrs:
            ops[op.name] = OpSlot(op.get("device"), float(op.get("start", 0.0)), float(op.get("end", 0.0)))
    transfers = [Transfer(t["src"], t["from"], t["to"], float(t["start"]), float(t["end"]), int(t.get("bytes", 0)))
                 for t in graph.attrs["transfers"].value] if "transfers" in graph.attrs else []
    return Plan(graph.name, str(m.get("algorithm", "")), list(m.get("devices", ())), ops, transfers,
                m.get("lower_bound"), _plain(m.get("solver")), list(m.get("notes", ())),
                _peaks(_plain(m.get("peak_memory"))))


def _peaks(raw: Any) -> dict[str, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0
                                            for b in raw.values()):
        raise PestoError(f"peak_memory must map devices to whole numbers of bytes, not {raw!r}")
    return {str(d): int(b) for d, b in raw.items()}


def _plain(x: Any) -> Any:
    if isinstance(x, tuple):
        return [_plain(i) for i in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x
