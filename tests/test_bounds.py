"""Lower bounds and memory infeasibility found before solving."""

from __future__ import annotations

import pytest

from pesto_ir import parse
from pesto_ir.bounds import lower_bound, memory_shortfall
from pesto_ir.cluster import Cluster, Device

MS = 1e-3
CHAIN_AND_SIDE = parse("""
graph @g() {
  %a = opaque() {cost = 2ms} : blob[0]
  %b = opaque(%a) {cost = 2ms} : blob[0]
  %s1 = opaque() {cost = 1ms} : blob[0]
  %s2 = opaque() {cost = 1ms} : blob[0]
}
""")


def test_critical_path_dominates_on_many_devices() -> None:
    assert lower_bound(CHAIN_AND_SIDE, Cluster.homogeneous(4)) == pytest.approx(4 * MS)


def test_total_work_dominates_on_one_device() -> None:
    assert lower_bound(CHAIN_AND_SIDE, Cluster.homogeneous(1)) == pytest.approx(6 * MS)


def test_work_bound_counts_slow_devices_for_what_they_are_worth() -> None:
    g = parse("""
graph @g() {
  %a = opaque() {cost = {fast = 3ms, slow = 6ms}} : blob[0]
  %b = opaque() {cost = {fast = 3ms, slow = 6ms}} : blob[0]
  %c = opaque() {cost = {fast = 3ms, slow = 6ms}} : blob[0]
}
""")
    devices = [Device("fast", "fast", 1e12, 1e11, 1e9), Device("slow", "slow", 1e12, 1e11, 1e9)]
    c = Cluster.fully_connected(devices, 0.0, 1e9)
    # the slow device is worth half a fast one: 9 ms of fast work over 1.5 devices
    assert lower_bound(g, c) == pytest.approx(6 * MS)


def test_a_join_waits_for_a_transfer_or_for_both_branches_on_its_device() -> None:
    """a -> (b, c) -> d, 1 ms each, 10 MB tensors over 1 GB/s links (10 ms): the plain critical path
    (3 ms) runs b and c in parallel for free; with transfers counted, d either waits 10 ms for one
    branch or runs after both on one device, so 4 ms, which is the optimum (all on one device)."""
    g = parse("""
graph @g() {
  %a = opaque() {cost = 1ms} : blob[10000000]
  %b = opaque(%a) {cost = 1ms} : blob[10000000]
  %c = opaque(%a) {cost = 1ms} : blob[10000000]
  %d = opaque(%b, %c) {cost = 1ms} : blob[0]
}
""")
    assert lower_bound(g, Cluster.homogeneous(2, latency=0.0, bandwidth=1e9)) == pytest.approx(4 * MS)
    assert lower_bound(g, Cluster.homogeneous(2, latency=0.0, bandwidth=1e12)) == pytest.approx(3.01 * MS)


def test_memory_shortfall_names_devices_and_bytes() -> None:
    g = parse("""
graph @g() {
  %w1 = opaque() {memory = 700B, colocate = "layer"} : blob[0]
  %w2 = opaque() {memory = 700B, colocate = "layer"} : blob[0]
  %big = opaque() {memory = 1200B} : blob[0]
}
""")
    c = Cluster.homogeneous(2, memory=1000)
    assert memory_shortfall(g, c) == [
        "the graph holds 2600 bytes for the whole step (resident memory and inputs) but all 2 devices together "
        "hold 2000 (short by 600 bytes)",
        "op 'big' needs 1200 bytes but the largest device, gpu0, holds 1000 (short by 200 bytes)",
        "colocation group 'layer' needs 1400 bytes on one device but the largest, gpu0, holds 1000 (short by 400 bytes)",
    ]
    assert memory_shortfall(g, Cluster.homogeneous(2, memory=2000)) == []
