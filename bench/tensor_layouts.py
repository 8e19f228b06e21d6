"""Tensor-parallel layouts and plans of GPT steps, as the note and docs/hybrid.md quote them.

`--layout`: the layout search (`passes/sharding/choose.py`) on the zoo's 12-layer GPT (d 1024, seq
1024, batch 16) at t ranks of H100s: the layout's simulated step (its ops one after another on a
rank) and peak per rank, beside every parameter whole and the MLP alone split as Megatron does.
`--plan OPTS`: place options on the 13B GPT step of issue 41 (40 layers, d 5120, seq 2048, batch
16, fp32) over 8 H100s: step, peak per device and planning time.

    python3 bench/tensor_layouts.py --layout 4
    python3 bench/tensor_layouts.py --plan "algo=auto tensor-parallel=4 data-parallel=1 microbatches=auto time-limit=120"
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.zoo_jax import lower_config, lower_model  # noqa: E402
from bench.zoo_jax_models import GptConfig  # noqa: E402
from pesto_ir.cluster import Cluster  # noqa: E402
from pesto_ir.passes.rewrite.replicas import collective_cost, mirror_groups  # noqa: E402
from pesto_ir.passes.rewrite.tensor_shard import TensorLayout  # noqa: E402
from pesto_ir.passes.sharding.choose import choose_layout, score_layout  # noqa: E402
from pesto_ir.passmanager import PassContext, PassManager  # noqa: E402
from pesto_ir.schedule.plan import read_plan_attrs  # noqa: E402

GPT13 = GptConfig(40, 5120, 40, 2048, 16, 51200)
MLP_SPLITS = {"fc.w": 1, "fc.b": 0, "out.w": 0}  # Megatron's MLP: columns, then rows


def layouts(t: int) -> None:
    graph = lower_model("gpt")
    cluster = Cluster.homogeneous(t, "h100")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    ring = collective_cost(cluster, mirror_groups(cluster, 1, t))
    device = cluster.devices[0]
    began = time.perf_counter()
    choice = choose_layout(graph, t, device, ring)
    seconds = time.perf_counter() - began
    mlp = TensorLayout(t, tuple((v.name, a) for v in graph.inputs for part, a in MLP_SPLITS.items()
                                if v.name.endswith(part) and ".blocks." in v.name))
    print(f"| layout, t = {t} | step ms | peak GiB per rank |\n|---|---|---|")
    for name, layout in (("every parameter whole", TensorLayout(t)), ("the MLP split (Megatron)", mlp),
                         (f"the search's ({choice.evaluations} layouts, {seconds:.1f} s)", choice.layout)):
        score = score_layout(graph, layout, device, ring)
        assert score is not None
        print(f"| {name} | {score.seconds * 1e3:.1f} | {score.peak / 2**30:.1f} |")
    print("\nsplit outside the blocks:", sorted(n for n, _ in choice.layout.splits if ".blocks." not in n))


def plan(options: str) -> None:
    graph = lower_config("gpt", GPT13)
    began = time.perf_counter()
    placed = PassManager(f"annotate-costs{{model=roofline}},place{{{options}}},expand").run(
        graph, PassContext(cluster=Cluster.homogeneous(8, "h100"), quiet=True))
    found = read_plan_attrs(placed)
    assert found is not None and found.peak_memory is not None
    print(f"place{{{options}}}: step {found.makespan:.3f} s, peak {max(found.peak_memory.values()) / 2**30:.1f} GiB, "
          f"planned in {time.perf_counter() - began:.1f} s ({len(graph.ops)} ops)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", type=int, metavar="T", help="the layout search on the zoo GPT at T ranks")
    ap.add_argument("--plan", metavar="OPTS", help="place options for the 13B GPT step on 8 H100s")
    args = ap.parse_args(argv)
    if args.layout is None and args.plan is None:
        ap.error("give --layout T or --plan OPTS")
    if args.layout is not None:
        layouts(args.layout)
    if args.plan is not None:
        plan(args.plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
