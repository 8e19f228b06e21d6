"""`pesto_ir.parallelize(fn, devices=...)`: a jit-like wrapper that runs `fn` split across devices.

The first call with a given input signature (pytree structure, shapes, dtypes) lowers `fn` with
the JAX frontend, runs `annotate-costs, coarsen, place, expand, simulate` on a cluster made of
the devices, and builds the multi-device executable (`pesto_ir.backends.jax`); later calls with
the same signature reuse it. The result has the same pytree structure as `fn`'s.

Defaults, and why:

* `cost_model="roofline"`: FLOPs and bytes from shapes, so planning is instant and the same plan
  comes out every time; `"profile"` times every op on the real devices (slower, cached on disk).
* `algo="m-etf"`: Baechi's earliest-task-first heuristic plans a few hundred ops in about a
  tenth of a second, deterministically, and is the best of the fast heuristics on training
  graphs; the exact solvers (`ilp`, `cpsat`, `auto`) spend up to `time_limit` seconds, which a
  jit-like first call should not do unless asked.
* Training state: for each argument in `param_argnums` (parameters, optimizer state), the first
  element of `fn`'s returned tuple with the same structure and types is its next value. Those
  outputs come back on the devices their inputs live on, so feeding them to the next call moves
  no weights.
* Batch: `batch_argnums` names the positional arguments whose arrays carry the batch along axis 0
  (default: every argument not in `param_argnums`); the lowered graph records them in its
  `batch_inputs` attribute. `data_parallel` (d replicas, each on batch/d, gradients all-reduced)
  and `microbatches` (each replica's batch run as that many slices, gradients accumulated; a whole
  number >= 1 or `"auto"` for the search to choose) go to the place pass, with `optimizer_state`
  (`"sharded"`: each replica holds and updates 1/d of the optimizer state, ZeRO-1; `"auto"`: where
  the whole state does not fit, and for one-device replicas where that is faster); the executable runs the
  replicas as `jax.shard_map` over the meshes of mirrored devices (`backends/jax.py`, `Replicas`).
  `autotune=True` builds the plan asked for, plain `jax.jit` on the first device and data
  parallelism over all the devices, times each for `autotune_steps` steps on the first call's
  arguments, and runs the fastest (`pesto_ir/parallel/autotune.py`; `.report()` shows each candidate's
  simulated and measured step). When plain jax.jit wins, calls go straight to `jax.jit(fn)`
  (`_fast_path`); `.calibrated_cluster()` is the cluster corrected by the measured speed.

`.plan`, `.graph` and `.executable` describe the most recent signature called.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from pesto_ir.cluster.host import differences, elsewhere_note, machine_of
from pesto_ir.cluster.model import Cluster, Device, Link
from pesto_ir.distributed import is_multiprocess, shared_text
from pesto_ir.ir.graph import Graph
from pesto_ir.jaxrt.measure_collectives import measured_cluster
from pesto_ir.passes.placement.options import time_limit_problem
from pesto_ir.schedule.plan import Plan, read_plan_attrs
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import brief, seed_problem
from pesto_ir.util.units import human_time

DEFAULT_ALGO = "m-etf"
DEFAULT_COST_MODEL = "roofline"
DEFAULT_TIME_LIMIT = 10.0


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
    autotune: bool = False  # time the plan, plain jax.jit and data parallelism; run the fastest
    autotune_steps: int = 5  # timed steps per candidate (after a warm-up step)

    def pipeline(self) -> str:
        coarsen = "coarsen" if self.coarsen_target is None else f"coarsen{{target={self.coarsen_target}}}"
        batch = "" if self.microbatches in (None, 1) and self.data_parallel in (None, 1) else \
            f" microbatches={self.microbatches or 1} data-parallel={self.data_parallel or 1}"
        if self.optimizer_state != "auto":
            batch += f" optimizer-state={self.optimizer_state}"
        return (f"annotate-costs{{model={self.cost_model}}},{coarsen},"
                f"place{{algo={self.algo} time-limit={self.time_limit} seed={self.seed}{batch}}},expand,simulate")


@dataclass
class Compiled:
    """What one input signature compiled to: the plan that runs, and (autotune) every candidate."""

    lowered: Any  # frontends.jax.LoweredFunction
    graph: Graph  # the placed graph
    plan: Plan
    executable: Any  # backends.jax.Executable, or the jitted function when plain jax.jit won
    pipeline: str
    seconds: dict[str, float] = field(default_factory=dict)  # lower, passes, build (and autotune)
    candidates: list[Any] = field(default_factory=list)  # autotune.Candidate, when autotuned
    chosen: str = "plan"
    # measured / roofline speed of the devices (autotune.speed_factor), or why there is none
    speed_factor: float | None = None
    speed_note: str = ""
    dispatch: float | None = None  # seconds: the host's floor for one executable call (autotune.dispatch_floor)


class Parallelized:
    """`fn` planned and run across devices; call it like `fn`."""

    def __init__(self, fn: Callable[..., Any], options: ParallelizeOptions) -> None:
        import jax

        _check_callable(fn)
        _check_options(options)
        self.fn = fn
        self.options = options
        self._flatten = jax.tree_util.tree_flatten
        self._unflatten = jax.tree_util.tree_unflatten
        self._cache: dict[Any, Compiled] = {}
        self._last: Compiled | None = None
        self._fast: Callable[..., Any] | None = None  # see _fast_path
        self.__name__ = getattr(fn, "__name__", "parallelized")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fast = self._fast
        if fast is not None and not kwargs:
            try:
                return fast(*args)
            except _NewSignature:
                self._fast = None  # a second signature: every call takes the general path from now on
        leaves, tree = self._flatten((args, kwargs))
        entry = self._entry(leaves, tree, args, kwargs)
        return self._unflatten(entry.lowered.out_tree, entry.executable(*leaves))

    def compile(self, *args: Any, **kwargs: Any) -> Compiled:
        """Plan and build for these arguments without running (cached like a call)."""
        leaves, tree = self._flatten((args, kwargs))
        return self._entry(leaves, tree, args, kwargs)

    def _entry(self, leaves: list[Any], tree: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Compiled:
        """The plan and executable for this input signature, made on its first call."""
        key = (tree, _signatures(leaves))
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = self._compile(args, kwargs)
            self._fast = self._fast_path(entry, key, leaves, kwargs)
        self._last = entry
        return entry

    def _fast_path(self, entry: Compiled, key: Any, leaves: list[Any], kwargs: dict[str, Any]) -> Any:
        """When autotuning chose plain jax.jit for the only signature seen: `jax.jit(fn)` itself,
        called on the caller's arguments, so JAX's C++ dispatch does the flattening and the signature
        check that `__call__` otherwise does in Python (40 us a call, measured on a 154-op MLP whose
        step takes 90 us). A new signature makes it trace, and the trace raises `_NewSignature`
        instead of compiling, so that signature is planned and autotuned like any other."""
        if entry.chosen != "jit" or len(self._cache) != 1 or kwargs \
                or not all(hasattr(x, "weak_type") for x in leaves):
            return None
        devices, _ = _devices_and_cluster(self.options)
        device = next(iter(devices.values() if isinstance(devices, Mapping) else devices))
        return _guarded_jit(self.fn, key, device, self.options.donate_argnums)

    # ---------------------------------------------------------------- the most recent signature
    @property
    def last(self) -> Compiled:
        if self._last is None:
            raise PestoError(f"{self.__name__} has not been called yet: there is no plan until the first call")
        return self._last

    @property
    def plan(self) -> Plan:
        return self.last.plan

    @property
    def graph(self) -> Graph:
        return self.last.graph

    @property
    def executable(self) -> Any:
        return self.last.executable

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def report(self) -> str:
        """The most recent signature's autotune table: each candidate's simulated and measured step."""
        from pesto_ir.parallel.autotune import report

        last = self.last
        if not last.candidates:
            return f"{self.__name__}: not autotuned (autotune=False): runs the {last.plan.algorithm} plan"
        table = report(last.candidates, next((c for c in last.candidates if c.name == last.chosen), None))
        devices, cluster = _devices_and_cluster(self.options)
        elsewhere = elsewhere_note(cluster.calibrated_on, machine_of(_first(devices)), "the cluster's calibrated figures")
        table += f"\n\n{elsewhere}" if elsewhere else ""
        if last.speed_factor is None:
            return f"{table}\n\nno speed calibration: {last.speed_note}"
        return (f"{table}\n\nspeed factor {last.speed_factor:.3g}: the one-device step, less the host's "
                f"{human_time(last.dispatch or 0.0, 3)} to dispatch one executable, took {last.speed_factor:.3g}x the "
                "roofline model's time; calibrated_cluster() plans with devices that much slower")

    def calibrated_cluster(self, measure_links: bool = True) -> Cluster:
        """The cluster of these devices corrected by what autotuning measured: peak FLOP/s and memory
        bandwidth divided by the speed factor (`pesto_ir.parallel.autotune`), and, unless a cluster was given
        or `measure_links=False`, links fitted to timed copies between the devices. Pass it as
        `parallelize(..., cluster=...)` to plan with what these devices really do. It says it
        describes this machine (`calibrated_on`), unless the cluster given was measured on another."""
        from pesto_ir.parallel.autotune import with_speed

        last = self.last
        if last.speed_factor is None:
            raise PestoError(f"{self.__name__}: no measured speed to calibrate with: "
                             + (last.speed_note or "call it with autotune=True first"))
        devices, cluster = _devices_and_cluster(self.options)
        if measure_links and self.options.cluster is None:
            cluster = measured_cluster(list(devices.values()) if isinstance(devices, Mapping) else devices,
                                       kind=cluster.devices[0].kind)
            if isinstance(devices, Mapping):
                cluster = _renamed(cluster, list(devices))
        # the speed factor was measured here; a given cluster measured elsewhere keeps saying so
        here = machine_of(_first(devices))
        mixed = cluster.calibrated_on is not None and bool(differences(cluster.calibrated_on, here))
        return dataclasses.replace(with_speed(cluster, last.speed_factor),
                                   calibrated_on=cluster.calibrated_on if mixed else here)

    # ---------------------------------------------------------------- compiling
    def _compile(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Compiled:
        from pesto_ir.frontends.jax import lower_function

        o = self.options
        t0 = time.perf_counter()
        if o.autotune:
            from pesto_ir.util.loader import ArgumentError

            devices, _ = _devices_and_cluster(o)
            if is_multiprocess(devices.values() if isinstance(devices, Mapping) else devices):
                raise ArgumentError("autotune times its candidates on one process's devices; devices of several "
                                    "processes are planned and run without it (autotune=False)")
        lowered = lower_function(self.fn, *args, param_argnums=o.param_argnums, batch_argnums=o.batch_argnums,
                                 **kwargs)
        pristine = lowered.graph.clone() if o.autotune else None
        lowered_seconds = time.perf_counter() - t0
        donate = _flat_indices(args, o.donate_argnums)
        entry = self._planned(lowered, lowered.graph, args, o, () if o.autotune else donate)
        entry.seconds["lower"] = lowered_seconds
        if not o.autotune:
            return entry
        assert pristine is not None
        return self._autotuned(entry, pristine, args, kwargs, donate)

    def _planned(self, lowered: Any, graph: Graph, args: tuple[Any, ...], o: ParallelizeOptions,
                 donate: Sequence[int]) -> Compiled:
        """`graph` (a lowered step) planned with `o`'s pipeline and built on `o`'s devices."""
        from pesto_ir.passmanager import PassContext, PassManager

        devices, cluster = _devices_and_cluster(o)
        t1 = time.perf_counter()
        pipeline = o.pipeline()

        def make_plan() -> Graph:
            return PassManager(pipeline).run(graph, PassContext(cluster=cluster, quiet=o.quiet, seed=o.seed))

        if is_multiprocess(devices.values() if isinstance(devices, Mapping) else devices):
            from pesto_ir.frontends.text import parse

            # process 0 plans, every process runs its plan: time-limited solvers differ run to run
            graph = parse(shared_text("plan", make_plan), filename="<plan from process 0>")
        else:
            graph = make_plan()
        t2 = time.perf_counter()
        plan = read_plan_attrs(graph)
        assert plan is not None  # the pipeline ends with place, expand and simulate
        executable = self._built(lowered, graph, args, o, donate)
        return Compiled(lowered, graph, plan, executable, pipeline,
                        {"passes": t2 - t1, "build": time.perf_counter() - t2})

    @staticmethod
    def _built(lowered: Any, graph: Graph, args: tuple[Any, ...], o: ParallelizeOptions,
               donate: Sequence[int]) -> Any:
        """The executable of a placed graph on `o`'s devices."""
        from pesto_ir.backends.jax import build

        devices, cluster = _devices_and_cluster(o)
        names = dict(zip(cluster.names, devices.values() if isinstance(devices, Mapping) else devices))
        return build(graph, names, constants=lowered.consts,
                     state_map=state_map(graph, lowered.out_tree, args, o.param_argnums),
                     donate=donate, compiler_options=o.compiler_options)

    def _autotuned(self, entry: Compiled, pristine: Graph, args: tuple[Any, ...], kwargs: dict[str, Any],
                   donate: list[int]) -> Compiled:
        """`entry` (the plan asked for) timed against plain jax.jit on the first device and data
        parallelism over all the devices; the fastest, with every candidate in `candidates`."""
        import dataclasses

        from pesto_ir.parallel.autotune import Candidate, choose, dispatch_floor

        o = self.options
        t0 = time.perf_counter()
        leaves, treedef = self._flatten((args, kwargs))
        devices, _ = _devices_and_cluster(o)
        device_list = list(devices.values()) if isinstance(devices, Mapping) else list(devices)
        built: dict[str, Compiled] = {"plan": entry}
        variants: dict[str, ParallelizeOptions] = {"plan": o}
        candidates = [Candidate("plan", f"{entry.plan.algorithm} on {len(device_list)} device(s)"
                                + _strategy(entry.plan), entry.executable, entry.plan.makespan)]
        one = dataclasses.replace(o, devices=device_list[:1], cluster=None, algo="single", data_parallel=None,
                                  microbatches=None, autotune=False, optimizer_state="auto")
        try:
            built["jit"] = self._planned(entry.lowered, pristine.clone(), args, one, ())
            candidates.append(Candidate("jit", f"jax.jit on {device_list[0]}",
                                        _jitted(self.fn, treedef, len(leaves), device_list[0], ()),
                                        built["jit"].plan.makespan))
        except PestoError as e:
            candidates.append(Candidate("jit", "jax.jit on one device", None, why=str(e).splitlines()[0]))
        if len(device_list) > 1:
            dp = dataclasses.replace(o, algo="single", data_parallel=len(device_list), microbatches=1, autotune=False)
            try:
                built["data-parallel"] = self._planned(entry.lowered, pristine.clone(), args, dp, ())
                variants["data-parallel"] = dp
                plan = built["data-parallel"].plan
                candidates.append(Candidate("data-parallel", f"{len(device_list)} replicas, shard_map over all "
                                            "devices", built["data-parallel"].executable, plan.makespan))
            except PestoError as e:
                why = getattr(e, "cause", e)
                candidates.append(Candidate("data-parallel", f"{len(device_list)} replicas", None,
                                            why=str(why).splitlines()[0]))
        chosen = choose(candidates, leaves, o.autotune_steps)
        winner = built[chosen.name]
        if chosen.name == "jit":
            winner.executable = _jitted(self.fn, treedef, len(leaves), device_list[0], donate)
        elif donate:  # timed without donating the caller's arrays; the one that runs donates
            winner.executable = self._built(entry.lowered, winner.graph, args, variants[chosen.name], donate)
        winner.candidates, winner.chosen = candidates, chosen.name
        winner.dispatch = dispatch_floor(device_list[0])
        winner.speed_factor, winner.speed_note = _speed(built.get("jit"), candidates,
                                                        _devices_and_cluster(one)[1].devices[0], winner.dispatch)
        winner.seconds.update(lower=entry.seconds.get("lower", 0.0), autotune=time.perf_counter() - t0)
        if not o.quiet:
            print(f"parallelize {self.__name__}: autotune chose {chosen.name} ("
                  + ", ".join(f"{c.name} {c.measured * 1e3:.3g} ms measured / "
                              f"{(c.predicted or 0) * 1e3:.3g} ms simulated" for c in candidates
                              if c.measured is not None) + ")", file=sys.stderr)
        return winner


