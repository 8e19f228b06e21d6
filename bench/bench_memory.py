"""Peak memory of the zoo's JAX training steps on one device: Pesto's count next to XLA's own.

For each model of `bench/zoo_jax.py` at full size, one training step is lowered, costed with the
roofline model of one H100 (80 GiB) and placed with `single`; its peak is the exact peak of that
schedule by tensor lifetimes (`pesto_ir.schedule.memory`). Beside it, the same step compiled by `jax.jit`
on this machine's backend: XLA's `memory_analysis()` (arguments + outputs + temporaries - aliases),
and the count the project used before lifetimes (every op's results and inputs held for the whole
step). Ratio = Pesto / XLA.

    python3 bench/bench_memory.py                       # the zoo as configured
    python3 bench/bench_memory.py --batch gpt=16 resnet=256 --models gpt resnet
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

from bench import zoo_jax  # noqa: E402
from pesto_ir.cluster.model import Cluster  # noqa: E402
from pesto_ir.frontends.jax import lower  # noqa: E402
from pesto_ir.passes.placement.options import PlaceOptions  # noqa: E402
from pesto_ir.passes.placement.registry import ALGORITHMS  # noqa: E402
from pesto_ir.passmanager import PassContext, PassManager  # noqa: E402
from pesto_ir.schedule.memory import footprints, peak_memory  # noqa: E402
from pesto_ir.util.units import human_bytes  # noqa: E402

GiB = 2**30


def step_and_args(name: str, batch: int | None) -> tuple[object, tuple[object, ...], str]:
    """The training step of zoo model `name` (its batch replaced when given) and abstract arguments."""
    entry = zoo_jax.ZOO[name]
    config = entry.configs["full"]
    if batch is not None:
        config = dataclasses.replace(config, batch=batch)
    model = entry.build(config)
    state = tuple(model.params for _ in range(entry.optimizer.slots))
    step = zoo_jax._train_step(f"{name}_full", model.loss, entry.optimizer)
    return step, (model.params, state, *model.batch), entry.describe(config)


def xla_bytes(step: object, args: tuple[object, ...]) -> int:
    stats = jax.jit(step).lower(*args).compile().memory_analysis()
    return (stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
            - stats.alias_size_in_bytes)


def measure(name: str, batch: int | None) -> dict[str, object]:
    step, args, what = step_and_args(name, batch)
    started = time.perf_counter()
    graph = lower(step, *args, param_argnums=(0, 1))
    cluster = Cluster.homogeneous(1, "h100")
    PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))
    plan = ALGORITHMS["single"].run(graph, cluster.with_memory(float("inf")), PlaceOptions(quiet=True))
    peak = peak_memory(graph, plan)[cluster.names[0]]
    ours = time.perf_counter() - started
    xla = xla_bytes(step, args)
    return {"model": name, "what": what, "ops": len(graph.ops), "peak": peak.nbytes,
            "peak_at": peak.time / plan.makespan if plan.makespan else 0.0, "xla": xla,
            "all_alive": sum(footprints(graph).values()), "seconds": ours}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(zoo_jax.MODELS), choices=zoo_jax.MODELS)
    parser.add_argument("--batch", nargs="*", default=[], metavar="MODEL=N", help="replace a model's batch size")
    args = parser.parse_args(argv)
    batches: dict[str, int] = {}
    for item in args.batch:
        model, _, n = item.partition("=")
        if model not in zoo_jax.MODELS or not n.isdigit() or int(n) < 1:
            parser.error(f"--batch takes MODEL=N with a zoo model and a positive whole number, not '{item}'")
        batches[model] = int(n)
    print(f"backend for XLA's figure: {jax.default_backend()} (jax {jax.__version__})\n")
    print("| model | step | ops | Pesto peak | XLA args+out+temp | Pesto / XLA | peak at | all alive (old count) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        r = measure(name, batches.get(name))
        print(f"| {r['model']} | {r['what']} | {r['ops']} | {human_bytes(r['peak'])} | {human_bytes(r['xla'])} | "
              f"{r['peak'] / r['xla']:.2f} | {100 * r['peak_at']:.0f}% of the step | {human_bytes(r['all_alive'])} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
