"""The cluster model: pesto-cluster/1 parsing and its errors, real JAX devices, fitted links."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from pesto_ir.cluster import Cluster, ClusterError, fit_link, jax_device_kind, measure_links


def doc(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {"format": "pesto-cluster/1",
                               "devices": [{"name": "gpu0", "kind": "h100", "memory": 80e9},
                                           {"name": "gpu1", "kind": "h100", "memory": 80e9}],
                               "link": {"latency": 1e-5, "bandwidth": 4.5e11}}
    base.update(extra)
    return base


def test_design_example_parses() -> None:
    c = Cluster.from_json(doc(links=[{"src": "gpu0", "dst": "gpu1", "latency": 2e-5, "bandwidth": 1e11}]))
    assert c.names == ["gpu0", "gpu1"]
    assert c.device("gpu0").memory == 80e9
    assert c.device("gpu0").peak_flops == 989e12  # filled in from the built-in kind
    assert c.transfer_time("gpu0", "gpu1", 1e11) == pytest.approx(2e-5 + 1.0)
    assert c.transfer_time("gpu1", "gpu0", 4.5e11) == pytest.approx(1e-5 + 1.0)
    assert c.transfer_time("gpu0", "gpu0", 1e12) == 0.0


def test_round_trip_through_json(tmp_path: Path) -> None:
    c = Cluster.from_json(doc())
    p = tmp_path / "c.json"
    p.write_text(json.dumps(c.to_json()))
    back = Cluster.load(p)
    assert back.devices == c.devices and back.links == c.links


def test_custom_kind_with_figures() -> None:
    c = Cluster.from_json({"format": "pesto-cluster/1",
                           "devices": [{"name": "t0", "kind": "tpu9", "peak_flops": 1e15, "mem_bandwidth": 1e12,
                                        "memory": 3.2e10}]})
    assert c.device("t0").kind == "tpu9" and c.device("t0").peak_flops == 1e15


@pytest.mark.parametrize(("data", "message"), [
    ({"format": "pesto-cluster/2", "devices": []}, "not a pesto-cluster/1 document"),
    ({"format": "pesto-cluster/1", "devices": []}, "non-empty list"),
    ({"format": "pesto-cluster/1", "devices": [{"kind": "h100"}]}, "devices\\[0\\] needs a string \"name\""),
    ({"format": "pesto-cluster/1", "devices": [{"name": "x", "kind": "tpu9"}]}, "is not built in"),
    ({"format": "pesto-cluster/1", "devices": [{"name": "x", "kind": "h100", "memory": -1}]}, "positive"),
    ({"format": "pesto-cluster/1", "devices": [{"name": "x"}, {"name": "x"}]}, "duplicate device names"),
    (doc(links=[{"src": "gpu0", "dst": "gpu9"}]), "links\\[0\\]"),
    (doc(links=[{"src": "gpu0", "dst": "gpu1", "bandwidth": 0}]), "bandwidth must be positive"),
])
def test_errors_name_the_problem(data: dict[str, object], message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        Cluster.from_json(data, "c.json")


def test_load_reports_bad_json_position(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('{"format": "pesto-cluster/1",\n "devices": [}')
    with pytest.raises(ClusterError, match=r"bad.json:2:\d+: invalid JSON"):
        Cluster.load(p)
    with pytest.raises(ClusterError, match="cannot read"):
        Cluster.load(tmp_path / "missing.json")


def test_homogeneous_and_unknown_kind() -> None:
    c = Cluster.homogeneous(3, "a100")
    assert c.names == ["gpu0", "gpu1", "gpu2"] and c.is_homogeneous()
    with pytest.raises(ClusterError, match="unknown device kind 'z80'"):
        Cluster.homogeneous(2, "z80")
    with pytest.raises(ClusterError, match="at least 1"):
        Cluster.homogeneous(0)


# ---------------------------------------------------------------- JAX devices

@dataclass
class FakeDevice:
    platform: str
    device_kind: str
    id: int = 0


@pytest.mark.parametrize(("platform", "text", "kind"), [
    ("cpu", "cpu", "cpu"),
    ("gpu", "NVIDIA H100 80GB HBM3", "h100"),
    ("gpu", "NVIDIA H200", "h200"),
    ("gpu", "NVIDIA A100-SXM4-40GB", "a100"),
    ("gpu", "Tesla V100-SXM2-16GB", "v100"),
])
def test_jax_device_kind(platform: str, text: str, kind: str) -> None:
    assert jax_device_kind(FakeDevice(platform, text)) == kind


def test_unknown_jax_device_kind_is_a_clean_error() -> None:
    with pytest.raises(ClusterError, match="GeForce 8800"):
        jax_device_kind(FakeDevice("gpu", "GeForce 8800"))


def test_from_jax_devices_on_cpu() -> None:
    import jax

    c = Cluster.from_jax_devices()
    assert len(c) == len(jax.devices()) == 8
    assert c.names[:2] == ["cpu0", "cpu1"]
    assert {d.kind for d in c.devices} == {"cpu"}
    forced = Cluster.from_jax_devices(jax.devices()[:2], kind="h100")
    assert [d.kind for d in forced.devices] == ["h100", "h100"]


def test_fit_link_recovers_latency_and_bandwidth() -> None:
    pts = [(n, 3e-6 + n / 2e9) for n in (1e3, 1e4, 1e5, 1e6, 1e7)]
    lat, bw = fit_link(pts)
    assert lat == pytest.approx(3e-6, rel=1e-6) and bw == pytest.approx(2e9, rel=1e-6)
    with pytest.raises(ClusterError, match="no usable bandwidth"):
        fit_link([(1e3, 1e-3), (1e6, 1e-6)])


def test_measure_links_on_cpu_devices_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jax

    monkeypatch.setenv("PESTO_CACHE", str(tmp_path))
    devices = jax.devices()[:2]
    lat, bw = measure_links(devices, sizes=(1 << 12, 1 << 16, 1 << 20, 1 << 22), repeats=3)
    assert lat >= 0 and bw > 0
    assert list(tmp_path.rglob("*.json")), "the fit is cached"
    assert measure_links(devices, sizes=(1 << 12, 1 << 16, 1 << 20, 1 << 22), repeats=3) == (lat, bw)
    c = Cluster.from_jax_devices(devices, measure=True)
    assert c.link("cpu0", "cpu1").bandwidth > 0


def test_a_custom_kind_needs_its_figures_only_for_the_roofline_model() -> None:
    import pesto_ir
    from pesto_ir.passmanager import PassContext, PassManager

    cluster = Cluster.from_json({"format": "pesto-cluster/1",
                                 "devices": [{"name": "a", "kind": "tpu9", "memory": 1e9},
                                             {"name": "b", "kind": "tpu9", "memory": 1e9}]})
    assert cluster.devices[0].peak_flops is None and "peak_flops" not in cluster.to_json()["devices"][0]
    assert Cluster.from_json(cluster.to_json()).devices == cluster.devices
    given = "graph @g() {\n  %a = opaque() {cost = {tpu9 = 1ms}} : blob[4]\n  %b = opaque(%a) {cost = 2ms} : blob[4]\n}\n"
    ctx = PassContext(cluster=cluster, quiet=True)
    PassManager("annotate-costs,place{algo=m-etf},simulate").run(pesto_ir.parse(given), ctx)
    shaped = "graph @g(%x: f32[4]) {\n  %y = tanh(%x) : f32[4]\n  return %y\n}\n"
    with pytest.raises(pesto_ir.PestoError) as e:
        PassManager("annotate-costs{model=roofline}").run(pesto_ir.parse(shaped), ctx)
    assert "has no peak_flops or mem_bandwidth, which the roofline model needs" in str(e.value.__cause__ or e.value)


def test_a_cluster_too_big_to_plan_is_refused_at_once() -> None:
    from pesto_ir.cluster import MAX_DEVICES

    with pytest.raises(ClusterError, match=f"a cluster of 100000 devices is more than Pesto plans \\({MAX_DEVICES}\\)"):
        Cluster.homogeneous(100000, "h100")
    doc = {"format": "pesto-cluster/1", "devices": [{"name": f"d{i}", "kind": "h100"} for i in range(MAX_DEVICES + 1)]}
    with pytest.raises(ClusterError, match="more than Pesto plans"):
        Cluster.from_json(doc)


# ---------------------------------------------------------------- hosts (processes, machines)

def two_hosts(**host_link: float) -> Cluster:
    devices = [{"name": f"gpu{i}", "kind": "h100", "host": i // 2} for i in range(4)]
    return Cluster.from_json(doc(devices=devices, host_link=host_link or {"latency": 5e-5, "bandwidth": 1.25e10}))


def test_links_across_hosts_take_the_host_link_and_round_trip() -> None:
    c = two_hosts()
    assert [d.host for d in c.devices] == [0, 0, 1, 1] and c.hosts == [0, 1]
    assert c.transfer_time("gpu0", "gpu1", 4.5e11) == pytest.approx(1e-5 + 1.0)  # within host 0: "link"
    assert c.transfer_time("gpu1", "gpu2", 1.25e10) == pytest.approx(5e-5 + 1.0)  # across: "host_link"
    again = Cluster.from_json(c.to_json())
    assert again.to_json() == c.to_json() and [d.host for d in again.devices] == [0, 0, 1, 1]
    one_host = Cluster.from_json(doc())
    assert "host" not in json.dumps(one_host.to_json())  # files of one host read and write as before


@pytest.mark.parametrize("host", [-1, 1.5, "a", True, None])
def test_a_host_is_a_whole_number(host: object) -> None:
    devices = [{"name": "gpu0", "kind": "h100", "host": host}, {"name": "gpu1", "kind": "h100"}]
    with pytest.raises(ClusterError, match=r"devices\[0\] \(gpu0\): \"host\" must be a whole number >= 0"):
        Cluster.from_json(doc(devices=devices))


def test_a_bad_host_link_is_refused() -> None:
    with pytest.raises(ClusterError, match="host_link: bandwidth must be positive"):
        two_hosts(latency=1e-5, bandwidth=0.0)


def test_the_planner_keeps_chatty_work_on_one_host_when_the_network_is_slow() -> None:
    """Two independent chains joined at the end by a large tensor, on hosts of one device each: over
    a fast host link the MILP runs the chains side by side on both hosts; over a slow one it keeps
    everything on one."""
    from pesto_ir import parse
    from pesto_ir.passmanager import PassContext, PassManager
    from pesto_ir.plan import read_plan_attrs

    text = "graph @g() {\n" + "".join(
        f"  %{b}{i} = opaque({f'%{b}{i - 1}' if i else ''}) {{cost = 1ms}} : f32[4096, 4096]\n"
        for b in "ab" for i in range(4)) + "  %j = opaque(%a3, %b3) {cost = 1ms} : f32[4]\n}\n"
    def cluster(latency: float, bandwidth: float) -> Cluster:
        devices = [{"name": f"gpu{i}", "kind": "h100", "host": i} for i in range(2)]
        return Cluster.from_json(doc(devices=devices, host_link={"latency": latency, "bandwidth": bandwidth}))

    hosts_used = []
    for c in (cluster(1e-5, 4.5e11), cluster(1e-2, 1e8)):
        placed = PassManager("place{algo=ilp time-limit=10}").run(parse(text), PassContext(cluster=c, quiet=True))
        plan = read_plan_attrs(placed)
        assert plan is not None
        hosts_used.append({c.device(s.device).host for s in plan.ops.values()})
    assert hosts_used == [{0, 1}, {0}]
