"""One row of the suite for one algorithm: `coarsen{target=200},place{algo=...}` on a zoo model at
k devices with place's default time limit, as `bench/suite.py` runs it, printing the place pass's
seconds, its limit and the plan (the hybrid search's summary). For checking a row quickly.

    python3 bench/place_row.py jax_gpt 8 [auto | "auto data-parallel=1 microbatches=1"]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pesto_ir  # noqa: E402
from bench.suite import default_time_limit, zoo  # noqa: E402
from pesto_ir.passmanager import PassContext, PassManager  # noqa: E402
from pesto_ir.plan import read_plan_attrs  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    models = {m.name: m for m in zoo(quick=False)}
    name, k, algo = argv[0], int(argv[1]), argv[2] if len(argv) > 2 else "auto"
    if name not in models:
        print(f"unknown model {name} (known: {', '.join(models)})", file=sys.stderr)
        return 2
    model = models[name]
    cluster = model.cluster(k)
    ctx = PassContext(cluster=cluster, quiet=True, seed=0)
    graph = PassManager("coarsen{target=200}", verify_each=False).run(pesto_ir.parse(str(model.build())), ctx)
    groups = {op.get("group") for op in graph.ops if "group" in op.attrs}
    limit = default_time_limit(len(groups) if groups else len(graph.ops))
    started = time.perf_counter()
    graph = PassManager(f"place{{algo={algo} time-limit={limit:g} seed=0}}", verify_each=False).run(graph, ctx)
    plan = read_plan_attrs(graph)
    assert plan is not None
    print(f"{name} k={k} {algo}: place {time.perf_counter() - started:.1f} s (limit {limit:g} s), "
          f"makespan {plan.makespan * 1e3:.4g} ms\n{plan.notes[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
