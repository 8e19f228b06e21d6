"""Train across processes: a plan over the devices of every process of a JAX job, next to `jax.jit`.

Run it through the local launcher (two processes of four CPU devices each, here on one machine):

    python -m pesto_ir.launch --processes 2 --local-devices 4 examples/train_multiprocess.py \
        [--model mlp|gpt] [--steps 3] [--algo expert]

Every process runs this same script. `pesto_ir.distributed.initialize()` joins the job; JAX then
sees the devices of both processes. Process 0 plans the training step over all of them (`expert`
by default: contiguous stages balanced by work, one per device, so the stages span both
processes and activations cross between them every step) and the other processes run its plan;
each process dispatches its own devices' stages. Parameters stay on the devices of their stage:
the step returns them as resident arrays, and feeding them back moves no weights.

The same step also runs under `jax.jit` on one device of each process, from the same parameters on
the same batches; `pesto_ir.distributed.fetch` brings every loss and parameter to every process,
and process 0 prints both losses and the largest difference of the parameters at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from train_common import make_train_step


def mlp(dim: int = 32, hidden: int = 128, classes: int = 10) -> tuple[Any, Any, Any]:
    """(init, loss, batch): a ReLU MLP on a seeded teacher-labelled data set."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((dim, classes)).astype(np.float32)

    def init(key: Any) -> Any:
        sizes = [dim, hidden, hidden, hidden, classes]
        keys = jax.random.split(key, len(sizes) - 1)
        return [{"w": jax.random.normal(k, (a, b)) * (2.0 / a) ** 0.5, "b": jnp.zeros(b)}
                for k, a, b in zip(keys, sizes, sizes[1:])]

    def loss(params: Any, x: Any, y: Any) -> Any:
        for layer in params[:-1]:
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
        return optax.softmax_cross_entropy_with_integer_labels(x @ params[-1]["w"] + params[-1]["b"], y).mean()

    def batch(step: int) -> tuple[Any, Any]:
        r = np.random.default_rng(1000 + step)
        x = r.standard_normal((64, dim)).astype(np.float32)
        return x, np.argmax(x @ teacher, axis=1).astype(np.int32)

    return init, loss, batch


def gpt() -> tuple[Any, Any, Any]:
    """(init, loss, batch): the small GPT of examples/train_gpt.py on seeded token batches."""
    import numpy as np

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import train_gpt

    def batch(step: int) -> tuple[Any, Any]:
        r = np.random.default_rng(2000 + step)
        tokens = r.integers(0, train_gpt.VOCAB, (8, train_gpt.SEQ + 1)).astype(np.int32)
        return tokens[:, :-1], tokens[:, 1:]

    return train_gpt.init, train_gpt.loss_fn, batch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--algo", default="expert", help="placement algorithm (process 0 plans)")
    ap.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                    help="adam (default), or sgd to compare every parameter closely: Adam divides each gradient by "
                         "its own size, so an entry whose gradient is zero in exact arithmetic (the GPT's attention "
                         "key bias: softmax ignores a shift common to all keys) moves by up to the learning rate on "
                         "rounding noise, which replicas summing in another order round differently")
    ap.add_argument("--data-parallel", type=lambda t: [int(x) for x in t.split(",")], default=[1],
                    help="replicas; a list like 1,2 trains once per value (2: one replica per process, each in "
                         "stages over its own devices)")
    opts = ap.parse_args(argv)

    import pesto_ir.distributed

    pesto_ir.distributed.initialize()  # before anything else touches JAX's devices

    import jax
    import optax

    import pesto_ir

    init, loss_fn, batch = mlp() if opts.model == "mlp" else gpt()
    optimizer = optax.adam(1e-3) if opts.optimizer == "adam" else optax.sgd(1e-2)
    train_step = make_train_step(loss_fn, optimizer)

    me = jax.process_index()
    print(f"process {me} of {jax.process_count()}: {len(jax.local_devices())} of {len(jax.devices())} devices "
          "are mine", flush=True)
    ok = True
    for d in opts.data_parallel:
        step = pesto_ir.parallelize(train_step, devices=jax.devices(), algo=opts.algo, param_argnums=(0, 1),
                                    quiet=True, data_parallel=d, microbatches=1)
        ok &= train(step, jax.jit(train_step), init, optimizer, batch, opts.steps, f"{opts.model}, data-parallel {d}")
    return 0 if ok else 1


def train(step: Any, reference: Any, init: Any, optimizer: Any, batch: Any, steps: int, label: str) -> bool:
    """`steps` steps of `step` (parallelized) and of `reference` (jax.jit on one device of this
    process) from the same start; whether they agree. Process 0 prints the plan and the losses."""
    import jax
    import numpy as np

    import pesto_ir.distributed

    me, local = jax.process_index(), jax.local_devices()[0]
    params = init(jax.random.PRNGKey(0))
    state = optimizer.init(params)
    ref_params, ref_state = jax.device_put((params, state), local)
    losses, ref_losses, seconds = [], [], []
    for i in range(steps):
        x, y = batch(i)
        started = time.perf_counter()
        params, state, loss = step(params, state, x, y)
        losses.append(float(pesto_ir.distributed.fetch(loss)))  # waits for the step: a collective
        seconds.append(time.perf_counter() - started)
        ref_params, ref_state, ref_loss = reference(ref_params, ref_state, jax.device_put(x, local),
                                                    jax.device_put(y, local))
        ref_losses.append(float(ref_loss))
    fetched = pesto_ir.distributed.fetch(params)
    diff = max(float(np.max(np.abs(a - np.asarray(b))))
               for a, b in zip(jax.tree_util.tree_leaves(fetched), jax.tree_util.tree_leaves(ref_params)))
    if me == 0:
        print(f"{label}: {describe(step)}")
        for i, (a, b, t) in enumerate(zip(losses, ref_losses, seconds)):
            print(f"  step {i}: loss {a:.6f} (jax.jit {b:.6f}), {t * 1e3:.1f} ms" + (" (plans and compiles)" if i == 0
                                                                                  else ""))
        print(f"  largest parameter difference from jax.jit: {diff:.3g}")
    ok = diff <= 1e-4 and all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(losses, ref_losses))
    print(f"process {me}, {label}: {'same as jax.jit' if ok else 'DIFFERS from jax.jit'}", flush=True)
    return ok


def span(step: Any) -> tuple[int, list[str], list[int], int]:
    """(replicas, the devices the plan uses, their processes, copies between processes per step)."""
    plan, placed_on = step.plan, step.executable.devices
    used = sorted({slot.device for slot in plan.ops.values()})
    replicas = 1
    if plan.parallelism is not None:  # replica 0's devices stand for their mirrors in the other replicas
        used = sorted({n for name in used for n in plan.parallelism.group(name)})
        replicas = plan.parallelism.data_parallel
    hosts = sorted({placed_on[name].process_index for name in used})
    crossing = sum(1 for m in step.executable.transfers
                   if placed_on[m.src].process_index != placed_on[m.dst].process_index)
    return replicas, used, hosts, crossing


def describe(step: Any) -> str:
    """The plan in a line: replicas, the devices and processes it uses, what crosses between them."""
    plan = step.plan
    replicas, used, hosts, crossing = span(step)
    return (f"{plan.algorithm}, {replicas} replica(s) over {len(used)} devices of processes {hosts}, simulated step "
            f"{plan.makespan * 1e3:.3f} ms; {crossing} copies between processes per step"
            + (f", {len(plan.collectives)} all-reduces across the replicas" if replicas > 1 else ""))


if __name__ == "__main__":
    sys.exit(main())
