"""A cost graph's `suggested_cluster` is the cluster `pesto-compile` plans for when none is given:
the MSR graphs were measured on V100s of 16 GiB with 10 us + 50 GB/s links, and say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pesto_ir
from pesto_ir.cli import build_arg_parser, main, make_cluster
from pesto_ir.util.errors import PestoError

MSR = Path(__file__).parent.parent / "graphs" / "msr"


def _cluster(*argv: str):  # type: ignore[no-untyped-def]
    args = build_arg_parser().parse_args(list(argv))
    return make_cluster(args, pesto_ir.load(args.model))


@pytest.mark.parametrize("path", sorted(MSR.glob("*.json")), ids=lambda p: p.stem)
def test_every_msr_graph_suggests_v100s_with_their_links(path: Path) -> None:
    hint = json.loads(path.read_text())["suggested_cluster"]
    assert hint["kind"] == "v100" and hint["memory"] >= 16 * 2**30
    assert hint["latency"] == 1e-5 and hint["bandwidth"] == 50e9


def test_devices_without_a_kind_take_the_suggested_kind_and_links() -> None:
    model = str(MSR / "gnmt_training_layer.json")
    cluster = _cluster(model, "--devices", "4")
    assert len(cluster.devices) == 4 and {d.kind for d in cluster.devices} == {"v100"}
    assert {d.memory for d in cluster.devices} == {17185374208}
    link = cluster.links[("gpu0", "gpu1")]
    assert (link.latency, link.bandwidth) == (1e-5, 50e9)
    suggested = _cluster(model)  # no flags at all: the suggested count too
    assert len(suggested.devices) == 6 and suggested.devices[0].kind == "v100"


def test_an_explicit_kind_keeps_its_own_links() -> None:
    cluster = _cluster(str(MSR / "gnmt_training_layer.json"), "--devices", "2", "--device-kind", "h100")
    assert cluster.devices[0].kind == "h100"
    assert cluster.links[("gpu0", "gpu1")].bandwidth == 450e9


def test_a_pir_model_without_a_hint_plans_for_h100s() -> None:
    cluster = _cluster("examples/mlp_train_step.pir")
    assert len(cluster.devices) == 2 and cluster.devices[0].kind == "h100"


@pytest.mark.parametrize("hint, message", [
    ('{kind = "tpu9"}', "suggested_cluster: kind must be a built-in device kind"),
    ('{kind = "v100", bandwidth = 0}', "suggested_cluster: bandwidth must be a positive number"),
    ('{kind = "v100", latency = -1.0}', "suggested_cluster: latency must be a non-negative number"),
])
def test_a_bad_suggested_kind_or_link_is_a_clear_error(hint: str, message: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "g.pir"
    model.write_text(f"graph @g(%x: f32[4,4]) attributes {{suggested_cluster = {hint}}} {{\n"
                     "  %y = add(%x, %x) : f32[4,4]\n  return %y\n}\n")
    assert main([str(model), "-q", "-o", str(tmp_path / "out.pir")]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    with pytest.raises(PestoError, match=message.split(": ", 1)[1]):
        _cluster(str(model))
