"""What `parallelize` is asked for: its options, checked when the function is wrapped (before any
tracing), and the JAX devices they name with the cluster that models them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster.devices import Link
from pesto_ir.cluster.model import Cluster
from pesto_ir.parallel.autotune import check_steps
from pesto_ir.passes.annotate_costs import MODELS
from pesto_ir.passes.placement.options import time_limit_problem
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passes.rewrite.rebatch import MAX_MICROBATCHES  # the place pass's own bound on both
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import ArgumentError, brief, seed_problem

DEFAULT_ALGO = "m-etf"
DEFAULT_COST_MODEL = "roofline"
DEFAULT_TIME_LIMIT = 10.0
# `autotune`'s default: measure wherever that can be done (one process), so that what runs by default
# is never slower than plain jax.jit on the machine at hand; devices of several processes are planned
# and run without it (the candidates are timed on one process's devices)
AUTO_TUNE = "auto"


@dataclass(frozen=True)
class ParallelizeOptions:
    devices: Sequence[Any] | Mapping[str, Any] | None = None  # None: every JAX device
    algo: str = DEFAULT_ALGO
    time_limit: float = DEFAULT_TIME_LIMIT
    cluster: Cluster | None = None
    cost_model: str = DEFAULT_COST_MODEL
    param_argnums: tuple[int, ...] = ()
    donate_argnums: tuple[int, ...] = ()
    coarsen_target: int | None = None  # None: the coarsen pass's default
    seed: int = 0
    quiet: bool = True
    compiler_options: Mapping[str, Any] | None = None  # XLA options for every segment
    # Batch and data parallelism: `batch_argnums` goes to the lowering (the graph attribute
    # `batch_inputs`), `data_parallel` and `microbatches` to the place pass (the numbers the search
    # finds best for "auto").
    data_parallel: int | str | None = None  # replicas: a whole number >= 1, "auto", or None (1)
    microbatches: int | str | None = None  # micro-batches per step: a whole number >= 1, "auto", or None (1)
    batch_argnums: tuple[int, ...] | None = None  # None: every positional argument not in param_argnums
    optimizer_state: str = "auto"  # replicated, sharded across the replicas (ZeRO-1), or auto (see place)
    # tensor-parallel ranks: a whole number >= 1, "auto", or None (1); the place pass's tensor-parallel
    tensor_parallel: int | str | None = None
    parameters: str = "auto"  # replicated, sharded across the replicas with the state (FSDP), or auto (see place)
    # time the plan, plain jax.jit and data parallelism on the first call and run the fastest: True,
    # False (the plan as asked), or "auto" (default): wherever it can, i.e. on one process's devices
    autotune: bool | str = AUTO_TUNE
    autotune_steps: int = 5  # timed steps per candidate (after a warm-up step)

    def tunes(self, across_processes: bool) -> bool:
        """Whether the first call with a signature times the candidates: always with True, never with
        False, and with "auto" unless the devices belong to several processes (refused with True:
        the candidates are timed on one process's devices, and the others could not follow)."""
        if self.autotune is True and across_processes:
            raise ArgumentError("autotune=True times its candidates on one process's devices; devices of several "
                                "processes are planned and run without it (leave autotune at \"auto\", or False)")
        return self.autotune is True or (self.autotune == AUTO_TUNE and not across_processes)

    def pipeline(self) -> str:
        coarsen = "coarsen" if self.coarsen_target is None else f"coarsen{{target={self.coarsen_target}}}"
        batch = "" if self.microbatches in (None, 1) and self.data_parallel in (None, 1) else \
            f" microbatches={self.microbatches or 1} data-parallel={self.data_parallel or 1}"
        if self.optimizer_state != "auto":
            batch += f" optimizer-state={self.optimizer_state}"
        if self.tensor_parallel not in (None, 1):
            batch += f" tensor-parallel={self.tensor_parallel}"
        if self.parameters != "auto":
            batch += f" parameters={self.parameters}"
        return (f"annotate-costs{{model={self.cost_model}}},{coarsen},"
                f"place{{algo={self.algo} time-limit={self.time_limit} seed={self.seed}{batch}}},expand,simulate")


def check_callable(fn: Any) -> None:
    if not callable(fn):
        raise ArgumentError(f"parallelize needs a function to plan (e.g. a training step), got {fn!r:.80}")


def as_argnums(x: Any) -> Any:
    """Argument positions as a tuple; what is not positions is kept as given for `check_options`
    to refuse by name."""
    if isinstance(x, int) and not isinstance(x, bool):
        return (x,)
    return tuple(x) if isinstance(x, Sequence) and not isinstance(x, (str, bytes)) else x


def as_argnums_or_none(x: Any) -> Any:
    """`batch_argnums` as a tuple; None stays None, and anything that is not positions is kept as
    given for `check_options` to refuse by name."""
    return None if x is None else as_argnums(x)


def check_options(o: ParallelizeOptions) -> None:
    if not isinstance(o.algo, str) or o.algo not in ALGORITHMS:
        raise PestoError(f"unknown placement algorithm {o.algo!r} (known: {', '.join(sorted(ALGORITHMS))})")
    if not isinstance(o.cost_model, str) or o.cost_model not in MODELS:
        raise PestoError(f"unknown cost model {o.cost_model!r} (known: {', '.join(MODELS)})")
    target = o.coarsen_target
    if target is not None and (isinstance(target, bool) or not isinstance(target, int) or target < 1):
        raise PestoError(f"coarsen_target must be a whole number of groups >= 1 (or None), got {target!r}")
    if not isinstance(o.quiet, bool):
        raise PestoError(f"quiet must be True or False, got {o.quiet!r}")
    if (why := time_limit_problem(o.time_limit)) is not None:
        raise PestoError(f"time_limit {why}")
    if (why := seed_problem(o.seed)) is not None:
        raise PestoError(f"seed {why}")
    for name, nums in (("param_argnums", o.param_argnums), ("donate_argnums", o.donate_argnums)):
        if not isinstance(nums, tuple) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in nums):
            raise PestoError(f"{name} must be argument positions (whole numbers from 0), got {nums!r}")
    _check_batch_options(o)
    if o.cluster is not None and not isinstance(o.cluster, Cluster):
        raise ArgumentError(f"cluster must be a pesto_ir Cluster (e.g. Cluster.load('cluster.json') or "
                         f"Cluster.from_jax_devices()), got {o.cluster!r:.80}")
    if o.compiler_options is not None and (not isinstance(o.compiler_options, Mapping)
                                           or not all(isinstance(k, str) for k in o.compiler_options)):
        raise ArgumentError(f"compiler_options must be a dict from XLA option names to values, got "
                         f"{o.compiler_options!r:.80}")
    devices = o.devices
    if isinstance(devices, Mapping) and not all(isinstance(k, str) for k in devices):
        raise ArgumentError(f"a devices dict must be keyed by cluster device names (strings), got keys "
                         f"{list(devices)!r:.80}")
    if devices is not None and (isinstance(devices, (str, bytes)) or not isinstance(devices, (Sequence, Mapping))):
        raise PestoError(f"devices must be a list of JAX devices (e.g. jax.devices()[:4]) or a dict from names to "
                         f"JAX devices, got {devices!r}")
    values = list(devices.values()) if isinstance(devices, Mapping) else list(devices or ())
    wrong = [d for d in values if not hasattr(d, "platform") or not hasattr(d, "id")]
    if wrong:
        raise PestoError(f"devices must be JAX devices (e.g. jax.devices()[:4]), got {wrong[0]!r}")


