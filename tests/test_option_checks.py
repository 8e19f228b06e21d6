"""`parallelize` and the `place` pass refuse options that are not what they need, by name, before any work."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest

import pesto_ir
from pesto_ir import PestoError


def _f(x: jax.Array) -> jax.Array:
    return jnp.sin(x) * 2


@pytest.mark.parametrize("kwargs, message", [
    ({"devices": ["gpu0"]}, "devices must be JAX devices"),
    ({"devices": 4}, "devices must be a list of JAX devices"),
    ({"devices": "cpu"}, "devices must be a list of JAX devices"),
    ({"time_limit": float("nan")}, "time_limit must be a positive, finite number"),
    ({"time_limit": -1}, "time_limit must be a positive, finite number"),
    ({"time_limit": "10"}, "time_limit must be a positive, finite number"),
    ({"seed": 1.5}, "seed must be a whole number"),
    ({"time_limit": 1e300}, "time_limit must be at most 1e\\+06 seconds, not 1e\\+300"),
    ({"seed": 2 ** 31}, "seed must be a whole number from 0 to 2147483647, not 2147483648"),
    ({"seed": -1}, "seed must be a whole number from 0 to 2147483647, not -1"),
    ({"param_argnums": (-1,)}, "param_argnums must be argument positions"),
    ({"donate_argnums": ("x",)}, "donate_argnums must be argument positions"),
    ({"algo": "turbo"}, "unknown placement algorithm 'turbo'"),
    ({"algo": []}, r"unknown placement algorithm \[\]"),
    ({"cost_model": {}}, r"unknown cost model \{\}"),
    ({"param_argnums": None}, "param_argnums must be argument positions"),
    ({"donate_argnums": 1.5}, "donate_argnums must be argument positions"),
    ({"coarsen_target": "x"}, r"coarsen_target must be a whole number of groups >= 1 \(or None\), got 'x'"),
    ({"coarsen_target": 0}, "coarsen_target must be a whole number of groups >= 1"),
    ({"quiet": "no"}, "quiet must be True or False, got 'no'"),
])
def test_bad_arguments_are_refused_by_name(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(PestoError, match=message):
        pesto_ir.parallelize(_f, **kwargs)


def test_good_arguments_still_run() -> None:
    step = pesto_ir.parallelize(_f, devices=jax.devices()[:2], algo="m-etf", time_limit=1)
    x = jnp.arange(4.0)
    assert jnp.allclose(step(x), jax.jit(_f)(x))


@pytest.mark.parametrize("pipeline, message", [
    ("place{time-limit=nan}", "time-limit must be a positive, finite number"),
    ("place{time-limit=-1}", "time-limit must be a positive, finite number"),
    ("place{time-limit=inf}", "time-limit must be a positive, finite number"),
    ("place{time-limit=1e300}", "time-limit must be at most 1e\\+06 seconds"),
    ("place{seed=2147483648}", "seed must be a whole number from 0 to 2147483647, not 2147483648"),
    ("place{algo=turbo}", "unknown placement algorithm 'turbo'"),
    ("coarsen{target=0}", r"pass 'coarsen': target must be at least 1 \(a whole number of groups\), got 0"),
    ("coarsen{target=-5}", "pass 'coarsen': target must be at least 1"),
    ("coarsen{colocation=turbo}", "pass 'coarsen': colocation must be one of connected, whole, got 'turbo'"),
])
def test_place_options_are_checked_when_the_pipeline_is_built(pipeline: str, message: str) -> None:
    from pesto_ir.passmanager import Pipeline

    with pytest.raises(PestoError, match=message):
        Pipeline.parse(pipeline)


def _place(text: str) -> pesto_ir.Graph:
    from pesto_ir.cluster.model import Cluster
    from pesto_ir.passes.place import place_graph
    from pesto_ir.passes.placement.options import PlaceOptions

    graph = pesto_ir.parse(text)
    place_graph(graph, Cluster.homogeneous(2, "h100"), "m-etf", PlaceOptions(quiet=True))
    return graph


def test_place_refuses_a_graph_without_costs() -> None:
    with pytest.raises(PestoError, match="place needs op costs, and none of the 1 ops has one"):
        _place("graph @g(%x: f32[4]) {\n  %y = tanh(%x) : f32[4]\n  return %y\n}\n")


def test_place_refuses_to_replace_devices_set_by_hand() -> None:
    text = "graph @g() {\n  %a = opaque() {cost = 1ms, device = @gpu1} : blob[4]\n  %b = opaque(%a) {cost = 1ms} : blob[4]\n}\n"
    with pytest.raises(PestoError, match=r"op 'a' \(.*\) has device = @gpu1, set by hand"):
        _place(text)
    placed = _place(text.replace(", device = @gpu1", ""))
    _place(str(placed))  # a placed graph (it has a plan) may be placed again


def test_roofline_says_when_it_replaces_costs_written_on_ops(capsys: pytest.CaptureFixture[str]) -> None:
    """model=auto with one op's cost written by hand used roofline for all, replacing it silently."""
    from pesto_ir.cluster.model import Cluster
    from pesto_ir.passmanager import PassContext, PassManager

    text = "graph @g(%x: f32[4]) {\n  %y = tanh(%x) {cost = 7ms} : f32[4]\n  %z = exp(%y) : f32[4]\n  return %z\n}\n"
    for model in ("auto", "roofline"):
        PassManager(f"annotate-costs{{model={model}}}").run(pesto_ir.parse(text, "m.pir"),
                                                            PassContext(cluster=Cluster.homogeneous(1), quiet=False))
        assert ("warning: annotate-costs: roofline costs replace the costs already on 1 op(s), e.g. 'y' "
                "(m.pir:2:8, cost = 7ms)") in capsys.readouterr().err
    graph = pesto_ir.parse(text.replace("exp(%y)", "exp(%y) {cost = 1ms}"))  # every op has one: given, kept
    PassManager("annotate-costs").run(graph, PassContext(cluster=Cluster.homogeneous(1), quiet=False))
    assert "warning" not in capsys.readouterr().err and str(graph.op("y").attrs["cost"]) == "7ms"
