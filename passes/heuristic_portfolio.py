"""The registry of placement algorithms by name, and the best plan of the heuristics.

`ALGORITHMS` holds the heuristics (Baechi's m-ETF, m-SCT, m-TOPO, the classic ETF and HEFT list
schedulers and the simple placers); the place pass (`passes/place.py`) adds the exact engines to the
same dict, since they may import this module and so cannot be imported by it. `best_heuristic_plan` is the exact engines' warm start and
the plan the place pass compares their coarse plans with.
"""

from __future__ import annotations

from pesto_ir.cluster import Cluster
from pesto_ir.errors import PestoError
from pesto_ir.ir import Graph
from pesto_ir.passes.algo_baechi import m_etf, m_sct, m_topo
from pesto_ir.passes.algo_list import etf, heft
from pesto_ir.passes.algo_simple import place_expert, place_random, place_single
from pesto_ir.placement import Algorithm, PlaceOptions, interrupted
from pesto_ir.plan import Plan
from pesto_ir.units import human_time
from pesto_ir.validate import check_plan

ALGORITHMS: dict[str, Algorithm] = {
    "m-etf": m_etf,
    "m-sct": m_sct,
    "m-topo": m_topo,
    "etf": etf,
    "heft": heft,
    "expert": place_expert,
    "single": place_single,
    "random": place_random,
}
# Tried for an exact solver's start, and against its expanded plan; `single` because on graphs with
# little parallelism one device beats every split (bert_l-6_training_op: 192.9 ms against ilp's 193.1).
WARM_START_ALGOS = ("m-etf", "m-sct", "m-topo", "etf", "heft", "expert", "single")


def best_heuristic_plan(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan | None:
    """The valid plan with the smallest makespan among the heuristics that succeed (None if none do)."""
    best: Plan | None = None
    for name in WARM_START_ALGOS:
        try:
            plan = check_plan(graph, cluster, ALGORITHMS[name](graph, cluster, options))
        except PestoError as e:
            options.progress(f"place: {name} gives no plan to start from: {str(e).splitlines()[0]}")
            continue
        except KeyboardInterrupt as e:
            raise interrupted(e, graph, best) from None
        if best is None or plan.makespan < best.makespan:
            best = plan
    if best is not None:
        options.progress(f"place: warm start from {best.algorithm} (makespan {human_time(best.makespan, 4)})")
    return best
