"""Analysis annotations: the op attributes that tools, importers and passes write about an op, as
opposed to a primitive's parameters (`dimension_numbers`, `axes`, `shape`, ...).

Both share an op's attribute dict (and the `.pir` syntax); this is the one list that tells them
apart. Every key here is an annotation, never passed to JAX: `primitive_params` is what the
interpreter binds, the profiler keys its measurements by and the Python emitter writes.
"""

from __future__ import annotations

from pesto_ir.ir.attributes import Attr
from pesto_ir.ir.graph import Op

# Each annotation key, with why an op has it.
ANNOTATIONS: dict[str, str] = {
    # costs
    "cost": "the op's time on a device (annotate-costs, hand-written files, JSON import)",
    "flops": "the op's floating-point operations (annotate-costs)",
    "bytes_accessed": "bytes the op moves to and from device memory (annotate-costs)",
    "fusion": "the kernel XLA would fuse the op into (annotate-costs{fusion=xla})",
    "trip_count": "trip count of a `while` body, for costs (a user or a frontend)",
    "bytes": "reserved for a byte count; nothing writes it at present",
    "body_cost": "reserved for the cost of a nested body; nothing writes it at present",
    # memory
    "memory": "resident bytes, held on the op's device for the whole step",
    "activation": "bytes of the op's output, used in place of its result types' sizes",
    "workspace": "scratch bytes held while the op runs (the coarse graph)",
    # placement and the plan
    "colocate": "a group name: all ops with the same name run on one device",
    "group": "the coarse node the op belongs to (coarsen)",
    "device": "where the op runs (place, expand, simulate)",
    "start": "when the op starts within the step (place, expand, simulate)",
    "end": "when the op ends within the step (place, expand, simulate)",
    "tie": "the order among ops of its device with the same start and end (simulate, expand: Plan.ties)",
    "stage": "reserved for a pipeline stage; nothing writes it at present",
    "priority": "reserved for a scheduling priority; nothing writes it at present",
    # micro-batches and data-parallel replicas
    "microbatch": "the micro-batch an op's copy computes (the micro-batch rewrite)",
    "per_sample": "false when the op's cost does not scale with the batch, e.g. an optimizer update",
    "param_bytes": "gradient bytes all-reduced across data-parallel replicas after the op",
    "backward": "the op belongs to the backward pass (a JSON node's `backward`; pipeline schedules)",
    # where the op comes from
    "scope": "the JAX name stack, joined with `/` (the JAX frontend)",
    "label": "display name of a pesto-graph/1 node whose name differs from its id",
}


def primitive_params(op: Op) -> dict[str, Attr]:
    """The attributes of `op` that are its primitive's parameters: all but the annotations."""
    return {k: a for k, a in op.attrs.items() if k not in ANNOTATIONS}
