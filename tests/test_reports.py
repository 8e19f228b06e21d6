"""Reports (plan JSON, Chrome trace, Gantt) and the `simulate` pass on small placed graphs."""

from __future__ import annotations

import json

import pytest

import pesto_ir
from pesto_ir.backends.gantt import GanttError, colour_key, gantt_for_path, gantt_image
from pesto_ir.backends.plan_json import plan_json_text
from pesto_ir.backends.trace import chrome_trace, trace_json_text
from pesto_ir.cluster.model import Cluster
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.plan import Plan, read_plan_attrs
from pesto_ir.schedule.report import device_busy, format_summary, link_busy, peak_memory, summarize, utilisation

# a -> b on gpu0, a -> c on gpu1, b and c -> d on gpu1: a's 1 MB and b's 8 bytes go gpu0 -> gpu1
PLACED = """graph @toy() {
  %a = opaque() {cost = 1ms, memory = 100B, group = "g1", device = @gpu0} : blob[1000000]
  %b = opaque(%a) {cost = 2ms, memory = 10B, group = "g1", device = @gpu0} : blob[8]
  %c = opaque(%a) {cost = 3ms, memory = 20B, group = "g2", device = @gpu1} : blob[8]
  %d = opaque(%b, %c) {cost = 1ms, device = @gpu1} : blob[0]
}"""


def cluster() -> Cluster:
    return Cluster.homogeneous(2, "h100", latency=1e-4, bandwidth=1e9)  # 1 MB takes 1 ms + 0.1 ms


def simulated(text: str = PLACED, c: Cluster | None = None) -> tuple[pesto_ir.Graph, Plan]:
    g = PassManager("annotate-costs,simulate").run(pesto_ir.parse(text), PassContext(cluster=c or cluster(),
                                                                                      quiet=True))
    plan = read_plan_attrs(g)
    assert plan is not None
    return g, plan


def test_simulate_pass_times_the_recorded_placement() -> None:
    g, plan = simulated()
    assert plan.ops["a"].end == pytest.approx(1e-3)
    assert plan.ops["b"].start == pytest.approx(1e-3) and plan.ops["b"].end == pytest.approx(3e-3)
    t, tb = sorted(plan.transfers, key=lambda x: x.start)
    assert (t.src, t.src_device, t.to, t.nbytes) == ("a", "gpu0", "gpu1", 1000000)
    assert t.end == pytest.approx(1e-3 + 1e-4 + 1e-3)
    assert (tb.src, tb.nbytes) == ("b", 8) and tb.start == pytest.approx(3e-3)
    assert plan.ops["c"].start == pytest.approx(t.end)
    assert plan.ops["d"].start == pytest.approx(t.end + 3e-3)  # waits for c; b arrives earlier
    assert plan.makespan == pytest.approx(t.end + 4e-3)
    assert plan.lower_bound is not None and plan.lower_bound <= plan.makespan
    assert g.op("d").get("end") == pytest.approx(plan.makespan)
    back = pesto_ir.parse(str(g))  # the simulated plan survives printing
    assert read_plan_attrs(back).ops == plan.ops


def test_simulate_orders_by_recorded_start() -> None:
    text = """graph @two(%x: f32[4]) {
  %a = exp(%x) {cost = 1ms, device = @cpu0, start = 5ms} : f32[4]
  %b = exp(%x) {cost = 1ms, device = @cpu0, start = 0.0s} : f32[4]
}"""
    _, plan = simulated(text, Cluster.homogeneous(1, "cpu"))
    assert plan.ops["b"].start == 0.0 and plan.ops["a"].start == pytest.approx(1e-3)


def test_simulate_unplaced_graph_on_one_device() -> None:
    text = "graph @u() {\n  %a = opaque() {cost = 1ms} : blob[4]\n  %b = opaque(%a) {cost = 2ms} : blob[4]\n}"
    _, plan = simulated(text, Cluster.homogeneous(1, "cpu"))
    assert plan.makespan == pytest.approx(3e-3)


def test_simulate_needs_placement_on_several_devices() -> None:
    text = "graph @u() {\n  %a = opaque() {cost = 1ms} : blob[4]\n}"
    with pytest.raises(pesto_ir.PassError) as e:
        simulated(text)
    assert "op(s) have no device, e.g. 'a'" in e.value.format()


def test_simulate_rejects_deadlocking_order() -> None:
    text = """graph @dl() {
  %a = opaque() {cost = 1ms, device = @gpu0, start = 2ms} : blob[4]
  %b = opaque(%a) {cost = 1ms, device = @gpu0, start = 0.0s} : blob[4]
}"""
    with pytest.raises(pesto_ir.PassError, match="simulate"):
        simulated(text)


def test_summary_numbers() -> None:
    g, plan = simulated()
    assert device_busy(plan) == pytest.approx({"gpu0": 3e-3, "gpu1": 4e-3})
    assert utilisation(plan)["gpu1"] == pytest.approx(4e-3 / plan.makespan)
    assert link_busy(plan) == pytest.approx({("gpu0", "gpu1"): 1.1e-3 + 1e-4 + 8e-9})
    # gpu0: resident 110 + %a (until b ends at 3 ms) + %b (sent from 3 ms), from 1 ms on;
    # gpu1: resident 20 + the copy of a (1 ms to c's end) + %c + the copy of b, from 3 ms on
    assert peak_memory(g, plan) == {"gpu0": 110 + 1_000_000 + 8, "gpu1": 20 + 1_000_000 + 8 + 8}
    s = summarize(g, plan, cluster())
    text = format_summary(s)
    assert "makespan" in text and "gpu0 (h100): 2 ops" in text and "link gpu0 -> gpu1: 2 transfers" in text
    json.dumps(s.to_json())


