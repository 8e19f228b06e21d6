"""The plan validator catches each kind of violation (one test per rule of pesto-plan/1)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from pesto_ir import parse
from pesto_ir.cluster.model import Cluster
from pesto_ir.schedule.plan import OpSlot, Plan, Transfer
from pesto_ir.schedule.simulate import PlanError, simulate
from pesto_ir.schedule.validate import check_plan, validate_plan

MS = 1e-3
GRAPH = parse("""
graph @g() {
  %a = opaque() {cost = 1ms, memory = 600B, colocate = "w"} : blob[1000]
  %a2 = opaque() {cost = 1ms, memory = 100B} : blob[1000]
  %b = opaque(%a, %a2) {cost = 2ms, memory = 100B} : blob[0]
  %c = opaque(%a) {cost = 3ms, memory = 100B, colocate = "w"} : blob[0]
}
""")
CLUSTER = Cluster.homogeneous(2, "v100", memory=4000, latency=1 * MS, bandwidth=1e6)
PLACE = {"a": "gpu0", "a2": "gpu0", "c": "gpu0", "b": "gpu1"}


def valid_plan() -> Plan:
    return simulate(GRAPH, CLUSTER, PLACE, {"gpu0": ["a", "a2", "c"], "gpu1": ["b"]})


def broken(edit: Callable[[Plan], None]) -> list[str]:
    plan = copy.deepcopy(valid_plan())
    edit(plan)
    return validate_plan(GRAPH, CLUSTER, plan)


def transfer(plan: Plan, src: str) -> Transfer:
    return next(t for t in plan.transfers if t.src == src)


def test_a_simulated_plan_is_valid() -> None:
    assert validate_plan(GRAPH, CLUSTER, valid_plan()) == []
    check_plan(GRAPH, CLUSTER, valid_plan())


def test_every_op_runs_once() -> None:
    assert broken(lambda p: p.ops.pop("c")) == ["op 'c' is not in the plan"]


def test_ops_run_on_known_devices() -> None:
    assert broken(lambda p: setattr(p.ops["c"], "device", "tpu7")) == ["op 'c' is on unknown device 'tpu7'"]


def test_an_op_runs_at_least_its_cost() -> None:
    (msg,) = broken(lambda p: setattr(p.ops["c"], "end", p.ops["c"].start + 1 * MS))
    assert "op 'c' runs 0.001s on gpu0 but costs 0.003s there" == msg


def test_ops_on_one_device_do_not_overlap() -> None:
    def edit(p: Plan) -> None:
        p.ops["a2"] = OpSlot("gpu0", 0.5 * MS, 1.5 * MS)
    problems = broken(edit)
    assert any("op 'a' and op 'a2' overlap on gpu0" in m for m in problems)


def test_an_op_starts_after_its_producer_on_the_same_device() -> None:
    def edit(p: Plan) -> None:
        p.ops["c"] = OpSlot("gpu0", 0.5 * MS, 3.5 * MS)
    assert any("op 'c' starts at 0.0005s before its producer 'a' ends" in m for m in broken(edit))


def test_a_cross_device_read_needs_a_transfer() -> None:
    assert broken(lambda p: p.transfers.remove(transfer(p, "a2"))) == [
        "op 'b' on gpu1 reads 'a2' from gpu0 but no transfer brings it"]


def test_an_op_starts_after_its_transfers_arrive() -> None:
    def edit(p: Plan) -> None:
        p.ops["b"].start -= 0.5 * MS
        p.ops["b"].end -= 0.5 * MS
    assert any("op 'b' starts at" in m and "before the transfer of 'a2' arrives" in m for m in broken(edit))


def test_a_transfer_starts_after_its_producer_ends() -> None:
    def edit(p: Plan) -> None:
        t = transfer(p, "a")
        t.start -= 0.5 * MS
    problems = broken(edit)
    assert any("transfer of 'a' to gpu1 starts at 0.0005s, before the op ends" in m for m in problems)


def test_a_transfer_lasts_at_least_what_its_link_needs() -> None:
    def edit(p: Plan) -> None:
        t = transfer(p, "a2")
        t.end = t.start + 0.5 * MS
    assert any("transfer of 'a2' to gpu1 lasts 0.0005s, less than its link needs (0.002s)" in m for m in broken(edit))


def test_a_transfer_carries_every_byte_read_there() -> None:
    def edit(p: Plan) -> None:
        transfer(p, "a").nbytes = 10
    assert broken(edit) == ["transfer of 'a' to gpu1 carries 10 bytes; ops there read 1000"]


def test_a_tensor_is_sent_once_per_device() -> None:
    def edit(p: Plan) -> None:
        p.transfers.append(copy.deepcopy(transfer(p, "a")))
    problems = broken(edit)
    assert "op 'a' is sent to gpu1 twice (a tensor is sent once per device)" in problems


def test_transfers_on_one_link_do_not_overlap() -> None:
    def edit(p: Plan) -> None:
        t = transfer(p, "a2")
        t.start, t.end = transfer(p, "a").start, transfer(p, "a").end + 0.1 * MS
        p.ops["b"].start, p.ops["b"].end = t.end, t.end + 2 * MS
    assert any("overlap on link gpu0 -> gpu1" in m for m in broken(edit))


def test_colocated_ops_share_a_device() -> None:
    plan = simulate(GRAPH, CLUSTER, {**PLACE, "c": "gpu1"}, {"gpu0": ["a", "a2"], "gpu1": ["c", "b"]})
    assert "colocation group 'w' is split over gpu0, gpu1" in validate_plan(GRAPH, CLUSTER, plan)


def test_each_device_memory_fits() -> None:
    place = {n: "gpu0" for n in PLACE}
    plan = simulate(GRAPH, CLUSTER, place, {"gpu0": ["a", "a2", "b", "c"]})
    # resident 900 bytes all step; %a (1000 B) until c ends, %a2 (1000 B) from 1 ms until b ends
    assert validate_plan(GRAPH, CLUSTER, plan) == []  # 2900 of 4000 bytes
    assert validate_plan(GRAPH, CLUSTER.with_memory(2800), plan) == [
        "out of memory: gpu0 peaks at 2.83 KiB (2900 bytes) at 1 ms, 100 bytes more than its 2.73 KiB; alive then: "
        "%a 1000 B, %a2 1000 B, resident of 'a' 600 B, resident of 'a2' 100 B, resident of 'b' 100 B and 1 more"]


def test_check_plan_raises_with_every_problem() -> None:
    plan = copy.deepcopy(valid_plan())
    plan.ops.pop("c")
    plan.algorithm = "test"
    with pytest.raises(PlanError, match="the test plan for 'g' is invalid"):
        check_plan(GRAPH, CLUSTER, plan)
