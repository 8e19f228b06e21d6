"""Which machine a measurement describes.

A figure timed on one machine (a calibration, a link fit, a profiled op) describes that machine:
its processor, how many cores XLA's CPU kernels may use, and the XLA release that compiled the
kernels. It is not a figure of another machine, even one of the same device kind: the same jitted
step of a small CNN took 104-131 ms on one 2-core "cpu" machine of this project and 53 ms on the
next. `machine_of(device)` names the machine a JAX device belongs to; a calibrated cluster file
keeps it (`calibrated_on`, docs/contracts.md), and measurements kept on disk are keyed by it.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Mapping
from typing import Any

# what names a machine, in the order it is written; `processor` and `cores` only for CPU devices
MACHINE_FIELDS = ("platform", "device_kind", "processor", "cores", "jax")

Machine = Mapping[str, str | int]
MAX_CORES = 1 << 20  # a field of a file: a count no machine reaches is a broken file
MAX_TEXT = 200  # characters of a field: printed in warnings, so no control characters either


def _brief(value: object) -> str:
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."


def machine_of(device: Any) -> dict[str, str | int]:
    """The machine of JAX device `device`: its platform and device kind, the JAX release, and for a
    CPU device the processor model and the machine's core count."""
    import jax

    out: dict[str, str | int] = {"platform": str(device.platform), "device_kind": str(device.device_kind)}
    if device.platform == "cpu":
        out["processor"] = cpu_model()
        out["cores"] = os.cpu_count() or 1
    out["jax"] = jax.__version__
    return out


@functools.cache  # read once: disk-cache keys ask for it per measurement
def cpu_model() -> str:
    """The processor's model name with its family, model and stepping where the OS tells them
    (virtual machines often report a bare 'AMD EPYC' for several generations)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown"
    detail = [f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if fields.get(k)]
    if not detail:
        return name
    vendor = fields.get("vendor_id", "")
    return f"{name} ({vendor + ' ' if vendor else ''}{', '.join(detail)})"


def describe(machine: Machine) -> str:
    """One line naming a machine: `cpu: AMD EPYC (...), 2 cores, jax 0.10.2`."""
    parts = [str(machine.get("processor") or machine.get("device_kind") or machine.get("platform") or "unknown")]
    if "cores" in machine:
        parts.append(f"{machine['cores']} cores")
    if "jax" in machine:
        parts.append(f"jax {machine['jax']}")
    return f"{machine.get('platform', '?')}: {', '.join(parts)}"


def differences(recorded: Machine, current: Machine) -> list[str]:
    """The fields in which `current` is not the machine `recorded` (fields either lacks are not compared)."""
    return [f"{key} {current[key]!r} here, {recorded[key]!r} there" for key in MACHINE_FIELDS
            if key in recorded and key in current and recorded[key] != current[key]]


def elsewhere_note(recorded: Machine | None, current: Machine, what: str) -> str | None:
    """A sentence saying that `what` (e.g. "the cluster's figures") were measured elsewhere than on
    `current` (another machine, or another JAX release), or None when they were measured here or
    nothing says where."""
    if recorded is None:
        return None
    diff = differences(recorded, current)
    if not diff:
        return None
    return (f"{what} were measured elsewhere ({describe(recorded)}); here differs in "
            f"{'; '.join(diff)}: run `python -m bench.calibrate` here for figures of this machine")


def machine_key(device: Any) -> str:
    """A key for measurements of `device` kept on disk: the same on one machine, different on another."""
    return " | ".join(f"{k}={v}" for k, v in machine_of(device).items())


def machine_from_json(raw: Any) -> dict[str, str | int] | None:
    """A cluster file's `calibrated_on` object (absent or null: not said), as a new dict in field
    order. Raises ValueError with the reason when it is not a non-empty object of the known fields:
    strings, and `cores` a whole number >= 1."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        name = type(raw).__name__
        got = "an empty object" if isinstance(raw, dict) else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
        raise ValueError(f"must be an object with the fields {', '.join(MACHINE_FIELDS)}, got {got} "
                         "(leave it out or null when nothing says where the figures were measured)")
    out: dict[str, str | int] = {}
    for key, value in raw.items():
        if key not in MACHINE_FIELDS:
            raise ValueError(f"unknown field {key!r} (fields: {', '.join(MACHINE_FIELDS)})")
        if key == "cores":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CORES:
                raise ValueError(f"cores must be a whole number from 1 to {MAX_CORES}, got {_brief(value)}")
        elif not isinstance(value, str) or not value.isprintable() or len(value) > MAX_TEXT:
            raise ValueError(f"{key} must be a string of at most {MAX_TEXT} printable characters, "
                             f"got {_brief(value)}")
        out[key] = value
    return {k: out[k] for k in MACHINE_FIELDS if k in out}
