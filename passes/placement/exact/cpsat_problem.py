"""`cpsat`'s problem as plain data in integer ticks (`Problem`), and the messages of a solve: what
the caller sends the solver process (`Request`, with a `Hint`) and what comes back (`Result`, with a
`Solution`). The model itself is built from a `Problem` in that process (`cpsat_model`).

The same problem as the MILP of `ilp_model` (placement, per-device order, transfers sent once per
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
  Ops and transfers that take no time at all occupy no device or link (the overlap rule of docs/contracts.md, "Validity"
  only concerns spans of positive length).
- Memory per device, the makespan `T` above every op's end plus its tail (longest path after it)
  and above each device's load, and symmetry breaking between interchangeable devices (a unit may
  open device j of a class only once an earlier unit uses device j-1).

Time is integer: one tick is a power of ten of seconds chosen so that the warm start's makespan is
10^8 to 10^9 ticks (`resolution` in `plan.solver`). Durations are rounded *down*, so the model is a
relaxation of the real problem and its bound times the tick is a true lower bound, while the warm
start's times rounded down are a feasible hint. The solved placement and per-device orders are
timed exactly by `algo_cpsat`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.common import unit_indices
from pesto_ir.passes.placement.exact.common import allowed_devices, foreign_results, loose_upper_bound
from pesto_ir.passes.placement.exact.common import device_classes as _device_classes
from pesto_ir.schedule.memory import footprints
from pesto_ir.schedule.plan import Plan
from pesto_ir.util.errors import PestoError

TARGET_TICKS = 1e8  # the warm start's makespan in ticks is in [TARGET_TICKS, 10 * TARGET_TICKS)


class CpSatError(PestoError):
    pass


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
            ub_seconds = max(loose_upper_bound(ops, cluster, raw), 1e-9)
        unit_of, units = unit_indices(ops)
        footprint = footprints(graph)  # conservative: every byte held for the whole step
        unit_mem = [sum(footprint[ops[i].name] for i in members) for members in units]
        names = cluster.names
        links = [[cluster.links.get((a, b)) for b in names] for a in names]
        prob = Problem([op.name for op in ops], index, units, unit_of,
                       [allowed_devices(cluster, [ops[i] for i in members], unit_mem[u], CpSatError)
                        for u, members in enumerate(units)],
                       [], [[c == 0 for c in row] for row in raw],
                       [sorted(index[p.name] for p in op.producers()) for op in ops],
                       [foreign_results(ops[i], index, set(units[unit_of[i]])) for i in range(len(ops))],
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


def device_classes(prob: Problem) -> list[list[int]]:
    """Groups (of 2 or more) of interchangeable devices: same op costs, memory, allowed units and links."""
    first = {d: (tuple(row[d] for row in prob.cost), tuple(row[d] for row in prob.idle), prob.memory[d],
                 tuple(d in a for a in prob.allowed)) for d in range(prob.k)}
    return _device_classes(first, lambda a, b: (prob.latency[a][b], prob.bandwidth[a][b]))


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
    deterministic: float | None = None  # CP-SAT deterministic seconds (`cpsat.solve` always sets it)
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
    deterministic: float = 0.0  # CP-SAT's deterministic seconds of the search


class SolveInterrupted(KeyboardInterrupt):
    """Ctrl-C during a solve: the worker is stopped; `result` holds its last incumbent (if any)."""

    def __init__(self, result: Result) -> None:
        super().__init__("interrupted")
        self.result = result
