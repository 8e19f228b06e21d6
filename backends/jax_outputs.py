"""Outputs of a plan across processes (`backends/jax.py`'s `Executable`): which outputs every
process gets a readable copy of each step, and the gathers that make them so.

Outputs that are the next value of an input (parameters, optimizer state) come back as resident
arrays on their devices (`pesto_ir/jaxrt/cross_process.py`); small other outputs (losses, metrics:
`EVERYWHERE_BYTES`) are replicated to a device of every process, so that every process can read
them as it would a `jax.jit` result; larger ones stay where they were made
(`pesto_ir.distributed.fetch` copies them when asked).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any, Protocol

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from pesto_ir.backends.jax_replicas import BackendError
from pesto_ir.ir.graph import Graph, Value
from pesto_ir.ir.types import TensorType
from pesto_ir.jaxrt import cross_process
from pesto_ir.jaxrt.params import jax_dtype

# Across processes, an output of at most this many bytes that is not the next value of an input (a
# loss, a metric) is copied to every process each step, so that every process can read it. A
# scalar's copy over the loopback took ~0.3 ms next to steps of 20-50 ms (bench/results/
# multiprocess.md), and it is waited for only where it is read; larger outputs stay on their
# device (`pesto_ir.distributed.fetch` copies them when asked).
EVERYWHERE_BYTES = 64 * 1024


class Indexed(Protocol):
    def __getitem__(self, i: int, /) -> Any: ...


Gather = Callable[[Indexed], tuple[Any, ...]]


def small_outputs(graph: Graph, state_map: Mapping[int, Any]) -> frozenset[int]:
    """Across processes, the outputs every process gets a readable copy of each step: those of at
    most `EVERYWHERE_BYTES` that are not the next value of an input (losses, metrics; parameters
    and optimizer state stay on the devices the plan put them on, however small)."""
    out = set()
    for k, v in enumerate(graph.outputs):
        t = v.type
        if k in state_map or not isinstance(t, TensorType) or t.key_impl is not None:
            continue
        if math.prod(t.shape) * np.dtype(jax_dtype(t.dtype)).itemsize <= EVERYWHERE_BYTES:
            out.add(k)
    return frozenset(out)


def resident_outputs(outputs: Sequence[int], where: Sequence[tuple[Any, Any]], here: Sequence[bool],
                     everywhere: frozenset[int], plan_devices: list[Any]) -> Gather:
    """The outputs (registers `outputs`, each on its (device, spec) of `where`, made in this process
    where `here`) as resident arrays: every process gets one per output, with its data in the
    process of the output's device; the small ones (`everywhere`) instead replicated over a device
    of every process, copied there from the output's device."""
    targets = [cross_process.everywhere_targets([device], plan_devices) if k in everywhere else None
               for k, (device, _) in enumerate(where)]

    def gather(regs: Indexed) -> tuple[Any, ...]:
        return tuple(cross_process.resident(regs[r] if mine else None, device, spec) if to is None
                     else cross_process.everywhere({device: regs[r]} if mine else {}, (device,), to, spec)
                     for r, mine, (device, spec), to in zip(outputs, here, where, targets))

    return gather


def replicated_outputs(outputs: Gather, everywhere: frozenset[int], plan_devices: list[Any]) -> Gather:
    """With replicas across processes: each small output (`everywhere`) that some process holds
    none or only part of, made whole on its devices and replicated over a device of every process.
    (Meshes of mirrored devices usually span every process already: then only a per-sample output,
    whose rows the replicas hold, is gathered.)"""
    small = sorted(everywhere)
    everyone = set(range(jax.process_count()))

    def readable(x: jax.Array) -> jax.Array:
        holders = _device_list(x.sharding)
        if not x.is_fully_replicated:
            x = _replicate(x, tuple(holders)) if any(map(cross_process.is_local, holders)) else x
        elif {d.process_index for d in holders} == everyone:
            return x  # every process holds it whole already
        held = {s.device: s.data for s in x.addressable_shards}
        spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return cross_process.everywhere(held, holders, cross_process.everywhere_targets(holders, plan_devices), spec)

    def gather(regs: Indexed) -> tuple[Any, ...]:
        out = list(outputs(regs))
        for k in small:
            out[k] = readable(out[k])
        return tuple(out)

    return gather


def _device_list(sharding: Sharding) -> list[Any]:
    """The devices of `sharding` in an order every process sees alike (a mesh's, else by id)."""
    if isinstance(sharding, NamedSharding):
        return list(sharding.mesh.devices.flat)
    return sorted(sharding.device_set, key=lambda d: d.id)


@cache
def _replicator(devices: tuple[Any, ...]) -> Callable[[jax.Array], jax.Array]:
    """A jitted identity whose result is replicated over `devices` (one per device set, compiled once)."""
    return jax.jit(lambda a: a, out_shardings=NamedSharding(Mesh(np.array(devices), ("all",)), PartitionSpec()))


def _replicate(x: jax.Array, devices: tuple[Any, ...]) -> jax.Array:
    """`x`, held in parts by `devices`, whole on each of them (the processes of `devices` call it)."""
    return _replicator(devices)(x)


def whole_here(x: Any, v: Value) -> Any:
    """An input given across processes, as a value this process holds whole: an output made readable
    everywhere (replicated over a device of each process) as this process's copy; refused by name
    when it is a global array this process holds only part of."""
    local = cross_process.local_value(x)
    if local is None:
        raise BackendError(f"input %{v.name} is a global array this process holds only part of: pass "
                           "pesto_ir.distributed.fetch(x), which gives every process the whole value")
    return local