def parallelize(fn: Callable[..., Any] | None = None, *, devices: Sequence[Any] | Mapping[str, Any] | None = None,
                algo: str = DEFAULT_ALGO, time_limit: float = DEFAULT_TIME_LIMIT, cluster: Cluster | None = None,
                cost_model: str = DEFAULT_COST_MODEL, param_argnums: int | Sequence[int] = (),
                donate_argnums: int | Sequence[int] = (), coarsen_target: int | None = None, seed: int = 0,
                quiet: bool = True, compiler_options: Mapping[str, Any] | None = None,
                data_parallel: int | str | None = None, microbatches: int | str | None = None,
                batch_argnums: int | Sequence[int] | None = None, autotune: bool = False,
                autotune_steps: int = 5, optimizer_state: str = "auto") -> Any:
    """`fn` planned with Pesto and run across `devices` (a list, or a dict from cluster device name to
    JAX device); used bare or as `@parallelize(devices=...)`. See the module docstring."""
    options = ParallelizeOptions(devices, algo, time_limit, cluster, cost_model, _argnums(param_argnums),
                                 _argnums(donate_argnums), coarsen_target, seed, quiet, compiler_options,
                                 data_parallel=data_parallel, microbatches=microbatches,
                                 batch_argnums=_argnums_or_none(batch_argnums), autotune=autotune,
                                 autotune_steps=autotune_steps, optimizer_state=optimizer_state)
    if fn is None:
        return lambda f: Parallelized(f, options)
    return Parallelized(fn, options)


