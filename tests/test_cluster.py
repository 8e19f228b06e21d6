"""The cluster model: pesto-cluster/1 parsing and its errors, real JAX devices, fitted links."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from pesto_ir.cluster.devices import OP_FAMILIES, Device, Link
from pesto_ir.cluster.figures import AllReduceFit, ClusterError
from pesto_ir.cluster.host import machine_of
from pesto_ir.cluster.model import NODE_LINKS, Cluster, jax_device_kind, ring_all_reduce_time, ring_time
from pesto_ir.jaxrt.measure_collectives import fit_all_reduce, fit_link, measure_links, measured_cluster


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
    ({"format": "pesto-cluster/1", "devices": [{"name": "x", "kind": ""}]},
     r"devices\[0\] \(x\): \"kind\" must be a non-empty name such as \"h100\", not ''"),
    ({"format": "pesto-cluster/1", "devices": [{"name": "x", "kind": "  "}]}, r"\"kind\" must be a non-empty name"),
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
    c = measured_cluster(devices)
    assert c.link("cpu0", "cpu1").bandwidth > 0
    assert c.calibrated_on == machine_of(devices[0]), "measured figures say where they were measured"
    assert Cluster.from_jax_devices(devices).calibrated_on is None, "datasheet figures describe no machine"


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
    from pesto_ir.cluster.model import MAX_DEVICES

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


@pytest.mark.parametrize("host", [-1, 1.5, "a", True, None, 10 ** 400])
def test_a_host_is_a_whole_number(host: object) -> None:
    devices = [{"name": "gpu0", "kind": "h100", "host": host}, {"name": "gpu1", "kind": "h100"}]
    with pytest.raises(ClusterError, match=r"devices\[0\] \(gpu0\): \"host\" must be a whole number from 0 to 1048575"):
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
    from pesto_ir.schedule.plan import read_plan_attrs

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


# ---------------------------------------------------------------- calibrated figures

CALIBRATED = {"launch_overhead": 3e-6, "efficiency": {"matmul": 0.6, "elementwise": 0.25}}


def calibrated_doc(**extra: object) -> dict[str, object]:
    d = doc(**extra)
    d["devices"] = [{**dev, **CALIBRATED} for dev in d["devices"]]  # type: ignore[attr-defined]
    return d


def test_calibrated_figures_read_and_round_trip(tmp_path: Path) -> None:
    c = Cluster.from_json(calibrated_doc(all_reduce={"latency": 2e-6, "bandwidth": "5e9"}))
    gpu0 = c.device("gpu0")
    assert gpu0.launch_overhead == 3e-6 and c.all_reduce == AllReduceFit(2e-6, 5e9)
    assert gpu0.efficiency_for("matmul") == 0.6 and gpu0.efficiency_for("conv") == 1.0
    assert {gpu0: 1}[gpu0] == 1  # still hashable
    p = tmp_path / "c.json"
    p.write_text(json.dumps(c.to_json()))
    back = Cluster.load(p)
    assert back.devices == c.devices and back.links == c.links and back.all_reduce == c.all_reduce
    assert back.to_json() == c.to_json()
    assert back.with_memory(1e9).all_reduce == c.all_reduce


def test_files_without_calibration_write_back_as_before() -> None:
    c = Cluster.from_json(doc())
    out = c.to_json()
    assert "all_reduce" not in out and c.all_reduce is None
    assert all(set(d) == {"name", "kind", "memory", "peak_flops", "mem_bandwidth"} for d in out["devices"])
    assert c.device("gpu0").launch_overhead is None and c.device("gpu0").efficiency_for("matmul") == 1.0


def test_efficiency_is_kept_sorted_whatever_order_it_came_in() -> None:
    a = Device("x", "cpu", 1e11, 2e10, 1e9, efficiency={"matmul": 0.5, "conv": 0.4})
    b = Device("x", "cpu", 1e11, 2e10, 1e9, efficiency=(("conv", 0.4), ("matmul", 0.5)))
    assert a == b and hash(a) == hash(b) and a.efficiency == (("conv", 0.4), ("matmul", 0.5))


@pytest.mark.parametrize(("device", "message"), [
    ({"launch_overhead": -1e-6}, r"devices\[0\] \(gpu0\): launch_overhead must be a finite number of seconds >= 0, got -1e-06"),
    ({"launch_overhead": float("nan")}, "launch_overhead must be .* got nan"),
    ({"launch_overhead": "soon"}, "launch_overhead must be .* got 'soon'"),
    ({"launch_overhead": True}, "launch_overhead must be .* got True"),
    ({"efficiency": {"gemm": 0.5}}, "unknown op family 'gemm' \\(op families: matmul, matmul_weight_grad, conv, conv_filter_grad, elementwise"),
    ({"efficiency": {"matmul": 0}}, "efficiency of 'matmul' must be a positive finite factor .* got 0"),
    ({"efficiency": {"matmul": float("inf")}}, "efficiency of 'matmul' must be .* got inf"),
    ({"efficiency": {"matmul": "fast"}}, "efficiency of 'matmul' must be .* got 'fast'"),
    ({"efficiency": [0.5]}, r"\"efficiency\" must be an object \{op family: factor\}"),
    ({"setup": {"conv": -1e-6}}, "setup of 'conv' must be a finite number of seconds >= 0, got -1e-06"),
    ({"setup": {"conv": float("inf")}}, "setup of 'conv' must be .* got inf"),
    ({"setup": {"conv": "slow"}}, "setup of 'conv' must be .* got 'slow'"),
    ({"setup": {"gemm": 1e-5}}, "setup: unknown op family 'gemm'"),
    ({"setup": 1e-5}, r"\"setup\" must be an object \{op family: seconds\}"),
])
def test_bad_calibrated_device_figures_are_refused(device: dict[str, object], message: str) -> None:
    data = doc()
    data["devices"][0].update(device)  # type: ignore[index]
    with pytest.raises(ClusterError, match=message):
        Cluster.from_json(data, "c.json")


@pytest.mark.parametrize(("all_reduce", "message"), [
    ({"latency": -1, "bandwidth": 1e9}, "all_reduce: latency must be a finite number of seconds >= 0, got -1"),
    ({"latency": 1e-6, "bandwidth": 0}, "all_reduce: bandwidth must be positive and finite .* got 0"),
    ({"latency": 1e-6, "bandwidth": float("nan")}, "all_reduce: bandwidth must be .* got nan"),
    ({"latency": "x", "bandwidth": 1e9}, "all_reduce: latency must be .* got 'x'"),
    ({"latency": 1e-6}, "all_reduce: \"bandwidth\" is required"),
    ([1e-6, 1e9], "\"all_reduce\" must be an object"),
])
def test_a_bad_all_reduce_fit_is_refused(all_reduce: object, message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        Cluster.from_json(doc(all_reduce=all_reduce), "c.json")


def test_calibrated_figures_through_the_api_are_checked() -> None:
    with pytest.raises(ClusterError, match="device x: efficiency: unknown op family 'gemm'"):
        Device("x", "cpu", 1e11, 2e10, 1e9, efficiency={"gemm": 1.0})
    with pytest.raises(ClusterError, match="device x: launch_overhead must be"):
        Device("x", "cpu", 1e11, 2e10, 1e9, launch_overhead=-1.0)
    with pytest.raises(ClusterError, match="all_reduce: bandwidth must be positive"):
        AllReduceFit(0.0, -1.0)
    with pytest.raises(ClusterError, match="unknown op family 'gemm'"):
        Device.of_kind("x", "cpu").efficiency_for("gemm")
    assert OP_FAMILIES == ("matmul", "matmul_weight_grad", "conv", "conv_filter_grad", "elementwise", "reduction",
                           "window", "scatter", "movement", "other")


def test_setup_per_family_reads_writes_back_and_falls_back_to_the_parent_family() -> None:
    data = doc()
    data["devices"][0].update({"efficiency": {"conv": 0.5}, "setup": {"conv": 4e-5, "matmul": "3e-5"}})  # type: ignore[index]
    c = Cluster.from_json(data, "c.json")
    d = c.device("gpu0")
    assert d.setup == (("conv", 4e-5), ("matmul", 3e-5))
    assert d.setup_for("conv_filter_grad") == 4e-5  # no figure of its own: the convolution's
    assert d.setup_for("elementwise") == 0.0  # none measured: nothing beyond the launch
    assert Cluster.from_json(c.to_json(), "again.json").device("gpu0") == d
    assert "setup" not in Cluster.from_json(doc(), "c.json").to_json()["devices"][0]  # old files write back as they were
    assert not c.is_homogeneous()  # gpu1 has no setup: the devices differ
    with pytest.raises(ClusterError, match="unknown op family 'gemm'"):
        d.setup_for("gemm")


def test_a_gradient_family_without_a_figure_takes_its_forward_familys() -> None:
    d = Device("x", "cpu", 1e11, 2e10, 1e9, efficiency={"matmul": 0.7, "conv": 0.4, "conv_filter_grad": 0.2})
    assert d.efficiency_for("matmul_weight_grad") == 0.7  # no figure of its own: the matmul's
    assert d.efficiency_for("conv_filter_grad") == 0.2  # its own figure
    assert d.efficiency_for("reduction") == 1.0  # no parent: the datasheet
    assert Device("y", "cpu", 1e11, 2e10, 1e9).efficiency_for("matmul_weight_grad") == 1.0


def test_ring_all_reduce_uses_the_fit_within_one_host_only() -> None:
    fit = AllReduceFit(1e-6, 1e9)
    c = Cluster.from_json(doc(all_reduce={"latency": 1e-6, "bandwidth": 1e9}))
    assert ring_all_reduce_time(c, ["gpu0", "gpu1"], 2_000_000) == pytest.approx(2 * (1e-6 + 1e6 / 1e9))
    assert ring_all_reduce_time(Cluster.from_json(doc()), ["gpu0", "gpu1"], 2_000_000) == \
        pytest.approx(2 * (1e-5 + 1e6 / 4.5e11))
    across = dataclasses.replace(two_hosts(latency=1e-3, bandwidth=1e9), all_reduce=fit)
    hosts = [d.name for d in across.devices]
    assert ring_all_reduce_time(across, hosts, 1000) == pytest.approx(
        2 * (len(hosts) - 1) * max(across.transfer_time(a, b, 1000 / len(hosts))
                                   for a, b in zip(hosts, hosts[1:] + hosts[:1])))


def test_fit_all_reduce_recovers_latency_and_bandwidth() -> None:
    alpha, beta = 4e-6, 3e9
    pts = [(n, b, 2 * (n - 1) * alpha + 2 * (n - 1) / n * b / beta) for n in (2, 4, 8) for b in (4096, 65536, 1 << 20)]
    fit = fit_all_reduce(pts)
    assert fit.latency == pytest.approx(alpha, rel=1e-6) and fit.bandwidth == pytest.approx(beta, rel=1e-6)
    no_latency = fit_all_reduce([(n, b, 2 * (n - 1) / n * b / beta - 1e-7) for n in (2, 4) for b in (1e4, 1e6)])
    assert no_latency.latency == 0.0 and no_latency.bandwidth > 0
    with pytest.raises(ClusterError, match="no usable bandwidth"):
        fit_all_reduce([(2, 1e3, 1e-3), (2, 1e6, 1e-6)])
    with pytest.raises(ClusterError, match="fewer than two times"):
        fit_all_reduce([(2, 1e3, 0.0), (2, 1e6, 1e-3)])


def test_measured_all_reduce_on_cpu_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import math
    import time

    import jax

    monkeypatch.setenv("PESTO_CACHE", str(tmp_path))
    t0 = time.perf_counter()
    c = measured_cluster(jax.devices())
    assert time.perf_counter() - t0 < 30
    fit = c.all_reduce
    assert fit is not None and math.isfinite(fit.latency) and fit.latency >= 0
    assert math.isfinite(fit.bandwidth) and fit.bandwidth > 0
    assert ring_all_reduce_time(c, c.names, 8 << 20) == pytest.approx(
        2 * 7 * (fit.latency + (8 << 20) / 8 / fit.bandwidth))
    assert measured_cluster(jax.devices()).all_reduce == fit  # from the disk cache
    assert measured_cluster(jax.devices()[:1]).all_reduce is None


def test_a_data_parallel_plan_times_its_all_reduces_by_the_fit(tmp_path: Path) -> None:
    from pesto_ir.cli import main

    data = Cluster.homogeneous(4, "h100").to_json()
    data["all_reduce"] = {"latency": 1e-4, "bandwidth": 1e9}  # far slower than the links: it must show
    (tmp_path / "c.json").write_text(json.dumps(data))
    assert main(["examples/mlp_train_step.pir", "--cluster", str(tmp_path / "c.json"), "--data-parallel", "2",
                 "--microbatches", "1", "--algo", "m-etf", "--plan-json", str(tmp_path / "p.json"),
                 "-o", str(tmp_path / "x.pir"), "-q"]) == 0
    collectives = json.loads((tmp_path / "p.json").read_text())["collectives"]
    assert collectives
    for c in collectives:
        assert c["end"] - c["start"] == pytest.approx(2 * (1e-4 + c["bytes"] / 2 / 1e9))


@pytest.mark.parametrize("change, message", [
    ({"link": {"bandwidth": 5e-324}}, "link: bandwidth 4.94066e-324 is out of range: from 1 to 1e+21 bytes per second"),
    ({"link": {"latency": 1e300}}, "link: latency 1e+300 is out of range: from 0 to 1e+06 seconds"),
    ({"all_reduce": {"latency": 0.0, "bandwidth": 1e30}}, "all_reduce: bandwidth 1e+30 is out of range"),
    ({"devices": [{"name": "a", "kind": "cpu", "launch_overhead": 1e308}, {"name": "b"}]},
     "devices[0] (a): launch_overhead 1e+308 is out of range: from 0 to 1e+06 seconds"),
    ({"devices": [{"name": "a", "kind": "cpu", "efficiency": {"matmul": 5e-324}}, {"name": "b"}]},
     "devices[0] (a): efficiency of 'matmul' 4.94066e-324 is out of range: from 1e-06 to 1e+06"),
    ({"devices": [{"name": "a", "kind": "cpu", "setup": {"conv": 1e308}}, {"name": "b"}]},
     "devices[0] (a): setup of 'conv' 1e+308 is out of range"),
    ({"devices": [{"name": "a", "kind": "cpu", "memory": 1e308}, {"name": "b"}]},
     "devices[0] (a): memory 1e+308 is out of range: from 0 to 9.22337e+18 bytes"),
    ({"devices": [{"name": "a", "kind": "cpu", "peak_flops": 1e-300}, {"name": "b"}]},
     "devices[0] (a): peak_flops 1e-300 is out of range: from 1 to 1e+21 FLOP per second"),
])
def test_figures_no_device_or_link_has_are_refused(change: dict[str, object], message: str) -> None:
    """Finite but extreme figures made every makespan inf (a plan file could not be written) or
    blamed the placement algorithm for times that had overflowed."""
    raw: dict[str, object] = {"format": "pesto-cluster/1", "devices": [{"name": "a", "kind": "cpu"},
                                                                         {"name": "b", "kind": "cpu"}], **change}
    with pytest.raises(ClusterError) as e:
        Cluster.from_json(raw, "c.json")
    assert str(e.value).startswith("c.json: " + message), str(e.value)


def test_memory_beyond_any_device_is_refused_but_no_limit_is_allowed() -> None:
    cluster = Cluster.from_json({"format": "pesto-cluster/1", "devices": [{"name": "a", "kind": "cpu"}]})
    with pytest.raises(ClusterError, match="memory 1e\\+308 is out of range"):
        cluster.with_memory(1e308)
    assert cluster.with_memory(math.inf).devices[0].memory == math.inf


# ---------------------------------------------------------------- nodes of several devices

ROOT = Path(__file__).resolve().parent.parent
CLUSTERS = ROOT / "examples" / "clusters"


def test_64_nodes_of_8_devices_link_within_and_across_nodes_and_round_trip() -> None:
    c = Cluster.homogeneous(512, "h100", devices_per_host=8)
    assert len(c) == 512 and len(c.links) == 512 * 511 and c.hosts == list(range(64))
    assert [d.host for d in c.devices[7:10]] == [0, 1, 1] and c.names[-1] == "gpu511"
    within, across = (1e-5, 450e9), NODE_LINKS["h100"]
    assert across == (2e-5, 50e9)  # 400 Gb/s NDR per GPU
    for a, b in (("gpu0", "gpu7"), ("gpu7", "gpu0"), ("gpu504", "gpu511")):
        assert (c.link(a, b).latency, c.link(a, b).bandwidth) == within and c.link(a, b).src == a
    for a, b in (("gpu0", "gpu8"), ("gpu8", "gpu0"), ("gpu7", "gpu511")):
        assert (c.link(a, b).latency, c.link(a, b).bandwidth) == across and c.link(a, b).dst == b
    data = c.to_json()
    assert data["link"] == {"latency": 1e-5, "bandwidth": 450e9}
    assert data["host_link"] == {"latency": 2e-5, "bandwidth": 50e9} and "links" not in data
    back = Cluster.from_json(json.loads(json.dumps(data)))
    assert back.devices == c.devices and back.links == c.links and back.to_json() == data


def test_nodes_take_given_links_and_one_host_is_the_default() -> None:
    c = Cluster.homogeneous(8, "a100", latency=2e-6, bandwidth=1e11, devices_per_host=4, host_link=(3e-5, 1e9))
    assert c.link("gpu0", "gpu3") == Link("gpu0", "gpu3", 2e-6, 1e11)
    assert (c.link("gpu3", "gpu4").latency, c.link("gpu3", "gpu4").bandwidth) == (3e-5, 1e9)
    assert Cluster.homogeneous(8, "a100", devices_per_host=8).hosts == [0] == Cluster.homogeneous(8, "a100").hosts
    assert Cluster.homogeneous(4, "v100", devices_per_host=1).link("gpu0", "gpu1").bandwidth == NODE_LINKS["v100"][1]
    assert Cluster.homogeneous(16, "h100", devices_per_host=8).to_json() == Cluster.load(CLUSTERS / "h100_2x8.json").to_json()


def test_links_that_differ_from_link_and_host_link_are_written_one_by_one() -> None:
    c = two_hosts()
    odd = dataclasses.replace(c, links={**c.links, ("gpu1", "gpu2"): Link("gpu1", "gpu2", 1e-3, 1e6)})
    data = odd.to_json()
    assert data["links"] == [{"src": "gpu1", "dst": "gpu2", "latency": 1e-3, "bandwidth": 1e6}]
    assert Cluster.from_json(data).links == odd.links
    assert Cluster.from_json(Cluster.homogeneous(1, "h100").to_json()).names == ["gpu0"]


def test_a_ring_across_nodes_is_as_slow_as_the_network_between_them() -> None:
    c = Cluster.homogeneous(16, "h100", devices_per_host=8)
    nbytes = 1 << 30
    (lat, bw), n = NODE_LINKS["h100"], 16
    assert ring_all_reduce_time(c, c.names, nbytes) == pytest.approx(2 * (n - 1) * (lat + nbytes / n / bw))
    assert ring_time(c, c.names[:8], nbytes, phases=1) == pytest.approx(7 * (1e-5 + nbytes / 8 / 450e9))
    fitted = dataclasses.replace(c, all_reduce=AllReduceFit(1e-6, 1e12))  # a fit is of one host's collective
    assert ring_all_reduce_time(fitted, c.names, nbytes) == ring_all_reduce_time(c, c.names, nbytes)
    assert ring_all_reduce_time(c, c.names, nbytes) > 8 * ring_all_reduce_time(c, c.names[:8], nbytes)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"devices_per_host": 0}, "the devices per host must be at least 1, got 0"),
    ({"devices_per_host": -8}, "the devices per host must be at least 1, got -8"),
    ({"devices_per_host": 3}, "16 devices do not make whole hosts of 3 devices"),
    ({"devices_per_host": 32}, "16 devices do not make whole hosts of 32 devices"),
    ({"devices_per_host": 8.0}, "the devices per host must be a whole number, got 8.0"),
    ({"devices_per_host": True}, "the devices per host must be a whole number, got True"),
    ({"devices_per_host": "8"}, "the devices per host must be a whole number, got '8'"),
    ({"host_link": (2e-5, 5e10)}, "host_link is the link between hosts: give devices_per_host too"),
    ({"devices_per_host": 8, "host_link": "fast"}, "host_link is a pair \\(latency in seconds, bandwidth"),
    ({"devices_per_host": 8, "host_link": (2e-5,)}, "host_link is a pair"),
    ({"devices_per_host": 8, "host_link": (2e-5, math.nan)}, "link gpu0->gpu8: bandwidth must be positive"),
    ({"devices_per_host": 8, "host_link": (2e-5, 0)}, "link gpu0->gpu8: bandwidth must be positive"),
    ({"devices_per_host": 8, "host_link": (2e-5, math.inf)}, "link gpu0->gpu8: bandwidth inf is out of range"),
    ({"devices_per_host": 8, "host_link": (-1, 5e10)}, "link gpu0->gpu8: latency must be a finite number"),
    ({"devices_per_host": 8, "bandwidth": -1}, "link gpu0->gpu1: bandwidth must be positive"),
    ({"devices_per_host": 1, "latency": math.inf}, "link gpu0->gpu1: latency must be a finite number"),
])
def test_bad_nodes_are_refused_with_the_reason(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        Cluster.homogeneous(16, "h100", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "memory", "across"), [("h100_2x8", 80 * 2**30, (2e-5, 50e9)),
                                                         ("v100_p3_2x8", 16 * 2**30, (5e-5, 25e9 / 8))])
def test_the_example_cluster_files_are_two_nodes_of_eight(name: str, memory: float,
                                                          across: tuple[float, float]) -> None:
    c = Cluster.load(CLUSTERS / f"{name}.json")
    assert len(c) == 16 and [d.host for d in c.devices] == [0] * 8 + [1] * 8
    assert {d.memory for d in c.devices} == {memory}
    assert (c.link("gpu15", "gpu0").latency, c.link("gpu15", "gpu0").bandwidth) == across
    assert c.link("gpu8", "gpu15").bandwidth == (450e9 if name.startswith("h100") else 150e9)


def test_the_cli_plans_on_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pesto_ir.cli import build_arg_parser, main

    model, plan = str(ROOT / "examples" / "mlp_train_step.pir"), tmp_path / "plan.json"
    assert main([model, "--devices", "16", "--devices-per-host", "8", "--algo", "m-etf",
                 "--plan-json", str(plan), "-o", str(tmp_path / "x.pir"), "-q"]) == 0
    assert json.loads(plan.read_text())["devices"] == [f"gpu{i}" for i in range(16)]
    assert main([model, "--cluster", str(CLUSTERS / "v100_p3_2x8.json"), "--algo", "m-etf", "-q",
                 "-o", str(tmp_path / "y.pir")]) == 0
    assert main([model, "--devices", "16", "--devices-per-host", "3", "-q"]) == 1
    assert "--devices-per-host 3 does not divide the 16 devices into whole hosts" in capsys.readouterr().err
    assert main([model, "--cluster", str(CLUSTERS / "h100_2x8.json"), "--devices-per-host", "8", "-q"]) == 1
    assert "give either --cluster or --devices/--device-kind/--devices-per-host" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([model, "--devices", "16", "--devices-per-host", "0", "-q"])
    assert "argument --devices-per-host: '0' is not a positive whole number" in capsys.readouterr().err
    assert "at most 512" in " ".join(build_arg_parser().format_help().split())
