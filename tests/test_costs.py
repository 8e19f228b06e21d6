"""Cost annotation: roofline FLOP/byte rules against hand counts, cost keys, memory, `given` checks."""

from __future__ import annotations

import io

import pytest

import pesto_ir
from pesto_ir.cluster.devices import Device
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import CostError, op_cost, summed_costs
from pesto_ir.cost.roofline import LAUNCH_OVERHEAD, op_time, op_work
from pesto_ir.ir.attributes import DictAttr, DurationAttr
from pesto_ir.passes.annotate_costs import AnnotateCostsPass
from pesto_ir.passmanager import PassContext, PassManager, Pipeline
from pesto_ir.schedule.memory import footprints


def one_op(op_text: str, inputs: str) -> pesto_ir.Op:
    g = pesto_ir.parse(f"graph @t({inputs}) {{\n  {op_text}\n}}")
    pesto_ir.verify(g)
    return g.ops[0]


# ---------------------------------------------------------------- dot_general

def test_matmul_flops() -> None:
    op = one_op("%y = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[64,10]",
                "%x: f32[64,784], %w: f32[784,10]")
    w = op_work(op)
    assert w.flops == 2 * 64 * 10 * 784
    assert w.bytes == 4 * (64 * 784 + 784 * 10 + 64 * 10)


def test_batched_dot_general_flops() -> None:
    # einsum bij,bjk->bik with batch 3: 2 * b * i * k * j
    op = one_op("%y = dot_general(%a, %b) {dimension_numbers = [[[2], [1]], [[0], [0]]]} : f32[3,4,6]",
                "%a: f32[3,4,5], %b: f32[3,5,6]")
    assert op_work(op).flops == 2 * 3 * 4 * 6 * 5


def test_dot_general_two_contracting_dims() -> None:
    op = one_op("%y = dot_general(%a, %b) {dimension_numbers = [[[1, 2], [0, 1]], [[], []]]} : f32[7,9]",
                "%a: f32[7,4,5], %b: f32[4,5,9]")
    assert op_work(op).flops == 2 * 7 * 9 * 4 * 5


def test_a_matmul_is_a_weight_gradient_when_it_contracts_leading_dimensions_of_its_left_operand() -> None:
    from pesto_ir.cost.roofline import op_family

    def family(dims: str, lhs: str, rhs: str, out: str) -> str:
        return op_family(one_op(f"%y = dot_general(%a, %b) {{dimension_numbers = {dims}}} : {out}",
                                f"%a: {lhs}, %b: {rhs}"))

    assert family("[[[1], [0]], [[], []]]", "f32[8,4]", "f32[4,6]", "f32[8,6]") == "matmul"  # x @ w
    assert family("[[[1], [1]], [[], []]]", "f32[8,6]", "f32[4,6]", "f32[8,4]") == "matmul"  # dy @ w^T
    assert family("[[[0], [0]], [[], []]]", "f32[8,4]", "f32[8,6]", "f32[4,6]") == "matmul_weight_grad"  # x^T dy
    assert family("[[[1, 2], [0, 1]], [[], []]]", "f32[7,4,5]", "f32[4,5,9]", "f32[7,9]") == "matmul"
    assert family("[[[0, 1], [0, 1]], [[], []]]", "f32[2,8,4]", "f32[2,8,6]", "f32[4,6]") == "matmul_weight_grad"


# ---------------------------------------------------------------- conv_general_dilated

def conv_op(x: str, w: str, out: str, attrs: str) -> pesto_ir.Op:
    return one_op(f"%y = conv_general_dilated(%x, %w) {{{attrs}}} : {out}", f"%x: {x}, %w: {w}")


def test_conv_nchw_oihw_stride_padding_groups() -> None:
    # N=2, C=4, 9x9 image; O=8, I/groups=2, 3x3 kernel; stride 2, pad 1 -> 5x5 output
    op = conv_op("f32[2,4,9,9]", "f32[8,2,3,3]", "f32[2,8,5,5]",
                 "window_strides = [2, 2], padding = [[1, 1], [1, 1]], feature_group_count = 2, "
                 "dimension_numbers = [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]")
    w = op_work(op)
    assert w.flops == 2 * (2 * 8 * 5 * 5) * (2 * 3 * 3)
    assert w.bytes == 4 * (2 * 4 * 9 * 9 + 8 * 2 * 3 * 3 + 2 * 8 * 5 * 5)


