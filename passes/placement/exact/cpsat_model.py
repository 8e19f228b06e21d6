"""The CP-SAT model of a `Problem` (see `cpsat_problem` for the formulation), built and solved in the
solver process only: OR-tools and python-mip's CBC ship clashing builds of the same COIN-OR
libraries (`libOsi.so.0`), so this module must never be imported where CBC may run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ortools.sat.python import cp_model

from pesto_ir.passes.placement.exact.cpsat_problem import Hint, Problem, Request, Result, Solution, device_classes

STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
          cp_model.MODEL_INVALID: "model-invalid"}


class _Send:
    """A possible transfer of producer p's results to device d, from each possible source device."""

    def __init__(self, need: Any, start: Any, end: Any, present: dict[int, Any]) -> None:
        self.need = need  # literal: p is elsewhere and some result of p is read on d
        self.start = start
        self.end = end
        self.present = present  # source device -> literal


class CpModel:
    """The CP-SAT model of one problem, with its variables by role.

    `chains` are extra (before, after) op pairs that must run in that order (a neighbourhood keeps
    the order of the ops it does not free); `symmetry` adds symmetry breaking between
    interchangeable devices, which only a model whose placements are all free may use.
    """

    def __init__(self, prob: Problem, symmetry: bool = True, chains: Sequence[tuple[int, int]] = ()) -> None:
        self.prob = prob
        self.m = cp_model.CpModel()
        self.x: dict[tuple[int, int], Any] = {}
        self.S: list[Any] = []
        self.T: cp_model.IntVar  # the makespan, made by _ops
        self.y: dict[tuple[int, int, int], Any] = {}
        self.readers: dict[tuple[int, int, int], list[int]] = {}  # (p, d, k) -> ops on d reading result k
        self.read_bytes: dict[tuple[int, int, int], int] = {}  # (p, d, k) -> bytes of that result
        self.sends: dict[tuple[int, int], _Send] = {}
        self.durations: dict[tuple[int, int, int], Any] = {}  # (p, s, d): int or IntVar
        self.h: dict[tuple[int, int], Any] = {}  # symmetry: (unit, device) -> "used up to unit"
        self.classes = device_classes(prob) if symmetry else []
        self.n_intervals = 0
        self._placement()
        self._ops()
        self._transfers()
        for a, b in chains:
            self.m.add(self.S[b] >= self.end(a))
        self._symmetry()
        self.m.minimize(self.T)

    def size(self) -> str:
        proto = self.m.proto
        return f"{len(proto.variables)} variables, {len(proto.constraints)} constraints, {self.n_intervals} intervals"

    def xv(self, i: int, d: int) -> Any:
        """The literal of op i's unit on device d (None where the unit may not go)."""
        return self.x.get((self.prob.unit_of[i], d))

    def end(self, i: int) -> Any:
        prob = self.prob
        devices = prob.allowed[prob.unit_of[i]]
        costs = {prob.cost[i][d] for d in devices}
        if len(costs) == 1:
            return self.S[i] + costs.pop()
        return self.S[i] + sum(prob.cost[i][d] * self.xv(i, d) for d in devices)

    # ------------------------------------------------------------------ building
    def _placement(self) -> None:
        prob, m = self.prob, self.m
        for u, devices in enumerate(prob.allowed):
            for d in devices:
                self.x[(u, d)] = m.new_constant(1) if len(devices) == 1 else m.new_bool_var(f"x_{u}_{d}")
            if len(devices) > 1:
                m.add_exactly_one(self.x[(u, d)] for d in devices)
        # Conservative: every byte an op holds, and a copy of every tensor a device receives, held
        # for the whole step (a copy is there when a reader is and its producer is not).
        everything = sum(nbytes for sends in prob.sends for nbytes, _ in sends)
        for d, capacity in enumerate(prob.memory):
            on_d = [u for u in range(len(prob.units)) if d in prob.allowed[u] and prob.unit_mem[u] > 0]
            if sum(prob.unit_mem[u] for u in on_d) + everything <= capacity:
                continue
            copies = []
            for i, sends in enumerate(prob.sends):
                for r, (nbytes, readers) in enumerate(sends):
                    literals = [self.xv(c, d) for c in readers if self.xv(c, d) is not None]
                    if not nbytes or not literals:
                        continue
                    here = m.new_bool_var(f"copy_{i}_{r}_{d}")
                    own = self.xv(i, d)
                    for lit in literals:
                        m.add(here >= lit - own) if own is not None else m.add_implication(lit, here)
                    copies.append(nbytes * here)
            m.add(sum(prob.unit_mem[u] * self.x[(u, d)] for u in on_d) + sum(copies) <= int(capacity))

    def _ops(self) -> None:
        prob, m = self.prob, self.m
        n = prob.n
        self.T = m.new_int_var(min(prob.lb, prob.horizon), prob.horizon, "T")
        self.S = [m.new_int_var(prob.est[i], prob.latest_start(i), f"S_{i}") for i in range(n)]
        per_device: dict[int, list[Any]] = {d: [] for d in range(prob.k)}
        load: dict[int, list[Any]] = {d: [] for d in range(prob.k)}
        for i in range(n):
            u = prob.unit_of[i]
            for d in prob.allowed[u]:
                c = prob.cost[i][d]
                if not prob.idle[i][d]:  # an op that takes no time at all may sit anywhere (docs/contracts.md, "Validity")
                    per_device[d].append(m.new_optional_fixed_size_interval_var(self.S[i], c, self.x[(u, d)],
                                                                                f"I_{i}_{d}"))
                if c > 0:
                    load[d].append(c * self.x[(u, d)])
            m.add(self.T >= self.end(i) + prob.tail[i])
            for p in prob.producers[i]:
                m.add(self.S[i] >= self.end(p))
        for d, intervals in per_device.items():
            if len(intervals) > 1:
                m.add_no_overlap(intervals)
                self.n_intervals += len(intervals)
            if load[d]:
                m.add(self.T >= sum(load[d]))

    def _transfers(self) -> None:
        prob = self.prob
        per_link: dict[tuple[int, int], list[Any]] = {}
        for p in range(prob.n):
            if not prob.sends[p]:
                continue
            sources_all = prob.allowed[prob.unit_of[p]]
            for d in range(prob.k):
                sources = [s for s in sources_all if s != d]
                results = [(b, [c for c in users if d in prob.allowed[prob.unit_of[c]]]) for b, users in prob.sends[p]]
                results = [(b, users) for b, users in results if users]
                if not sources or not results:
                    continue
                send = self._send(p, d, sources, results)
                for s, lit in send.present.items():
                    interval = self.m.new_optional_interval_var(send.start, self.durations[(p, s, d)], send.end,
                                                                lit, f"L_{p}_{s}_{d}")
                    if prob.link_seconds(s, d, min(b for b, _ in results)) > 0:  # instant ones block nothing
                        per_link.setdefault((s, d), []).append(interval)
        for intervals in per_link.values():
            if len(intervals) > 1:
                self.m.add_no_overlap(intervals)
                self.n_intervals += len(intervals)

    def _send(self, p: int, d: int, sources: list[int], results: list[tuple[int, list[int]]]) -> _Send:
        prob, m = self.prob, self.m
        x_pd = self.xv(p, d)
        ys = []
        for k, (nbytes, users) in enumerate(results):
            y = m.new_bool_var(f"y_{p}_{d}_{k}")
            self.read_bytes[(p, d, k)] = nbytes
            for c in users:  # c on d and p elsewhere -> the result goes to d
                m.add_bool_or([self.xv(c, d).Not(), y] + ([x_pd] if x_pd is not None else []))
            if x_pd is not None:
                m.add_implication(y, x_pd.Not())
            m.add_bool_or([self.xv(c, d) for c in users] + [y.Not()])
            self.y[(p, d, k)] = y
            self.readers[(p, d, k)] = users
            ys.append(y)
        need = ys[0] if len(ys) == 1 else m.new_bool_var(f"need_{p}_{d}")
        if len(ys) > 1:
            m.add_max_equality(need, ys)
        release = prob.est[p] + prob.fast[p]
        start = m.new_int_var(release, max(release, prob.horizon), f"R_{p}_{d}")
        end = m.new_int_var(release, max(release, prob.horizon), f"A_{p}_{d}")
        m.add(start >= self.end(p))
        present = {}
        for s in sources:
            if len(prob.allowed[prob.unit_of[p]]) == 1:
                lit = need  # p's device is fixed (and is not d)
            else:
                lit = m.new_bool_var(f"z_{p}_{s}_{d}")
                xs = self.x[(prob.unit_of[p], s)]
                m.add_implication(lit, xs)
                m.add_implication(lit, need)
                m.add_bool_or([xs.Not(), need.Not(), lit])
            present[s] = lit
            self.durations[(p, s, d)] = self._duration(p, s, d, results, ys)
        for k, (_, users) in enumerate(results):
            for c in users:
                m.add(self.S[c] >= end).only_enforce_if([self.xv(c, d), ys[k]])
        send = _Send(need, start, end, present)
        self.sends[(p, d)] = send
        return send

    def _duration(self, p: int, s: int, d: int, results: list[tuple[int, list[int]]], ys: list[Any]) -> Any:
        """Ticks to send p's needed results from s to d: fixed when every result is read by the same ops."""
        prob = self.prob
        if len(results) == 1 or all(set(u) == set(results[0][1]) for _, u in results):
            return prob.ticks(prob.link_seconds(s, d, sum(b for b, _ in results)))
        latency = prob.ticks(prob.latency[s][d])
        parts = [prob.ticks(b / prob.bandwidth[s][d]) for b, _ in results]
        dur = self.m.new_int_var(latency, latency + sum(parts), f"D_{p}_{s}_{d}")
        self.m.add(dur == latency + sum(t * y for t, y in zip(parts, ys)))
        return dur

    def _symmetry(self) -> None:
        """Within a class of interchangeable devices, unit u may use the class's device j only
        if an earlier unit uses device j-1 (`h[u,j]`: some unit up to u uses device j)."""
        prob, m = self.prob, self.m
        for cls in self.classes:
            prev: list[Any] = [None] * len(cls)
            for u in range(len(prob.units)):
                if not all(d in prob.allowed[u] for d in cls):
                    continue
                for j in range(1, len(cls)):
                    if prev[j - 1] is None:
                        m.add(self.x[(u, cls[j])] == 0)
                    else:
                        m.add_implication(self.x[(u, cls[j])], prev[j - 1])
                cur: list[Any] = []
                for j in range(len(cls) - 1):
                    h = m.new_bool_var(f"h_{u}_{cls[j]}")
                    m.add_max_equality(h, [self.x[(u, cls[j])]] + ([prev[j]] if prev[j] is not None else []))
                    self.h[(u, cls[j])] = h
                    cur.append(h)
                prev = cur + [None]

    # ------------------------------------------------------------------ hint
    def hint(self, hint: Hint) -> None:
        """Every variable's value in the hinted plan (times rounded down): a feasible first solution."""
        hint = self._relabelled(hint)
        prob, m = self.prob, self.m
        dev = hint.device
        for (u, d), var in self.x.items():
            if len(prob.allowed[u]) > 1:
                m.add_hint(var, dev[prob.units[u][0]] == d)
        for i, var in enumerate(self.S):
            m.add_hint(var, hint.start[i])
        end = [hint.start[i] + prob.cost[i][dev[i]] for i in range(prob.n)]
        m.add_hint(self.T, max(end, default=0))
        for (p, d, k), y in self.y.items():
            m.add_hint(y, dev[p] != d and any(dev[c] == d for c in self.readers[(p, d, k)]))
        for (p, d), send in self.sends.items():
            need = (p, d) in hint.sends
            r = hint.sends.get((p, d), end[p])
            m.add_hint(send.start, r)
            dur = 0
            for s, lit in send.present.items():
                if lit is not send.need:
                    m.add_hint(lit, need and dev[p] == s)
                ticks = self._hint_duration(p, s, d, dev)
                if need and dev[p] == s:
                    dur = ticks
            m.add_hint(send.end, r + dur)
            if (p, d, 1) in self.y:  # several results: `need` is a variable of its own
                m.add_hint(send.need, need)
        first_use: dict[int, int] = {}
        for u, members in enumerate(prob.units):
            first_use.setdefault(dev[members[0]], u)
        for (u, d), h in self.h.items():
            m.add_hint(h, first_use.get(d, len(prob.units)) <= u)

    def _hint_duration(self, p: int, s: int, d: int, dev: list[int]) -> int:
        dur = self.durations[(p, s, d)]
        if isinstance(dur, int):
            return dur
        prob = self.prob
        total = prob.ticks(prob.latency[s][d])
        k = 0
        while (p, d, k) in self.y:
            if dev[p] != d and any(dev[c] == d for c in self.readers[(p, d, k)]):
                total += prob.ticks(self.read_bytes[(p, d, k)] / prob.bandwidth[s][d])
            k += 1
        self.m.add_hint(dur, total)
        return total

    def _relabelled(self, hint: Hint) -> Hint:
        """The hint with interchangeable devices renamed in order of first use, as symmetry breaking wants."""
        if not self.classes:
            return hint
        rename = list(range(self.prob.k))
        for cls in self.classes:
            first_use: list[int] = []
            for members in self.prob.units:
                d = hint.device[members[0]]
                if d in cls and d not in first_use:
                    first_use.append(d)
            first_use += [d for d in cls if d not in first_use]
            for new, old in zip(cls, first_use):
                rename[old] = new
        return Hint([rename[d] for d in hint.device], hint.start,
                    {(p, rename[d]): r for (p, d), r in hint.sends.items()})

    # ------------------------------------------------------------------ solving
    def solve(self, request: Request, report: Callable[[float, float], None] | None,
              incumbent: Callable[[Solution], None] | None = None) -> Result:
        """Solve within the request's limits; `report(objective, bound)` (ticks) sees each incumbent's
        objective, `incumbent` each incumbent itself (for the caller to keep on Ctrl-C)."""
        solver = cp_model.CpSolver()
        params = solver.parameters
        params.max_time_in_seconds = max(request.seconds, 0.05)
        if request.deterministic is not None:
            params.max_deterministic_time = max(request.deterministic, 0.01)
        params.num_workers = max(1, request.workers)
        params.random_seed = request.seed
        for key, value in request.params.items():
            setattr(params, key, value)
        callback = None
        if report is not None or incumbent is not None:
            callback = _Callback(report, (lambda found: incumbent(self._solution(found))) if incumbent else None)
            if report is not None:
                solver.best_bound_callback = callback.bound
        started = time.perf_counter()
        status = solver.solve(self.m, callback)
        elapsed = time.perf_counter() - started
        name = STATUS.get(status, "no-solution")
        if name == "model-invalid":
            raise RuntimeError(f"the CP-SAT model is invalid: {self.m.validate()}")
        has = name in ("optimal", "feasible")
        tick = self.prob.tick
        objective = solver.objective_value * tick if has else None
        bound = solver.best_objective_bound * tick if name != "infeasible" else None
        return Result(name, objective, bound, elapsed, self._solution(solver) if has else None,
                      deterministic=float(solver.deterministic_time))

    def _solution(self, solver: Any) -> Solution:
        prob = self.prob
        device = []
        for i in range(prob.n):
            u = prob.unit_of[i]
            device.append(next(d for d in prob.allowed[u] if solver.boolean_value(self.x[(u, d)])))
        start = [solver.value(s) for s in self.S]
        end = [start[i] + prob.cost[i][device[i]] for i in range(prob.n)]
        sends = {key: solver.value(send.start) for key, send in self.sends.items() if solver.boolean_value(send.need)}
        return Solution(device, start, end, sends)


class _Callback(cp_model.CpSolverSolutionCallback):
    """Passes each incumbent's objective, and the bound at most once a second, to `report`, and
    each better incumbent itself (read from this callback) to `incumbent`."""

    def __init__(self, report: Callable[[float, float], None] | None,
                 incumbent: Callable[[Any], None] | None) -> None:
        super().__init__()
        self.report = report
        self.incumbent = incumbent
        self.best = float("inf")
        self.low = float("-inf")
        self.last = time.perf_counter()

    def on_solution_callback(self) -> None:
        better = self.objective_value < self.best
        self.best = min(self.best, self.objective_value)
        self.low = max(self.low, self.best_objective_bound)
        self.last = time.perf_counter()
        if self.incumbent is not None and better:
            self.incumbent(self)
        if self.report is not None:
            self.report(self.best, self.low)

    def bound(self, bound: float) -> None:
        self.low = max(self.low, bound)
        if self.report is not None and time.perf_counter() - self.last >= 1.0:
            self.last = time.perf_counter()
            self.report(self.best, self.low)
