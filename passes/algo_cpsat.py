"""`cpsat`: Pesto's joint placement-and-scheduling problem in OR-tools CP-SAT.

The same problem as the MILP of `algo_ilp` (placement, per-device order, transfers sent once per
destination device, one transfer at a time per directed link, memory, colocation, heterogeneous
speeds and links), stated with CP-SAT's scheduling constraints instead of big-M pairs:

- `x[u,d]` (Boolean): colocation unit `u` runs on device `d`; one optional interval per
  (op, allowed device) with the op's cost there, all sharing the op's start `S[i]`;
  `AddNoOverlap` per device.
- Per producer p and destination d: `y[p,d,k]` is true when result k of p is read on d and p is
  elsewhere; the transfer is needed (`need[p,d]`) when any is. Per possible source device s an
  optional interval on link (s, d), present iff p is on s and the transfer is needed, lasting
  latency + the bytes of the needed results over the bandwidth; `AddNoOverlap` per directed link.
  A consumer on d starts after the transfer ends; every consumer starts after its producer ends.
  Ops and transfers that take no time at all occupy no device or link (DESIGN.md's overlap rule
  only concerns spans of positive length).
- Memory per device, the makespan `T` above every op's end plus its tail (longest path after it)
  and above each device's load, and symmetry breaking between interchangeable devices (a unit may
  open device j of a class only once an earlier unit uses device j-1).

Time is integer: one tick is a power of ten of seconds chosen so that the warm start's makespan is
10^8 to 10^9 ticks (`resolution` in `plan.solver`). Durations are rounded *down*, so the model is a
relaxation of the real problem and its bound times the tick is a true lower bound, while the warm
start's times rounded down are a feasible hint. The solved placement and per-device orders are
timed exactly by `simulate` and by replaying the solver's own link order; the best of those and the
warm start is returned, after `check_plan`.

The model is built and solved in a worker process (`cpsat_worker`): OR-tools and python-mip's CBC
cannot share one. One CP-SAT worker thread (`options.threads`, default 1) is deterministic when the
solve ends by optimality; a second thread sometimes helps the whole model (coarse ResNet-50
training at 4 devices: 1.38 -> 1.26 times the lower bound in 10 s) but not LNS, on this 2-core
machine shared with other jobs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pesto_ir.bounds import lower_bound
from pesto_ir.cluster import Cluster
from pesto_ir.costs import op_cost, value_bytes
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph, Op
from pesto_ir.memory import footprints
from pesto_ir.passes.algo_common import NO_START_HINT, interchangeable_devices, longest_paths, unplaceable_reason
from pesto_ir.passes.algo_ilp import _colocation_units
from pesto_ir.placement import Interrupted, PlaceOptions, interrupted
from pesto_ir.plan import OpSlot, Plan, Transfer
from pesto_ir.simulate import PlanError, simulate, transfer_bytes
from pesto_ir.validate import check_plan, validate_plan

if TYPE_CHECKING:
    from pesto_ir.passes.cpsat_worker import SolverProcess

ALGORITHM = "cpsat"
SOLVER_NAME = "cp-sat"
TARGET_TICKS = 1e8  # the warm start's makespan in ticks is in [TARGET_TICKS, 10 * TARGET_TICKS)
REL_GAP = 1e-6  # a plan within this fraction of the bound needs no solve
# Without the LP relaxation CP-SAT's single worker finds better plans on the MSR graphs in the
# same time (coarse resnet50/bert24/gnmt training graphs at 4 devices); the bound comes from
# `lower_bound` and propagation either way. Without probing, presolve takes 1.8 s instead of 10 s
# on the coarse BERT-12 training graph at 8 devices, where probing then left no time to search
# (status UNKNOWN despite a complete, feasible hint).
SEARCH_PARAMS = {"linearization_level": 0, "cp_model_probing_level": 0}


class CpSatError(PestoError):
    pass


# ---------------------------------------------------------------------------- entry point

def place_cpsat(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """Solve the CP-SAT model from the warm start; return the best real schedule found. On Ctrl-C,
    raise `Interrupted` with the best of the solver's last incumbent and the warm start."""
    started = time.perf_counter()
    if not graph.ops:
        return Plan(graph.name, ALGORITHM, list(cluster.names), {}, [], 0.0,
                    solver_info("optimal", 0.0, 0.0, 0.0, 0.0, None, options))
    try:
        warm, notes = starting_plan(graph, cluster, options)
    except KeyboardInterrupt as e:
        raise interrupted(e, graph, options.warm_start) from None
    lb = lower_bound(graph, cluster)
    early = _early_answer(graph, cluster, warm, lb, started, options)
    if early is not None:
        early.notes[:0] = notes
        return check_plan(graph, cluster, early)
    from pesto_ir.passes.cpsat_worker import shared_solver

    proc = shared_solver()
    proc.start()
    prob = Problem.build(graph, cluster, warm.makespan if warm is not None else None, lb)
    hint = Hint.of(prob, cluster, warm) if warm is not None else None
    options.progress(f"cpsat: {graph.name}: {len(graph.ops)} ops on {len(cluster)} devices; warm start "
                     f"{fmt(warm.makespan) if warm else 'none'}, lower bound {fmt(lb)}, 1 tick = {prob.tick:.0e} s")
    remaining = options.time_limit - (time.perf_counter() - started)
    try:
        result = solve(proc, prob, hint, options, remaining, "cpsat", params=dict(SEARCH_PARAMS), incumbents=True)
    except KeyboardInterrupt as e:
        raise _interrupted(graph, cluster, prob, e, warm, notes, lb, started, options) from None
    if result.note:
        notes.append(result.note)
    plan = realise(graph, cluster, prob, result, warm, notes)
    if plan is None and result.status == "infeasible" and warm is None:
        # Without a warm start the horizon is loose, so only memory (with colocation) can be unmet.
        raise CpSatError(f"no placement of '{graph.name}' fits the devices' memory: CP-SAT proved it "
                         f"(the heuristics found none either); add devices or memory")
    if plan is None:
        raise CpSatError(f"CP-SAT found no plan for '{graph.name}' within {options.time_limit:g}s "
                         f"(status {result.status}) and no heuristic found a plan to start from: "
                         f"{NO_START_HINT}")
    return finish(graph, cluster, plan, result, prob, lb, started, options)