def test_conv_without_dimension_numbers_is_oihw() -> None:
    op = conv_op("f32[1,3,8,8]", "f32[16,3,5,5]", "f32[1,16,4,4]", "window_strides = [1, 1]")
    assert op_work(op).flops == 2 * (16 * 4 * 4) * (3 * 5 * 5)


def test_conv_nhwc_hwio() -> None:
    # jax.lax.conv_general_dilated(..., ('NHWC', 'HWIO', 'NHWC')): rhs_spec = (3, 2, 0, 1), O is dim 3
    op = conv_op("f32[1,8,8,3]", "f32[3,3,3,4]", "f32[1,8,8,4]",
                 "padding = [[1, 1], [1, 1]], dimension_numbers = [[0, 3, 1, 2], [3, 2, 0, 1], [0, 3, 1, 2]]")
    assert op_work(op).flops == 2 * (8 * 8 * 4) * (3 * 3 * 3)


def test_conv_dimension_numbers_as_dict() -> None:
    op = conv_op("f32[1,8,8,3]", "f32[3,3,3,4]", "f32[1,8,8,4]",
                 "dimension_numbers = {lhs_spec = [0, 3, 1, 2], rhs_spec = [3, 2, 0, 1], out_spec = [0, 3, 1, 2]}")
    assert op_work(op).flops == 2 * (8 * 8 * 4) * 27


# ---------------------------------------------------------------- other rules

@pytest.mark.parametrize(("text", "inputs", "flops", "nbytes"), [
    ("%y = add(%a, %b) : f32[4,5]", "%a: f32[4,5], %b: f32[4,5]", 20, 3 * 80),
    ("%y = exp(%a) : f32[4,5]", "%a: f32[4,5]", 20, 2 * 80),
    ("%y = reduce_sum(%a) {axes = [1]} : f32[4]", "%a: f32[4,5]", 20, 80 + 16),
    ("%y = transpose(%a) {permutation = [1, 0]} : f32[5,4]", "%a: f32[4,5]", 0, 2 * 80),
    ("%y = reshape(%a) {new_sizes = [20]} : f32[20]", "%a: f32[4,5]", 0, 2 * 80),
    ("%y = broadcast_in_dim(%a) {shape = [4, 5], broadcast_dimensions = [1]} : f32[4,5]", "%a: f32[5]",
     0, 20 + 80),
    ("%y = reduce_window_max(%a) {window_dimensions = [1, 2, 2, 1], window_strides = [1, 2, 2, 1]} : f32[1,4,4,3]",
     "%a: f32[1,8,8,3]", 48 * 4, 4 * (192 + 48)),
    ("%y = mystery(%a, %a) : f32[4,5]", "%a: f32[4,5]", 20, 2 * 80),  # default rule, operand read once
])
def test_rule_table(text: str, inputs: str, flops: int, nbytes: int) -> None:
    w = op_work(one_op(text, inputs))
    assert (w.flops, w.bytes) == (flops, nbytes)


SCAN = """graph @s(%c: f32[], %xs: f32[10,8,8]) {
  %out, %ys = scan(%c, %xs) {length = 10, jaxpr = graph @body(%h: f32[8,8], %x: f32[8,8]) {
    %m = dot_general(%h, %x) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[8,8]
    return %m, %m
  }} : f32[8,8], f32[10,8,8]
  return %out
}"""


def test_scan_costs_body_times_length() -> None:
    g = pesto_ir.parse(SCAN)
    op = g.ops[0]
    assert op_work(op).flops == 10 * 2 * 8 * 8 * 8
    dev = Device.of_kind("d", "h100")
    body_op = op.attrs["jaxpr"].value.ops[0]
    assert op_time(op, dev) == pytest.approx(10 * op_time(body_op, dev) + LAUNCH_OVERHEAD.get("h100", 5e-6))


def test_constants_take_no_time() -> None:
    op = one_op("%c = constant() {value = 1.0} : f32[]", "")
    assert op_time(op, Device.of_kind("d", "v100")) == 0.0