def _check_batch_options(o: ParallelizeOptions) -> None:
    """`data_parallel`, `microbatches`, `batch_argnums`, `autotune`: well-formed, then supported."""
    for name, value in (("data_parallel", o.data_parallel), ("microbatches", o.microbatches),
                        ("tensor_parallel", o.tensor_parallel)):
        if value is None or isinstance(value, str) and value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MICROBATCHES:
            raise PestoError(f"{name} must be a whole number from 1 to {MAX_MICROBATCHES} or \"auto\", "
                             f"got {brief(repr(value))}")
    nums = o.batch_argnums
    if nums is not None:
        if not isinstance(nums, tuple) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in nums):
            raise PestoError(f"batch_argnums must be argument positions (whole numbers from 0), got {nums!r}")
        both = sorted(set(nums) & set(o.param_argnums))
        if both:
            raise PestoError(f"argument(s) {both} are in both batch_argnums and param_argnums: an argument is "
                             f"either trainable state or batch data, not both")
    if not isinstance(o.autotune, bool) and not (isinstance(o.autotune, str) and o.autotune == AUTO_TUNE):
        raise PestoError(f"autotune must be True, False or \"auto\" (time the candidates where the devices are "
                         f"one process's), got {brief(repr(o.autotune))}")
    for name, value in (("optimizer_state", o.optimizer_state), ("parameters", o.parameters)):
        if value not in ("auto", "replicated", "sharded"):
            raise PestoError(f"{name} must be \"auto\", \"replicated\" or \"sharded\", got {value!r}")
    check_steps(o.autotune_steps)


def devices_and_cluster(o: ParallelizeOptions) -> tuple[Sequence[Any] | Mapping[str, Any], Cluster]:
    """The JAX devices and the cluster that models them, with one cluster device per JAX device."""
    import jax

    devices = o.devices if o.devices is not None else jax.devices()
    jax_devices = list(devices.values()) if isinstance(devices, Mapping) else list(devices)
    if not jax_devices:
        raise PestoError("parallelize needs at least one device")
    cluster = o.cluster
    if cluster is None:
        cluster = Cluster.from_jax_devices(jax_devices)
        if isinstance(devices, Mapping):
            cluster = renamed_cluster(cluster, list(devices))
    if len(cluster) != len(jax_devices):
        raise PestoError(f"the cluster has {len(cluster)} device(s) ({', '.join(cluster.names)}) but "
                         f"{len(jax_devices)} JAX device(s) were given")
    if isinstance(devices, Mapping) and list(devices) != cluster.names:
        raise PestoError(f"the devices dict is keyed {', '.join(devices)} but the cluster's devices are "
                         f"{', '.join(cluster.names)}")
    return devices, cluster


def first_device(devices: Sequence[Any] | Mapping[str, Any]) -> Any:
    """The first JAX device of a list or of a dict keyed by cluster device name."""
    return next(iter(devices.values())) if isinstance(devices, Mapping) else devices[0]


def renamed_cluster(cluster: Cluster, names: list[str]) -> Cluster:
    """The same devices and links under new names, in order."""
    new = dict(zip(cluster.names, names))
    devices = [dataclasses.replace(d, name=new[d.name]) for d in cluster.devices]
    links = {(new[a], new[b]): Link(new[a], new[b], lk.latency, lk.bandwidth) for (a, b), lk in cluster.links.items()}
    return dataclasses.replace(cluster, devices=devices, links=links)
