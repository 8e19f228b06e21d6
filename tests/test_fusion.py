"""The fusion analysis (`pesto_ir.cost.fusion`) and `annotate-costs{fusion=xla}`: which ops make one kernel,
what a kernel reads and writes, and that fused costs add up to the kernels' times."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

import pesto_ir
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.fusion import fusion_groups, group_time, group_work, runs_a_kernel
from pesto_ir.cost.roofline import Work, kernel_opcode, op_family, op_time, op_work
from pesto_ir.ir.graph import Graph
from pesto_ir.passmanager import PassContext, PassManager

DOT = "{dimension_numbers = [[[1], [0]], [[], []]]}"
ROW = "{shape = [64, 32], broadcast_dimensions = [1]}"
F32 = 4


def parse(body: str, inputs: str = "%x: f32[64,16], %w: f32[16,32], %b: f32[32]") -> Graph:
    g = pesto_ir.parse(f"graph @t({inputs}) {{\n{body}\n}}")
    pesto_ir.verify(g)
    return g


def kernels(g: Graph) -> list[list[str]]:
    return [[op.name for op in grp.ops] for grp in fusion_groups(g)]


def test_dense_layer_is_one_kernel_matmul_with_bias_and_relu_epilogue() -> None:
    g = parse(f"""  %mm = dot_general(%x, %w) {DOT} : f32[64,32]
  %row = broadcast_in_dim(%b) {ROW} : f32[64,32]
  %h = add(%mm, %row) : f32[64,32]
  %zero = constant() {{value = 0.0}} : f32[]
  %a = max(%h, %zero) : f32[64,32]
  return %a""")
    (group,) = fusion_groups(g)
    assert group.family == "matmul"
    assert [v.name for v in group.inputs] == ["x", "w", "b"]
    assert [v.name for v in group.outputs] == ["a"]
    # reads x, w and the bias row's source (not the broadcast), writes a; the dot's FLOPs plus one per add/max element
    assert group_work(group).bytes == F32 * (64 * 16 + 16 * 32 + 32 + 64 * 32)
    assert group_work(group).flops == 2 * 64 * 32 * 16 + 2 * 64 * 32


def test_reduction_takes_its_elementwise_producers_but_not_its_consumers() -> None:
    g = parse("""  %e = exp(%x) : f32[64,16]
  %s = reduce_sum(%e) {axes = [1]} : f32[64]
  %n = neg(%s) : f32[64]
  return %n""", "%x: f32[64,16]")
    assert kernels(g) == [["e", "s"], ["n"]]
    assert [grp.family for grp in fusion_groups(g)] == ["reduction", "elementwise"]


def test_a_value_read_by_two_kernels_is_written_once_and_not_fused() -> None:
    g = parse("""  %e = exp(%x) : f32[64,16]
  %s = reduce_sum(%e) {axes = [1]} : f32[64]
  %t = reduce_max(%e) {axes = [1]} : f32[64]
  return %s, %t""", "%x: f32[64,16]")
    assert kernels(g) == [["e"], ["s"], ["t"]]


def test_no_prologue_fusion_into_a_matmul() -> None:
    g = parse(f"""  %e = exp(%x) : f32[64,16]
  %mm = dot_general(%e, %w) {DOT} : f32[64,32]
  return %mm""", "%x: f32[64,16], %w: f32[16,32]")
    assert kernels(g) == [["e"], ["mm"]]


def test_a_matmul_feeding_two_kernels_keeps_its_own() -> None:
    g = parse(f"""  %mm = dot_general(%x, %w) {DOT} : f32[64,32]
  %a = exp(%mm) : f32[64,32]
  %c = neg(%mm) : f32[64,32]
  return %a, %c""", "%x: f32[64,16], %w: f32[16,32]")
    assert kernels(g) == [["mm"], ["a"], ["c"]]


def test_a_graph_output_is_not_fused_into_its_reader() -> None:
    g = parse("""  %e = exp(%x) : f32[64,16]
  %n = neg(%e) : f32[64,16]
  return %e, %n""", "%x: f32[64,16]")
    assert kernels(g) == [["e"], ["n"]]


def test_a_reduction_over_axes_of_size_one_is_a_reshape_that_fuses_into_its_reader() -> None:
    """XLA's algebraic simplifier makes `reduce_sum` over size-1 axes a reshape: no reduction kernel."""
    g = parse("""  %s = reduce_sum(%x) {axes = [0]} : f32[32]
  %n = neg(%s) : f32[32]
  %r = reduce_sum(%y) {axes = [0]} : f32[32]
  return %n, %r""", "%x: f32[1,32], %y: f32[4,32]")
    trivial, real = (op for op in g.ops if op.opcode == "reduce_sum")
    assert kernel_opcode(trivial) == "reshape" and kernel_opcode(real) == "reduce_sum"
    assert op_family(trivial) == "movement" and op_family(real) == "reduction"
    assert op_work(trivial) == Work(0, 2 * F32 * 32)  # reads and writes, as a reshape does
    groups = {grp.name: grp for grp in fusion_groups(g)}
    assert kernels(g) == [["s", "n"], ["r"]]
    assert groups["n"].family == "elementwise" and groups["r"].family == "reduction"


