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
* `autotune="auto"`: a plan is a prediction, and on the machine at hand it can lose to plain
  `jax.jit` (CPU devices share the machine's cores: splitting a step there cannot win). So by
  default the first call with a signature builds the plan asked for (its `algo`, `data_parallel`,
  `microbatches`, ...), plain `jax.jit` on the first device and data parallelism over all the
  devices, times each for `autotune_steps` interleaved steps on the call's arguments, and runs the
  fastest (`pesto_ir/parallel/autotune.py`; `.report()` shows each candidate's simulated and
  measured step), so that what runs by default is never slower than jax.jit here. `autotune=False`
  runs the plan as asked, unmeasured; devices of several processes cannot be timed from one
  process, so there "auto" plans and runs without it (and True is refused). When plain jax.jit
  wins, `.executable` is a `JitExecutable` (its `describe()` says so, with the times), `.plan` is
  the one-device plan that models it, its `algorithm` "jax.jit", and calls go straight to
  `jax.jit(fn)` (`_fast_path`); whichever wins, the plan's notes and `describe()` say what was
  measured against what. `.calibrated_cluster()` is the cluster corrected by the measured speed.

`.plan`, `.graph` and `.executable` describe the most recent signature called.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.host import differences, elsewhere_note, machine_of
from pesto_ir.cluster.model import Cluster
from pesto_ir.distributed import is_multiprocess, shared_text
from pesto_ir.ir.attributes import DictAttr, to_attr
from pesto_ir.ir.graph import Graph
from pesto_ir.jaxrt.measure_collectives import measured_cluster
from pesto_ir.parallel import autotune
from pesto_ir.parallel.arguments import (
    JitExecutable,
    NewSignature,
    flat_indices,
    guarded_jit,
    plain_jit,
    signatures,
    state_map,
)
from pesto_ir.parallel.options import (
    AUTO_TUNE,
    DEFAULT_ALGO,
    DEFAULT_COST_MODEL,
    DEFAULT_TIME_LIMIT,
    ParallelizeOptions,
    as_argnums,
    as_argnums_or_none,
    check_callable,
    check_options,
    devices_and_cluster,
    first_device,
    renamed_cluster,
)
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import Plan, read_plan_attrs
from pesto_ir.util.errors import PestoError, first_reason
from pesto_ir.util.units import human_time


@dataclass
class Compiled:
    """What one input signature compiled to: the plan that runs, and (autotune) every candidate."""

    lowered: Any  # frontends.jax.LoweredFunction
    graph: Graph  # the placed graph
    plan: Plan
    executable: Any  # backends.jax.Executable, or arguments.JitExecutable when plain jax.jit won
    pipeline: str
    seconds: dict[str, float] = field(default_factory=dict)  # lower, passes, build (and autotune)
    candidates: list[Any] = field(default_factory=list)  # autotune.Candidate, when autotuned
    chosen: str = "plan"
    not_tuned: str = ""  # why the candidates were not timed: autotune=False, or devices of several processes
    # measured / roofline speed of the devices (autotune.speed_factor), or why there is none
    speed_factor: float | None = None
    speed_note: str = ""
    dispatch: float | None = None  # seconds: the host's floor for one executable call (autotune.dispatch_floor)


class Parallelized:
    """`fn` planned and run across devices; call it like `fn`."""

    def __init__(self, fn: Callable[..., Any], options: ParallelizeOptions) -> None:
        import jax

        check_callable(fn)
        check_options(options)
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
            except NewSignature:
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
        key = (tree, signatures(leaves))
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = self._compile(args, kwargs)
            self._fast = self._fast_path(entry, kwargs)
        self._last = entry
        return entry

    def _fast_path(self, entry: Compiled, kwargs: dict[str, Any]) -> Any:
        """When autotuning chose plain jax.jit for the only signature seen: `jax.jit(fn)` itself,
        called on the caller's arguments, so JAX's C++ dispatch does the flattening and the signature
        check that `__call__` otherwise does in Python (40 us a call, measured on a 154-op MLP whose
        step takes 90 us). A new signature makes it trace, and the trace raises `NewSignature`
        instead of compiling, so that signature is planned and autotuned like any other. It is the
        very function the candidate was timed as (or, donating, the winner built for the first
        call), so it is not compiled again."""
        exe = entry.executable
        if len(self._cache) != 1 or kwargs or not isinstance(exe, JitExecutable) or not exe.guarded:
            return None
        return exe.jitted

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
        last = self.last
        if not last.candidates:
            return f"{self.__name__}: not autotuned ({last.not_tuned}): runs the {last.plan.algorithm} plan"
        table = autotune.report(last.candidates, next((c for c in last.candidates if c.name == last.chosen), None))
        devices, cluster = devices_and_cluster(self.options)
        elsewhere = elsewhere_note(cluster.calibrated_on, machine_of(first_device(devices)), "the cluster's calibrated figures")
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
        last = self.last
        if last.speed_factor is None:
            raise PestoError(f"{self.__name__}: no measured speed to calibrate with: "
                             + (last.speed_note or "call it with autotune=True first"))
        devices, cluster = devices_and_cluster(self.options)
        if measure_links and self.options.cluster is None:
            cluster = measured_cluster(list(devices.values()) if isinstance(devices, Mapping) else devices,
                                       kind=cluster.devices[0].kind)
            if isinstance(devices, Mapping):
                cluster = renamed_cluster(cluster, list(devices))
        # the speed factor was measured here; a given cluster measured elsewhere keeps saying so
        here = machine_of(first_device(devices))
        mixed = cluster.calibrated_on is not None and bool(differences(cluster.calibrated_on, here))
        return dataclasses.replace(autotune.with_speed(cluster, last.speed_factor),
                                   calibrated_on=cluster.calibrated_on if mixed else here)

    # ---------------------------------------------------------------- compiling
    def _compile(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Compiled:
        from pesto_ir.frontends.jax import lower_function  # start-up: JAX

        o = self.options
        t0 = time.perf_counter()
        devices, _ = devices_and_cluster(o)
        across = is_multiprocess(devices.values() if isinstance(devices, Mapping) else devices)
        tune = o.tunes(across)
        # the plan frees donated inputs after their last read only where its executable donates them:
        # autotuning times every candidate on the caller's arrays, none donating (`_autotuned`)
        lowered = lower_function(self.fn, *args, param_argnums=o.param_argnums, batch_argnums=o.batch_argnums,
                                 donate_argnums=() if tune else o.donate_argnums, **kwargs)
        pristine = lowered.graph.clone() if tune else None
        lowered_seconds = time.perf_counter() - t0
        donate = flat_indices(args, o.donate_argnums)
        entry = self._planned(lowered, lowered.graph, args, o, () if tune else donate)
        entry.seconds["lower"] = lowered_seconds
        if not tune:
            entry.not_tuned = "autotune=False" if o.autotune is False else \
                "devices of several processes: the candidates could only be timed on one process's devices"
            return entry
        assert pristine is not None
        return self._autotuned(entry, pristine, args, kwargs, donate)

    def _planned(self, lowered: Any, graph: Graph, args: tuple[Any, ...], o: ParallelizeOptions,
                 donate: Sequence[int], build: bool = True) -> Compiled:
        """`graph` (a lowered step) planned with `o`'s pipeline and, with `build`, built on `o`'s
        devices (else its executable is None: the plan alone is wanted)."""
        devices, cluster = devices_and_cluster(o)
        t1 = time.perf_counter()
        pipeline = o.pipeline()

        def make_plan() -> Graph:
            return PassManager(pipeline).run(graph, PassContext(cluster=cluster, quiet=o.quiet, seed=o.seed))

        if is_multiprocess(devices.values() if isinstance(devices, Mapping) else devices):
            from pesto_ir.frontends.text import parse  # start-up: Lark

            # process 0 plans, every process runs its plan: time-limited solvers differ run to run
            graph = parse(shared_text("plan", make_plan), filename="<plan from process 0>")
        else:
            graph = make_plan()
        t2 = time.perf_counter()
        plan = read_plan_attrs(graph)
        assert plan is not None  # the pipeline ends with place, expand and simulate
        executable = self._built(lowered, graph, args, o, donate) if build else None
        return Compiled(lowered, graph, plan, executable, pipeline,
                        {"passes": t2 - t1, "build": time.perf_counter() - t2})

    @staticmethod
    def _built(lowered: Any, graph: Graph, args: tuple[Any, ...], o: ParallelizeOptions,
               donate: Sequence[int]) -> Any:
        """The executable of a placed graph on `o`'s devices."""
        from pesto_ir.backends.jax import build  # start-up: JAX

        devices, cluster = devices_and_cluster(o)
        names = dict(zip(cluster.names, devices.values() if isinstance(devices, Mapping) else devices))
        return build(graph, names, constants=lowered.consts,
                     state_map=state_map(graph, lowered.out_tree, args, o.param_argnums),
                     donate=donate, compiler_options=o.compiler_options)

    def _autotuned(self, entry: Compiled, pristine: Graph, args: tuple[Any, ...], kwargs: dict[str, Any],
                   donate: list[int]) -> Compiled:
        """`entry` (the plan asked for) timed against plain jax.jit on the first device and data
        parallelism over all the devices; the fastest, with every candidate in `candidates`, its
        plan and executable saying that autotuning chose it and against what (`_label`)."""
        o = self.options
        t0 = time.perf_counter()
        leaves, treedef = self._flatten((args, kwargs))
        devices, cluster = devices_and_cluster(o)
        device_list = list(devices.values()) if isinstance(devices, Mapping) else list(devices)
        built: dict[str, Compiled] = {"plan": entry}
        variants: dict[str, ParallelizeOptions] = {"plan": o}
        candidates = [autotune.Candidate("plan", f"{entry.plan.algorithm} on {len(device_list)} device(s)"
                                         + _strategy(entry.plan), entry.executable, entry.plan.makespan)]
        one = dataclasses.replace(o, devices=device_list[:1], cluster=None, algo="single", data_parallel=None,
                                  microbatches=None, autotune=False, optimizer_state="auto")
        # jax.jit is timed as the fast path will call it (on the arguments, not the flat leaves), and
        # is that very function unless the winner must donate: then one more compile, with donation
        key = (treedef, signatures(leaves))
        guarded = not kwargs and all(hasattr(x, "weak_type") for x in leaves)
        timed_jit = guarded_jit(self.fn, key, device_list[0], ()) if guarded else \
            plain_jit(self.fn, treedef, len(leaves), device_list[0], ())
        try:
            # its one-device plan is only its prediction and the speed calibration's graph: not built
            built["jit"] = self._planned(entry.lowered, pristine.clone(), args, one, (), build=False)
            run = _on_arguments(timed_jit, treedef) if guarded else timed_jit
            candidates.append(autotune.Candidate("jit", f"jax.jit on {device_list[0]}", run,
                                                 built["jit"].plan.makespan))
        except PestoError as e:
            candidates.append(autotune.Candidate("jit", "jax.jit on one device", None, why=first_reason(e)))
        if len(device_list) > 1:
            dp = dataclasses.replace(o, algo="single", data_parallel=len(device_list), microbatches=1, autotune=False)
            try:
                built["data-parallel"] = self._planned(entry.lowered, pristine.clone(), args, dp, ())
                variants["data-parallel"] = dp
                plan = built["data-parallel"].plan
                candidates.append(autotune.Candidate("data-parallel", f"{len(device_list)} replicas, shard_map "
                                                     "over all devices", built["data-parallel"].executable,
                                                     plan.makespan))
            except PestoError as e:
                why = getattr(e, "cause", e)
                candidates.append(autotune.Candidate("data-parallel", f"{len(device_list)} replicas", None,
                                                     why=first_reason(why)))
        chosen = autotune.choose(candidates, leaves, o.autotune_steps)
        winner = built[chosen.name]
        verdict = autotune.verdict(candidates, chosen)
        if chosen.name == "jit":
            jitted = timed_jit
            if donate:  # timed without donating the caller's arrays; the one that runs donates
                jitted = guarded_jit(self.fn, key, device_list[0], o.donate_argnums) if guarded else \
                    plain_jit(self.fn, treedef, len(leaves), device_list[0], donate)
            winner.executable = JitExecutable(jitted, guarded, treedef, device_list[0], cluster.names[0],
                                              len(leaves), verdict)
        elif donate:
            winner.executable = self._built(entry.lowered, winner.graph, args, variants[chosen.name], donate)
        if chosen.name != "jit":
            winner.executable.chosen_by = verdict
        _label(winner, chosen.name, verdict)
        winner.candidates, winner.chosen = candidates, chosen.name
        winner.dispatch = autotune.dispatch_floor(device_list[0])
        winner.speed_factor, winner.speed_note = _speed(built.get("jit"), candidates,
                                                        devices_and_cluster(one)[1].devices[0], winner.dispatch)
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
                batch_argnums: int | Sequence[int] | None = None, autotune: bool | str = AUTO_TUNE,
                autotune_steps: int = 5, optimizer_state: str = "auto",
                tensor_parallel: int | str | None = None, parameters: str = "auto") -> Any:
    """`fn` planned with Pesto and run across `devices` (a list, or a dict from cluster device name to
    JAX device); used bare or as `@parallelize(devices=...)`. See the module docstring."""
    options = ParallelizeOptions(devices, algo, time_limit, cluster, cost_model, as_argnums(param_argnums),
                                 as_argnums(donate_argnums), coarsen_target, seed, quiet, compiler_options,
                                 data_parallel=data_parallel, microbatches=microbatches,
                                 batch_argnums=as_argnums_or_none(batch_argnums), autotune=autotune,
                                 autotune_steps=autotune_steps, optimizer_state=optimizer_state,
                                 tensor_parallel=tensor_parallel, parameters=parameters)
    if fn is None:
        return lambda f: Parallelized(f, options)
    return Parallelized(fn, options)


# ---------------------------------------------------------------- helpers

def _speed(jit: Compiled | None, candidates: list[Any], device: Device, dispatch: float) -> tuple[float | None, str]:
    """The speed factor the `jit` candidate's measured step gives (see `autotune.speed_factor`),
    or why there is none."""
    measured = next((c.measured for c in candidates if c.name == "jit"), None)
    if jit is None or measured is None:
        return None, "plain jax.jit on one device was not measured"
    try:
        return autotune.speed_factor(jit.graph, device, measured - dispatch), ""
    except PestoError as e:
        return None, str(e)


def _on_arguments(jitted: Callable[..., Any], treedef: Any) -> Callable[..., Any]:
    """`jitted` (a function of the positional arguments) as a candidate runner of the flat leaves."""
    import jax

    def run(*leaves: Any) -> Any:
        args, _ = jax.tree_util.tree_unflatten(treedef, leaves)
        return jitted(*args)

    return run


# what `Plan.algorithm` says for a candidate that is not the plan asked for: a user reading
# `step.plan.algorithm` after jax.jit won must not read "single" (the placement that models it)
CANDIDATE_ALGORITHMS = {"jit": "jax.jit", "data-parallel": "data-parallel"}


def _label(entry: Compiled, chosen: str, verdict: str) -> None:
    """The chosen candidate's plan, in `entry.plan` and in its placed graph's plan attribute, named
    after the candidate (`CANDIDATE_ALGORITHMS`) and noting the verdict of the timing."""
    algorithm = CANDIDATE_ALGORITHMS.get(chosen, entry.plan.algorithm)
    entry.plan = dataclasses.replace(entry.plan, algorithm=algorithm, notes=[*entry.plan.notes, verdict])
    meta = entry.graph.attrs.get("plan")
    if isinstance(meta, DictAttr):
        fields = dict(meta.entries)
        fields["algorithm"] = to_attr(algorithm)
        fields["notes"] = to_attr(list(entry.plan.notes))
        entry.graph.attrs["plan"] = DictAttr(tuple(fields.items()))


def _strategy(plan: Plan) -> str:
    par = plan.parallelism
    if par is None:
        return ""
    ranks = f" x tensor-parallel {par.tensor_parallel}" if par.tensor_parallel > 1 else ""
    return f", data-parallel {par.data_parallel}{ranks} x {par.microbatches} micro-batches"


__all__ = ["Compiled", "Parallelized", "parallelize"]