def _check_callable(fn: Any) -> None:
    from pesto_ir.util.loader import ArgumentError

    if not callable(fn):
        raise ArgumentError(f"parallelize needs a function to plan (e.g. a training step), got {fn!r:.80}")


# ---------------------------------------------------------------- helpers

def _speed(jit: Compiled | None, candidates: list[Any], device: Device, dispatch: float) -> tuple[float | None, str]:
    """The speed factor the `jit` candidate's measured step gives (see `autotune.speed_factor`),
    or why there is none."""
    from pesto_ir.parallel.autotune import speed_factor

    measured = next((c.measured for c in candidates if c.name == "jit"), None)
    if jit is None or measured is None:
        return None, "plain jax.jit on one device was not measured"
    try:
        return speed_factor(jit.graph, device, measured - dispatch), ""
    except PestoError as e:
        return None, str(e)


def _strategy(plan: Plan) -> str:
    par = plan.parallelism
    return "" if par is None else f", data-parallel {par.data_parallel} x {par.microbatches} micro-batches"


def _jitted(fn: Callable[..., Any], treedef: Any, n_leaves: int, device: Any,
            donate: Sequence[int]) -> Callable[..., Any]:
    """Plain `jax.jit(fn)` on one device, as a function of the flat input leaves (of `treedef`, the
    structure of `(args, kwargs)`) returning the flat outputs."""
    import jax
    from jax.sharding import SingleDeviceSharding

    def flat(*xs: Any) -> list[Any]:
        args, kwargs = jax.tree_util.tree_unflatten(treedef, list(xs))
        return jax.tree_util.tree_leaves(fn(*args, **kwargs))

    sharding = SingleDeviceSharding(device)
    return jax.jit(flat, in_shardings=tuple(sharding for _ in range(n_leaves)), out_shardings=sharding,
                   donate_argnums=tuple(donate))