def test_a_broadcast_read_by_two_kernels_is_recomputed_in_each_and_costs_nothing() -> None:
    g = parse(f"""  %row = broadcast_in_dim(%b) {ROW} : f32[64,32]
  %mm = dot_general(%x, %w) {DOT} : f32[64,32]
  %s = reduce_sum(%row) {{axes = [0]}} : f32[32]
  %h = add(%mm, %row) : f32[64,32]
  return %s, %h""")
    groups = {grp.name: grp for grp in fusion_groups(g)}
    assert groups["row"].free and group_work(groups["row"]).bytes == 0
    assert not runs_a_kernel(groups["row"]) and runs_a_kernel(groups["s"]) and runs_a_kernel(groups["h"])
    assert group_time(groups["row"], Cluster.homogeneous(1, "h100").devices[0]) == 0.0
    # the reduction reads the bias (32 floats), not the 64 x 32 broadcast
    assert group_work(groups["s"]).bytes == F32 * (32 + 32)


def test_annotate_costs_fused_op_costs_add_up_to_the_kernels_and_label_them() -> None:
    text = (f"""  %mm = dot_general(%x, %w) {DOT} : f32[64,32]
  %row = broadcast_in_dim(%b) {ROW} : f32[64,32]
  %h = add(%mm, %row) : f32[64,32]
  %e = exp(%h) : f32[64,32]
  %s = reduce_sum(%e) {{axes = [1]}} : f32[64]
  return %s""")
    cluster = Cluster.homogeneous(1, "h100")
    device = cluster.devices[0]
    fused = parse(text)
    PassManager("annotate-costs{model=roofline}").run(fused, PassContext(cluster=cluster, quiet=True))
    expected = sum(group_time(grp, device) for grp in fusion_groups(parse(text)))
    assert math.isclose(sum(float(op.attrs["cost"].value) for op in fused.ops), expected, rel_tol=1e-9)
    assert len({str(op.attrs["fusion"]) for op in fused.ops}) == 2
    kernel_total = sum(group_work(grp).bytes for grp in fusion_groups(parse(text)))
    assert sum(int(op.attrs["bytes_accessed"].value) for op in fused.ops) == kernel_total
    # kernels: the matmul (reads x, w; writes mm), and the reduction with its producers: h reads mm
    # and the bias, exp works in registers only, the sum writes s
    assert int(fused.op("mm").attrs["bytes_accessed"].value) == F32 * (64 * 16 + 16 * 32 + 64 * 32)
    assert int(fused.op("h").attrs["bytes_accessed"].value) == F32 * 64 * 32
    assert int(fused.op("e").attrs["bytes_accessed"].value) == 0
    alone = parse(text)
    PassManager("annotate-costs{model=roofline fusion=none}").run(alone, PassContext(cluster=cluster, quiet=True))
    for op in alone.ops:
        assert math.isclose(float(op.attrs["cost"].value), op_time(op, device))
        assert "fusion" not in op.attrs


def test_fusion_option_is_checked() -> None:
    import pytest

    from pesto_ir.passes.annotate_costs import AnnotateCostsPass

    with pytest.raises(ValueError, match="fusion must be one of xla, none"):
        AnnotateCostsPass(fusion="tpu")


# ---------------------------------------------------------------- random graphs

OPS = ("exp", "neg", "add", "mul", "dot", "reduce", "bcast", "transpose")


@st.composite
def shaped_graphs(draw: st.DrawFn, max_ops: int = 14) -> Graph:
    """Random DAGs of 8 x 8 tensors: elementwise, matmul, reduce-then-broadcast, transpose."""
    lines, names = [], ["x", "y"]
    for i in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(OPS))
        a, b = (draw(st.sampled_from(names)) for _ in range(2))
        n = f"v{i}"
        if kind in ("exp", "neg"):
            lines.append(f"  %{n} = {kind}(%{a}) : f32[8,8]")
        elif kind in ("add", "mul"):
            lines.append(f"  %{n} = {kind}(%{a}, %{b}) : f32[8,8]")
        elif kind == "dot":
            lines.append(f"  %{n} = dot_general(%{a}, %{b}) {DOT} : f32[8,8]")
        elif kind == "transpose":
            lines.append(f"  %{n} = transpose(%{a}) {{permutation = [1, 0]}} : f32[8,8]")
        else:
            lines.append(f"  %{n}_r = reduce_sum(%{a}) {{axes = [1]}} : f32[8]")
            lines.append(f"  %{n} = broadcast_in_dim(%{n}_r) {{shape = [8, 8], broadcast_dimensions = [0]}} : f32[8,8]")
        names.append(n)
    outs = draw(st.lists(st.sampled_from(names[2:]), min_size=1, max_size=3, unique=True))
    return parse("\n".join(lines) + "\n  return " + ", ".join(f"%{o}" for o in outs), "%x: f32[8,8], %y: f32[8,8]")


