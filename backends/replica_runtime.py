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
TENSOR_AXIS = "tensor"  # the mesh axis of a tensor-parallel group's ranks


def replica_mesh(devices: list[jax.Device], tensor: int = 1) -> jax.sharding.Mesh:
    """The mesh of one device of replica 0 and its mirrors, one per replica in replica order; with
    `tensor` ranks per replica (mirror r*tensor + j is replica r's rank j), a replicas x ranks mesh."""
    if tensor == 1:
        return jax.sharding.Mesh(np.array(devices, dtype=object), (REPLICA_AXIS,))
    grid = np.array(devices, dtype=object).reshape(len(devices) // tensor, tensor)
    return jax.sharding.Mesh(grid, (REPLICA_AXIS, TENSOR_AXIS))


def replica_sharding(mesh: jax.sharding.Mesh, stacked: bool) -> jax.sharding.NamedSharding:
    """A value every replica has the same of is replicated over the mesh; a stacked one (it differs
    per replica) has one replica's array per device along its leading axis (over every mesh axis)."""
    names = tuple(mesh.axis_names)
    spec = jax.sharding.PartitionSpec(names[0] if len(names) == 1 else names) if stacked \
        else jax.sharding.PartitionSpec()
    return jax.sharding.NamedSharding(mesh, spec)


def split_rows(x: jax.Array | np.ndarray, axis: int, replicas: int, runs: int = 1) -> jax.Array | np.ndarray:
    """A global batch input as the replicas' rows, stacked: replica r's is the r-th block of rows
    along `axis` (what jax.jit over a batch-sharded mesh gives each device). With `runs`, the axis
    is that many equal runs and replica r's rows are the r-th block of each, in run order."""
    shape = tuple(x.shape)
    if shape[axis] % (replicas * runs):
        raise ValueError(f"the batch axis {axis} of an input of shape {shape} does not split into {replicas} "
                         "replicas" + (f" in {runs} runs" if runs > 1 else ""))
    blocked = shape[:axis] + (runs, replicas, shape[axis] // (replicas * runs)) + shape[axis + 1:]
    local = shape[:axis] + (shape[axis] // replicas,) + shape[axis + 1:]
    if isinstance(x, jax.Array):
        return jnp.reshape(jnp.moveaxis(jnp.reshape(x, blocked), axis + 1, 0), (replicas, *local))
    return np.reshape(np.moveaxis(np.reshape(x, blocked), axis + 1, 0), (replicas, *local))


def join_rows(x: jax.Array, axis: int, runs: int = 1) -> jax.Array:
    """The replicas' rows of a stacked per-sample output, put back together along `axis` (in
    `runs` runs, as `split_rows` cut them)."""
    d, shape = x.shape[0], x.shape[1:]
    blocked = jnp.reshape(x, (d, *shape[:axis], runs, shape[axis] // runs, *shape[axis + 1:]))
    rows = jnp.moveaxis(blocked, 0, axis + 1)
    return jnp.reshape(rows, (*shape[:axis], shape[axis] * d, *shape[axis + 1:]))


def over_replicas(fn: Callable[..., list[jax.Array]], mesh: jax.sharding.Mesh, ins: tuple[bool, ...],
                  outs: tuple[bool, ...]) -> Callable[..., list[jax.Array]]:
    """`fn` (one replica's segment) as a shard_map over `mesh`: stacked arguments (`ins[i]` true)
    lose their replica axis inside, stacked results (`outs[j]`) get it back."""

    def body(*args: jax.Array) -> list[jax.Array]:
        results = fn(*(a[0] if stacked else a for a, stacked in zip(args, ins)))
        return [r[None] if stacked else r for r, stacked in zip(results, outs)]

    names = tuple(mesh.axis_names)
    spec = {True: jax.sharding.PartitionSpec(names[0] if len(names) == 1 else names),
            False: jax.sharding.PartitionSpec()}
    # check_vma off: the ops are bound as primitives, which (unlike jax.numpy) do not mark
    # replicated operands as varying; the caller's analysis of what differs per replica is the
    # same one JAX would make
    return jax.shard_map(body, mesh=mesh, in_specs=tuple(spec[x] for x in ins),
                         out_specs=[spec[x] for x in outs], check_vma=False)


RUNTIME: tuple[Callable[..., object], ...] = (replica_mesh, replica_sharding, split_rows, join_rows, over_replicas)

__all__ = ["REPLICA_AXIS", "RUNTIME", "TENSOR_AXIS", "join_rows", "over_replicas", "replica_mesh", "replica_sharding", "split_rows"]
