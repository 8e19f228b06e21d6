"""The benchmark suite's model zoo: the MSR graphs and the JAX models, each with the cluster it runs on.

MSR graphs (`graphs/msr`, from the NeurIPS 2020 device-placement paper) carry their
measured op costs and tensor sizes; they are placed on the paper's cluster: V100s with 16 GiB and
links of 10 us + bytes / 50 GB/s. The JAX models (`bench/zoo_jax.py`) are lowered by the frontend
and costed with the roofline model of a datasheet H100 (80 GiB, NVLink at 450 GB/s, 10 us), so
their numbers do not depend on the machine the suite runs on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pesto_ir
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passmanager import PassContext, PassManager

MSR = Path(__file__).resolve().parents[1] / "graphs" / "msr"  # the MSR graphs, in the repository
MSR_MEMORY = 16 * 2**30
MSR_LATENCY = 1e-5
MSR_BANDWIDTH = 50e9
JAX_KIND = "h100"

QUICK_MSR = ("bert24_training_layer", "gnmt_training_layer")
QUICK_JAX = ("mlp", "lstm_seq2seq")


@dataclass(frozen=True)
class Model:
    """One zoo entry: how to build its costed graph and the cluster of k devices it is placed on."""

    name: str
    source: str  # "msr" or "jax"
    description: str
    build: Callable[[], Graph]
    cluster: Callable[[int], Cluster]


def msr_cluster(k: int) -> Cluster:
    return Cluster.homogeneous(k, "v100", memory=MSR_MEMORY, latency=MSR_LATENCY, bandwidth=MSR_BANDWIDTH)


def jax_cluster(k: int) -> Cluster:
    return Cluster.homogeneous(k, JAX_KIND)


def msr_names() -> list[str]:
    return sorted(p.stem for p in MSR.glob("*.json"))


def msr_model(name: str) -> Model:
    kind = "operator" if name.endswith("_op") else "layer"
    phase = "training" if "_training" in name else "inference"
    return Model(name, "msr", f"MSR {kind} graph, {phase}, measured costs",
                 lambda: pesto_ir.load(MSR / f"{name}.json"), msr_cluster)


def jax_model(name: str, size: str) -> Model:
    from bench import zoo_jax

    def build() -> Graph:
        graph = zoo_jax.lower_model(name, size)
        ctx = PassContext(cluster=jax_cluster(1), quiet=True)
        return PassManager("annotate-costs{model=roofline}", verify_each=False).run(graph, ctx)

    return Model(f"jax_{name}" + ("_quick" if size == "quick" else ""), "jax", zoo_jax.describe(name, size),
                 build, jax_cluster)


def zoo(quick: bool = False) -> list[Model]:
    """Every model of the suite, or the quick subset: two small MSR graphs and two small JAX models."""
    from bench import zoo_jax

    if quick:
        return [*(msr_model(n) for n in QUICK_MSR),
                *(jax_model(n, "quick") for n in QUICK_JAX)]
    return [*(msr_model(n) for n in msr_names()), *(jax_model(n, "full") for n in zoo_jax.MODELS)]