class _NewSignature(Exception):
    """Raised while `_guarded_jit` traces: the arguments are not of the signature it stands for."""


def _guarded_jit(fn: Callable[..., Any], key: Any, device: Any, donate_argnums: Sequence[int]) -> Callable[..., Any]:
    """`jax.jit(fn)` on `device` that only ever compiles for `key` (pytree structure of `(args, {})`
    and `_signatures` of its leaves); tracing for any other signature raises `_NewSignature`."""
    import jax
    from jax.sharding import SingleDeviceSharding

    def guarded(*args: Any) -> Any:
        leaves, tree = jax.tree_util.tree_flatten((args, {}))
        if (tree, tuple((x.shape, x.dtype, x.aval.weak_type) for x in leaves)) != key:
            raise _NewSignature
        return fn(*args)

    sharding = SingleDeviceSharding(device)
    return jax.jit(guarded, in_shardings=sharding, out_shardings=sharding, donate_argnums=tuple(donate_argnums))


def _argnums(x: Any) -> Any:
    """Argument positions as a tuple; what is not positions is kept as given for `_check_options`
    to refuse by name."""
    if isinstance(x, int) and not isinstance(x, bool):
        return (x,)
    return tuple(x) if isinstance(x, Sequence) and not isinstance(x, (str, bytes)) else x


