"""The data-parallel contract: ring all-reduce time, `Plan.parallelism` and `Plan.collectives` in
pesto-plan/1 and in the IR, the `all_reduce` op (verifier, printer, costs, single-process
backends) and the validator's rules for hybrid plans."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pesto_ir import parse, verify
from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.model import Cluster, ring_all_reduce_time
from pesto_ir.ir.attributes import DurationAttr, to_attr
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.types import BlobType, TensorType
from pesto_ir.passes.annotate_costs import AnnotateCostsPass
from pesto_ir.passmanager import PassContext
from pesto_ir.schedule.plan import (
    Collective,
    OpSlot,
    Parallelism,
    Plan,
    Transfer,
    collectives_for,
    read_plan_attrs,
    write_plan_attrs,
)
from pesto_ir.schedule.simulate import PlanError, simulate
from pesto_ir.schedule.validate import check_plan, validate_plan
from pesto_ir.util.errors import PestoError, VerifyError

MS = 1e-3
LATENCY, BANDWIDTH = 1e-5, 1e9
GRAD_BYTES = 256 * 4  # f32[256]
# the ring all-reduce of GRAD_BYTES over 2 devices: 2 (n - 1) steps of latency + (bytes / n) / bandwidth
RING_2 = 2 * 1 * (LATENCY + (GRAD_BYTES / 2) / BANDWIDTH)
CLUSTER = Cluster.homogeneous(2, "v100", memory=1 << 20, latency=LATENCY, bandwidth=BANDWIDTH)
PAR = Parallelism(2, 1, (("gpu0",), ("gpu1",)))


def dp_graph(ar_cost: float = RING_2, replicas: int = 2) -> Graph:
    """grad -> all_reduce -> update: one replica's graph of a data-parallel SGD step."""
    return parse(f"""
graph @dp(%x: f32[256], param %w: f32[256]) attributes {{microbatched = {{data_parallel = {replicas}, microbatches = 1}}}} {{
  %grad = mul(%x, %w) {{cost = 1ms}} : f32[256]
  %ar = all_reduce(%grad) {{reduction = "sum", replicas = {replicas}, cost = {ar_cost!r}}} : f32[256]
  %upd = sub(%w, %ar) {{cost = 1ms}} : f32[256]
  return %upd
}}
""")


def dp_plan(graph: Graph | None = None, par: Parallelism | None = PAR) -> Plan:
    graph = graph or dp_graph()
    plan = simulate(graph, CLUSTER, {"grad": "gpu0", "ar": "gpu0", "upd": "gpu0"},
                    {"gpu0": ["grad", "ar", "upd"], "gpu1": []}, "hand")
    plan.parallelism = par
    plan.collectives = collectives_for(graph, plan)
    return plan


def problems(edit: Callable[[Plan], None], graph: Graph | None = None, cluster: Cluster = CLUSTER) -> list[str]:
    graph = graph or dp_graph()
    plan = copy.deepcopy(dp_plan(graph))
    edit(plan)
    return validate_plan(graph, cluster, plan)


# ---------------------------------------------------------------- ring all-reduce time

@pytest.mark.parametrize("k", [2, 3, 4, 8])
@pytest.mark.parametrize("nbytes", [0, 1000, 4 << 20])
def test_ring_time_is_the_hand_formula_on_a_homogeneous_cluster(k: int, nbytes: int) -> None:
    cluster = Cluster.homogeneous(k, "h100", memory=1e9, latency=2e-6, bandwidth=1e10)
    want = 2 * (k - 1) * (2e-6 + (nbytes / k) / 1e10)
    assert ring_all_reduce_time(cluster, cluster.names, nbytes) == pytest.approx(want, rel=1e-12)


def test_ring_time_of_numbers_worked_by_hand() -> None:
    cluster = Cluster.homogeneous(4, "v100", memory=1e9, latency=1e-5, bandwidth=1e9)
    # 6 steps of 10 us + 1 MB / 4 / 1 GB/s = 250 us: 6 * 260 us
    assert ring_all_reduce_time(cluster, cluster.names, 10**6) == pytest.approx(1.56e-3)
    assert ring_all_reduce_time(cluster, ["gpu2"], 10**6) == 0.0