def _interrupted(graph: Graph, cluster: Cluster, prob: Problem, caught: KeyboardInterrupt, warm: Plan | None,
                 notes: list[str], lb: float, started: float, options: PlaceOptions) -> Interrupted:
    """Ctrl-C during the solve: the best of its last incumbent (timed exactly) and the warm start."""
    result = caught.result if isinstance(caught, SolveInterrupted) else Result("interrupted", None, None, 0.0)
    seconds = time.perf_counter() - started
    plan = realise(graph, cluster, prob, result, warm,
                   [*notes, f"interrupted (Ctrl-C) after {seconds:.1f}s: the best plan CP-SAT had found"])
    if plan is None:
        return Interrupted(None, graph)
    return Interrupted(finish(graph, cluster, plan, result, prob, lb, started, options), graph)


def solver_info(status: str, seconds: float, bound: float | None, gap: float | None, objective: float | None,
                tick: float | None, options: PlaceOptions) -> dict[str, Any]:
    """What `plan.solver` records for a CP-SAT solve."""
    info: dict[str, Any] = {"name": SOLVER_NAME, "status": status, "gap": gap, "bound": bound,
                            "seconds": round(seconds, 3), "objective": objective,
                            "workers": max(1, options.threads)}
    if tick is not None:
        info["resolution"] = tick
    return info


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


def gap(makespan: float, bound: float) -> float:
    return max(0.0, (makespan - bound) / makespan) if makespan > 0 else 0.0