def test_cond_takes_the_costliest_branch() -> None:
    g = pesto_ir.parse("""graph @c(%p: i32[], %a: f32[16,16]) {
  %y = cond(%p, %a) {branches = [graph @b0(%x: f32[16,16]) {
      return %x
    }, graph @b1(%x: f32[16,16]) {
      %m = dot_general(%x, %x) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[16,16]
      return %m
    }]} : f32[16,16]
  return %y
}""")
    assert op_work(g.ops[0]).flops == 2 * 16 ** 3


# ---------------------------------------------------------------- the pass

MLP = """graph @mlp(%x: f32[64,784], param %w: f32[784,10], param %b: f32[10]) {
  %y = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[64,10]
  %z = add(%y, %b) : f32[64,10]
  %r = tanh(%z) : f32[64,10]
  return %r
}"""


def run_pass(text: str, pipeline: str, cluster: Cluster, quiet: bool = True) -> pesto_ir.Graph:
    return PassManager(pipeline).run(pesto_ir.parse(text), PassContext(cluster=cluster, quiet=quiet))


def test_roofline_homogeneous_writes_one_duration() -> None:
    g = run_pass(MLP, "annotate-costs{model=roofline fusion=none}", Cluster.homogeneous(2, "h100"))
    dot = g.op("y")
    assert isinstance(dot.attrs["cost"], DurationAttr)
    k = Device.of_kind("x", "h100")
    expected = max(dot.get("flops") / k.peak_flops, dot.get("bytes_accessed") / k.mem_bandwidth)
    assert dot.get("cost") == pytest.approx(expected + 5e-6)
    assert dot.get("flops") == 2 * 64 * 10 * 784


def test_roofline_heterogeneous_keys_by_kind_and_round_trips() -> None:
    devices = [Device.of_kind("g0", "h100"), Device.of_kind("g1", "v100"), Device.of_kind("g2", "v100")]
    cluster = Cluster.fully_connected(devices, 1e-5, 1e11)
    g = run_pass(MLP, "annotate-costs{model=roofline}", cluster)
    cost = g.op("y").attrs["cost"]
    assert isinstance(cost, DictAttr)
    assert [k for k, _ in cost.entries] == ["h100", "v100"]
    assert op_cost(g.op("y"), devices[0]) < op_cost(g.op("y"), devices[1])
    back = pesto_ir.parse(str(g))
    assert back.structurally_equal(g)


def test_roofline_same_kind_different_speeds_keys_by_name() -> None:
    fast = Device("a", "custom", 1e12, 1e11, 1e9)
    slow = Device("b", "custom", 1e11, 1e10, 1e9)
    g = run_pass(MLP, "annotate-costs{model=roofline}", Cluster.fully_connected([fast, slow], 0.0, 1e9))
    cost = g.op("y").attrs["cost"]
    assert isinstance(cost, DictAttr) and [k for k, _ in cost.entries] == ["a", "b"]


def test_footprint_counts_results_and_first_reads_of_inputs() -> None:
    g = run_pass(MLP, "annotate-costs{model=roofline}", Cluster.homogeneous(1, "h100"))
    assert not any("memory" in op.attrs for op in g.ops)  # resident bytes are the inputs, in the types
    mem = footprints(g)
    assert mem["y"] == 4 * (64 * 784 + 784 * 10 + 64 * 10)  # x and w first read here, plus the result
    assert mem["z"] == 4 * (10 + 64 * 10)  # b first read here
    assert mem["r"] == 4 * 64 * 10


def test_given_passes_on_cost_graph_with_kinds() -> None:
    """Every op has a cost (per device kind or one duration), so the default model (`auto`) is
    `given`: the costs stay as written, with no warning, and each device reads its kind's entry."""
    text = """graph @g() {
  %a = opaque() {cost = {h100 = 1ms, cpu = 20ms}} : blob[8]
  %b = opaque(%a) {cost = 2ms} : blob[0]
}"""
    h100s = Cluster.homogeneous(2, "h100")
    mixed = Cluster.fully_connected([Device.of_kind("gpu0", "h100"), Device.of_kind("cpu0", "cpu")], 1e-5, 1e10)
    for cluster in (h100s, mixed):
        log = io.StringIO()
        g = PassManager("annotate-costs").run(pesto_ir.parse(text), PassContext(cluster=cluster, log=log))
        assert g.structurally_equal(pesto_ir.parse(text)), "given costs are kept as written"
        assert "warning" not in log.getvalue()  # e.g. that another model's costs replaced them
        a, b = g.op("a"), g.op("b")
        assert not any(key in a.attrs or key in b.attrs for key in ("flops", "bytes_accessed"))  # not roofline
        for device in cluster.devices:
            assert op_cost(a, device) == pytest.approx({"h100": 1e-3, "cpu": 20e-3}[device.kind])
            assert op_cost(b, device) == pytest.approx(2e-3)  # one duration: the same on every kind
    assert summed_costs(g.ops, mixed.devices) == pytest.approx([3e-3, 22e-3])  # g: the graph costed for `mixed`


