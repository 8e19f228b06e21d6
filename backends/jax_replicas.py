"""Data-parallel replicas in the JAX backend (`backends/jax.py`): what differs per replica, from the
graph alone (`ReplicaLayout`, which the Python emitter lays modules out by too), and where each
value's arrays live on the replicas' meshes (`Replicas`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jax.sharding import Sharding

from pesto_ir.backends.replica_runtime import join_rows, over_replicas, replica_mesh, replica_sharding, split_rows
from pesto_ir.backends.schedule import Segment
from pesto_ir.ir.graph import Graph, Value
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

    def __init__(self, graph: Graph, replicas: int, tensor: bool = False) -> None:
        self.d = replicas
        self.tensor = tensor
        # the mirrors are one tensor-parallel group's ranks (`passes/rewrite/tensor_shard.py`): what
        # differs per rank is the split parameters' blocks, and the batch is every rank's whole
        inputs, outputs = (("tensor_inputs",), ("tensor_outputs",)) if tensor else (
            ("batch_inputs", "sharded_inputs"), ("batch_outputs", "sharded_outputs"))
        self.varying = _varying(graph, inputs)
        by_name = {v.name: i for i, v in enumerate(graph.inputs)}
        by_index = {str(k): k for k in range(len(graph.outputs))}
        self.input_axes = {i: a for attr in inputs for i, a in _axes(graph, attr, by_name).items()}
        self.output_axes = {k: a for attr in outputs for k, a in _axes(graph, attr, by_index).items()}
        # split in several runs of blocks (a fused projection's parts, each split alike)
        self.input_runs = _axes(graph, "tensor_input_runs", by_name) if tensor else {}
        self.output_runs = _axes(graph, "tensor_output_runs", by_index) if tensor else {}
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
        if par.data_parallel > 1 and par.tensor_parallel > 1:
            raise BackendError(f"this backend runs data-parallel replicas or tensor-parallel ranks, not both "
                               f"(the plan has {par.data_parallel} x {par.tensor_parallel})")
        super().__init__(graph, par.mirrors, par.tensor_parallel > 1)
        self.replicated: dict[str, Sharding] = {}
        self.stacked: dict[str, Sharding] = {}
        for name in par.replicas[0]:
            mesh = replica_mesh([devices[n] for n in par.group(name)])
            self.replicated[name] = replica_sharding(mesh, False)
            self.stacked[name] = replica_sharding(mesh, True)

    def sharding(self, v: Value, device: str) -> Sharding:
        return (self.stacked if id(v) in self.varying else self.replicated)[device]

    def per_replica(self, fn: Callable[..., list[Any]], seg: Segment) -> Callable[..., list[Any]]:
        """`fn` (one replica's segment) over the replicas of `seg`'s device (`over_replicas`)."""
        mesh = self.replicated[seg.device].mesh  # type: ignore[attr-defined]
        return over_replicas(fn, mesh, self.stacked_flags(seg.inputs), self.stacked_flags(seg.outputs))

    def stack(self, x: Any, axis: int, runs: int = 1) -> Any:
        """A global batch input as d replicas' rows (replica r: the r-th block of rows along `axis`,
        of each of `runs` runs)."""
        try:
            return split_rows(x, axis, self.d, runs)
        except ValueError as e:
            raise BackendError(str(e)) from None

    @staticmethod
    def unstack(x: Any, axis: int, runs: int = 1) -> Any:
        """The replicas' rows of a stacked output, put together along `axis`."""
        return join_rows(x, axis, runs)


def _varying(graph: Graph, inputs: tuple[str, ...]) -> set[int]:
    """Values that differ per replica: the inputs the graph attributes `inputs` name (the batch
    inputs and the blocks of sharded optimizer state, or a rank's parameter blocks), a replica's
    block of a value (`reduce_scatter`, `replica_slice`), and what is computed from them without an
    all-reduce or all-gather in between."""
    names: set[str] = set()
    for attr in inputs:
        axes = graph.attrs.get(attr)
        names |= set(axes.value) if axes is not None and isinstance(axes.value, dict) else set()
    out = {id(v) for v in graph.inputs if v.name in names}
    for op in graph.ops:
        if op.opcode in ("reduce_scatter", "replica_slice") or (
                op.opcode not in ("all_reduce", "all_gather") and any(id(v) in out for v in op.operands)):
            out.update(id(r) for r in op.results)
    return out


def _axes(graph: Graph, attr: str, index: Mapping[str, int]) -> dict[int, int]:
    """A graph attribute mapping names to batch axes, as position -> axis."""
    raw = graph.attrs.get(attr)
    if raw is None or not isinstance(raw.value, dict):
        return {}
    return {index[k]: int(a) for k, a in raw.value.items() if k in index}
