"""The heuristics by name, and the best plan of them.

`HEURISTICS` holds Baechi's m-ETF, m-SCT, m-TOPO, the classic ETF and HEFT list schedulers and the
simple placers; the registry of every algorithm (`placement/registry.py`) is built on it. The best
heuristic plan (`best_heuristic_plan`) is the exact engines' warm start and the plan their coarse
plans must beat on the fine graph. A heuristic added to `HEURISTICS` also gets a place in
`WARM_START_ALGOS` (the order of ties), `BUDGET_ORDER` and `RELATIVE_TIME` (its run time against
m-ETF's), or is left out of the portfolio on purpose, as `random` is.
"""

from __future__ import annotations

import math

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.heuristics.baechi import m_etf, m_sct, m_topo
from pesto_ir.passes.placement.heuristics.list_scheduling import etf, heft
from pesto_ir.passes.placement.heuristics.simple import place_expert, place_random, place_single
from pesto_ir.passes.placement.options import Algorithm, PlaceOptions, kept_on_interrupt
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError, first_reason
from pesto_ir.util.gc_pause import gc_paused
from pesto_ir.util.units import human_time

# Tried for an exact solver's start, and against its expanded plan; `single` because on graphs with
# little parallelism one device beats every split (bert_l-6_training_op: 192.9 ms against ilp's 193.1).
# Of plans as fast, the first in this order is kept.
WARM_START_ALGOS = ("m-etf", "m-sct", "m-topo", "etf", "heft", "expert", "single")
# The order they run in under a deadline: the ones that win on the large JAX graphs at k = 8 first
# (m-SCT on jax_gpt24 and jax_lstm_seq2seq, HEFT on jax_inception, one device on jax_resnet), and
# their run times relative to m-ETF's (on jax_gpt24's 8,347 ops at k = 8: m-ETF 5.5 s, m-SCT 8.7,
# ETF 5.4, HEFT 2.8, m-TOPO 1.7, expert 1.4, single 3.9), from which the time of the next is
# guessed by the ones run before.
BUDGET_ORDER = ("m-sct", "heft", "etf", "single", "m-etf", "m-topo", "expert")
RELATIVE_TIME = {"m-sct": 1.6, "m-etf": 1.0, "etf": 1.0, "heft": 0.5, "m-topo": 0.3, "expert": 0.25, "single": 0.7}


def _counted(name: str, run: Algorithm) -> Algorithm:
    """`run`, charging the work clock (`util/work.py`) its work per op (its tables, its plan's
    timing and peak); the list schedulers over pairs also charge their search as it goes, by the
    inputs they look up (`LinkQueues`)."""
    def placed(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
        work.charge("list-schedule-op", len(graph.ops))
        with gc_paused():  # one schedule's tables, alive until it ends: the collector would walk them again and again
            return run(graph, cluster, options)

    placed.__name__ = placed.__qualname__ = getattr(run, "__name__", name)
    placed.__doc__ = run.__doc__
    return placed


_RUNS: dict[str, Algorithm] = {
    "m-etf": m_etf,
    "m-sct": m_sct,
    "m-topo": m_topo,
    "etf": etf,
    "heft": heft,
    "expert": place_expert,
    "single": place_single,
    "random": place_random,
}
HEURISTICS: dict[str, Algorithm] = {name: _counted(name, run) for name, run in _RUNS.items()}


def best_heuristic_plan(graph: Graph, cluster: Cluster, options: PlaceOptions, until: float | None = None,
                        good_enough: float = 0.0) -> Plan | None:
    """The valid plan with the smallest makespan among the heuristics that succeed (None if none do).
    With `until` (a `work.now()` deadline), the heuristics run until one gives a plan, and
    each next one only if its time, guessed from those that gave one, ends before the deadline: on
    8,000-op graphs at 8 devices the seven take 30 s together, more than a whole default time limit.
    The first always runs, to its end unless its caller stops it (`work.stopping_at`); each after it
    stops once the work clock passes the deadline, and none starts after it, plan or not: where
    none fits in memory, each ran until it found out (on alpa-gpt-39B's 22,598 ops over 64 devices
    the seven took 233 s, of a 120 s limit).
    The first plan of at most `good_enough` seconds ends the search: none after it can gain enough
    to be worth its time (a 1 -> 50,000 star takes seconds per heuristic)."""
    found: dict[str, Plan] = {}
    skipped: list[str] = []
    per_unit: list[float] = []  # seconds per unit of `RELATIVE_TIME`, of each heuristic that gave a plan
    ran = False
    for name in BUDGET_ORDER if until is not None else WARM_START_ALGOS:
        if until is not None and (work.now() + max(per_unit) * RELATIVE_TIME[name] > until if per_unit
                                  else ran and work.now() >= until):
            skipped.append(name)
            continue
        # the first runs to its end (the plan every exact engine and auto's one-batch search must
        # never be slower than), each after it to the deadline; a caller's own deadline holds for all
        deadline = until if until is not None and ran else math.inf
        started, ran = work.now(), True
        try:
            with work.stopping_at(deadline):
                found[name] = check_plan(graph, cluster, HEURISTICS[name](graph, cluster, options))
        except PestoError as e:  # out of memory: no plan, and its time says little of the others'
            options.progress(f"place: {name} gives no plan to start from: {first_reason(e)}")
            continue
        except KeyboardInterrupt:
            raise kept_on_interrupt(options, graph, _fastest(found)) from None
        per_unit.append((work.now() - started) / RELATIVE_TIME[name])
        if found[name].makespan <= good_enough:
            return found[name]
    if skipped:
        options.progress(f"place: {', '.join(skipped)} not run: the time they were given had passed, or by the "
                         "times of the heuristics before them they would end past it")
    best = _fastest(found)
    if best is not None:
        options.progress(f"place: warm start from {best.algorithm} (makespan {human_time(best.makespan, 4)})")
    return best


def _fastest(found: dict[str, Plan]) -> Plan | None:
    """The fastest plan, the first in `WARM_START_ALGOS` order of those as fast."""
    ranked = [found[name] for name in WARM_START_ALGOS if name in found]
    return min(ranked, key=lambda p: p.makespan) if ranked else None