def test_given_names_the_op_missing_a_kind() -> None:
    text = """graph @g() {
  %a = opaque() {cost = {h100 = 1ms}} : blob[8]
  %b = opaque(%a) {cost = 2ms} : blob[0]
}"""
    with pytest.raises(pesto_ir.PassError) as e:
        run_pass(text, "annotate-costs{model=given}", Cluster.homogeneous(1, "v100"))
    assert isinstance(e.value.cause, CostError)
    msg = e.value.format()
    assert "'a'" in msg and "v100" in msg and "annotate-costs" in msg


def test_given_names_ops_without_cost() -> None:
    with pytest.raises(pesto_ir.PassError, match="annotate-costs") as e:
        run_pass(MLP, "annotate-costs{model=given}", Cluster.homogeneous(1, "cpu"))
    assert "op 'y'" in e.value.format()


def test_given_on_cost_graph_json() -> None:
    from pesto_ir.frontends.json_graph import graph_from_json

    g = graph_from_json({"format": "pesto-graph/1", "name": "toy",
                         "nodes": [{"id": "a", "cost": 0.002, "memory": 1048576},
                                   {"id": "b", "cost": {"v100": 0.001, "cpu": 0.02}}],
                         "edges": [{"src": "a", "dst": "b", "bytes": 4194304}]})
    AnnotateCostsPass().run(g, PassContext(cluster=Cluster.homogeneous(2, "v100"), quiet=True))
    assert g.op("a").get("memory") == 1048576  # given keeps memory as it is


def test_roofline_refuses_opaque_cost_graph_ops() -> None:
    text = "graph @g() {\n  %a = opaque() {cost = 1ms} : blob[8]\n}"
    with pytest.raises(pesto_ir.PassError) as e:
        run_pass(text, "annotate-costs{model=roofline}", Cluster.homogeneous(1, "v100"))
    assert "op 'a'" in e.value.format() and "model=given" in e.value.format()


def test_auto_uses_given_costs_or_roofline() -> None:
    given = "graph @g() {\n  %a = opaque() {cost = 1ms} : blob[8]\n}"
    assert run_pass(given, "annotate-costs{model=auto}", Cluster.homogeneous(1, "v100")).op("a").get("cost") == 1e-3
    g = run_pass(MLP, "annotate-costs{model=auto}", Cluster.homogeneous(1, "v100"))
    assert all("flops" in op.attrs and "cost" in op.attrs for op in g.ops)


def test_bad_model_option_is_a_pipeline_error() -> None:
    with pytest.raises(pesto_ir.ParseError, match="model must be one of"):
        Pipeline.parse("annotate-costs{model=guess}")


# ---------------------------------------------------------------- profile (tiny ops, real CPU device)

TINY = """graph @tiny(%x: f32[8,8], %w: f32[8,8]) {
  %y = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[8,8]
  %z = add(%y, %x) : f32[8,8]
  %z2 = add(%y, %x) : f32[8,8]
  return %z, %z2
}"""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PESTO_CACHE", str(tmp_path))
    return tmp_path


