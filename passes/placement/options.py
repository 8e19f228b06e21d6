"""What every placement algorithm shares: its options, its signature and its registry entry; and
what `place` and `expand` share (the coarse-plan note, PlaceError, require_cluster).

An algorithm takes a graph without groups (the `place` pass hands it the coarse quotient graph
when the graph was coarsened), a cluster and options, and returns a `Plan` with times for every
op and transfer. The `place` pass validates that plan before it is recorded.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passmanager import PassContext
from pesto_ir.schedule.plan import Plan
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
    on_incumbent: Callable[[Plan], None] | None = None  # told each better plan as a solver finds it

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


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during placement, carrying the best valid plan the search held: `plan` of `graph`
    (the graph being placed, its coarse quotient or a replica graph), or None when it had none.

    Each layer of a search that holds plans of its own catches it and raises its own with the
    faster plan (`interrupted`), in its own graph's terms; the place pass records what arrives,
    and the pipeline goes on, as it does when the MILP worker is interrupted."""

    def __init__(self, plan: Plan | None, graph: Graph | None) -> None:
        super().__init__("interrupted")
        self.plan = plan
        self.graph = graph


def carried_plan(caught: BaseException, graph: Graph) -> Plan | None:
    """The plan the interrupt `caught` carries, when it is a plan of `graph`; else None."""
    return caught.plan if isinstance(caught, Interrupted) and caught.graph is graph else None


def interrupted(caught: BaseException, graph: Graph, *plans: Plan | None) -> Interrupted:
    """What a layer placing `graph` raises on Ctrl-C: the fastest of its `plans` (valid plans of
    `graph`) and the plan `caught` carries, when that is a plan of `graph` too."""
    found = [p for p in (carried_plan(caught, graph), *plans) if p is not None]
    return Interrupted(min(found, key=lambda p: p.makespan) if found else None, graph)