def finish(graph: Graph, cluster: Cluster, plan: Plan, result: Result, prob: Problem, lb: float,
           started: float, options: PlaceOptions) -> Plan:
    """Record the solve in `plan.solver` (bound: the best of CP-SAT's and the lower bound)."""
    bound = min(max(b for b in (result.bound, lb) if b is not None), plan.makespan)
    plan.lower_bound = bound
    plan.solver = solver_info(result.status, time.perf_counter() - started, bound, gap(plan.makespan, bound),
                              result.objective, prob.tick, options)
    options.progress(f"cpsat: {result.status} after {result.seconds:.1f}s: makespan {fmt(plan.makespan)}, "
                     f"bound {fmt(bound)}, gap {plan.solver['gap']:.2%}")
    return check_plan(graph, cluster, plan)


# ---------------------------------------------------------------------------- warm start

def starting_plan(graph: Graph, cluster: Cluster, options: PlaceOptions) -> tuple[Plan | None, list[str]]:
    """The given warm start when it is a valid plan of this graph, else the best of the place pass's
    heuristics (m-ETF alone where the place pass is not installed) and everything on the fastest
    device that holds it; None if none fits in memory."""
    notes: list[str] = []
    given = options.warm_start
    if given is not None:
        problems = validate_plan(graph, cluster, given)
        if not problems:
            return given, notes
        notes.append(f"the warm start was not a valid plan of this graph ({problems[0]}); ignored it")
    quiet = dataclasses.replace(options, quiet=True, warm_start=None)
    fallback = _fallback_plan(graph, cluster)
    if fallback is not None and validate_plan(graph, cluster, fallback):
        fallback = None  # its memory count leaves out copies and lifetimes; the exact peak says no
    candidates = [p for p in (_heuristic_plan(graph, cluster, quiet), fallback) if p is not None]
    return (min(candidates, key=lambda p: p.makespan) if candidates else None), notes


