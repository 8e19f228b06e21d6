"""The JAX model zoo (`bench/zoo_jax.py`): every model lowers, costs, fits and is deterministic.

The `quick` size of each model is lowered, verified, costed with the roofline model on two H100s
and checked to fit in memory; lowering it twice prints the same IR. Each `full` model is lowered
to check that the realistic size still fits one H100, so its single-device baseline exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import pesto_ir
from pesto_ir.cluster.model import Cluster
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.bounds import memory_shortfall
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util.errors import PestoError

# `bench` is a folder of the repository, not an installed package: import it from the root.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.zoo_jax import MODELS, SIZES, describe, lower_model  # noqa: E402


def _roofline(graph: pesto_ir.Graph, cluster: Cluster) -> pesto_ir.Graph:
    return PassManager("annotate-costs{model=roofline}").run(graph, PassContext(cluster=cluster, quiet=True))


@pytest.mark.parametrize("name", MODELS)
def test_quick_model_lowers_costs_and_fits(name: str) -> None:
    graph = lower_model(name, "quick")
    pesto_ir.verify(graph)
    assert graph.name == f"{name}_quick"
    assert 50 <= len(graph.ops) <= 1000
    assert any(v.param for v in graph.inputs) and not all(v.param for v in graph.inputs)
    cluster = Cluster.homogeneous(2, "h100")
    graph = _roofline(graph, cluster)
    assert all("cost" in op.attrs and "memory" not in op.attrs for op in graph.ops)  # memory is in the types
    assert sum(int(op.get("flops")) for op in graph.ops) > 0
    assert memory_shortfall(graph, Cluster.homogeneous(1, "h100")) == []


@pytest.mark.parametrize("name", MODELS)
def test_quick_model_is_deterministic(name: str) -> None:
    assert pesto_ir.print_graph(lower_model(name, "quick")) == pesto_ir.print_graph(lower_model(name, "quick"))


def test_descriptions_are_one_line_per_size() -> None:
    for name in MODELS:
        lines = {describe(name, size) for size in SIZES}
        assert len(lines) == len(SIZES)
        assert all(line and "\n" not in line and line.endswith("train step") for line in lines)


def test_unknown_model_or_size_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown model"):
        lower_model("alexnet", "quick")
    with pytest.raises(KeyError, match="unknown size"):
        describe("gpt", "huge")


@pytest.mark.parametrize("name", [m for m in MODELS if m != "gpt24"])
@pytest.mark.slow
def test_full_model_fits_one_h100(name: str) -> None:
    """The realistic size is big (hundreds to thousands of ops, many GiB at the peak) yet fits one
    80 GiB H100 by its peak over the step (tensor lifetimes, `single`'s graph order)."""
    one = Cluster.homogeneous(1, "h100")
    graph = _roofline(lower_model(name, "full"), one)
    assert 200 <= len(graph.ops) <= 6000
    assert memory_shortfall(graph, one) == []
    plan = check_plan(graph, one, ALGORITHMS["single"].run(graph, one, PlaceOptions(quiet=True)))
    assert plan.peak_memory is not None and 4 * 2**30 < plan.peak_memory["gpu0"] <= 80 * 2**30


@pytest.mark.slow
def test_gpt24_does_not_fit_one_h100() -> None:
    """The zoo's model that memory decides: twice GPT's depth at its batch is over 80 GiB at the
    peak on one device, though its parameters and optimizer state fit."""
    one = Cluster.homogeneous(1, "h100")
    graph = _roofline(lower_model("gpt24", "full"), one)
    assert memory_shortfall(graph, one) == []
    with pytest.raises(PestoError, match=r"gpu0 peaks at 99\.\d GiB .* more than its 80 GiB"):
        check_plan(graph, one, ALGORITHMS["single"].run(graph, one, PlaceOptions(quiet=True)))
