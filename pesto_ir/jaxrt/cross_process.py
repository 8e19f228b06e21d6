"""Copies between devices of different processes (JAX's multi-controller runtime).

A process holds arrays on its own devices only. An array another process needs is copied with a
cross-host `jax.device_put`: both processes describe the array as the same global array on its
device (the owner with its data, the other with none) and put it on the destination device; the
owner sends, the destination's process receives. Every process takes part in the copies that
leave or reach its devices in the same order (the executable's program order, the same in every
process), so each send meets its receive.

Why `device_put` and not a `ppermute` over the two devices' mesh: measured side by side on this
machine (two processes of four CPU devices, loopback), a ppermute copies one block faster (0.26
against 0.60 ms for 64 KiB, 14.9 against 24.3 ms for 16 MiB), but it is a collective that blocks
both processes until both reach it, and training steps with it were slower: the MLP of
`examples/train_multiprocess.py` in 8 stages over both processes 35.2 against 23.8 ms, the GPT
69.9 against 49.6 ms (medians of three alternating runs of 15 steps). The receiving side of a
`device_put` waits only where the value is read.

Arrays that stay on another process's device between steps (parameters, say) are handed to the
caller as *resident* arrays: global arrays on one device, sharded over a one-device mesh whose
axis is `RESIDENT_AXIS`. Every process holds one for each such output, with the data only where
the device is; given back as an input they tell every process alike where the value already is.

Small outputs a user reads every step (losses, metrics) are instead made readable in every process
(`everywhere`): copied from the device that made them to one device of each other process, and
handed back as one global array replicated over those devices, so `float(loss)`, `np.asarray`, and
JAX's own `multihost_utils.process_allgather` work in every process, as after a `jax.jit` whose
result is replicated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

RESIDENT_AXIS = "pesto_resident"
EVERYWHERE_AXIS = "pesto_everywhere"  # the mesh axis of a value replicated over one device per process


def is_local(device: Any) -> bool:
    """Whether this process dispatches work to `device`."""
    return bool(device.process_index == jax.process_index())


@cache
def resident_sharding(device: Any) -> NamedSharding:
    """The sharding of a resident array on `device` (the same object for a device, so that an
    input given back is recognised by identity)."""
    return NamedSharding(Mesh(np.array([device]), (RESIDENT_AXIS,)), PartitionSpec())


def resident(x: Any, device: Any, spec: jax.ShapeDtypeStruct) -> jax.Array:
    """The global array on `device` of shape `spec`: `x`'s data where `device` is this process's
    (`x` on it), none elsewhere (`x` None)."""
    shards = [x] if is_local(device) else []
    return jax.make_array_from_single_device_arrays(spec.shape, resident_sharding(device), shards, dtype=spec.dtype)


def resident_device(x: Any) -> Any | None:
    """The device of a resident array, None for anything else."""
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh.axis_names == (RESIDENT_AXIS,):
        return sharding.mesh.devices.flat[0]
    return None


def local_data(x: jax.Array) -> Any:
    """This process's single-device array of a resident (or plain) array."""
    return x.addressable_data(0)


def copy(x: Any, src: Any, dst: Any, spec: jax.ShapeDtypeStruct) -> Any | None:
    """`x` (this process's array on `src`; None where `src` is another process's) copied to `dst`:
    the array on `dst` where `dst` is this process's, else None. The processes of `src` and `dst`
    must both call it, in the same order relative to their other copies."""
    here_src, here_dst = is_local(src), is_local(dst)
    if here_src and here_dst:
        return jax.device_put(x, dst)
    if not here_src and not here_dst:
        return None
    moved = jax.device_put(resident(x if here_src else None, src, spec), resident_sharding(dst))
    return moved.addressable_data(0) if here_dst else None


@cache
def everywhere_sharding(devices: tuple[Any, ...]) -> NamedSharding:
    """The sharding of a value replicated over `devices`, one per process (the same object for the
    same devices, so that a step's outputs carry the very sharding of the last step's)."""
    return NamedSharding(Mesh(np.array(devices), (EVERYWHERE_AXIS,)), PartitionSpec())


def everywhere_targets(holders: Sequence[Any], candidates: Sequence[Any]) -> tuple[Any, ...]:
    """One device per process, in process order, to hold a value replicated everywhere: in a process
    with a device of `holders` (the devices that hold the whole value), the first of them, so that
    it takes no copy; elsewhere the first of `candidates` there (the plan's devices), else the
    process's first device. Every process computes the same tuple from the same arguments."""
    out = []
    for process in range(jax.process_count()):
        mine = [d for d in holders if d.process_index == process] or \
            [d for d in candidates if d.process_index == process] or \
            [d for d in jax.devices() if d.process_index == process]
        out.append(mine[0])
    return tuple(out)


def everywhere(held: Mapping[Any, Any], holders: Sequence[Any], targets: tuple[Any, ...],
               spec: jax.ShapeDtypeStruct) -> jax.Array:
    """The value of shape `spec` that the devices `holders` each hold whole (`held`: this process's
    arrays of it, by device; empty where it holds none), as the global array replicated over
    `targets` (`everywhere_targets`): a target among the holders takes its own array, any other a
    copy from `holders[0]`. Every process calls it with the same holders and targets, in the same
    order relative to its other copies (each copy is a send in one process, a receive in another)."""
    src = holders[0]
    piece = None
    for dst in targets:
        if dst in holders:
            got = held.get(dst)
        else:
            got = copy(held.get(src), src, dst, spec)
        if is_local(dst):
            piece = got
    assert piece is not None, "every process has a target device"
    return jax.make_array_from_single_device_arrays(spec.shape, everywhere_sharding(targets), [piece])


def local_value(x: Any) -> Any:
    """`x` as an array or value this process can use whole: a global array that is replicated over
    devices including one of this process's (an output made readable everywhere) as the copy this
    process holds; anything else as it is. None when `x` is a global array this process holds only
    part of, or none of."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return x
    if x.is_fully_replicated and x.addressable_shards:
        return x.addressable_data(0)
    return None


def put_global(x: Any, sharding: Any) -> jax.Array:
    """`x`, a value every process holds alike, as the global array on `sharding`, made from this
    process's devices' pieces."""
    value = np.asarray(x)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def copy_to_every_process(x: jax.Array) -> Any:
    """This process's full copy of `x`, an array not (fully) held here: a one-device array is
    copied from its device to a device of each other process; an array over several devices is
    first gathered onto all of them. A collective: every process calls it."""
    # annotated: JAX's own annotation of `device_set` names a Device class mypy cannot resolve
    devices: list[jax.Device] = list(x.sharding.device_set)
    if len(devices) > 1:
        mesh = Mesh(np.array(devices), ("all",))
        replicated = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
        return replicated.addressable_data(0)
    (src,) = devices
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    mine = x.addressable_data(0) if is_local(src) else None
    out = mine
    for process in range(jax.process_count()):
        if process == src.process_index:
            continue
        dst = next(d for d in jax.devices() if d.process_index == process)
        got = copy(mine, src, dst, spec)
        if is_local(dst):
            out = got
    return out