def _heuristic_plan(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan | None:
    try:
        from pesto_ir.passes.place import best_heuristic_plan
    except ImportError:
        best_heuristic_plan = None
    if best_heuristic_plan is not None:
        return best_heuristic_plan(graph, cluster, options)
    try:
        from pesto_ir.passes.algo_baechi import m_etf
    except ImportError:
        return None
    try:
        return check_plan(graph, cluster, m_etf(graph, cluster, options))
    except PestoError:
        return None


def _fallback_plan(graph: Graph, cluster: Cluster) -> Plan | None:
    """Everything on the fastest device that holds it all; else units first-fit, fastest first."""
    by_speed = sorted(cluster.devices, key=lambda d: (sum(op_cost(op, d) for op in graph.ops),
                                                      cluster.names.index(d.name)))
    footprint = footprints(graph)
    total = sum(footprint.values())
    placement: dict[str, str] = {}
    fits_one = next((d for d in by_speed if total <= d.memory), None)
    if fits_one is not None:
        placement = {op.name: fits_one.name for op in graph.ops}
    else:
        free = {d.name: d.memory for d in cluster.devices}
        for members in _colocation_units(graph.topo_order()):
            need = sum(footprint[op.name] for op in members)
            dev = next((d.name for d in by_speed if free[d.name] >= need), None)
            if dev is None:
                return None
            free[dev] -= need
            placement.update({op.name: dev for op in members})
    order: dict[str, list[str]] = {}
    for op in graph.topo_order():
        order.setdefault(placement[op.name], []).append(op.name)
    return simulate(graph, cluster, placement, order, algorithm="fastest-device")


def _early_answer(graph: Graph, cluster: Cluster, warm: Plan | None, lb: float, started: float,
                  options: PlaceOptions) -> Plan | None:
    """Answers that need no solve: one device, or a warm start at the lower bound."""
    if warm is None:
        reason = unplaceable_reason(graph, cluster)
        if reason is not None:
            raise CpSatError(reason)
        return None
    if len(cluster) == 1 or warm.makespan <= lb * (1 + REL_GAP) + 1e-15:
        plan = as_algorithm(warm, ALGORITHM)
        plan.lower_bound = warm.makespan
        plan.solver = solver_info("optimal", time.perf_counter() - started, warm.makespan, 0.0, warm.makespan,
                                  None, options)
        why = "one device" if len(cluster) == 1 else "the warm start meets the lower bound"
        plan.notes.append(f"no CP-SAT solve needed: {why}, so it is optimal")
        return plan
    return None


def as_algorithm(plan: Plan, algorithm: str) -> Plan:
    """A copy of `plan` that says it came out of `algorithm` (and from which one before)."""
    notes = list(plan.notes)
    if plan.algorithm and plan.algorithm != algorithm:
        notes.append(f"warm start from {plan.algorithm}")
    return Plan(plan.graph, algorithm, list(plan.devices),
                {n: OpSlot(s.device, s.start, s.end) for n, s in plan.ops.items()},
                [Transfer(t.src, t.src_device, t.to, t.start, t.end, t.nbytes) for t in plan.transfers],
                plan.lower_bound, dict(plan.solver) if plan.solver else None, notes)


# ---------------------------------------------------------------------------- the problem in ticks

@dataclass
class Problem:
    """Everything the model needs, as plain data in integer ticks (it is sent to the solver
    process); ops by topological index, devices by cluster index."""

    names: list[str]  # op names
    index: dict[str, int]
    units: list[list[int]]
    unit_of: list[int]
    allowed: list[list[int]]  # devices each unit may use
    cost: list[list[int]]  # ticks per op per device, rounded down
    idle: list[list[bool]]  # the op takes no time at all there (it then occupies no device)
    producers: list[list[int]]
    sends: list[list[tuple[int, list[int]]]]  # per op: (bytes, readers in other units) per result
    unit_mem: list[int]
    memory: list[float]  # capacity per device
    latency: list[list[float]]  # seconds per link (0 on the diagonal)
    bandwidth: list[list[float]]  # bytes/s per link (inf on the diagonal)
    tick: float  # seconds per tick
    horizon: int = 0  # an upper bound of the makespan in ticks
    lb: int = 0
    fast: list[int] = field(default_factory=list)
    est: list[int] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def k(self) -> int:
        return len(self.memory)

    def ticks(self, seconds: float) -> int:
        """Seconds as ticks, rounded down (a tiny relative epsilon absorbs float noise)."""
        return int(math.floor(seconds / self.tick * (1 + 1e-12) + 1e-9))

    def link_seconds(self, s: int, d: int, nbytes: float) -> float:
        return 0.0 if s == d else self.latency[s][d] + nbytes / self.bandwidth[s][d]

    @staticmethod
    def build(graph: Graph, cluster: Cluster, ub_seconds: float | None, lb_seconds: float) -> Problem:
        ops = graph.topo_order()
        index = {op.name: i for i, op in enumerate(ops)}
        raw = [[op_cost(op, d) for d in cluster.devices] for op in ops]
        if ub_seconds is None or ub_seconds <= 0:
            ub_seconds = loose_upper_bound(ops, cluster, raw)
        units = [[index[op.name] for op in members] for members in _colocation_units(ops)]
        unit_of = [0] * len(ops)
        for u, members in enumerate(units):
            for i in members:
                unit_of[i] = u
        footprint = footprints(graph)  # conservative: every byte held for the whole step
        unit_mem = [sum(footprint[ops[i].name] for i in members) for members in units]
        names = cluster.names
        links = [[cluster.links.get((a, b)) for b in names] for a in names]
        prob = Problem([op.name for op in ops], index, units, unit_of,
                       [_allowed(cluster, ops, members, unit_mem[u]) for u, members in enumerate(units)],
                       [], [[c == 0 for c in row] for row in raw],
                       [sorted(index[p.name] for p in op.producers()) for op in ops],
                       [_foreign_results(ops[i], index, set(units[unit_of[i]])) for i in range(len(ops))],
                       unit_mem, [d.memory for d in cluster.devices],
                       [[lk.latency if lk else 0.0 for lk in row] for row in links],
                       [[lk.bandwidth if lk else math.inf for lk in row] for row in links],
                       tick_for(ub_seconds))
        prob.cost = [[prob.ticks(c) for c in row] for row in raw]
        prob.horizon = int(math.ceil(ub_seconds / prob.tick * (1 + 1e-9))) + 1
        prob.lb = prob.ticks(lb_seconds)
        prob.windows()
        return prob

    def restricted(self, allowed_now: Mapping[int, Sequence[int]], ub_seconds: float) -> Problem:
        """The problem with the units in `allowed_now` held to those devices (a neighbourhood)
        and the makespan below `ub_seconds`."""
        allowed = [list(allowed_now[u]) if u in allowed_now else list(a) for u, a in enumerate(self.allowed)]
        sub = dataclasses.replace(self, allowed=allowed)
        sub.horizon = int(math.ceil(ub_seconds / self.tick * (1 + 1e-9))) + 1
        sub.windows()
        return sub

    def windows(self) -> None:
        """Earliest starts and tails from the fastest allowed costs (free links)."""
        n = self.n
        self.fast = [min(self.cost[i][d] for d in self.allowed[self.unit_of[i]]) for i in range(n)]
        self.est = [0] * n
        consumers: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            for p in self.producers[i]:
                self.est[i] = max(self.est[i], self.est[p] + self.fast[p])
                consumers[p].append(i)
        self.tail = [0] * n
        for i in range(n - 1, -1, -1):
            self.tail[i] = max((self.fast[c] + self.tail[c] for c in consumers[i]), default=0)

    def latest_start(self, i: int) -> int:
        return max(self.est[i], self.horizon - self.tail[i] - self.fast[i])


def tick_for(ub_seconds: float) -> float:
    """Seconds per tick: the power of ten that puts `ub_seconds` in [TARGET_TICKS, 10 * TARGET_TICKS)."""
    return 10.0 ** math.floor(math.log10(ub_seconds / TARGET_TICKS))


def loose_upper_bound(ops: Sequence[Op], cluster: Cluster, cost: list[list[float]]) -> float:
    """Without a warm start: every op at its worst cost plus every result sent on the slowest link."""
    links = list(cluster.links.values())
    worst_lat = max((lk.latency for lk in links), default=0.0)
    slowest_bw = min((lk.bandwidth for lk in links), default=1.0)
    sends = sum(worst_lat + sum(value_bytes(r) for r in op.results) / slowest_bw for op in ops if op.consumers())
    return max(sum(max(row) for row in cost) + sends, 1e-9)


def _allowed(cluster: Cluster, ops: list[Op], members: list[int], need: int) -> list[int]:
    allowed = [d for d, dev in enumerate(cluster.devices) if need <= dev.memory]
    if not allowed:
        first = ops[members[0]]
        what = f"op '{first.name}'" if len(members) == 1 else \
            f"colocation group '{first.get('colocate')}' ({len(members)} ops)"
        biggest = max(dev.memory for dev in cluster.devices)
        raise CpSatError(f"{what} needs {need} bytes but the largest device holds {int(biggest)}")
    return allowed


def _foreign_results(op: Op, index: Mapping[str, int], own: set[int]) -> list[tuple[int, list[int]]]:
    """(bytes, readers in other units) for each result of `op` that another unit reads."""
    out = []
    for r in op.results:
        users = sorted({index[u.name] for u in r.users()} - own)
        if users:
            out.append((value_bytes(r), users))
    return out


def device_classes(prob: Problem) -> list[list[int]]:
    """Groups (of 2 or more) of interchangeable devices: same op costs, memory, allowed units and links."""
    first = {d: (tuple(row[d] for row in prob.cost), tuple(row[d] for row in prob.idle), prob.memory[d],
                 tuple(d in a for a in prob.allowed)) for d in range(prob.k)}
    groups = interchangeable_devices(first, lambda d, f: (prob.latency[d][f], prob.bandwidth[d][f],
                                                          prob.latency[f][d], prob.bandwidth[f][d]))
    inside = [{(prob.latency[a][b], prob.bandwidth[a][b]) for a in g for b in g if a != b} for g in groups]
    return [g for g, links in zip(groups, inside) if len(g) > 1 and len(links) <= 1]


@dataclass
class Hint:
    """A plan in the model's terms: device and start (ticks, rounded down) per op, transfer starts."""

    device: list[int]
    start: list[int]
    sends: dict[tuple[int, int], int]  # (producer, destination device) -> start

    @staticmethod
    def of(prob: Problem, cluster: Cluster, plan: Plan) -> Hint:
        names = {n: d for d, n in enumerate(cluster.names)}
        device = [names[plan.ops[n].device] for n in prob.names]
        start = [prob.ticks(plan.ops[n].start) for n in prob.names]
        sends = {(prob.index[t.src], names[t.to]): prob.ticks(t.start) for t in plan.transfers}
        return Hint(device, start, sends)


@dataclass
class Solution:
    """A solved placement with the solver's times (ticks) for ops and transfers."""

    device: list[int]  # per op
    start: list[int]
    end: list[int]
    sends: dict[tuple[int, int], int]  # (producer, destination device) -> transfer start


@dataclass
class Request:
    """One solve for the solver process."""

    problem: Problem
    hint: Hint | None
    seconds: float  # wall-clock limit, including building the model
    deadline: float  # time.monotonic() by which the answer is due (the same clock in both processes)
    chains: list[tuple[int, int]] = field(default_factory=list)
    symmetry: bool = True
    deterministic: float | None = None  # CP-SAT deterministic seconds
    workers: int = 1
    seed: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    incumbents: bool = False  # send each better solution as it is found (kept on Ctrl-C)


@dataclass
class Result:
    status: str
    objective: float | None  # seconds
    bound: float | None  # seconds, a true lower bound of the request's problem
    seconds: float
    solution: Solution | None = None
    size: str = ""
    note: str = ""
    setup_seconds: float = 0.0  # of `seconds`, spent building the model before the search


class SolveInterrupted(KeyboardInterrupt):
    """Ctrl-C during a solve: the worker is stopped; `result` holds its last incumbent (if any)."""

    def __init__(self, result: Result) -> None:
        super().__init__("interrupted")
        self.result = result


def solve(proc: SolverProcess, prob: Problem, hint: Hint | None, options: PlaceOptions, seconds: float,
          label: str, **kwargs: Any) -> Result:
    """Solve `prob` in the solver process within `seconds`, reporting progress unless quiet."""
    request = Request(prob, hint, seconds, time.monotonic() + seconds, workers=max(1, options.threads),
                      seed=options.seed, **kwargs)
    started = time.perf_counter()

    def report(objective: float, bound: float) -> None:
        inc = fmt(objective * prob.tick) if math.isfinite(objective) else "none"
        low = fmt(bound * prob.tick) if math.isfinite(bound) else "none"
        options.progress(f"{label}: {time.perf_counter() - started:6.1f}s  incumbent {inc}  bound {low}")

    return proc.solve(request, None if options.quiet else report)


# ---------------------------------------------------------------------------- a real schedule

def schedules(graph: Graph, cluster: Cluster, prob: Problem, sol: Solution, algorithm: str) -> list[tuple[Plan, str]]:
    """The solution timed exactly: by `simulate` (links first come, first served) and by replaying
    the solver's link order; (plan, how) for each that does not deadlock."""
    names = cluster.names
    placement = {n: names[sol.device[i]] for i, n in enumerate(prob.names)}
    order: dict[str, list[str]] = {}
    for i in sorted(range(prob.n), key=lambda i: (sol.start[i], sol.end[i], i)):
        order.setdefault(placement[prob.names[i]], []).append(prob.names[i])
    links: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for (p, d), r in sol.sends.items():
        links.setdefault((placement[prob.names[p]], names[d]), []).append((r, p))
    link_order = {k: [prob.names[p] for _, p in sorted(v)] for k, v in links.items()}
    out: list[tuple[Plan, str]] = []
    try:
        out.append((simulate(graph, cluster, placement, order, algorithm), "simulated"))
    except PlanError:
        pass
    replayed = earliest_schedule(graph, cluster, placement, order, link_order, algorithm)
    if replayed is not None:
        out.append((replayed, "replayed"))
    return out


def realise(graph: Graph, cluster: Cluster, prob: Problem, result: Result, warm: Plan | None,
            notes: list[str], algorithm: str = ALGORITHM) -> Plan | None:
    """The best of the solver's schedules and the warm start, with notes saying which won."""
    candidates = schedules(graph, cluster, prob, result.solution, algorithm) if result.solution else []
    if warm is not None:
        candidates.append((as_algorithm(warm, algorithm), "warm"))
    if not candidates:
        return None
    plan, how = min(candidates, key=lambda c: (c[0].makespan, c[1] == "warm"))
    by = {h: p.makespan for p, h in candidates}
    plan.notes = notes + [n for n in plan.notes if n not in notes]
    if how == "warm" or (warm is not None and plan.makespan >= warm.makespan * (1 - 1e-9)):
        plan.notes.append(f"CP-SAT found nothing better than the warm start (status {result.status})")
    else:
        others = ", ".join(f"{h} {fmt(t)}" for h, t in by.items() if h != how)
        plan.notes.append(f"kept the {how} CP-SAT schedule ({fmt(plan.makespan)}; {others})")
    return plan


def earliest_schedule(graph: Graph, cluster: Cluster, placement: Mapping[str, str],
                      order: Mapping[str, Sequence[str]], link_order: Mapping[tuple[str, str], Sequence[str]],
                      algorithm: str = ALGORITHM) -> Plan | None:
    """The earliest schedule that keeps the device orders and the link orders (None if they deadlock).

    Unlike `simulate` it keeps the solver's link order instead of first come, first served, and,
    as the model does, lets ops and transfers that take no time at all wait for their inputs only.
    """
    preds: dict[Any, list[Any]] = {}
    length: dict[Any, float] = {}
    for d, names in order.items():
        busy: str | None = None
        for name in names:
            op = graph.op(name)
            length[name] = op_cost(op, cluster.device(d))
            inputs = [p.name if placement[p.name] == d else (p.name, d) for p in op.producers()]
            preds[name] = inputs + ([busy] if busy is not None and length[name] > 0 else [])
            if length[name] > 0:
                busy = name
    sends = {(op.name, dst): nbytes for op in graph.ops for dst, nbytes in sorted(transfer_bytes(op, placement).items())}
    for (src, dst), nbytes in sends.items():
        preds[(src, dst)] = [src]
        length[(src, dst)] = cluster.transfer_time(placement[src], dst, nbytes)
    for (a, b), names in link_order.items():
        busy_send: tuple[str, str] | None = None
        for name in names:
            key = (name, b)
            if key not in sends or placement[name] != a:
                continue
            if busy_send is not None and length[key] > 0:
                preds[key].append(busy_send)
            if length[key] > 0:
                busy_send = key
    finish = longest_paths(preds, length)
    if finish is None:
        return None
    slots = {op.name: OpSlot(placement[op.name], finish[op.name] - length[op.name], finish[op.name])
             for op in graph.ops}
    transfers = [Transfer(src, placement[src], dst, finish[(src, dst)] - length[(src, dst)], finish[(src, dst)], nbytes)
                 for (src, dst), nbytes in sends.items()]
    return Plan(graph.name, algorithm, list(cluster.names), slots, transfers)


