"""Data-parallel replicas in the JAX backend (`backends/jax.py`): what differs per replica, from the
graph alone (`ReplicaLayout`, which the Python emitter lays modules out by too), and where each
value's arrays live on the replicas' meshes (`Replicas`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from pesto_ir.backends.replica_runtime import (
    TENSOR_AXIS,
    join_rows,
    over_replicas,
    replica_mesh,
    replica_sharding,
    split_rows,
)
from pesto_ir.backends.schedule import Segment
from pesto_ir.ir.graph import Graph, Value
from pesto_ir.jaxrt.interpreter import ACROSS_REPLICAS
from pesto_ir.schedule.plan import Parallelism
from pesto_ir.util.errors import PestoError


class BackendError(PestoError):
    """The placed graph cannot run on the given JAX devices."""


class ReplicaLayout:
    """What differs per replica when a plan has d > 1 data-parallel replicas, from the graph alone
    (no devices): the JAX backend and the Python emitter lay replicas out by it. A value every
    replica has the same of (parameters, constants, what an all-reduce returns and what is computed
    from such values alone) is replicated; a value that differs per replica (the batch inputs' rows
    and what is computed from them) is `varying`. `input_axes` and `output_axes` give the batch axis
    of inputs and outputs by position (`batch_inputs`, `batch_outputs`), along which the caller's
    whole batch is split into the replicas' rows and per-sample outputs are put back together;
    sharded optimizer state (`sharded_inputs`, `sharded_outputs`: `passes/rewrite/shard_state.py`) is split
    into the replicas' blocks and put back together the same way."""

    def __init__(self, graph: Graph, replicas: int, tensor: int = 1) -> None:
        self.dp, self.tp = replicas, tensor
        self.d = replicas * tensor  # the mirrors: replica r's rank j is mirror r*tensor + j
        self.tensor = tensor > 1
        # a tensor-parallel group's ranks (`passes/rewrite/tensor_shard.py`) differ by the split
        # parameters' blocks; every rank of a replica has its whole batch
        kinds = ([("replica", ("batch_inputs", "sharded_inputs"), ("batch_outputs", "sharded_outputs"))]
                 if replicas > 1 else []) + ([("tensor", ("tensor_inputs",), ("tensor_outputs",))] if tensor > 1 else [])
        self.varying = _varying(graph, tuple(a for _, ins, _ in kinds for a in ins))
        by_name = {v.name: i for i, v in enumerate(graph.inputs)}
        by_index = {str(k): k for k in range(len(graph.outputs))}
        self.input_axes: dict[int, int] = {}
        self.output_axes: dict[int, int] = {}
        # "replica" (split over replicas), "tensor" (over ranks), or "both": a rank's block split again
        # over the replicas (sharded optimizer state of a split parameter), `*_axes` the block's axis
        # and `*_inner` the replicas' axis of the block
        self.input_kind: dict[int, str] = {}
        self.output_kind: dict[int, str] = {}
        self.input_inner: dict[int, int] = {}
        self.output_inner: dict[int, int] = {}
        for kind, ins, outs in kinds:
            for attrs, axes, kind_of, inner, index in ((ins, self.input_axes, self.input_kind, self.input_inner, by_name),
                                                       (outs, self.output_axes, self.output_kind, self.output_inner,
                                                        by_index)):
                for i, a in (item for attr in attrs for item in _axes(graph, attr, index).items()):
                    if kind_of.get(i) == "replica" and kind == "tensor":
                        inner[i], axes[i], kind_of[i] = axes[i], a, "both"
                    else:
                        axes[i], kind_of[i] = a, kind
        # split in several runs of blocks (a fused projection's parts, each split alike)
        self.input_runs = _axes(graph, "tensor_input_runs", by_name) if tensor > 1 else {}
        self.output_runs = _axes(graph, "tensor_output_runs", by_index) if tensor > 1 else {}
        for i, v in enumerate(graph.inputs):
            if id(v) in self.varying and i not in self.input_axes:
                raise BackendError(f"input %{v.name} differs per replica but has no batch axis")
        for k, v in enumerate(graph.outputs):
            if id(v) in self.varying and k not in self.output_axes:
                raise BackendError(f"output {k} (%{v.name}) differs per replica but the graph gives no batch axis "
                                   "to put the replicas' rows together along (batch_outputs)")

    def stacked_flags(self, values: Iterable[Value]) -> tuple[bool, ...]:
        """For each value: does it differ per replica (one replica's array per device)?"""
        return tuple(id(v) in self.varying for v in values)


