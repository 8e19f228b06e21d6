"""How data-parallel replicas run, shared by the JAX backend and the modules the Python emitter writes.

The JAX backend (`backends/jax.py`, `Replicas`) calls these functions; the emitter
(`backends/python_emit.py`) copies their source into every module it writes for a plan with
replicas, so both split batches, rejoin per-sample outputs and run segments over meshes by the
same code. Hence the rules for this file: it imports only JAX, numpy and `Callable` (a module
written from it must run without pesto_ir), every name below is in `RUNTIME` (the emitter copies
exactly those) and annotations are ones the emitted module can evaluate (it has no
`from __future__ import annotations`).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

REPLICA_AXIS = "replica"  # the mesh axis of data-parallel replicas


def replica_mesh(devices: list[jax.Device]) -> jax.sharding.Mesh:
    """The mesh of one device of replica 0 and its mirrors, one per replica in replica order."""
    return jax.sharding.Mesh(np.array(devices, dtype=object), (REPLICA_AXIS,))


def replica_sharding(mesh: jax.sharding.Mesh, stacked: bool) -> jax.sharding.NamedSharding:
    """A value every replica has the same of is replicated over the mesh; a stacked one (it differs
    per replica) has one replica's array per device along its leading axis."""
    spec = jax.sharding.PartitionSpec(REPLICA_AXIS) if stacked else jax.sharding.PartitionSpec()
    return jax.sharding.NamedSharding(mesh, spec)


def split_rows(x: jax.Array | np.ndarray, axis: int, replicas: int) -> jax.Array | np.ndarray:
    """A global batch input as the replicas' rows, stacked: replica r's is the r-th block of rows
    along `axis` (what jax.jit over a batch-sharded mesh gives each device)."""
    shape = tuple(x.shape)
    if shape[axis] % replicas:
        raise ValueError(f"the batch axis {axis} of an input of shape {shape} does not split into {replicas} "
                         "replicas")
    blocked = shape[:axis] + (replicas, shape[axis] // replicas) + shape[axis + 1:]
    if isinstance(x, jax.Array):
        return jnp.moveaxis(jnp.reshape(x, blocked), axis, 0)
    return np.moveaxis(np.reshape(x, blocked), axis, 0)


def join_rows(x: jax.Array, axis: int) -> jax.Array:
    """The replicas' rows of a stacked per-sample output, put back together along `axis`."""
    rows = jnp.moveaxis(x, 0, axis)
    shape = rows.shape
    return jnp.reshape(rows, shape[:axis] + (shape[axis] * shape[axis + 1],) + shape[axis + 2:])


def over_replicas(fn: Callable[..., list[jax.Array]], mesh: jax.sharding.Mesh, ins: tuple[bool, ...],
                  outs: tuple[bool, ...]) -> Callable[..., list[jax.Array]]:
    """`fn` (one replica's segment) as a shard_map over `mesh`: stacked arguments (`ins[i]` true)
    lose their replica axis inside, stacked results (`outs[j]`) get it back."""

    def body(*args: jax.Array) -> list[jax.Array]:
        results = fn(*(a[0] if stacked else a for a, stacked in zip(args, ins)))
        return [r[None] if stacked else r for r, stacked in zip(results, outs)]

    spec = {True: jax.sharding.PartitionSpec(REPLICA_AXIS), False: jax.sharding.PartitionSpec()}
    # check_vma off: the ops are bound as primitives, which (unlike jax.numpy) do not mark
    # replicated operands as varying; the caller's analysis of what differs per replica is the
    # same one JAX would make
    return jax.shard_map(body, mesh=mesh, in_specs=tuple(spec[x] for x in ins),
                         out_specs=[spec[x] for x in outs], check_vma=False)


RUNTIME: tuple[Callable[..., object], ...] = (replica_mesh, replica_sharding, split_rows, join_rows, over_replicas)

__all__ = ["REPLICA_AXIS", "RUNTIME", "join_rows", "over_replicas", "replica_mesh", "replica_sharding", "split_rows"]