@settings(max_examples=150, deadline=None)
@given(shaped_graphs())
def test_kernels_partition_the_graph_into_an_acyclic_graph_of_kernels(g: Graph) -> None:
    groups = fusion_groups(g)
    of = {op.name: i for i, grp in enumerate(groups) for op in grp.ops}
    assert sorted(of) == sorted(op.name for op in g.ops)
    for grp in groups:
        heroes = [op for op in grp.ops if op.opcode in ("dot_general", "reduce_sum")]
        assert len(heroes) <= 1
    # kernels in the order of their last ops are a topological order of the kernel graph
    for p, c, _ in g.edges():
        assert of[p.name] <= of[c.name]


@settings(max_examples=150, deadline=None)
@given(shaped_graphs())
def test_fused_kernels_never_cost_more_than_the_ops_alone(g: Graph) -> None:
    device = Cluster.homogeneous(1, "h100").devices[0]
    fused = sum(group_time(grp, device) for grp in fusion_groups(g))
    assert fused <= sum(op_time(op, device) for op in g.ops) + 1e-12
    moved = sum(group_work(grp).bytes for grp in fusion_groups(g))
    from pesto_ir.cost.roofline import op_work

    assert moved <= sum(op_work(op).bytes for op in g.ops)


def test_coarsen_keeps_each_fused_kernel_in_one_group() -> None:
    g = pesto_ir.parse(open("examples/mlp_train_step.pir").read())
    cluster = Cluster.homogeneous(2, "h100")
    PassManager("annotate-costs{model=roofline},coarsen{target=12}").run(g, PassContext(cluster=cluster, quiet=True))
    kernels = {str(op.attrs["fusion"]) for op in g.ops}
    assert len(kernels) < len(g.ops)  # some kernels have several ops
    for kernel in kernels:
        assert len({str(op.attrs["group"]) for op in g.ops if str(op.attrs["fusion"]) == kernel}) == 1
    unlabelled = pesto_ir.parse(open("examples/mlp_train_step.pir").read())
    PassManager("annotate-costs{model=roofline fusion=none},coarsen{target=12}").run(
        unlabelled, PassContext(cluster=cluster, quiet=True))
    assert not any("fusion" in op.attrs for op in unlabelled.ops)


def test_a_conv_nets_kernel_gradients_and_max_pool_gradients_have_their_own_families() -> None:
    # XLA runs a convolution's filter gradient (its window, the output gradient, larger than its
    # output) at a fraction of the speed of a forward convolution, and pooling and its gradient
    # (select_and_scatter_add) as loops over every window, far slower than a fused reduction: the
    # calibration gives them efficiencies of their own.
    import jax
    import jax.numpy as jnp

    from pesto_ir.cost.roofline import op_family
    from pesto_ir.frontends.jax import lower

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        h = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return jnp.sum(h * h)

    g = lower(jax.grad(loss, argnums=(0, 1)), jnp.ones((3, 3, 4, 8)), jnp.ones((2, 8, 8, 4)))
    families = {op.name: op_family(op) for op in g.ops}
    convs = {op.name: tuple(op.results[0].type.shape) for op in g.ops if op.opcode == "conv_general_dilated"}
    assert sorted((shape, families[name]) for name, shape in convs.items()) == [
        ((2, 8, 8, 4), "conv"), ((2, 8, 8, 8), "conv"), ((3, 3, 4, 8), "conv_filter_grad")]
    assert {families[op.name] for op in g.ops if op.opcode == "select_and_scatter_add"} == {"window"}
    assert {families[op.name] for op in g.ops if op.opcode == "reduce_window_max"} == {"window"}


def test_a_dense_layers_weight_gradient_has_its_own_family() -> None:
    # x @ w forward, dy @ w^T for the input's gradient (both contract x's and dy's last dimension),
    # x^T @ dy for the weight's (contracts the batch dimension, x's first): XLA's CPU backend
    # relayouts the last one's operands and runs it on another library, at about half the speed.
    import jax
    import jax.numpy as jnp

    from pesto_ir.cost.roofline import op_family
    from pesto_ir.frontends.jax import lower

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(x @ w))

    g = lower(jax.grad(loss, argnums=(0, 1)), jnp.ones((16, 8)), jnp.ones((4, 16)))
    dots = {tuple(op.results[0].type.shape): op_family(op) for op in g.ops if op.opcode == "dot_general"}
    assert dots == {(4, 8): "matmul", (4, 16): "matmul", (8, 16): "matmul_weight_grad"}  # (w^T, transposed after)

    def attention_scores(q: jax.Array, k: jax.Array) -> jax.Array:  # batched: "bqd,bkd->bqk"
        return jnp.sum(jnp.einsum("bqd,bkd->bqk", q, k) ** 2)

    g = lower(jax.grad(attention_scores, argnums=(0, 1)), jnp.ones((2, 5, 3)), jnp.ones((2, 6, 3)))
    families = sorted((tuple(op.results[0].type.shape), op_family(op)) for op in g.ops if op.opcode == "dot_general")
    # the scores and the query's gradient (dS @ k) contract last dimensions; the key's (dS^T @ q)
    # contracts dS over its query dimension
    assert families == [((2, 5, 3), "matmul"), ((2, 5, 6), "matmul"), ((2, 6, 3), "matmul_weight_grad")]
