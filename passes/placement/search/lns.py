"""Large-neighbourhood search: improve a plan by re-solving one part of it exactly at a time.

Exact models of whole graphs stall above a couple of hundred ops, but a model in which most ops
keep their device and their order on it is small, and its optimum is often a better plan. Each
step frees a neighbourhood of the incumbent, chosen in turn among

- a time slice: the ops that start in a window of the schedule,
- a device pair: ops of two devices (one of them on the critical path), which may only trade
  places between those two,
- a subgraph: ops around a critical op, grown through producers and consumers,

and re-solves it exactly with CP-SAT (`engine="cpsat"`: the model of `algo_cpsat` with the other
units' devices fixed and their per-device order kept by precedence constraints, built afresh for
each step in the solver process) or python-mip (`engine="ilp"`: the MILP of `ilp_model`, built once,
with every integer choice outside the neighbourhood fixed to the incumbent's by its `fix_outside`).
The solution is timed exactly (`simulate`, and the solver's link order) and kept only when its
makespan is smaller and its peak memory (tensor lifetimes) fits, so the result is never worse than
the start.

Each kind's neighbourhoods grow while their sub-problems are solved to optimality and shrink while
they time out.

The models count memory conservatively (every byte held for the whole step), which a plan that fits
by lifetimes may exceed: a heuristic's plan of a memory-tight graph (ResNet-50 training layers on 4
or 8 V100s) broke that rule on some device, so every step that could not move enough off it was
infeasible, and at 8 devices none ever got that far. So a CP-SAT step lets each device hold, by the
model's count, as much as the incumbent holds there (`relaxed_memory`), and the exact lifetime check
decides. (`ilp` steps keep the MILP's count as it is.)

Every random choice comes from `options.seed`, and with one worker (`options.threads`) each
CP-SAT sub-solve ends at a deterministic-time limit, so a run takes the same steps on any machine
and the time limit only decides how many (the last may be cut short). MILP steps end after seconds.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.budget import Budget
from pesto_ir.passes.placement.exact.common import as_algorithm, fmt, gap
from pesto_ir.passes.placement.exact.cpsat import SEARCH_PARAMS, schedules, solve, starting_plan
from pesto_ir.passes.placement.exact.cpsat_problem import Hint, Problem, Result, device_classes
from pesto_ir.passes.placement.exact.cpsat_worker import SolverProcess, shared_solver
from pesto_ir.passes.placement.exact.ilp_instance import Instance
from pesto_ir.passes.placement.exact.ilp_model import Milp, solver_name
from pesto_ir.passes.placement.options import PlaceOptions, kept_on_interrupt
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.memory import fits_memory
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.validate import check_plan, validate_plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError

# Every step models the whole graph (the ops outside its neighbourhood fixed), so past this many ops
# a step's model takes longer to build and send than its solve: on a 2048-op pipeline on 8
# devices one 1 s step took 6.8 s. Larger graphs are improved by local moves instead.
LNS_MAX_OPS = 1_000

ENGINES = ("cpsat", "ilp")
KINDS = ("time slice", "device pair", "subgraph")
FIRST_SIZE = 24  # ops freed in the first neighbourhood
MIN_SIZE = 4
GROW, SHRINK = 1.25, 0.8
# CP-SAT deterministic seconds per step: about 3 s of wall clock on the shared 2-core machine
# this was tuned on; it, not the wall-clock cap, ends a step, so runs repeat step for step.
STEP_DETERMINISTIC = 1.0
STEP_SECONDS = 10.0  # wall-clock cap of one CP-SAT step (a safety net)
ILP_STEP_SECONDS = 3.0  # the MILP's limit per step (CBC has no deterministic limit)
MIN_STEP_SECONDS = 0.2  # below this much time left no step is started
IMPROVEMENT = 1e-9  # relative: smaller gains are float noise


class LnsError(PestoError):
    pass


def improve_with_lns(graph: Graph, cluster: Cluster, options: PlaceOptions, engine: str = "cpsat",
                     start: Plan | None = None) -> Plan:
    """The best plan found from `start` (default: `options.warm_start`, else a heuristic plan)
    within `options.time_limit`; never worse than the start."""
    budget = Budget.start(options.time_limit)
    if engine not in ENGINES:
        raise LnsError(f"unknown LNS engine '{engine}' (choose one of: {', '.join(ENGINES)})")
    notes: list[str] = []
    if start is None:
        try:
            start, notes = starting_plan(graph, cluster, options)
        except KeyboardInterrupt:
            raise kept_on_interrupt(options, graph, options.warm_start) from None
        if start is None:
            raise LnsError(f"LNS needs a plan to start from and no heuristic plan of '{graph.name}' fits in memory")
    problems = validate_plan(graph, cluster, start)
    if problems:
        raise LnsError(f"the LNS start plan for '{graph.name}' is invalid: {problems[0]}")
    search = _Search(graph, cluster, options, engine, start, budget, shared_solver())
    try:
        plan = search.run()
    except KeyboardInterrupt:  # the incumbent stands: every step's plan was timed exactly
        options.progress(f"{search.algorithm}: interrupted after {len(search.steps)} steps; keeping the best "
                         f"plan found so far ({fmt(search.best.makespan)})")
        plan = search._finish("interrupted")
        plan.notes[:0] = notes
        raise kept_on_interrupt(options, graph, check_plan(graph, cluster, plan)) from None
    plan.notes[:0] = notes
    return check_plan(graph, cluster, plan)


@dataclass
class _Step:
    kind: str
    free: int  # ops freed
    status: str
    improved: bool


class _Search:
    """One LNS run: the incumbent, the neighbourhood size and the random stream."""

    def __init__(self, graph: Graph, cluster: Cluster, options: PlaceOptions, engine: str, start: Plan,
                 budget: Budget, proc: SolverProcess) -> None:
        self.graph, self.cluster, self.engine, self.proc = graph, cluster, engine, proc
        self.options = options
        self.quiet = dataclasses.replace(options, quiet=True)
        self.budget = budget
        self.algorithm = f"{engine}-lns"
        self.start = start
        self.best = as_algorithm(start, self.algorithm)
        self.lb = lower_bound(graph, cluster) if graph.ops else 0.0
        self.rng = random.Random(options.seed)
        self.size = dict.fromkeys(KINDS, float(min(FIRST_SIZE, len(graph.ops))))  # ops to free, per kind
        self.steps: list[_Step] = []
        self.prob = Problem.build(graph, cluster, start.makespan, self.lb) if graph.ops else None
        self.classes = device_classes(self.prob) if self.prob is not None else []
        self.ilp: Milp | None = None  # engine "ilp": the MILP of the whole graph, built on the first step
        self.capacity = {d.name: d.memory for d in cluster.devices}

    @property
    def problem(self) -> Problem:
        """The scheduling problem; there is one whenever a step runs (`_worth_searching`)."""
        assert self.prob is not None, "LNS step on an empty graph"
        return self.prob

    def left(self) -> float:
        return self.budget.left()

    def run(self) -> Plan:
        if not self._worth_searching():
            return self._finish("optimal" if self.best.makespan <= self.lb * (1 + 1e-9) else "skipped")
        self.options.progress(f"{self.algorithm}: {self.graph.name}: {len(self.graph.ops)} ops on "
                              f"{len(self.cluster)} devices; start {fmt(self.best.makespan)}, lower bound {fmt(self.lb)}")
        overhead = 0.0  # the most a step spent outside the solver's own search (building, timing)
        while self.left() > MIN_STEP_SECONDS + overhead and self.best.makespan > self.lb * (1 + 1e-9):
            kind = KINDS[len(self.steps) % len(KINDS)]
            free = self._neighbourhood(kind)
            began = work.now()
            result, plan = self._solve(free)
            overhead = max(overhead, work.now() - began - self._search_work(result))
            improved = plan is not None and plan.makespan < self.best.makespan * (1 - IMPROVEMENT)
            if plan is not None and improved:
                self.best = plan
            self.steps.append(_Step(kind, sum(len(self.problem.units[u]) for u in free), result.status, improved))
            self._adapt(kind, result.status)
            self._report(improved)
        return self._finish("optimal" if self.best.makespan <= self.lb * (1 + 1e-9) else "feasible")

    def _search_work(self, result: Result) -> float:
        """The counted work of a step's search itself, not of building or timing around it: CP-SAT's
        deterministic seconds at their rate (never its wall clock, which a busy machine stretches:
        the steps taken would depend on the load), or CBC's seconds, which the wall clock stops."""
        if self.engine == "cpsat":
            return work.RATES["cpsat"] * result.deterministic
        return result.seconds - result.setup_seconds

    def _worth_searching(self) -> bool:
        return (self.prob is not None and len(self.cluster) > 1 and self.best.makespan > self.lb * (1 + 1e-9)
                and len(self.prob.units) > 1)

    def _adapt(self, kind: str, status: str) -> None:
        """Grow a kind's neighbourhoods while they are solved to optimality, shrink them while not."""
        n = len(self.graph.ops)
        if status in ("optimal", "infeasible"):
            self.size[kind] = min(float(n), self.size[kind] * GROW)
        else:
            self.size[kind] = max(float(MIN_SIZE), self.size[kind] * SHRINK)

    def _report(self, improved: bool) -> None:
        k = len(self.steps)
        if improved or k % 10 == 0:
            step = self.steps[-1]
            elapsed = self.budget.spent()
            self.options.progress(f"{self.algorithm}: {elapsed:6.1f}s  step {k} ({step.kind}, {step.free} ops, "
                                  f"{step.status})  incumbent {fmt(self.best.makespan)}  bound {fmt(self.lb)}")

    def _finish(self, status: str) -> Plan:
        plan = self.best
        improved = sum(s.improved for s in self.steps)
        bound = min(self.lb, plan.makespan)
        plan.lower_bound = bound
        plan.solver = {"name": f"{'cp-sat' if self.engine == 'cpsat' else self.options.solver}-lns",
                       "status": status, "gap": gap(plan.makespan, bound), "bound": bound,
                       "seconds": round(self.budget.spent(), 3), "objective": plan.makespan,
                       "steps": len(self.steps), "improvements": improved}
        if self.steps:
            plan.notes.append(f"LNS ({self.engine}): {len(self.steps)} steps, {improved} improvements, "
                              f"{fmt(self.start.makespan)} -> {fmt(plan.makespan)}")
        else:
            plan.notes.append(f"LNS ({self.engine}): no step needed or possible; kept the start plan")
        return plan

    # ------------------------------------------------------------------ neighbourhoods
    def _devices(self) -> list[int]:
        names = self.cluster.names
        return [names.index(self.best.ops[n].device) for n in self.problem.names]

    def _neighbourhood(self, kind: str) -> dict[int, list[int]]:
        """Free units -> the devices each may use."""
        prob, rng = self.problem, self.rng
        want = max(MIN_SIZE, int(self.size[kind]))
        dev = self._devices()
        offered = self._offered(dev)
        here = [dev[members[0]] for members in prob.units]  # each unit's device: always offered to it, as
        # `allowed` (by the conservative count) may leave it out on a memory-tight plan

        def choices(u: int, devices: Iterable[int]) -> list[int]:
            return [d for d in devices if d == here[u] or d in prob.allowed[u]]

        everywhere = {u: choices(u, sorted(offered)) for u in range(len(prob.units))}
        if kind == "time slice":
            by_start = sorted(range(prob.n), key=lambda i: (self.best.ops[prob.names[i]].start, i))
            first = rng.randrange(max(1, len(by_start) - want + 1))
            ops = by_start[first:first + want]
            return {prob.unit_of[i]: everywhere[prob.unit_of[i]] for i in ops}
        critical = self._critical_ops()
        seed = rng.choice(critical) if critical and rng.random() < 0.7 else rng.randrange(prob.n)
        if kind == "device pair" and len(self.cluster) > 1:
            a = dev[seed]
            b = rng.choice([d for d in range(prob.k) if d != a and d in offered])
            at = self.best.ops[prob.names[seed]].start
            on = sorted((i for i in range(prob.n) if dev[i] in (a, b)),
                        key=lambda i: (abs(self.best.ops[prob.names[i]].start - at), i))
            pair = [a, b]
            return {prob.unit_of[i]: choices(prob.unit_of[i], pair) for i in on[:want]}
        return {prob.unit_of[i]: everywhere[prob.unit_of[i]] for i in self._grow(seed, want)}

    def _offered(self, dev: list[int]) -> set[int]:
        """The devices a step may move ops to: those the incumbent uses, and of the unused devices
        of each class of interchangeable ones only the first: a step that may open any of five
        empty V100s searches five times over the same plans (on ResNet-50's training layers at 8
        devices, from ETF's plan on 3, the steps then took about 4 times as long as at 4 devices;
        with one empty device offered, the first steps are those of 4 devices)."""
        used = set(dev)
        offered = set(range(self.problem.k))
        for members in self.classes:
            offered -= set([d for d in members if d not in used][1:])
        return offered

    def _grow(self, seed: int, want: int) -> list[int]:
        """Up to `want` ops reached from `seed` through producers and consumers, nearest first."""
        prob = self.problem
        consumers: list[list[int]] = [[] for _ in range(prob.n)]
        for i, ps in enumerate(prob.producers):
            for p in ps:
                consumers[p].append(i)
        seen = {seed}
        frontier = [seed]
        while frontier and len(seen) < want:
            nxt = []
            for i in frontier:
                for j in prob.producers[i] + consumers[i]:
                    if j not in seen and len(seen) < want:
                        seen.add(j)
                        nxt.append(j)
            self.rng.shuffle(nxt)
            frontier = nxt
        return sorted(seen)

    def _critical_ops(self) -> list[int]:
        """Ops of the incumbent that end exactly when something after them on their path starts:
        walking back from the last op through whatever it waited for (device or input)."""
        prob, plan = self.problem, self.best
        slot = {i: plan.ops[n] for i, n in enumerate(prob.names)}
        arrive = {(t.src, t.to): t for t in plan.transfers}
        by_device: dict[str, list[int]] = {}
        for j in sorted(slot, key=lambda j: (slot[j].start, slot[j].end)):
            by_device.setdefault(slot[j].device, []).append(j)
        before = {j: (seq[k - 1] if k else None) for seq in by_device.values() for k, j in enumerate(seq)}
        i: int | None = max(slot, key=lambda j: slot[j].end)
        out: list[int] = []
        tol = 1e-12 + 1e-9 * plan.makespan
        while i is not None and len(out) < prob.n:
            out.append(i)
            s = slot[i].start
            nxt: int | None = None
            for p in prob.producers[i]:
                t = arrive.get((prob.names[p], slot[i].device))
                ready = t.end if t is not None and slot[p].device != slot[i].device else slot[p].end
                if abs(ready - s) <= tol:
                    nxt = p
                    break
            prev = before[i]
            if nxt is None and prev is not None and abs(slot[prev].end - s) <= tol:
                nxt = prev
            i = nxt
        return out

    # ------------------------------------------------------------------ one exact step
    def _solve(self, free: Mapping[int, list[int]]) -> tuple[Result, Plan | None]:
        """Re-solve the neighbourhood; the best exact timing of the solution that fits in memory
        (None without one)."""
        seconds = min(STEP_SECONDS if self.engine == "cpsat" else ILP_STEP_SECONDS, self.left())
        seed = self.rng.randrange(2**31)
        options = dataclasses.replace(self.quiet, seed=seed, time_limit=seconds)
        if self.engine == "cpsat":
            result = self._cpsat_step(free, options)
            timed = [p for p, _ in schedules(self.graph, self.cluster, self.problem, result.solution,
                                             self.algorithm)] if result.solution else []
        else:
            result, timed = self._ilp_step(free, options)
        timed = [p for p in timed if fits_memory(self.graph, p, self.capacity)]
        if not timed:
            return result, None
        plan = min(timed, key=lambda p: p.makespan)
        plan.algorithm = self.algorithm
        plan.notes = list(self.best.notes)
        return result, plan

    def _fixed(self, free: Mapping[int, list[int]]) -> tuple[Problem, list[tuple[int, int]]]:
        """The sub-problem with every unit outside `free` on its device, and the order of those
        units' ops on each device as (before, after) pairs of ops that take time."""
        prob = self.problem
        dev = self._devices()
        held = {u: [dev[members[0]]] for u, members in enumerate(prob.units) if u not in free}
        sub = prob.restricted({**held, **free}, self.best.makespan)
        sub.memory = relaxed_memory(prob, dev)
        chains: list[tuple[int, int]] = []
        for d in self.cluster.names:
            kept = [prob.index[n] for n in self.best.device_order(d)]
            kept = [i for i in kept if prob.unit_of[i] not in free and not prob.idle[i][dev[i]]]
            chains.extend(zip(kept, kept[1:]))
        return sub, chains

    def _cpsat_step(self, free: Mapping[int, list[int]], options: PlaceOptions) -> Result:
        sub, chains = self._fixed(free)
        return solve(self.proc, sub, Hint.of(sub, self.cluster, self.best), options, options.time_limit,
                     self.algorithm, chains=chains, symmetry=False, deterministic=STEP_DETERMINISTIC,
                     params=dict(SEARCH_PARAMS))

    def _ilp_step(self, free: Mapping[int, list[int]], options: PlaceOptions) -> tuple[Result, list[Plan]]:
        """The MILP of `ilp_model`, built once per run, with every integer choice that involves no
        free unit fixed to the incumbent's (its `fix_outside`), and the free units kept off the
        devices their neighbourhood does not offer."""
        milp = self._milp()
        names = [op.name for op in milp.inst.ops]
        ilp_unit = {self.problem.unit_of[self.problem.index[names[members[0]]]]: u
                    for u, members in enumerate(milp.inst.units)}
        values = milp.start_values(self.best)
        milp.fix_outside(values, {ilp_unit[u] for u in free})
        barred = [var for u, devices in free.items() for (v, d), var in milp.x.items()
                  if v == ilp_unit[u] and d not in devices]
        for var in barred:
            var.ub = 0.0
        milp.set_start(values)
        try:
            solved = milp.solve(options.time_limit, live=False)
            timed = [p for p, _ in milp.realize()] if solved.has_solution else []
        finally:
            milp.unfix()
            for var in barred:
                var.ub = 1.0
        return Result(solved.status, solved.objective, solved.bound, solved.seconds), timed

    def _milp(self) -> Milp:
        if self.ilp is None:
            inst = Instance.build(self.graph, self.cluster, self.best.makespan, self.lb)
            self.ilp = Milp(inst, solver_name(self.options.solver), self.quiet)
            self.ilp.drop_symmetry()
        return self.ilp


def relaxed_memory(prob: Problem, dev: list[int]) -> list[float]:
    """Each device's capacity, or more where the placement `dev` (a device per op) holds more there
    by the model's conservative count (every unit's bytes, and a copy of every tensor a device
    receives, for the whole step): the incumbent stays a solution of the step's model."""
    held = [0.0] * prob.k
    for u, members in enumerate(prob.units):
        held[dev[members[0]]] += prob.unit_mem[u]
    for i, sends in enumerate(prob.sends):
        for nbytes, readers in sends:
            for d in {dev[c] for c in readers} - {dev[i]}:
                held[d] += nbytes
    return [max(capacity, used) for capacity, used in zip(prob.memory, held)]
