"""Plans across processes, measured: copies between processes, and simulated vs measured steps.

    python3 bench/bench_multiprocess.py [--processes 2] [--local-devices 4] [--steps 20]
                                        [--out bench/results/multiprocess.md]

It starts itself under the local launcher (`python -m pesto_ir.launch`); every process then

1. fits latency and bandwidth to copies between two devices of one process (`measure_links`) and
   to round trips between the first devices of processes 0 and 1 (`measure_host_link`): the
   cluster every plan below is made on;
2. for the MLP and the small GPT of `examples/train_multiprocess.py`, with data-parallel 1
   (`expert` stages over all devices, so the stages span the processes) and with one replica per
   process, plans the training step on that cluster, runs two steps to compile, then times
   `--steps` steps (each ends when every process holds the loss, `distributed.fetch`) and gives
   the median next to the plan's simulated step, and `jax.jit` on one device of process 0 beside.

Process 0 prints the table; `--out` writes it as markdown. On one machine the "network" is the
loopback interface and the devices are CPU threads of the same cores, so the figures say how the
model tracks this machine, not a cluster's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKER = "PESTO_BENCH_WORKER"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--local-devices", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    opts = ap.parse_args(argv)
    if os.environ.get(WORKER):
        return worker(opts.steps)
    env = {**os.environ, WORKER: "1"}
    proc = subprocess.run([sys.executable, "-m", "pesto_ir.launch", "--processes", str(opts.processes),
                           "--local-devices", str(opts.local_devices), __file__, "--steps", str(opts.steps)],
                          env=env, cwd=ROOT, capture_output=True, text=True)
    table = [line[len("[p0] "):] for line in proc.stdout.splitlines()
             if line.startswith("[p0] ") and not line.startswith("[p0] [Gloo]")]
    print("\n".join(table))
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    if opts.out is not None:
        head = (f"# Plans across processes\n\n`python3 bench/bench_multiprocess.py --processes {opts.processes} "
                f"--local-devices {opts.local_devices} --steps {opts.steps}`, {time.strftime('%Y-%m-%d')}.\n\n")
        opts.out.write_text(head + "\n".join(table) + "\n", encoding="utf-8")
    return 0


def worker(steps: int) -> int:
    import pesto_ir.distributed

    pesto_ir.distributed.initialize()
    import jax
    import optax

    import pesto_ir
    from pesto_ir.cluster.model import Cluster
    from pesto_ir.jaxrt.measure_collectives import measure_host_link, measure_links

    sys.path.insert(0, str(ROOT / "examples"))
    import train_multiprocess

    me, devices = jax.process_index(), jax.devices()
    intra = measure_links(devices, cache=False)
    across = measure_host_link(devices)
    cluster = Cluster.fully_connected(Cluster.from_jax_devices(devices).devices, *intra, across)
    say = print if me == 0 else (lambda *a, **k: None)
    say(f"Copies fitted to `jax.device_put` on this machine: within a process {intra[0] * 1e6:.1f} us + "
        f"bytes / {intra[1] / 1e9:.2f} GB/s; between processes {across[0] * 1e6:.1f} us + bytes / "
        f"{across[1] / 1e9:.3f} GB/s (half a round trip, 4 KiB to 16 MiB).\n")
    say("| model | replicas | devices (processes) | copies between processes | simulated step | measured step "
        "| measured / simulated | jax.jit, one device |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- |")
    optimizer = optax.adam(1e-3)
    for model in ("mlp", "gpt"):
        init, loss_fn, batch = train_multiprocess.mlp() if model == "mlp" else train_multiprocess.gpt()

        def train_step(params: Any, opt_state: Any, x: Any, y: Any, loss_fn: Any = loss_fn) -> Any:
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        jit_ms = _jit_step_ms(train_step, init, optimizer, batch, steps)
        for d in (1, 2):
            step = pesto_ir.parallelize(train_step, devices=devices, cluster=cluster, algo="expert",
                                        param_argnums=(0, 1), quiet=True, data_parallel=d, microbatches=1)
            measured = _timed(step, init, optimizer, batch, steps)
            _, used, hosts, crossing = train_multiprocess.span(step)
            simulated = step.plan.makespan * 1e3
            say(f"| {model} | {d} | {len(used)} ({', '.join(map(str, hosts))}) | {crossing} | {simulated:.3f} ms | "
                f"{measured:.3f} ms | {measured / simulated:.2f} | {jit_ms:.3f} ms |")
    return 0


def _timed(step: Any, init: Any, optimizer: Any, batch: Any, steps: int) -> float:
    """Median milliseconds of a step (after two to compile), each ended by fetching its loss."""
    import jax

    import pesto_ir.distributed

    params = init(jax.random.PRNGKey(0))
    state = optimizer.init(params)
    times = []
    for i in range(steps + 2):
        x, y = batch(i)
        started = time.perf_counter()
        params, state, loss = step(params, state, x, y)
        pesto_ir.distributed.fetch(loss)
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:]) * 1e3


def _jit_step_ms(train_step: Any, init: Any, optimizer: Any, batch: Any, steps: int) -> float:
    import jax

    local = jax.local_devices()[0]
    step = jax.jit(train_step)
    params = jax.device_put(init(jax.random.PRNGKey(0)), local)
    state = jax.device_put(optimizer.init(params), local)
    times = []
    for i in range(steps + 2):
        x, y = (jax.device_put(a, local) for a in batch(i))
        started = time.perf_counter()
        params, state, loss = step(params, state, x, y)
        loss.block_until_ready()
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:]) * 1e3


if __name__ == "__main__":
    sys.exit(main())