def test_ring_time_waits_for_the_slowest_ring_link() -> None:
    cluster = Cluster.from_json({"format": "pesto-cluster/1",
                                 "devices": [{"name": f"g{i}", "kind": "v100"} for i in range(3)],
                                 "link": {"latency": 0.0, "bandwidth": 3e9},
                                 "links": [{"src": "g1", "dst": "g2", "bandwidth": 1e9}]})
    # ring g0 -> g1 -> g2 -> g0 uses the slow link g1 -> g2: 4 steps of 1 MB / 1 GB/s
    assert ring_all_reduce_time(cluster, ["g0", "g1", "g2"], 3 * 10**6) == pytest.approx(4e-3)
    # ring g0 -> g2 -> g1 -> g0 does not
    assert ring_all_reduce_time(cluster, ["g0", "g2", "g1"], 3 * 10**6) == pytest.approx(4e-3 / 3)


@pytest.mark.parametrize(("group", "nbytes", "message"), [
    (["gpu0", "tpu9"], 10, "no device named 'tpu9'"),
    (["gpu0", "gpu1", "gpu0"], 10, "device gpu0 is in the all-reduce group"),
    (["gpu0", "gpu1"], -1, "whole number of bytes >= 0, got -1"),
    (["gpu0", "gpu1"], 1.5, "whole number of bytes >= 0, got 1.5"),
    (["gpu0", "gpu1"], True, "whole number of bytes >= 0, got True"),
    ([], 10, "at least one device"),
    ("gpu0", 10, "a list of device names"),
])
def test_ring_time_refuses_bad_arguments(group: Any, nbytes: Any, message: str) -> None:
    with pytest.raises(ClusterError, match=message.replace("(", r"\(")):
        ring_all_reduce_time(CLUSTER, group, nbytes)


# ---------------------------------------------------------------- Parallelism

def test_parallelism_keeps_lists_as_tuples_and_finds_groups() -> None:
    par = Parallelism(2, 4, [["a", "b"], ["c", "d"]])  # type: ignore[arg-type]
    assert par.replicas == (("a", "b"), ("c", "d"))
    assert par.group("b") == ["b", "d"]
    assert par.devices == ["a", "b", "c", "d"]
    with pytest.raises(PestoError, match="device c is not a device of replica 0"):
        par.group("c")


