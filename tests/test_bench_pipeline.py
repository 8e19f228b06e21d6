"""`bench/bench_pipeline.py`'s analysis: the least busiest-device load any placement of the
colocated units allows (`bench/unit_balance.py`, CP-SAT in a process of its own)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from strategies import v100s  # noqa: E402

from bench.bench_pipeline import unit_balance  # noqa: E402
from bench.unit_balance import in_own_process  # noqa: E402
from pesto_ir.ir.graph import Graph  # noqa: E402


def test_the_least_busiest_load_is_the_best_split() -> None:
    assert in_own_process([3, 5, 2, 7], 2, 10.0) == (9, True)  # {2, 7} against {3, 5}
    assert in_own_process([5, 5, 4, 3, 3], 2, 10.0) == (10, True)  # greedy largest-first gives 11
    assert in_own_process([9, 1, 1], 3, 10.0) == (9, True)  # one unit larger than total / k


def test_bert24s_units_cannot_balance_six_devices(bert24: Graph) -> None:
    """The MSR BERT-24 training layer graph at 6 devices: its 32 colocated units leave the busiest
    device above total / 6, and no split does better than the bound says."""
    from pesto_ir.schedule.bounds import fastest_costs

    cluster = v100s(6)
    least, optimal = unit_balance(bert24, cluster, seconds=120.0)  # about 1 s on a quiet machine
    total = sum(fastest_costs(bert24, cluster).values())
    assert optimal
    assert total / 6 < least < 1.2 * total / 6
