"""Reading costs off the IR: op time on a device, op memory, bytes a value costs to send.

The `annotate-costs` pass writes these attributes; every placement algorithm and the simulator
read them only through the functions here, so there is one meaning of `cost`:

- `cost`: a duration (the same on every device) or a dict keyed by device name or device kind
  (`{h100 = 1ms, cpu = 20ms}`); a plain number is seconds. Missing means 0. A name is matched
  exactly, a kind without regard to case (`kind_key`), as clusters match kinds.
- `memory`: bytes the op holds on its device for the whole step (resident). Missing means 0.
  Outputs, copies and scratch have lifetimes: `pesto_ir.schedule.memory` counts them.
- bytes sent for a value: its type's size (`blob[N]` for cost-only graphs).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pesto_ir.cluster.devices import Device, kind_key
from pesto_ir.ir.attributes import Attr, DictAttr
from pesto_ir.ir.graph import Op, Value
from pesto_ir.util.errors import PestoError


class CostError(PestoError):
    pass


def op_cost(op: Op, device: Device) -> float:
    """Seconds `op` takes on `device`."""
    a = op.attrs.get("cost")
    if a is None:
        return 0.0
    if isinstance(a, DictAttr):
        entry = a.get(device.name) or a.get(device.kind) or _kind_entry(a, device.kind)
        if entry is None:
            raise CostError(f"op '{op.name}' ({op.where()}) has no cost for device {device.name} "
                            f"(kind {device.kind}); it has costs for: {', '.join(k for k, _ in a.entries)}")
        return float(entry.value)
    return float(a.value)


def op_costs(op: Op, devices: Sequence[Device]) -> list[float]:
    """`op_cost` of `op` on each of `devices`, in order: the attribute is read once, and a plain
    number (the same on every device) converted once, for callers that want every device's cost
    of every op (the bounds ask for 50,000 ops x 4 devices; one call each was most of their time)."""
    a = op.attrs.get("cost")
    if a is None:
        return [0.0] * len(devices)
    if isinstance(a, DictAttr) or not devices:
        return [op_cost(op, d) for d in devices]
    return [float(a.value)] * len(devices)


def _kind_entry(costs: DictAttr, kind: str) -> Attr | None:
    """The cost keyed by `kind` (a device's, already a `kind_key`) spelt in another case: "H100"."""
    return next((entry for key, entry in costs.entries if kind_key(key) == kind), None)


def summed_costs(ops: Iterable[Op], devices: Sequence[Device]) -> list[float]:
    """Seconds `ops` take one after another on each of `devices`; summed once where no op's cost
    depends on the device."""
    ops = list(ops)
    if not devices or any(isinstance(op.attrs.get("cost"), DictAttr) for op in ops):
        return [sum(op_cost(op, d) for op in ops) for d in devices]
    return [sum(op_cost(op, devices[0]) for op in ops)] * len(devices)


def op_memory(op: Op) -> int:
    return int(op.get("memory", 0) or 0)


def value_bytes(v: Value) -> int:
    return v.type.nbytes
