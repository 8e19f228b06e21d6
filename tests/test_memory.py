"""Per-device memory of a placed, timed plan (`pesto_ir.schedule.memory`): hand-computed peaks, a brute-force
property on random DAGs (lifetimes re-derived here from the rules, not taken from the module), the
`pesto-graph/1` memory fields and the validator's out-of-memory message."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clusters, graph_docs

from pesto_ir import parse
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_from_json, graph_to_json, parse_json_graph
from pesto_ir.ir.attributes import BytesAttr
from pesto_ir.ir.graph import DONATED, Graph, donate_inputs, donated_inputs
from pesto_ir.ir.types import BlobType
from pesto_ir.schedule.memory import GraphBytes, fits_memory, live_bytes, peak_memory
from pesto_ir.schedule.plan import Plan
from pesto_ir.schedule.simulate import PlanError, order_from_priority, simulate
from pesto_ir.schedule.validate import check_plan
from pesto_ir.util.errors import ParseError

MS = 1e-3
INF = math.inf


def one_device() -> Cluster:
    return Cluster.homogeneous(1, "v100")


def linked(n: int) -> Cluster:
    """`n` GPUs; a 1000-byte transfer takes 1 ms latency + 1 ms on the wire."""
    return Cluster.homogeneous(n, "v100", latency=1 * MS, bandwidth=1e6)


def names(peak: Any) -> list[str]:
    return [lt.what for lt in peak.alive]


def steps_ms(steps: list[tuple[float, int]]) -> list[tuple[float, int]]:
    return [(round(t / MS, 9), b) for t, b in steps]


# ---------------------------------------------------------------- hand-made schedules

CHAIN = parse("""graph @chain() {
  %a = opaque() {cost = 1ms} : blob[100]
  %b = opaque(%a) {cost = 1ms} : blob[200]
  %c = opaque(%b) {cost = 1ms} : blob[400]
  %d = opaque(%c) {cost = 1ms} : blob[50]
}""")


def test_a_chain_frees_outputs_as_their_readers_finish() -> None:
    # a [0,1) b [1,2) c [2,3) d [3,4) on gpu0. Held: %a [0,2) 100, %b [1,3) 200, %c [2,4) 400,
    # %d [3,4) 50 (nobody reads it, not an output). Sums: t=0: 100, t=1: 300, t=2: 600, t=3: 450,
    # t=4: 0. Peak 600 at 2 ms (%c + %b), not the 750 of all outputs together.
    plan = simulate(CHAIN, one_device(), dict.fromkeys("abcd", "gpu0"), {"gpu0": list("abcd")})
    peak = peak_memory(CHAIN, plan)["gpu0"]
    assert peak.nbytes == 600
    assert peak.time == pytest.approx(2 * MS)
    assert names(peak) == ["%c", "%b"]
    assert steps_ms(live_bytes(CHAIN, plan)["gpu0"]) == [(0, 100), (1, 300), (2, 600), (3, 450), (4, 0)]


SEND = parse("""graph @send() {
  %a = opaque() {cost = 1ms} : blob[1000]
  %b = opaque(%a) {cost = 1ms} : blob[10]
  %b2 = opaque() {cost = 1ms} : blob[500]
  %c = opaque(%a) {cost = 1ms} : blob[20]
  %e = opaque(%a) {cost = 1ms} : blob[30]
}""")


def test_a_transfer_holds_the_sender_until_it_ends_and_the_copy_until_its_last_reader() -> None:
    # gpu0 runs a [0,1), b [1,2), b2 [2,3); gpu1 runs c, e. %a goes to gpu1 over [1,3) (1 ms latency
    # + 1000 B at 1 MB/s). c starts when it arrives: c [3,4), e [4,5).
    # gpu0: %a [0,3) 1000 (its last local reader b ends at 2 but the transfer at 3), %b [1,2) 10,
    #   %b2 [2,3) 500. Sums: t=0: 1000, t=1: 1010, t=2: 1500, t=3: 0. Peak 1500 at 2 ms.
    # gpu1: copy [1,5) 1000 (from the transfer's start to e's end), %c [3,4) 20, %e [4,5) 30.
    #   Sums: t=1: 1000, t=3: 1020, t=4: 1030, t=5: 0. Peak 1030 at 4 ms.
    place = {"a": "gpu0", "b": "gpu0", "b2": "gpu0", "c": "gpu1", "e": "gpu1"}
    plan = simulate(SEND, linked(2), place, {"gpu0": ["a", "b", "b2"], "gpu1": ["c", "e"]})
    (t,) = plan.transfers
    assert (t.src, t.to, t.nbytes) == ("a", "gpu1", 1000)
    assert (t.start, t.end) == pytest.approx((1 * MS, 3 * MS))
    peaks = peak_memory(SEND, plan)
    assert peaks["gpu0"].nbytes == 1500 and peaks["gpu0"].time == pytest.approx(2 * MS)
    assert names(peaks["gpu0"]) == ["%a", "%b2"]
    assert peaks["gpu1"].nbytes == 1030 and peaks["gpu1"].time == pytest.approx(4 * MS)
    assert names(peaks["gpu1"]) == ["copy of 'a' from gpu0", "%e"]
    live = live_bytes(SEND, plan)
    assert steps_ms(live["gpu0"]) == [(0, 1000), (1, 1010), (2, 1500), (3, 0)]
    assert steps_ms(live["gpu1"]) == [(1, 1000), (3, 1020), (4, 1030), (5, 0)]


def test_a_graph_output_is_kept_to_the_end_of_the_step() -> None:
    g = parse("""graph @out() {
  %a = opaque() {cost = 1ms} : blob[100]
  %b = opaque(%a) {cost = 1ms} : blob[200]
  %c = opaque() {cost = 1ms} : blob[300]
  return %b
}""")
    # a [0,1) b [1,2) c [2,3): %a [0,2) 100, %b [1,inf) 200 (an output), %c [2,3) 300.
    # Sums: t=0: 100, t=1: 300, t=2: 500, t=3: 200 (still held). Peak 500 at 2 ms; were %b freed
    # when it ends it would be 300.
    plan = simulate(g, one_device(), dict.fromkeys("abc", "gpu0"), {"gpu0": ["a", "b", "c"]})
    peak = peak_memory(g, plan)["gpu0"]
    assert (peak.nbytes, names(peak)) == (500, ["%c", "%b"])
    assert peak.time == pytest.approx(2 * MS)
    assert steps_ms(live_bytes(g, plan)["gpu0"]) == [(0, 100), (1, 300), (2, 500), (3, 200)]


def test_a_graph_input_is_resident_on_every_device_that_reads_it() -> None:
    g = parse("""graph @inp(%x: f32[100], %y: f32[10], %unused: f32[1000]) {
  %a = opaque(%x) {cost = 1ms} : blob[8]
  %a2 = opaque(%x) {cost = 1ms} : blob[0]
  %b = opaque(%x, %y) {cost = 1ms} : blob[8]
  %c = opaque() {cost = 1ms} : blob[16]
}""")
    # %x (400 B) is read on gpu0 (twice: counted once) and gpu1; %y (40 B) on gpu1; nothing reads
    # %unused. gpu0: input %x [0,inf) 400 + %a [0,1) 8: peak 408 at 0. gpu1: 400 + 40 + %b [0,1) 8 =
    # 448 at 0. gpu2 reads no input: %c 16 only.
    place = {"a": "gpu0", "a2": "gpu0", "b": "gpu1", "c": "gpu2"}
    plan = simulate(g, linked(3), place, {"gpu0": ["a", "a2"], "gpu1": ["b"], "gpu2": ["c"]})
    peaks = peak_memory(g, plan)
    assert (peaks["gpu0"].nbytes, peaks["gpu0"].time, names(peaks["gpu0"])) == (408, 0.0, ["input %x", "%a"])
    assert (peaks["gpu1"].nbytes, peaks["gpu1"].time) == (448, 0.0)
    assert names(peaks["gpu1"]) == ["input %x", "input %y", "%b"]
    assert (peaks["gpu2"].nbytes, names(peaks["gpu2"])) == (16, ["%c"])
    # after every op has ended the inputs are still held
    assert steps_ms(live_bytes(g, plan)["gpu0"]) == [(0, 408), (1, 400)]


def test_a_donated_input_is_freed_on_each_device_after_its_last_reader_there() -> None:
    g = parse("""graph @don(param %w: f32[100], param %m: f32[50], %x: f32[10]) attributes {donated = ["w", "m"]} {
  %a = opaque(%w, %x) {cost = 1ms} : blob[8]
  %b = opaque(%w) {cost = 1ms} : blob[4]
  %c = opaque(%w) {cost = 1ms} : blob[2]
  %n = opaque(%m, %b) {cost = 1ms} : f32[50]
  return %n, %m
}""")
    # gpu0 runs a [0,1), b [1,2), n [2,3); gpu1 runs c [0,1). %w (400 B) is read on both devices:
    # freed on gpu0 when b ends (2 ms), on gpu1 when c ends (1 ms). %m (200 B) is donated but also
    # returned as it is, so it stays. %x (40 B) is not donated: held all step.
    # gpu0: t=0: 400 + 200 + 40 + %a 8 = 648; t=1: 400 + 200 + 40 + %b 4 = 644 (%a freed: nobody
    # reads it); t=2: 200 + 40 + %n 200 = 440 (%b freed when n ends at 3, so + 4 = 444).
    place = {"a": "gpu0", "b": "gpu0", "n": "gpu0", "c": "gpu1"}
    plan = simulate(g, linked(2), place, {"gpu0": ["a", "b", "n"], "gpu1": ["c"]})
    live = live_bytes(g, plan)
    assert steps_ms(live["gpu0"]) == [(0, 648), (1, 644), (2, 444), (3, 440)]
    assert steps_ms(live["gpu1"]) == [(0, 402), (1, 0)]
    kept = g.clone()
    del kept.attrs[DONATED]
    assert steps_ms(live_bytes(kept, plan)["gpu0"]) == [(0, 648), (1, 644), (2, 844), (3, 840)]
    assert steps_ms(live_bytes(kept, plan)["gpu1"]) == [(0, 402), (1, 400)]


def test_workspace_is_held_only_while_its_op_runs() -> None:
    g = parse("""graph @ws() {
  %a = opaque() {cost = 1ms, workspace = 500B} : blob[100]
  %b = opaque(%a) {cost = 2ms, workspace = 50B} : blob[10]
  %c = opaque(%b) {cost = 1ms} : blob[1]
}""")
    # a [0,1) b [1,3) c [3,4). t=0: %a 100 + ws(a) 500 = 600; t=1: %a 100 + %b 10 + ws(b) 50 = 160;
    # t=3: %b 10 + %c 1 = 11; t=4: 0. Peak 600 at 0.
    plan = simulate(g, one_device(), dict.fromkeys("abc", "gpu0"), {"gpu0": ["a", "b", "c"]})
    peak = peak_memory(g, plan)["gpu0"]
    assert (peak.nbytes, peak.time, names(peak)) == (600, 0.0, ["workspace of 'a'", "%a"])
    assert steps_ms(live_bytes(g, plan)["gpu0"]) == [(0, 600), (1, 160), (3, 11), (4, 0)]


def test_activation_overrides_result_sizes_and_memory_is_resident() -> None:
    g = parse("""graph @act() {
  %a = opaque() {cost = 1ms, memory = 1000B, activation = 0B} : blob[5000]
  %b, %b2 = opaque(%a) {cost = 1ms, activation = 300B} : blob[7], blob[9]
  %c = opaque(%b) {cost = 1ms} : blob[40]
}""")
    # a [0,1) b [1,2) c [2,3). resident of 'a' [0,inf) 1000; a's output is inside it (activation 0:
    # its 5000-byte blob counts nowhere); b's output is 300 B (not 7 + 9), held [1,3) until c ends;
    # %c [2,3) 40. Sums: t=0: 1000, t=1: 1300, t=2: 1340, t=3: 1000. Peak 1340 at 2 ms.
    plan = simulate(g, one_device(), dict.fromkeys("abc", "gpu0"), {"gpu0": ["a", "b", "c"]})
    peak = peak_memory(g, plan)["gpu0"]
    assert peak.nbytes == 1340 and peak.time == pytest.approx(2 * MS)
    assert names(peak) == ["resident of 'a'", "output of 'b'", "%c"]
    assert steps_ms(live_bytes(g, plan)["gpu0"]) == [(0, 1000), (1, 1300), (2, 1340), (3, 1000)]


def test_a_zero_cost_op_holds_only_what_its_readers_keep() -> None:
    g = parse("""graph @zero() {
  %a = opaque() {cost = 1ms} : blob[100]
  %z = opaque(%a) {cost = 0ms, workspace = 9999B} : blob[1000]
  %y = opaque() {cost = 0ms} : blob[5000]
  %b = opaque(%z) {cost = 1ms} : blob[10]
}""")
    # a [0,1), z [1,1), y [1,1), b [1,2). %a [0,1) 100 (freed at 1 when z ends); z's workspace and
    # %y are zero-length: nothing; %z [1,2) 1000 (b reads it); %b [1,2) 10.
    # Sums: t=0: 100, t=1: 1010, t=2: 0. Peak 1010 at 1 ms.
    plan = simulate(g, one_device(), dict.fromkeys("azyb", "gpu0"), {"gpu0": ["a", "z", "y", "b"]})
    assert plan.ops["z"].start == plan.ops["z"].end == plan.ops["y"].end == pytest.approx(1 * MS)
    peak = peak_memory(g, plan)["gpu0"]
    assert (peak.nbytes, names(peak)) == (1010, ["%z", "%b"])
    assert peak.time == pytest.approx(1 * MS)
    assert steps_ms(live_bytes(g, plan)["gpu0"]) == [(0, 100), (1, 1010), (2, 0)]


def test_an_idle_device_peaks_at_nothing() -> None:
    plan = simulate(CHAIN, linked(2), dict.fromkeys("abcd", "gpu0"), {"gpu0": list("abcd")})
    peak = peak_memory(CHAIN, plan)["gpu1"]
    assert (peak.nbytes, peak.time, peak.alive) == (0, 0.0, ())
    assert live_bytes(CHAIN, plan)["gpu1"] == []


# ---------------------------------------------------------------- brute force on random DAGs

Span = tuple[str, float, float, int, str]  # device, start, end, bytes, what


def spans_by_the_rules(graph: Graph, plan: Plan) -> list[Span]:
    """Every interval of bytes held, derived from the graph, the plan and its transfers."""
    readers: dict[int, list[str]] = defaultdict(list)  # value -> names of ops that read it
    for op in graph.ops:
        for v in op.operands:
            readers[id(v)].append(op.name)
    outputs = {id(v) for v in graph.outputs}
    transfers = {(t.src, t.to): t for t in plan.transfers}
    slot = plan.ops
    out: list[Span] = []
    donated = donated_inputs(graph)
    for v in graph.inputs:
        for d in sorted({slot[n].device for n in readers[id(v)]}):
            # a donated input is freed where it is read once its last reader there ends, unless returned
            end = max(slot[n].end for n in readers[id(v)] if slot[n].device == d) \
                if v.name in donated and id(v) not in outputs else INF
            out.append((d, 0.0, end, v.type.nbytes, f"input %{v.name}"))
    for op in graph.ops:
        s = slot[op.name]
        d = s.device
        out.append((d, 0.0, INF, int(op.get("memory") or 0), f"resident of '{op.name}'"))
        out.append((d, s.start, s.end, int(op.get("workspace") or 0), f"workspace of '{op.name}'"))
        released = []
        for r in op.results:
            if id(r) in outputs:
                released.append(INF)
                continue
            end = s.end
            for n in readers[id(r)]:
                there = slot[n].device
                end = max(end, slot[n].end if there == d else transfers[(op.name, there)].end)
            released.append(end)
        if op.get("activation") is not None:
            out.append((d, s.start, max(released), int(op.get("activation")), f"output of '{op.name}'"))
        else:
            out.extend((d, s.start, end, r.type.nbytes, f"%{r.name}") for r, end in zip(op.results, released))
    for t in plan.transfers:
        op = graph.op(t.src)
        last = max([slot[n].end for r in op.results for n in readers[id(r)] if slot[n].device == t.to])
        out.append((t.to, t.start, max(t.end, last), t.nbytes, f"copy of '{t.src}' from {t.src_device}"))
    return [sp for sp in out if sp[3] > 0 and sp[2] > sp[1]]


def held_at(spans: list[Span], device: str, t: float) -> list[Span]:
    return [sp for sp in spans if sp[0] == device and sp[1] <= t < sp[2]]


@st.composite
def memory_problems(draw: st.DrawFn) -> tuple[Graph, Cluster, Plan]:
    """A random DAG with every kind of memory (resident, activation, workspace, graph inputs,
    donated or not, and outputs), placed at random (colocation groups kept together) and simulated."""
    doc = draw(graph_docs(max_ops=8, memory=False))
    for node in doc["nodes"]:
        mode = draw(st.sampled_from(("edges", "memory", "split", "activation only")))
        if mode == "memory":
            node["memory"] = draw(st.integers(0, 1000))
        elif mode == "split":
            node["resident"] = draw(st.integers(0, 1000))
            node["activation"] = draw(st.integers(0, 3000))
        elif mode == "activation only":
            node["activation"] = draw(st.integers(0, 3000))
    graph = graph_from_json(doc)
    for op in graph.ops:
        if draw(st.booleans()):
            op.attrs["workspace"] = BytesAttr(draw(st.integers(0, 5000)))
    for i in range(draw(st.integers(0, 3))):
        x = graph.add_input(f"x{i}", BlobType(draw(st.sampled_from((0, 8, 400, 10**5)))))
        for op in draw(st.lists(st.sampled_from(graph.ops), max_size=3, unique_by=lambda o: o.name)):
            op.set_operands([*op.operands, x])
    results = [r for op in graph.ops for r in op.results] + graph.inputs
    graph.set_outputs(draw(st.lists(st.sampled_from(results), max_size=3, unique_by=id)))
    donate_inputs(graph, [v.name for v in graph.inputs if draw(st.booleans())])

    cluster = draw(clusters(max_devices=3))
    group_device: dict[str, str] = {}
    placement = {}
    for op in graph.ops:
        group = op.get("colocate")
        if group is None:
            placement[op.name] = draw(st.sampled_from(cluster.names))
        else:
            placement[op.name] = group_device.setdefault(group, draw(st.sampled_from(cluster.names)))
    priority = {op.name: draw(st.integers(0, 3)) for op in graph.ops}
    plan = simulate(graph, cluster, placement, order_from_priority(graph, placement, priority))
    return graph, cluster, plan


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memory_problems())
def test_peaks_and_live_bytes_match_a_brute_force(problem: tuple[Graph, Cluster, Plan]) -> None:
    graph, cluster, plan = problem
    spans = spans_by_the_rules(graph, plan)
    peaks = peak_memory(graph, plan)
    live = live_bytes(graph, plan)
    assert set(peaks) == set(live) == set(cluster.names)
    for d in cluster.names:
        starts = sorted({sp[1] for sp in spans if sp[0] == d})
        sums = [(sum(sp[3] for sp in held_at(spans, d, t)), t) for t in starts]
        best = max((b for b, _ in sums), default=0)
        first = min((t for b, t in sums if b == best), default=0.0)
        peak = peaks[d]
        assert peak.nbytes == best, (d, spans)
        if best:
            assert peak.time == first
            assert sorted((lt.what, lt.nbytes, lt.start, lt.end) for lt in peak.alive) == sorted(
                (sp[4], sp[3], sp[1], sp[2]) for sp in held_at(spans, d, first))
            assert [lt.nbytes for lt in peak.alive] == sorted((lt.nbytes for lt in peak.alive), reverse=True)
        # the step function: right at each step, and at every moment anything starts or ends
        steps = live[d]
        times = [t for t, _ in steps]
        assert times == sorted(set(times))
        for t, b in steps:
            assert b == sum(sp[3] for sp in held_at(spans, d, t)), (d, t, spans)
        for t in {sp[1] for sp in spans if sp[0] == d} | {sp[2] for sp in spans if sp[0] == d} - {INF}:
            before = [b for s, b in steps if s <= t]
            assert before and before[-1] == sum(sp[3] for sp in held_at(spans, d, t))
    check_plan(graph, cluster, plan)
    assert plan.peak_memory == {d: p.nbytes for d, p in peaks.items()}
    # donating frees bytes earlier, never later: no device peaks higher than when nothing is donated
    kept = graph.clone()
    kept.attrs.pop(DONATED, None)
    assert all(peak_memory(kept, plan)[d].nbytes >= peaks[d].nbytes for d in cluster.names)
    # the searches' check, prepared once per graph, says the same at every capacity around the peaks
    prepared = GraphBytes(graph)
    for d in cluster.names:
        for capacity in (peaks[d].nbytes, peaks[d].nbytes - 1):
            limits = {n: capacity if n == d else math.inf for n in cluster.names}
            assert fits_memory(graph, plan, limits, prepared) == (peaks[d].nbytes <= capacity)


# ---------------------------------------------------------------- pesto-graph/1 memory fields

def doc(*nodes: dict[str, Any], edges: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"format": "pesto-graph/1", "name": "m", "nodes": list(nodes), "edges": list(edges)}


def test_json_resident_and_activation_import_and_export() -> None:
    g = graph_from_json(doc({"id": "a", "cost": 0.001, "resident": 100, "activation": 40},
                            {"id": "b", "cost": 0.001, "memory": 70},
                            {"id": "c", "cost": 0.001, "activation": 5},
                            {"id": "d", "cost": 0.001},
                            edges=({"src": "a", "dst": "b", "bytes": 1000},)))
    a, b, c, d = (g.op(n) for n in "abcd")
    assert (a.get("memory"), a.get("activation")) == (100, 40)
    assert (b.get("memory"), b.get("activation")) == (70, 0)  # its output is inside its memory
    assert (c.get("memory"), c.get("activation")) == (0, 5)
    assert "memory" not in d.attrs and "activation" not in d.attrs
    out = graph_to_json(g)
    fields = {n["id"]: {k: n[k] for k in ("memory", "resident", "activation") if k in n} for n in out["nodes"]}
    assert fields == {"a": {"resident": 100, "activation": 40}, "b": {"memory": 70},
                      "c": {"resident": 0, "activation": 5}, "d": {}}
    back = graph_from_json(json.loads(json.dumps(out)))
    for op in g.ops:
        assert {k: op.get(k) for k in ("memory", "activation")} == {
            k: back.op(op.name).get(k) for k in ("memory", "activation")}
    assert graph_to_json(back) == out
    # the same peak either way: a on gpu0 [0,1) then b [1,2): resident 100 + 70, a's output 40 [0,2)
    place = dict.fromkeys("abcd", "gpu0")
    for graph in (g, back):
        plan = simulate(graph, one_device(), place, {"gpu0": list("abcd")})
        assert peak_memory(graph, plan)["gpu0"].nbytes == 100 + 70 + 40


def test_json_export_of_a_text_graph_keeps_its_outputs_counted() -> None:
    # `memory` without `activation` (a text graph): its results are its output, so the export must
    # say `activation` too; `resident` alone would import as activation 0 and drop %a's 1000 B.
    g = parse("""graph @t() {
  %a = opaque() {cost = 1ms, memory = 100B} : blob[1000]
  %b = opaque(%a) {cost = 1ms} : blob[0]
}""")
    (node, _) = graph_to_json(g)["nodes"]
    assert {k: node[k] for k in ("memory", "resident", "activation") if k in node} == {
        "resident": 100, "activation": 1000}
    back = graph_from_json(graph_to_json(g))
    place = {"a": "gpu0", "b": "gpu0"}
    for graph in (g, back):
        plan = simulate(graph, one_device(), place, {"gpu0": ["a", "b"]})
        # a [0,1) b [1,2): resident 100 for the step, a's output 1000 over [0,2): 1100 at 0
        assert peak_memory(graph, plan)["gpu0"].nbytes == 1100


@settings(max_examples=50, deadline=None)
@given(graph_docs(max_ops=8), clusters(max_devices=3), st.data())
def test_json_round_trip_keeps_every_peak(d: dict[str, Any], cluster: Cluster, data: st.DataObject) -> None:
    for node in d["nodes"]:  # some nodes split their memory into resident and activation
        if "memory" in node and data.draw(st.booleans()):
            node["resident"] = node.pop("memory")
            node["activation"] = data.draw(st.integers(0, 3000))
    g = graph_from_json(d)
    back = graph_from_json(json.loads(json.dumps(graph_to_json(g))))
    placement = {op.name: data.draw(st.sampled_from(cluster.names)) for op in g.ops}
    order = order_from_priority(g, placement)
    before = peak_memory(g, simulate(g, cluster, placement, order))
    after = peak_memory(back, simulate(back, cluster, placement, order))
    assert {k: p.nbytes for k, p in before.items()} == {k: p.nbytes for k, p in after.items()}


@pytest.mark.parametrize("node", [
    {"memory": 10, "resident": 5},
    {"memory": 10, "activation": 5},
    {"memory": 10, "resident": 5, "activation": 5},
])
def test_json_memory_with_resident_or_activation_is_an_error(node: dict[str, Any]) -> None:
    with pytest.raises(ParseError, match=r"node 'a': give either memory .* or resident and activation"):
        graph_from_json(doc({"id": "a", **node}))


@pytest.mark.parametrize("key", ["memory", "resident", "activation"])
@pytest.mark.parametrize("value", [1.5, -1, float("nan"), float("inf"), "100", True, None])
def test_json_node_bytes_must_be_whole_and_non_negative(key: str, value: Any) -> None:
    with pytest.raises(ParseError, match=f"node 'a': {key} must be a whole non-negative number of bytes"):
        graph_from_json(doc({"id": "a", key: value}))


def test_json_node_bytes_may_be_whole_floats() -> None:
    g = graph_from_json(doc({"id": "a", "resident": 100.0, "activation": 0}))
    assert (g.op("a").get("memory"), g.op("a").get("activation")) == (100, 0)


@pytest.mark.parametrize("value", [1.5, -1, "4", True])
def test_json_edge_bytes_must_be_whole_and_non_negative(value: Any) -> None:
    with pytest.raises(ParseError, match=r"edges\[0\] \(a -> b\): bytes must be a whole non-negative number"):
        graph_from_json(doc({"id": "a"}, {"id": "b"}, edges=({"src": "a", "dst": "b", "bytes": value},)))


@pytest.mark.parametrize("literal", ["NaN", "Infinity"])
def test_json_edge_bytes_nan_or_infinite_is_a_clean_error(literal: str) -> None:
    text = ('{"format": "pesto-graph/1", "nodes": [{"id": "a"}, {"id": "b"}], '
            f'"edges": [{{"src": "a", "dst": "b", "bytes": {literal}}}]}}')
    with pytest.raises(ParseError, match="bytes must be a whole non-negative number"):
        parse_json_graph(text)


# ---------------------------------------------------------------- the validator's message

def test_out_of_memory_names_the_device_the_peak_the_moment_and_the_largest_tensors() -> None:
    # CHAIN peaks at 600 B at 2 ms (%c 400 + %b 200): a 599-byte device is one byte short.
    cluster = Cluster.homogeneous(1, "v100", memory=599)
    plan = simulate(CHAIN, cluster, dict.fromkeys("abcd", "gpu0"), {"gpu0": list("abcd")})
    with pytest.raises(PlanError) as e:
        check_plan(CHAIN, cluster, plan)
    msg = str(e.value)
    assert "out of memory: gpu0 peaks at 600 B (600 bytes) at 2 ms, 1 bytes more than its 599 B" in msg
    assert "alive then: %c 400 B, %b 200 B" in msg
    assert plan.peak_memory is None
    roomy = Cluster.homogeneous(1, "v100", memory=600)
    check_plan(CHAIN, roomy, plan)
    assert plan.peak_memory == {"gpu0": 600}


def test_out_of_memory_shows_the_five_largest_and_counts_the_rest() -> None:
    g = parse("graph @many() {\n" + "".join(
        f"  %r{i} = opaque() {{cost = 1ms, memory = {100 * (i + 1)}B}} : blob[0]\n" for i in range(7)) + "}")
    # seven resident blocks of 100..700 B, all held from 0: 2800 B at 0 on the one device
    cluster = Cluster.homogeneous(1, "v100", memory=1000)
    plan = simulate(g, cluster, {f"r{i}": "gpu0" for i in range(7)}, {"gpu0": [f"r{i}" for i in range(7)]})
    with pytest.raises(PlanError) as e:
        check_plan(g, cluster, plan)
    msg = str(e.value)
    assert "gpu0 peaks at" in msg and "(2800 bytes) at 0 ns, 1800 bytes more than its" in msg
    assert ("alive then: resident of 'r6' 700 B, resident of 'r5' 600 B, resident of 'r4' 500 B, "
            "resident of 'r3' 400 B, resident of 'r2' 300 B and 2 more") in msg
