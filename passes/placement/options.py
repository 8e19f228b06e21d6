"""What every placement algorithm shares: its options, its signature and its registry entry; and
what `place` and `expand` share (the coarse-plan note, PlaceError, require_cluster).

An algorithm takes a graph without groups (the `place` pass hands it the coarse quotient graph
when the graph was coarsened), a cluster and options, and returns a `Plan` with times for every
op and transfer. The `place` pass validates that plan before it is recorded.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passmanager import PassContext
from pesto_ir.schedule.plan import Plan, faster
from pesto_ir.util.errors import PestoError
from pesto_ir.util.loader import MAX_SECONDS

COARSE_NOTE = "coarse plan"  # first words of the note a coarse plan carries until `expand`


class PlaceError(PestoError):
    pass


def require_cluster(ctx: PassContext, pass_name: str) -> Cluster:
    """The cluster `place` and `expand` place on; a PlaceError naming the pass when none was given."""
    if ctx.cluster is None:
        raise PlaceError(f"{pass_name} needs a cluster to place on: give --devices N (with --device-kind) "
                         "or --cluster FILE")
    return ctx.cluster


def time_limit_problem(t: object) -> str | None:
    """Why `t` is no time limit (None when it is one): a positive finite number of seconds, at
    most `MAX_SECONDS` (1e300 s overflowed CP-SAT's deadline into a crash)."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        return f"must be a positive, finite number of seconds, not {t!r}"
    if t > MAX_SECONDS:
        return f"must be at most {MAX_SECONDS:g} seconds, not {t:g}"
    return None



@dataclass(frozen=True)
class PlaceOptions:
    time_limit: float = 30.0  # seconds for exact solvers
    seed: int = 0  # every random choice is seeded
    solver: str = "cbc"  # MILP backend for algo=ilp: cbc, or highs when installed
    threads: int = 1  # solver threads; 1 keeps runs deterministic
    warm_start: Plan | None = None  # best heuristic plan, for exact solvers to start from
    quiet: bool = False
    log: TextIO = field(default_factory=lambda: sys.stderr)
    incumbent: Incumbent = field(default_factory=lambda: Incumbent())  # the best plan so far, for Ctrl-C

    def progress(self, message: str) -> None:
        if not self.quiet:
            print(message, file=self.log, flush=True)


Algorithm = Callable[[Graph, Cluster, PlaceOptions], Plan]


@dataclass(frozen=True)
class AlgorithmEntry:
    """A placement algorithm and how the place pass runs it."""

    name: str
    run: Algorithm
    # Uses the time limit: its coarse plan meets the heuristics' plan of the fine graph, which it
    # must beat once expanded, and the default time limit is said when it applies.
    exact: bool = False
    warm_start: bool = False  # the best heuristic plan is its start (`PlaceOptions.warm_start`)
    # Refines its plan on the fine graph after the coarse solve and justifies its devices' orders
    # last, and searches data-parallel replicas x micro-batches when they are not given.
    portfolio: bool = False
    # Its solver stops by the wall clock (CBC counts no work of its own): it gets the whole time
    # limit as work, and the same input may give another plan on a busier machine.
    wall_bounded: bool = False


class Incumbent:
    """Where a stage of a search keeps the best valid plan it holds, for Ctrl-C to keep.

    Every stage writes to the sink in its options (`PlaceOptions.incumbent`). A stage that turns
    its inner stages' plans into plans of its own (a coarse plan projected on the fine ops, a
    replica's plan as the whole step's, a portfolio's summary) gives them a sink of their own and,
    on Ctrl-C, offers the result to its own sink (`kept_on_interrupt`); the KeyboardInterrupt goes
    on, and the place pass records what its sink holds. Each better plan is also reported (`report`:
    the MILP worker sends its incumbents to the process that waits for it)."""

    def __init__(self, report: Callable[[Plan], None] | None = None) -> None:
        self.graph: Graph | None = None  # the graph `plan` is a plan of
        self.plan: Plan | None = None
        self._report = report

    def offer(self, plan: Plan | None, graph: Graph) -> bool:
        """Keep `plan`, a valid plan of `graph`, when it is the first or faster than the one held
        (a tie keeps the one held); whether it was kept."""
        if plan is None or (self.plan is not None and not faster(plan.makespan, self.plan.makespan)):
            return False
        self.plan, self.graph = plan, graph
        if self._report is not None:
            self._report(plan)
        return True

    def plan_of(self, graph: Graph) -> Plan | None:
        """The plan held, when it is a plan of `graph`; else None."""
        return self.plan if self.graph is graph else None


def inner(options: PlaceOptions) -> PlaceOptions:
    """`options` with a sink of their own, for a stage whose plans the caller converts on Ctrl-C."""
    return dataclasses.replace(options, incumbent=Incumbent())


def kept_on_interrupt(options: PlaceOptions, graph: Graph, *plans: Plan | None) -> KeyboardInterrupt:
    """Ctrl-C in a stage placing `graph`: the fastest of `plans` (valid plans of `graph`, the first
    of those as fast) offered to the stage's sink; the interrupt to raise on."""
    for plan in plans:
        options.incumbent.offer(plan, graph)
    return KeyboardInterrupt()
