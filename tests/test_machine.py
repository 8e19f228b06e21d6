"""Which machine a measurement describes: a calibrated cluster file says where it was measured, keeps
saying it through every cluster derived from it, and a run elsewhere is told so."""

from __future__ import annotations

import copy
import os
import re

import jax
import pytest

from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.host import MACHINE_FIELDS, describe, elsewhere_note, machine_key, machine_of
from pesto_ir.cluster.model import Cluster
from pesto_ir.passes.rewrite.replicas import sub_cluster

ELSEWHERE = {"platform": "cpu", "device_kind": "cpu", "processor": "Z80 (family 1, model 2)", "cores": 2,
             "jax": "0.4.1"}


def _calibrated(machine: dict[str, str | int] | None) -> dict[str, object]:
    return {"format": "pesto-cluster/1",
            "devices": [{"name": f"cpu{i}", "kind": "cpu", "launch_overhead": 1e-6, "efficiency": {"matmul": 0.5}}
                        for i in range(3)],
            **({"calibrated_on": machine} if machine is not None else {})}


def test_a_cpu_device_is_named_by_its_processor_cores_and_jax() -> None:
    here = machine_of(jax.devices()[0])
    assert list(here) == [k for k in MACHINE_FIELDS if k in here]
    assert here["platform"] == "cpu" and here["cores"] == os.cpu_count() and here["jax"] == jax.__version__
    assert isinstance(here["processor"], str) and here["processor"]
    assert describe(here) == f"cpu: {here['processor']}, {here['cores']} cores, jax {jax.__version__}"
    assert machine_key(jax.devices()[0]) == machine_key(jax.devices()[1]), "one machine, one key"


def test_calibrated_on_round_trips_and_survives_derived_clusters() -> None:
    cluster = Cluster.from_json(_calibrated(ELSEWHERE))
    assert cluster.calibrated_on == ELSEWHERE
    assert Cluster.from_json(cluster.to_json()) == cluster
    assert cluster.with_memory(1e9).calibrated_on == ELSEWHERE
    assert sub_cluster(cluster, ["cpu0", "cpu2"]).calibrated_on == ELSEWHERE
    plain = Cluster.from_json(_calibrated(None))
    assert plain.calibrated_on is None and "calibrated_on" not in plain.to_json()


@pytest.mark.parametrize("raw, message", [
    ("AMD", "must be an object with the fields platform, device_kind, processor, cores, jax, got a str"),
    (4, "must be an object with the fields platform, device_kind, processor, cores, jax, got an int"),
    ({"cpu": "x"}, "unknown field 'cpu' (fields: platform, device_kind, processor, cores, jax)"),
    ({"cores": 0}, "cores must be a whole number from 1 to 1048576, got 0"),
    ({"cores": True}, "cores must be a whole number from 1 to 1048576, got True"),
    ({"cores": "2"}, "cores must be a whole number from 1 to 1048576, got '2'"),
    ({"cores": 10 ** 400}, "cores must be a whole number from 1 to 1048576, got 1000000000"),
    ({"processor": 7}, "processor must be a string of at most 200 printable characters, got 7"),
    ({"platform": "c\u00e9pu\ud800"}, "platform must be a string of at most 200 printable characters, "
                                      "got 'c\\xe9pu\\ud800'"),
    ({"processor": "\u202eAMD"}, "processor must be a string of at most 200 printable characters"),
    ({"jax": "0" * 201}, "jax must be a string of at most 200 printable characters"),
    ({}, "must be an object with the fields platform, device_kind, processor, cores, jax, got an empty object"),
])
def test_a_bad_calibrated_on_is_refused_with_the_reason(raw: object, message: str) -> None:
    with pytest.raises(ClusterError, match="^" + re.escape("c.json: calibrated_on: " + message)):
        Cluster.from_json(_calibrated(raw), "c.json")  # type: ignore[arg-type]


def test_a_cluster_built_in_code_checks_calibrated_on_and_keeps_a_read_only_copy() -> None:
    devices = Cluster.from_json(_calibrated(None)).devices
    with pytest.raises(ClusterError, match="^a cluster's calibrated_on must be an object"):
        Cluster(devices, Cluster.fully_connected(devices, 1e-5, 1e10).links, calibrated_on="AMD")  # type: ignore[arg-type]
    given = dict(ELSEWHERE)
    cluster = Cluster(devices, Cluster.fully_connected(devices, 1e-5, 1e10).links, calibrated_on=given)
    given["cores"] = 64
    assert cluster.calibrated_on == ELSEWHERE, "the cluster keeps its own copy"
    with pytest.raises(TypeError):
        cluster.calibrated_on["cores"] = 64  # type: ignore[index]


def test_figures_from_another_machine_are_named_with_what_differs() -> None:
    here = machine_of(jax.devices()[0])
    assert elsewhere_note(here, here, "the figures") is None
    assert elsewhere_note(None, here, "the figures") is None, "a file that does not say is not second-guessed"
    other = {**here, "processor": "Z80 (family 1, model 2)"}
    note = elsewhere_note(other, here, "the figures")
    assert note is not None and note.startswith("the figures were measured elsewhere (cpu: Z80")
    assert f"processor {here['processor']!r} here, 'Z80 (family 1, model 2)' there" in note
    assert "python -m bench.calibrate" in note
    fewer = {k: v for k, v in other.items() if k != "processor"}
    assert elsewhere_note(fewer, here, "x") is None, "only the fields both name are compared"


def test_parallelize_s_report_says_the_cluster_was_calibrated_elsewhere() -> None:
    import jax.numpy as jnp

    import pesto_ir

    def step(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w).sum()

    raw = _calibrated({**machine_of(jax.devices()[0]), "processor": "Z80"})
    raw["devices"] = raw["devices"][:2]  # type: ignore[index]
    run = pesto_ir.parallelize(step, devices=jax.devices()[:2], cluster=Cluster.from_json(copy.deepcopy(raw)),
                               autotune=True, autotune_steps=1, quiet=True)
    run(jnp.ones((8, 8)), jnp.ones((4, 8)))
    assert "the cluster's calibrated figures were measured elsewhere (cpu: Z80" in run.report()
    assert run.calibrated_cluster(measure_links=False).calibrated_on == raw["calibrated_on"], \
        "figures measured elsewhere keep saying so once the speed factor measured here is applied"
    same = pesto_ir.parallelize(step, devices=jax.devices()[:2], autotune=True, autotune_steps=1, quiet=True,
                                cluster=Cluster.from_json({**raw, "calibrated_on": machine_of(jax.devices()[0])}))
    same(jnp.ones((8, 8)), jnp.ones((4, 8)))
    assert "measured elsewhere" not in same.report()