def test_plan_json_is_pesto_plan_1() -> None:
    _, plan = simulated()
    data = json.loads(plan_json_text(plan))
    assert data["format"] == "pesto-plan/1" and data["graph"] == "toy"
    assert {o["id"] for o in data["ops"]} == {"a", "b", "c", "d"}
    assert data["makespan"] == pytest.approx(plan.makespan)
    assert Plan.from_json(data).ops == plan.ops
    assert data["peak_memory"] == {"gpu0": 110 + 1_000_000 + 8, "gpu1": 20 + 1_000_000 + 8 + 8}
    assert Plan.from_json(data).peak_memory == data["peak_memory"]


def test_peak_memory_survives_the_text_round_trip() -> None:
    g, plan = simulated()
    back = read_plan_attrs(pesto_ir.parse(str(g)))
    assert back is not None and back.peak_memory == plan.peak_memory == peak_memory(g, plan)


def test_chrome_trace_rows_and_events() -> None:
    g, plan = simulated()
    data = json.loads(trace_json_text(plan, g))
    events = data["traceEvents"]
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {(1, "gpu0"), (1, "gpu1"), (2, "gpu0 -> gpu1")}
    ops = {e["name"]: e for e in events if e.get("cat") == "op"}
    assert ops["b"]["args"]["opcode"] == "opaque" and ops["b"]["args"]["group"] == "g1"
    assert ops["b"]["ts"] == pytest.approx(1000.0) and ops["b"]["dur"] == pytest.approx(2000.0)
    xfer, _ = sorted((e for e in events if e.get("cat") == "transfer"), key=lambda e: e["ts"])
    assert xfer["name"] == "a -> gpu1" and xfer["args"]["bytes"] == 1000000
    assert chrome_trace(plan)["traceEvents"]  # the graph is optional


def test_chrome_trace_of_a_hybrid_plan_shows_micro_batches_and_collectives() -> None:
    from test_gantt import all_reduces, hybrid_plan

    g, plan = hybrid_plan()
    data = json.loads(trace_json_text(plan, g))
    events = data["traceEvents"]
    ops = {e["name"]: e for e in events if e.get("ph") == "X" and e["pid"] == 1}
    assert set(ops) == set(plan.ops)
    copies = {n: e for n, e in ops.items() if "microbatch" in e["args"]}
    assert {e["args"]["microbatch"] for e in copies.values()} == {0, 1}
    assert all(e["cat"] == f"op,mb{e['args']['microbatch']}" for e in copies.values())
    assert copies.keys() == {op.name for op in g.ops if "microbatch" in op.attrs}
    by_op = {c.op: c for c in plan.collectives}
    collective = {n: e for n, e in ops.items() if e["cat"] == "collective"}
    assert set(collective) == set(all_reduces(g)) and collective
    for name, e in collective.items():
        assert e["args"]["bytes"] == by_op[name].nbytes and e["args"]["devices"] == by_op[name].devices
        assert len(e["args"]["devices"]) == 2 and e["args"]["opcode"] == "all_reduce"
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1}
    assert threads == {"gpu0", "gpu1"}  # replica 1 mirrors replica 0: no empty rows for gpu2, gpu3
    [labels] = [e["args"]["labels"] for e in events if e["ph"] == "M" and e["name"] == "process_labels"]
    assert "data-parallel 2 x 2 micro-batches" in labels and "gpu2,gpu3 mirror it" in labels
    [instant] = [e for e in events if e["ph"] == "i"]
    assert instant["s"] == "g" and instant["args"]["replicas"] == [["gpu0", "gpu1"], ["gpu2", "gpu3"]]
    assert data["otherData"]["parallelism"]["microbatches"] == 2


def test_chrome_trace_of_a_one_replica_plan_has_no_hybrid_events() -> None:
    g, plan = simulated()
    events = chrome_trace(plan, g)["traceEvents"]
    assert {e["cat"] for e in events if e["ph"] == "X"} == {"op", "transfer"}
    assert not [e for e in events if e["ph"] == "i" or e["name"] == "process_labels"]
    assert "parallelism" not in chrome_trace(plan, g)["otherData"]


def test_gantt_png_and_svg(tmp_path) -> None:
    g, plan = simulated()
    png = gantt_for_path(plan, g, tmp_path / "p.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    svg = gantt_for_path(plan, g, "p.svg").decode()
    assert "<svg" in svg and "makespan" in svg and "lower bound" in svg
    assert gantt_image(plan, None, "pdf")[:4] == b"%PDF"
    with pytest.raises(GanttError, match="must end in"):
        gantt_for_path(plan, g, "p.gif")


def test_colour_keys() -> None:
    g = pesto_ir.parse("""graph @k(%x: f32[4]) {
  %a = exp(%x) : f32[4]
  %b = opaque() {label = "bert/layer_3/attn"} : blob[4]
  %c = opaque() {label = "node12"} : blob[4]
  %d = exp(%x) {group = "coarse7"} : f32[4]
}""")
    assert [colour_key(g, n) for n in "abcd"] == ["exp", "bert", "node", "coarse7"]


def test_render_reports_all_or_a_clear_error() -> None:
    from pesto_ir.backends.reports import ReportError, render_reports

    g, _ = simulated()
    out = dict(render_reports(g, plan_json="p.json", trace="t.json", gantt="g.svg"))
    assert json.loads(out["p.json"])["format"] == "pesto-plan/1"
    assert "traceEvents" in json.loads(out["t.json"])
    assert b"<svg" in out["g.svg"]
    assert render_reports(pesto_ir.parse("graph @e() {\n}")) == []
    with pytest.raises(ReportError, match="no plan to report"):
        render_reports(pesto_ir.parse("graph @e() {\n}"), trace="t.json")