class Replicas(ReplicaLayout):
    """Where arrays live when a plan has d > 1 data-parallel replicas. The schedule is replica 0's;
    each of its devices stands for the mesh of the d devices that mirror it (one axis, `replica`).
    Replicated values (see `ReplicaLayout`) are replicated over that mesh; varying ones are
    stacked: one more leading axis of d, one replica's array per device. Segments run as
    `jax.shard_map` over the mesh, so XLA runs every replica's copy at once and the all-reduces
    are its collectives. The arrays are laid out by `backends/replica_runtime.py`, which emitted
    modules run too."""

    def __init__(self, graph: Graph, par: Parallelism, devices: Mapping[str, Any]) -> None:
        super().__init__(graph, par.data_parallel, par.tensor_parallel)
        self.replicated: dict[str, Sharding] = {}
        self.stacked: dict[str, Sharding] = {}
        for name in par.replicas[0]:
            mesh = replica_mesh([devices[n] for n in par.group(name)], par.tensor_parallel)
            self.replicated[name] = replica_sharding(mesh, False)
            self.stacked[name] = replica_sharding(mesh, True)

    def sharding(self, v: Value, device: str) -> Sharding:
        return (self.stacked if id(v) in self.varying else self.replicated)[device]

    def per_replica(self, fn: Callable[..., list[Any]], seg: Segment) -> Callable[..., list[Any]]:
        """`fn` (one replica's segment) over the replicas of `seg`'s device (`over_replicas`)."""
        mesh = self.replicated[seg.device].mesh  # type: ignore[attr-defined]
        return over_replicas(fn, mesh, self.stacked_flags(seg.inputs), self.stacked_flags(seg.outputs))

    def stack(self, x: Any, i: int) -> Any:
        """Input i as the mirrors' arrays, stacked: a batch input's rows of replica r (the r-th block
        along its axis) for each of r's ranks, a split parameter's block j (of each of its runs)
        for rank j of each replica, or (split both ways) block j's r-th part for rank j of replica r."""
        kind, axis = self.input_kind[i], self.input_axes[i]
        try:
            if kind == "both":
                blocks = split_rows(x, axis, self.tp, self.input_runs.get(i, 1))
                parts = [split_rows(blocks[j], self.input_inner[i], self.dp) for j in range(self.tp)]
                return jnp.reshape(jnp.stack(parts, axis=1), (self.d, *parts[0].shape[1:]))
            if kind == "replica":
                rows = split_rows(x, axis, self.dp)
                return rows if self.tp == 1 else jnp.repeat(rows, self.tp, axis=0)
            blocks = split_rows(x, axis, self.tp, self.input_runs.get(i, 1))
            return blocks if self.dp == 1 else jnp.tile(blocks, (self.dp,) + (1,) * (blocks.ndim - 1))
        except ValueError as e:
            raise BackendError(str(e)) from None

    def unstack(self, x: Any, k: int) -> Any:
        """Output k put together from the mirrors' arrays: the replicas' rows (of rank 0), the
        ranks' blocks (of replica 0), or (split both ways) each rank's block from its replicas' parts. A parameter split in contiguous blocks stays where it is: the
        global array is made of the blocks each device holds, sharded over the mesh's tensor axis
        (so the next step reads it without moving a byte: `stack_placed`)."""
        axis = self.output_axes[k]
        if self.output_kind[k] == "both":
            by_rank = jnp.reshape(x, (self.dp, self.tp, *x.shape[1:]))
            blocks = jnp.stack([join_rows(by_rank[:, j], self.output_inner[k]) for j in range(self.tp)])
            return join_rows(blocks, axis, self.output_runs.get(k, 1))
        if self.output_kind[k] == "replica":
            return join_rows(x if self.tp == 1 else x[::self.tp], axis)
        runs = self.output_runs.get(k, 1)
        if runs == 1 and isinstance(getattr(x, "sharding", None), NamedSharding):
            local = x.shape[1:]
            whole = (*local[:axis], local[axis] * self.tp, *local[axis + 1:])
            held = NamedSharding(x.sharding.mesh, _split_spec(len(local), axis))
            return jax.make_array_from_single_device_arrays(
                whole, held, [s.data.reshape(local) for s in x.addressable_shards])
        return join_rows(x if self.dp == 1 else x[:self.tp], axis, runs)

    def stack_placed(self, x: Any, i: int, stacked: Sharding) -> Any | None:
        """Input i as the mirrors' stacked arrays without a copy where it is a parameter this
        executable returned (`unstack`): held in contiguous blocks over the tensor axis of the mesh
        of `stacked`; else None."""
        if self.input_kind.get(i) != "tensor" or self.input_runs.get(i, 1) != 1 or not isinstance(stacked, NamedSharding):
            return None
        axis = self.input_axes[i]
        if getattr(x, "sharding", None) != NamedSharding(stacked.mesh, _split_spec(x.ndim, axis)):
            return None
        local = (*x.shape[:axis], x.shape[axis] // self.tp, *x.shape[axis + 1:])
        return jax.make_array_from_single_device_arrays(
            (self.d, *local), stacked, [s.data.reshape((1, *local)) for s in x.addressable_shards])


def _split_spec(rank: int, axis: int) -> PartitionSpec:
    """A parameter split in contiguous blocks along `axis` over the tensor axis, whole over replicas."""
    return PartitionSpec(*(TENSOR_AXIS if a == axis else None for a in range(rank)))


def _varying(graph: Graph, inputs: tuple[str, ...]) -> set[int]:
    """Values that differ per mirror: per replica or per tensor-parallel rank. A value differs per
    replica where it is one of the inputs the graph attributes `inputs` name for replicas (the batch
    inputs, the blocks of sharded optimizer state), a replica's block of a value (`reduce_scatter`,
    `replica_slice`), or computed from such a value without an all-reduce or all-gather across the
    replicas in between; per rank the same way, by `tensor_inputs` and the collectives `across`
    the ranks. A collective across one axis keeps what differs along the other (the replicas'
    all-gather of a rank's block of state is still the rank's)."""
    names: dict[str, set[str]] = {"replica": set(), "tensor": set()}
    for attr in inputs:
        axes = graph.attrs.get(attr)
        if axes is not None and isinstance(axes.value, dict):
            names["tensor" if attr == "tensor_inputs" else "replica"] |= set(axes.value)
    differs = {kind: {id(v) for v in graph.inputs if v.name in n} for kind, n in names.items()}
    for op in graph.ops:
        along = "tensor" if op.get("across") == "tensor" else "replica"
        for kind, out in differs.items():
            if op.opcode not in ACROSS_REPLICAS:
                if any(id(v) in out for v in op.operands):
                    out.update(id(r) for r in op.results)
                continue
            # a collective (a bucket of several too) maps operand k to result k
            for v, r in zip(op.operands, op.results):
                if (op.opcode in ("reduce_scatter", "replica_slice", "block_indices") if kind == along
                        else id(v) in out):
                    out.add(id(r))
    return differs["replica"] | differs["tensor"]


def _axes(graph: Graph, attr: str, index: Mapping[str, int]) -> dict[int, int]:
    """A graph attribute mapping names to batch axes, as position -> axis."""
    raw = graph.attrs.get(attr)
    if raw is None or not isinstance(raw.value, dict):
        return {}
    return {index[k]: int(a) for k, a in raw.value.items() if k in index}