def _argnums_or_none(x: Any) -> Any:
    """`batch_argnums` as a tuple; None stays None, and anything that is not positions is kept as
    given for `_check_options` to refuse by name."""
    return None if x is None else _argnums(x)


_ARRAY_SIGNATURE = attrgetter("shape", "dtype", "weak_type")


def _signature(x: Any) -> tuple[Any, ...]:
    """What a compiled entry depends on: shape, dtype and weak type (Python scalars by type)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return (type(x),)
    return (x.shape, dtype, getattr(x, "weak_type", False))


def _signatures(leaves: list[Any]) -> tuple[tuple[Any, ...], ...]:
    """`_signature` of every leaf; JAX arrays (the usual case) through one C-level attrgetter."""
    try:
        return tuple(map(_ARRAY_SIGNATURE, leaves))
    except AttributeError:
        return tuple(map(_signature, leaves))


def _check_options(o: ParallelizeOptions) -> None:
    from pesto_ir.passes.annotate_costs import MODELS
    from pesto_ir.passes.placement.registry import ALGORITHMS

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
    from pesto_ir.util.loader import ArgumentError

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
    from pesto_ir.passes.rewrite.rebatch import MAX_MICROBATCHES  # the place pass's own bound on both

    for name, value in (("data_parallel", o.data_parallel), ("microbatches", o.microbatches)):
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
    if not isinstance(o.autotune, bool):
        raise PestoError(f"autotune must be True or False, got {o.autotune!r}")
    if o.optimizer_state not in ("auto", "replicated", "sharded"):
        raise PestoError(f"optimizer_state must be \"auto\", \"replicated\" or \"sharded\", got {o.optimizer_state!r}")
    from pesto_ir.parallel.autotune import check_steps

    check_steps(o.autotune_steps)


def _devices_and_cluster(o: ParallelizeOptions) -> tuple[Sequence[Any] | Mapping[str, Any], Cluster]:
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
            cluster = _renamed(cluster, list(devices))
    if len(cluster) != len(jax_devices):
        raise PestoError(f"the cluster has {len(cluster)} device(s) ({', '.join(cluster.names)}) but "
                         f"{len(jax_devices)} JAX device(s) were given")
    if isinstance(devices, Mapping) and list(devices) != cluster.names:
        raise PestoError(f"the devices dict is keyed {', '.join(devices)} but the cluster's devices are "
                         f"{', '.join(cluster.names)}")
    return devices, cluster


def _first(devices: Sequence[Any] | Mapping[str, Any]) -> Any:
    """The first JAX device of a list or of a dict keyed by cluster device name."""
    return next(iter(devices.values())) if isinstance(devices, Mapping) else devices[0]


def _renamed(cluster: Cluster, names: list[str]) -> Cluster:
    """The same devices and links under new names, in order."""
    new = dict(zip(cluster.names, names))
    devices = [dataclasses.replace(d, name=new[d.name]) for d in cluster.devices]
    links = {(new[a], new[b]): Link(new[a], new[b], lk.latency, lk.bandwidth) for (a, b), lk in cluster.links.items()}
    return dataclasses.replace(cluster, devices=devices, links=links)


def _flat_indices(args: tuple[Any, ...], argnums: Sequence[int]) -> list[int]:
    """Indices among the flattened inputs of the leaves of the positional arguments `argnums`."""
    import jax

    bad = [i for i in argnums if not 0 <= i < len(args)]
    if bad:
        raise PestoError(f"argnums {bad} out of range for {len(args)} positional argument(s)")
    out: list[int] = []
    start = 0
    for i, a in enumerate(args):
        n = len(jax.tree_util.tree_leaves(a))
        if i in argnums:
            out += range(start, start + n)
        start += n
    return out


def state_map(graph: Graph, out_tree: Any, args: tuple[Any, ...], param_argnums: Sequence[int]) -> dict[int, int]:
    """Output index -> input index: for each argument of `param_argnums`, in order, the first unclaimed
    element of the returned tuple with the same pytree structure and leaf types is its next value."""
    import jax

    tu = jax.tree_util
    n_out = len(graph.outputs)
    result = tu.tree_unflatten(out_tree, list(range(n_out)))
    elements = list(result) if isinstance(result, (tuple, list)) else [result]
    starts, start = [], 0
    for a in args:
        starts.append(start)
        start += len(tu.tree_leaves(a))
    claimed: set[int] = set()
    out: dict[int, int] = {}
    for i in param_argnums:
        # annotated: JAX's annotation of tree_structure names a PyTreeDef class mypy cannot resolve
        want: jax.tree_util.PyTreeDef = tu.tree_structure(args[i])
        for j, element in enumerate(elements):
            if j in claimed or want != tu.tree_structure(element):
                continue
            outs = tu.tree_leaves(element)
            ins = range(starts[i], starts[i] + len(outs))
            if all(graph.outputs[k].type == graph.inputs[n].type for k, n in zip(outs, ins)):
                claimed.add(j)
                out.update(zip(outs, ins))
                break
    return out


__all__ = ["Compiled", "ParallelizeOptions", "Parallelized", "parallelize", "state_map"]
