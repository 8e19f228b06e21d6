"""Tensor-parallel layouts and plans of GPT steps, as the note and docs/hybrid.md quote them.

`--layout`: the layout search (`passes/sharding/choose.py`) on the zoo's 12-layer GPT (d 1024, seq
1024, batch 16) at t ranks of H100s: the layout's simulated step (its ops one after another on a
rank) and peak per rank, beside every parameter whole and the MLP alone split as Megatron does.
`--plan OPTS`: place options on the 13B GPT step of issue 41 (40 layers, d 5120, seq 2048, batch
16, fp32) over 8 H100s: step, peak per device and planning time. `--acceptance LIMIT`: the search
against the fixed layouts issue 41 names (TP=8, TP=4 x PP=2, PP=8, FSDP over 8) on that step.

    python3 bench/tensor_layouts.py --layout 4
    python3 bench/tensor_layouts.py --plan "algo=auto tensor-parallel=4 data-parallel=1 microbatches=auto time-limit=120"
    python3 bench/tensor_layouts.py --acceptance 120
"""

from __future__ import annotations

import argparse
import math
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
from pesto_ir.util.errors import PestoError  # noqa: E402

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


# Issue 41's table: the search against fixed layouts of the 13B step, each built by the same engines
# on the same costs (a fixed layout's micro-batches, its best m, and the sharding of its state are
# still searched: `optimizer-state` and `parameters` stay auto unless the layout is FSDP).
ACCEPTANCE = (
    ("auto", "tensor-parallel=auto"),
    ("TP=8", "tensor-parallel=8 data-parallel=1"),
    ("TP=4 x PP=2", "tensor-parallel=4 data-parallel=1"),
    ("PP=8", "tensor-parallel=1 data-parallel=1"),
    ("FSDP over 8", "tensor-parallel=1 data-parallel=8 parameters=sharded"),
)


def plan(options: str) -> tuple[float, float, float, str]:
    """(step s, peak GiB per device, planning s, the strategy) of `options` on the 13B step."""
    graph = lower_config("gpt", GPT13)
    began = time.perf_counter()
    placed = PassManager(f"annotate-costs{{model=roofline}},place{{{options}}},expand").run(
        graph, PassContext(cluster=Cluster.homogeneous(8, "h100"), quiet=True))
    seconds = time.perf_counter() - began
    found = read_plan_attrs(placed)
    assert found is not None and found.peak_memory is not None
    par = found.parallelism
    strategy = "one batch" if par is None else (
        f"d={par.data_parallel} t={par.tensor_parallel} m={par.microbatches}"
        + (", params sharded" if par.parameters == "sharded" else
           ", state sharded" if par.optimizer_state == "sharded" else ""))
    return found.makespan, max(found.peak_memory.values()) / 2**30, seconds, strategy


def acceptance(limit: float) -> None:
    """Issue 41's table: the search and each fixed layout, `limit` seconds each; a layout that
    gets no plan says why."""
    print(f"| layout | step s | peak GiB per device | plan s (limit {limit:g}) | strategy |\n|---|---|---|---|---|")
    refused: list[tuple[str, float, str]] = []
    for name, opts in ACCEPTANCE:
        began = time.perf_counter()
        try:
            step, peak, seconds, strategy = plan(f"algo=auto {opts} microbatches=auto time-limit={limit:g}")
            print(f"| {name} | {step:.3f} | {peak:.1f} | {seconds:.1f} | {strategy} |", flush=True)
        except PestoError as e:
            seconds = time.perf_counter() - began
            print(f"| {name} | no plan | | {seconds:.1f} | (below) |", flush=True)
            refused.append((name, seconds, str(e)))
    for name, seconds, why in refused:  # each strategy's reason, whole: what a reader checks the table by
        print(f"\n{name}, no plan in {seconds:.1f} s: " + why.replace("; d=", ";\n- d="))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", type=int, metavar="T", help="the layout search on the zoo GPT at T ranks")
    ap.add_argument("--plan", metavar="OPTS", help="place options for the 13B GPT step on 8 H100s")
    ap.add_argument("--acceptance", type=float, metavar="LIMIT",
                    help="the search against TP=8, TP=4 x PP=2, PP=8 and FSDP over 8 on the 13B step, LIMIT s each")
    args = ap.parse_args(argv)
    if args.layout is None and args.plan is None and args.acceptance is None:
        ap.error("give --layout T, --plan OPTS or --acceptance LIMIT")
    if args.acceptance is not None and not (math.isfinite(args.acceptance) and args.acceptance > 0):
        ap.error(f"--acceptance must be a positive number of seconds, not {args.acceptance}")
    if args.layout is not None:
        layouts(args.layout)
    if args.plan is not None:
        step, peak, seconds, strategy = plan(args.plan)
        print(f"place{{{args.plan}}}: step {step:.3f} s, peak {peak:.1f} GiB, planned in {seconds:.1f} s ({strategy})")
    if args.acceptance is not None:
        acceptance(args.acceptance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
