"""The one registry of placement algorithms: every name `place{algo=...}` takes, the function that
runs it, and what the place pass does around it (an `AlgorithmEntry`'s fields), so that no code
asks for an algorithm by its name.

The heuristics come from `heuristics/portfolio.py`; the exact engines and `auto`'s search are
registered here when the solver they need is installed (python-mip for `ilp`, OR-tools for the
others; CP-SAT runs in a worker process, so its modules import without OR-tools). The MILP's
worker module is imported on first use: it imports python-mip, which costs more start-up than
`pesto-compile --help` or a heuristic run takes.
"""

from __future__ import annotations

import importlib.util

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.exact.cpsat import place_cpsat
from pesto_ir.passes.placement.heuristics.portfolio import HEURISTICS
from pesto_ir.passes.placement.options import Algorithm, AlgorithmEntry, PlaceError, PlaceOptions
from pesto_ir.passes.placement.search.auto import place_auto
from pesto_ir.passes.placement.search.lns import improve_with_lns
from pesto_ir.schedule.plan import Plan


def _place_ilp(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """The exact MILP, solved in a worker process: a solver crash or Ctrl-C keeps the best plan found so far."""
    from pesto_ir.passes.placement.exact.ilp_worker import place_ilp_in_worker  # start-up: python-mip

    return place_ilp_in_worker(graph, cluster, options)


def _place_lns(engine: str) -> Algorithm:
    """Large-neighbourhood search re-solving one part of the plan at a time with `engine`."""

    def place(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
        return improve_with_lns(graph, cluster, options, engine=engine)

    return place


def _registry() -> dict[str, AlgorithmEntry]:
    entries = [AlgorithmEntry(name, run) for name, run in HEURISTICS.items()]
    if importlib.util.find_spec("mip") is not None:
        entries += [AlgorithmEntry("ilp", _place_ilp, exact=True, warm_start=True, wall_bounded=True),
                    AlgorithmEntry("ilp-lns", _place_lns("ilp"), exact=True, wall_bounded=True)]
    if importlib.util.find_spec("ortools") is not None:
        entries += [AlgorithmEntry("cpsat", place_cpsat, exact=True),
                    AlgorithmEntry("cpsat-lns", _place_lns("cpsat"), exact=True),
                    AlgorithmEntry("auto", place_auto, exact=True, portfolio=True)]
    return {e.name: e for e in entries}


ALGORITHMS: dict[str, AlgorithmEntry] = _registry()
# the portfolio where OR-tools is installed (it keeps the MILP's model where that helps, through
# CP-SAT); the paper's MILP (`ilp`) stays a name away; m-ETF without either solver
DEFAULT_ALGO = next(name for name in ("auto", "ilp", "m-etf") if name in ALGORITHMS)


def algorithm(name: str) -> AlgorithmEntry:
    """The entry of `name`; a PlaceError listing the known names when there is none."""
    found = ALGORITHMS.get(name)
    if found is None:
        raise PlaceError(f"unknown placement algorithm '{name}' (known: {', '.join(sorted(ALGORITHMS))})")
    return found