def test_profile_writes_costs_and_caches(cache_dir) -> None:
    import io

    cluster = Cluster.from_jax_devices(__import__("jax").devices()[:2])
    log = io.StringIO()
    g = PassManager("annotate-costs{model=profile runs=3 warmup=1}").run(
        pesto_ir.parse(TINY), PassContext(cluster=cluster, log=log))
    for op in g.ops:
        assert isinstance(op.attrs["cost"], DurationAttr) and op.get("cost") >= 0
        assert op.get("flops") > 0 and "memory" not in op.attrs
    assert "2 measured, 0 from cache" in log.getvalue()  # the two identical adds are timed once
    assert list(cache_dir.rglob("*.json"))
    log2 = io.StringIO()
    g2 = PassManager("annotate-costs{model=profile runs=3 warmup=1}").run(
        pesto_ir.parse(TINY), PassContext(cluster=cluster, log=log2))
    assert "0 measured, 2 from cache" in log2.getvalue()
    assert [op.get("cost") for op in g2.ops] == [op.get("cost") for op in g.ops]
    quiet = io.StringIO()
    PassManager("annotate-costs{model=profile runs=1 cache=false}").run(
        pesto_ir.parse(TINY), PassContext(cluster=cluster, log=quiet, quiet=True))
    assert quiet.getvalue() == ""


def test_profile_nested_scan_from_the_jax_frontend(cache_dir) -> None:
    import jax
    import jax.numpy as jnp

    from pesto_ir.frontends.jax import lower

    def f(c, xs):
        return jax.lax.scan(lambda h, x: (jnp.tanh(h @ x), h.sum()), c, xs)

    g = lower(f, jnp.ones((4, 4)), jnp.ones((3, 4, 4)))
    scan = next(op for op in g.ops if op.opcode == "scan")
    assert op_work(scan).flops >= 3 * 2 * 4 * 4 * 4
    PassManager("annotate-costs{model=profile runs=2 warmup=1}").run(
        g, PassContext(cluster=Cluster.from_jax_devices(jax.devices()[:1]), quiet=True))
    assert scan.get("cost") >= 0


def test_profile_errors_name_the_op_and_the_kind(cache_dir) -> None:
    opaque = "graph @o() {\n  %a = opaque() : blob[4]\n}"
    with pytest.raises(pesto_ir.PassError) as e:
        run_pass(opaque, "annotate-costs{model=profile runs=1}", Cluster.homogeneous(1, "cpu"))
    assert "op 'a'" in e.value.format()
    with pytest.raises(pesto_ir.PassError) as e:
        run_pass(TINY, "annotate-costs{model=profile runs=1}", Cluster.homogeneous(1, "h100"))
    assert "no local JAX device of that kind" in e.value.format() and "'h100'" in e.value.format()


def test_profile_segment_of_ops(cache_dir) -> None:
    import jax

    from pesto_ir.jaxrt.profile import Profiler, subgraph

    g = pesto_ir.parse(TINY)
    sub = subgraph(g.ops[:2])
    assert [v.name for v in sub.inputs] == ["x", "w"] and [v.name for v in sub.outputs] == ["y", "z"]
    assert Profiler(runs=2, warmup=1, cache=False).time_ops(g.ops[:2], jax.devices()[0]) >= 0


def test_roofline_warns_once_about_an_opcode_it_can_only_guess(capsys: pytest.CaptureFixture[str]) -> None:
    text = """graph @g(%x: f32[4]) {
  %y = my_custom(%x) : f32[4]
  %y2 = my_custom(%y) : f32[4]
  %z = tanh(%y2) : f32[4]
  return %z
}"""
    run_pass(text, "annotate-costs{model=roofline}", Cluster.homogeneous(1, "h100"), quiet=False)
    err = capsys.readouterr().err
    assert err.count("warning: annotate-costs: 'my_custom' is not a JAX primitive") == 1 and "tanh" not in err


def test_summed_costs_per_device_where_a_cost_depends_on_the_device() -> None:
    g = pesto_ir.parse("""
graph @g() {
  %a = opaque() {cost = 2ms} : blob[0]
  %b = opaque(%a) {cost = {fast = 3ms, slow = 6ms}} : blob[0]
}
""")
    fast, slow = Device("fast", "fast", 1e12, 1e11, 1e9), Device("slow", "slow", 1e12, 1e11, 1e9)
    assert summed_costs(g.ops, [fast, slow, fast]) == pytest.approx([5e-3, 8e-3, 5e-3])
    assert summed_costs(g.ops[:1], [fast, slow]) == pytest.approx([2e-3, 2e-3])
    assert summed_costs(g.ops, []) == []