@pytest.mark.parametrize(("args", "message"), [
    ((0, 1, (("a",),)), "data_parallel must be a whole number >= 1, not 0"),
    ((1, True, (("a",),)), "microbatches must be a whole number >= 1, not True"),
    ((2, 1, (("a",),)), "data_parallel is 2 but 1 replica device list"),
    ((2, 1, (("a", "b"), ("c",))), "replica 1 has 1 device"),
    ((2, 1, (("a",), ("a",))), "device a is in replicas 0 and 1"),
    ((1, 1, (("a", "a"),)), "device a is twice in replica 0"),
    ((1, 1, ((),)), "at least one device"),
    ((1, 1, ((1,),)), "must list device names"),
    ((1, 1, "ab"), "replicas must be a list of device lists"),
])
def test_parallelism_refuses_inconsistent_replicas(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(PestoError, match=message):
        Parallelism(*args)


# ---------------------------------------------------------------- pesto-plan/1

def _roundtrip(plan: Plan) -> Plan:
    return Plan.from_json(json.loads(json.dumps(plan.to_json())))


def test_a_plan_without_parallelism_writes_and_reads_as_before() -> None:
    plan = dp_plan(dp_graph(replicas=1), par=None)
    data = plan.to_json()
    assert "parallelism" not in data and "collectives" not in data
    again = _roundtrip(plan)
    assert again == plan and again.parallelism is None and again.collectives == []


def test_an_old_plan_file_still_reads() -> None:
    old = {"format": "pesto-plan/1", "graph": "toy", "algorithm": "ilp", "makespan": 0.005, "lower_bound": None,
           "devices": ["gpu0", "gpu1"],
           "ops": [{"id": "a", "device": "gpu0", "start": 0.0, "end": 0.002},
                   {"id": "b", "device": "gpu1", "start": 0.003, "end": 0.005}],
           "transfers": [{"src": "a", "to": "gpu1", "start": 0.002, "end": 0.003}]}
    plan = Plan.from_json(old)
    assert plan.parallelism is None and plan.collectives == []
    assert plan.transfers == [Transfer("a", "gpu0", "gpu1", 0.002, 0.003, 0)]
    assert plan.makespan == 0.005


def test_a_hybrid_plan_round_trips_through_json() -> None:
    plan = dp_plan()
    data = plan.to_json()
    assert data["parallelism"] == {"data_parallel": 2, "microbatches": 1, "replicas": [["gpu0"], ["gpu1"]]}
    slot = plan.ops["ar"]
    assert data["collectives"] == [{"op": "ar", "kind": "all_reduce", "devices": ["gpu0", "gpu1"],
                                    "bytes": GRAD_BYTES, "start": slot.start, "end": slot.end}]
    assert data["makespan"] == plan.ops["upd"].end  # one whole step: the latest op end
    again = _roundtrip(plan)
    assert again == plan
    assert again.parallelism == PAR and again.collectives == plan.collectives


def test_parallelism_with_no_collectives_writes_an_empty_list() -> None:
    plan = Plan("g", "x", ["a", "b"], {"n": OpSlot("a", 0.0, 1.0)}, parallelism=Parallelism(2, 3, (("a",), ("b",))))
    assert plan.to_json()["collectives"] == []
    assert _roundtrip(plan) == plan


BAD_PLAN_FIELDS: list[tuple[str, Any, str]] = [
    ("parallelism", [2], "parallelism must be an object"),
    ("parallelism", {"data_parallel": "2", "microbatches": 1, "replicas": [["a"], ["b"]]},
     "parallelism: data_parallel must be a whole number >= 1, not '2'"),
    ("parallelism", {"data_parallel": 2, "microbatches": 1.0, "replicas": [["a"], ["b"]]},
     "parallelism: microbatches must be a whole number >= 1, not 1.0"),
    ("parallelism", {"data_parallel": 2, "microbatches": 1}, "parallelism: replicas must be a list of lists"),
    ("parallelism", {"data_parallel": 2, "microbatches": 1, "replicas": [["a"], [7]]},
     "parallelism: replicas must be a list of lists"),
    ("parallelism", {"data_parallel": 3, "microbatches": 1, "replicas": [["a"], ["b"]]},
     "data_parallel is 3 but 2 replica"),
    ("collectives", {"op": "ar"}, "collectives must be a list"),
    ("collectives", ["ar"], r"collectives\[0\] must be an object"),
    ("collectives", [{"op": 1, "kind": "all_reduce", "devices": ["a"], "bytes": 1, "start": 0, "end": 1}],
     r"collectives\[0\]: op must be the name of an op"),
    ("collectives", [{"op": "ar", "kind": "broadcast", "devices": ["a"], "bytes": 1, "start": 0, "end": 1}],
     r"collectives\[0\]: kind must be one of all_reduce, reduce_scatter, all_gather, not 'broadcast'"),
    ("collectives", [{"op": "ar", "kind": "all_reduce", "devices": [], "bytes": 1, "start": 0, "end": 1}],
     r"collectives\[0\]: devices must be a non-empty list"),
    ("collectives", [{"op": "ar", "kind": "all_reduce", "devices": ["a"], "bytes": -4, "start": 0, "end": 1}],
     r"collectives\[0\]: bytes must be a whole number >= 0, not -4"),
    ("collectives", [{"op": "ar", "kind": "all_reduce", "devices": ["a"], "bytes": 4, "start": "0", "end": 1}],
     r"collectives\[0\]: start must be a finite number of seconds, not '0'"),
    ("collectives", [{"op": "ar", "kind": "all_reduce", "devices": ["a"], "bytes": 4, "start": 0}],
     r"collectives\[0\]: end must be a finite number of seconds, not None"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD_PLAN_FIELDS)
def test_from_json_checks_the_new_fields(key: str, value: Any, message: str) -> None:
    data = dp_plan().to_json()
    data[key] = value
    with pytest.raises(PestoError, match=message):
        Plan.from_json(data)


def test_null_fields_read_as_absent() -> None:
    data = dp_plan().to_json()
    data["parallelism"] = None
    data["collectives"] = None
    plan = Plan.from_json(data)
    assert plan.parallelism is None and plan.collectives == []


# ---------------------------------------------------------------- the plan in the IR (.pir)

def test_a_hybrid_plan_round_trips_through_pir_attributes() -> None:
    graph = dp_graph()
    plan = check_plan(graph, CLUSTER, dp_plan(graph))
    write_plan_attrs(graph, plan)
    text = str(graph)
    assert 'collectives = [{op = "ar", kind = "all_reduce", devices = [@gpu0, @gpu1], bytes = 1024' in text
    assert "parallelism = {data_parallel = 2, microbatches = 1, replicas = [[@gpu0], [@gpu1]]}" in text
    again = parse(text)
    verify(again)
    read = read_plan_attrs(again)
    assert read is not None
    assert read.parallelism == plan.parallelism
    assert read.collectives == plan.collectives
    assert read.ops == plan.ops and read.peak_memory == plan.peak_memory
    assert str(again) == text


def test_pir_attributes_of_a_plan_without_parallelism_have_no_collectives() -> None:
    graph = dp_graph()
    write_plan_attrs(graph, dp_plan(graph))
    assert "collectives" in graph.attrs
    plain = dp_plan(dp_graph(replicas=1), par=None)
    write_plan_attrs(graph, plain)  # a plan replaced by one without replicas drops them
    assert "collectives" not in graph.attrs
    read = read_plan_attrs(parse(str(graph)))
    assert read is not None and read.parallelism is None and read.collectives == []


# ---------------------------------------------------------------- the all_reduce op

ALL_REDUCE_TEXT = """\
graph @bucket(%a: f32[4,8], %b: bf16[3], %c: blob[100]) {
  @ar %ar.0, %ar.1, %ar.2 = all_reduce(%a, %b, %c) {reduction = "max", replicas = 4, cost = 12us} : f32[4,8], bf16[3], blob[100]
  return %ar.0, %ar.1, %ar.2
}
"""


def test_all_reduce_prints_and_parses_back_as_golden() -> None:
    g = Graph("bucket")
    a = g.add_input("a", TensorType("f32", (4, 8)))
    b = g.add_input("b", TensorType("bf16", (3,)))
    c = g.add_input("c", BlobType(100))
    op = g.add_op("all_reduce", [a, b, c], [a.type, b.type, c.type], name="ar")
    op.set("reduction", "max")
    op.set("replicas", 4)
    op.attrs["cost"] = DurationAttr(12e-6)
    g.set_outputs(list(op.results))
    verify(g)
    assert str(g) == ALL_REDUCE_TEXT
    again = parse(ALL_REDUCE_TEXT)
    verify(again)
    assert again.structurally_equal(g)
    assert str(again) == ALL_REDUCE_TEXT


@pytest.mark.parametrize(("line", "message"), [
    ('%r = all_reduce(%x) {reduction = "mean", replicas = 2} : f32[8]',
     "all_reduce: reduction must be one of 'sum', 'max', 'min', not \"mean\""),
    ('%r = all_reduce(%x) {reduction = "sum", replicas = 0} : f32[8]',
     "all_reduce: replicas must be a whole number >= 1, not 0"),
    ('%r = all_reduce(%x) {reduction = "sum", replicas = 2.0} : f32[8]',
     "all_reduce: replicas must be a whole number >= 1, not 2.0"),
    ('%r = all_reduce(%x) {replicas = 2} : f32[8]', "all_reduce: missing attribute 'reduction'"),
    ('%r = all_reduce(%x) {reduction = "sum"} : f32[8]', "all_reduce: missing attribute 'replicas'"),
    ('%r = all_reduce(%x) {reduction = "sum", replicas = 2} : f32[4]', "result %r is f32[4] but all_reduce gives f32[8]"),
    ('%r = all_reduce(%x) {reduction = "sum", replicas = 2} : f16[8]', "result %r is f16[8] but all_reduce gives f32[8]"),
    ('%r, %s = all_reduce(%x) {reduction = "sum", replicas = 2} : f32[8], f32[8]',
     "all_reduce: has 1 operand(s) but 2 result(s)"),
    ('%r = all_reduce() {reduction = "sum", replicas = 2} : f32[8]', "all_reduce: expects at least one operand"),
])
def test_the_verifier_checks_all_reduce(line: str, message: str) -> None:
    graph = parse(f"graph @g(%x: f32[8]) {{\n  {line}\n}}\n")
    with pytest.raises(VerifyError) as info:
        verify(graph)
    assert message in str(info.value)


def _ctx() -> PassContext:
    return PassContext(cluster=CLUSTER, quiet=True)


def test_annotate_costs_keeps_an_all_reduce_cost() -> None:
    graph = parse("""
graph @g(%x: f32[256]) {
  %n = neg(%x) : f32[256]
  %ar = all_reduce(%n) {reduction = "sum", replicas = 2, cost = 21us} : f32[256]
  %b = all_reduce(%n) {reduction = "sum", replicas = 1} : f32[256]
}
""")
    AnnotateCostsPass(model="roofline").run(graph, _ctx())
    assert graph.op("ar").get("cost") == 21e-6  # the ring time the rewrite set
    assert graph.op("b").get("cost") == 0.0  # none given: not costed as a kernel
    assert graph.op("n").get("cost") > 0
    assert graph.op("ar").get("flops") == 0 and graph.op("b").get("flops") == 0


def test_annotate_costs_accepts_blob_all_reduces() -> None:
    graph = parse("""
graph @g(%x: f32[256]) {
  %n = neg(%x) : f32[256]
  %ar = all_reduce(%x) {reduction = "sum", replicas = 2} : f32[256]
}
""")
    graph2 = parse('graph @h(%x: blob[64]) {\n  %ar = all_reduce(%x) {reduction = "sum", replicas = 2} : blob[64]\n}\n')
    AnnotateCostsPass(model="roofline").run(graph2, _ctx())  # no FLOPs to count, and none asked for
    assert graph2.op("ar").get("cost") == 0.0 and graph2.op("ar").get("flops") == 0
    AnnotateCostsPass(model="roofline").run(graph, _ctx())
    assert graph.op("ar").get("bytes_accessed") == 2 * 1024


# ---------------------------------------------------------------- single-process backends

ONE_DEVICE = Cluster.homogeneous(1, "cpu", memory=1 << 30)


def _placed(replicas: int) -> Graph:
    graph = parse(f"""
graph @g(%x: f32[4], %y: f32[4]) {{
  %s = add(%x, %y) {{cost = 1us}} : f32[4]
  %r0, %r1 = all_reduce(%s, %y) {{reduction = "sum", replicas = {replicas}}} : f32[4], f32[4]
  %out = mul(%r0, %r1) {{cost = 1us}} : f32[4]
  return %out
}}
""")
    plan = simulate(graph, ONE_DEVICE, {"s": "cpu0", "r0": "cpu0", "out": "cpu0"},
                    {"cpu0": ["s", "r0", "out"]}, "hand")
    write_plan_attrs(graph, plan)
    return graph


def test_one_replica_all_reduce_is_the_identity_everywhere() -> None:
    import jax

    from pesto_ir.backends.jax import build
    from pesto_ir.backends.python_emit import emit_python
    from pesto_ir.jaxrt.interpreter import evaluate

    graph = _placed(1)
    x, y = np.arange(4, dtype=np.float32), np.full(4, 2.0, np.float32)
    (out,) = evaluate(graph, x, y)
    np.testing.assert_allclose(np.asarray(out), (x + y) * y)
    (out,) = build(graph, jax.devices()[:1])(x, y)
    np.testing.assert_allclose(np.asarray(out), (x + y) * y)
    source = emit_python(graph)
    module: dict[str, Any] = {}
    exec(compile(source, "<emitted>", "exec"), module)
    (out,) = module["run"](x, y, devices=jax.devices()[:1])
    np.testing.assert_allclose(np.asarray(out), (x + y) * y)


def test_backends_refuse_replicas_the_plan_does_not_have() -> None:
    import jax

    from pesto_ir.backends.jax import BackendError, build
    from pesto_ir.backends.python_emit import EmitError, emit_python
    from pesto_ir.jaxrt.interpreter import evaluate

    graph = _placed(2)
    want = "op 'r0' all-reduces across 2 data-parallel replicas"
    with pytest.raises(BackendError, match=want) as info:
        build(graph, jax.devices()[:1])
    assert "but the plan has no replicas to reduce across" in str(info.value)
    with pytest.raises(EmitError, match=want) as emitted:
        emit_python(graph)
    assert "but the plan has no replicas to reduce across" in str(emitted.value)
    with pytest.raises(PestoError, match="through the JAX backend"):
        evaluate(graph, np.zeros(4, np.float32), np.zeros(4, np.float32))


def test_the_emitter_refuses_all_reduces_over_other_replicas_than_the_plan_s() -> None:
    from pesto_ir.backends.python_emit import EmitError, emit_python

    graph = dp_graph(replicas=4)
    write_plan_attrs(graph, dp_plan(graph))  # 2 replicas
    with pytest.raises(EmitError, match="op 'ar' all-reduces across 4 replicas, but the step runs 2"):
        emit_python(graph)


# ---------------------------------------------------------------- the validator

def test_a_correct_hybrid_plan_is_valid() -> None:
    graph = dp_graph()
    plan = dp_plan(graph)
    assert plan.ops["ar"].end - plan.ops["ar"].start == pytest.approx(RING_2)
    assert validate_plan(graph, CLUSTER, plan) == []
    check_plan(graph, CLUSTER, plan)
    assert plan.peak_memory is not None
    assert plan.peak_memory["gpu1"] == plan.peak_memory["gpu0"] > 0  # replica 1 holds what replica 0 holds


def test_an_all_reduce_lasts_its_ring_time() -> None:
    graph = dp_graph(ar_cost=0.0)  # costed as no time: the slot is too short for the ring
    assert problems(lambda p: None, graph) == [
        f"op 'ar' runs 0s on gpu0 but its ring all-reduce of 1024 bytes over gpu0, gpu1 takes {RING_2:.6g}s"]


def test_an_all_reduce_needs_its_collective() -> None:
    assert problems(lambda p: p.collectives.clear()) == [
        "op 'ar' is an all_reduce but the plan lists no collective for it"]


def test_the_collective_matches_its_op() -> None:
    def edit(p: Plan) -> None:
        c = p.collectives[0]
        c.devices, c.nbytes, c.end = ["gpu1", "gpu0"], 4, c.end + 1 * MS
    msgs = problems(edit)
    assert "the collective of op 'ar' spans gpu1, gpu0 but the op's group is gpu0, gpu1" in msgs
    assert "the collective of op 'ar' carries 4 bytes; its value is 1024" in msgs
    assert any(m.startswith("the collective of op 'ar' runs") for m in msgs)
    assert len(msgs) == 3


def test_collectives_name_all_reduce_ops_of_the_graph() -> None:
    def edit(p: Plan) -> None:
        p.collectives.append(Collective("ghost", "all_reduce", ["gpu0", "gpu1"], 4, 0.0, 1.0))
        p.collectives.append(Collective("upd", "all_reduce", ["gpu0", "gpu1"], 4, 0.0, 1.0))
    assert problems(edit) == ["the plan lists a collective for op 'ghost', which is not in the graph",
                              "the plan lists a collective for op 'upd', which is a sub, not a collective"]


def test_ops_run_on_replica_0() -> None:
    def edit(p: Plan) -> None:
        p.ops["upd"] = OpSlot("gpu1", p.ops["upd"].start, p.ops["upd"].end)
    assert problems(edit) == [
        "op 'upd' is on gpu1, which is not a device of replica 0 (gpu0); a hybrid plan places replica 0's graph"]


def test_mirror_devices_are_alike() -> None:
    mixed = Cluster.fully_connected([Device.of_kind("gpu0", "v100", 1 << 20), Device.of_kind("gpu1", "a100", 1 << 19)],
                                    LATENCY, BANDWIDTH)
    assert problems(lambda p: None, cluster=mixed) == [
        "device gpu1 of replica 1 is of kind a100 but mirrors gpu0 of replica 0, of kind v100",
        "device gpu1 of replica 1 has 524288 bytes of memory but mirrors gpu0 of replica 0, which has 1.04858e+06",
        "device gpu1 of replica 1 is not as fast as gpu0 of replica 0, which it mirrors (peak_flops or "
        "mem_bandwidth differ): it would not keep replica 0's schedule"]


def test_a_mirror_of_the_same_kind_but_slower_is_refused() -> None:
    slow = Device("gpu1", "v100", Device.of_kind("gpu0", "v100", 1 << 20).peak_flops / 10,
                  Device.of_kind("gpu0", "v100").mem_bandwidth, 1 << 20)
    cluster = Cluster.fully_connected([Device.of_kind("gpu0", "v100", 1 << 20), slow], LATENCY, BANDWIDTH)
    assert problems(lambda p: None, cluster=cluster) == [
        "device gpu1 of replica 1 is not as fast as gpu0 of replica 0, which it mirrors (peak_flops or "
        "mem_bandwidth differ): it would not keep replica 0's schedule"]


def test_the_plan_and_the_graph_agree_on_the_degrees() -> None:
    def edit(p: Plan) -> None:
        p.parallelism = Parallelism(2, 4, (("gpu0",), ("gpu1",)))
    assert problems(edit) == ["the plan says data_parallel 2 x 4 micro-batches but the graph is the step for "
                              "data_parallel 2 x 1 (its microbatched attribute)"]


def test_replica_devices_are_in_the_cluster() -> None:
    def edit(p: Plan) -> None:
        p.parallelism = Parallelism(2, 1, (("gpu0",), ("gpu7",)))
    assert problems(edit) == ["device gpu7 of replica 1 is not in the cluster"]


def test_the_all_reduce_spans_the_plans_replicas() -> None:
    graph = dp_graph(replicas=3)
    graph.attrs["microbatched"] = to_attr({"data_parallel": 2, "microbatches": 1})
    assert problems(lambda p: None, graph) == [
        "op 'ar' all-reduces across 3 replicas but the plan has data_parallel 2"]


def test_without_parallelism_a_plan_is_one_replicas_on_its_own_devices() -> None:
    """`place` plans one replica's graph on its devices before it names the replicas: the
    all_reduce is then timed by its cost attribute, like any op."""
    def edit(p: Plan) -> None:
        p.parallelism = None
        p.collectives = []
    assert problems(edit) == []
    one = dp_graph(replicas=1)
    plan = dp_plan(one, par=None)
    assert plan.collectives == []
    check_plan(one, CLUSTER, plan)


def test_check_plan_raises_every_problem() -> None:
    graph = dp_graph()
    plan = dp_plan(graph)
    plan.collectives = []
    with pytest.raises(PlanError, match="plan lists no collective"):
        check_plan(graph, CLUSTER, plan)
