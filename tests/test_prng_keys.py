"""Typed PRNG keys (`jax.random.key`) as the IR element type `key<impl>`, and shard_map / pmap refused.

Keys lower, print as `key<threefry2x32>[2]`, parse back, are costed by their bytes, and run through
the interpreter, `parallelize` and the emitted Python with jax.jit's very bits (same key, same
numbers); a step that splits itself across devices with shard_map or pmap is refused by name.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pesto_ir
from pesto_ir.backends.python_emit import emit_python
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.roofline import op_time, op_work
from pesto_ir.frontends.jax import LoweringError, lower, lower_function
from pesto_ir.frontends.text import ENGINES
from pesto_ir.ir.types import KEY_IMPLS, TensorType
from pesto_ir.jaxrt.interpreter import evaluate
from pesto_ir.passmanager import PassContext, PassManager

FAST = {"xla_backend_optimization_level": 0}


def _bits(x: Any) -> np.ndarray:
    """The exact contents of an array; a key array by its key data."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        assert jax.random.key_impl(x) is not None
        x = jax.random.key_data(x)
    return np.asarray(x)


def _assert_same_bits(got: Any, want: Any) -> None:
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(_bits(g), _bits(w))


def _round_trips(text: str) -> None:
    for engine in ENGINES:
        assert str(pesto_ir.parse(text, engine=engine)) == text


# ---------------------------------------------------------------- a step with typed keys

def _noisy_dropout_step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, ...]:
    """Gaussian noise and dropout from a key made inside the step; the random parts are returned."""
    key = jax.random.key(0)
    k_noise, k_drop = jax.random.split(key)
    noise = jax.random.normal(k_noise, (x.shape[0], w.shape[1]))
    h = jnp.tanh(x @ w + 0.1 * noise)
    keep = jax.random.bernoulli(k_drop, 0.75, h.shape)
    h = jnp.where(keep, h / 0.75, 0.0)
    return h.sum(), noise, keep, jax.random.fold_in(k_drop, 1), jax.random.uniform(k_noise, (5,))


def test_a_step_with_typed_keys_round_trips_and_runs_on_4_devices_like_jit() -> None:
    w, x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), jnp.arange(6.0).reshape(2, 3) / 6
    graph = lower(_noisy_dropout_step, w, x)
    text = str(graph)
    assert "random_seed(" in text and '{impl = "threefry2x32"}' in text
    assert ": key<threefry2x32>[2]" in text and ": key<threefry2x32>[]" in text
    _round_trips(text)

    run = pesto_ir.parallelize(_noisy_dropout_step, devices=jax.devices()[:4], compiler_options=FAST, autotune=False)
    got = run(w, x)
    want = jax.jit(_noisy_dropout_step)(w, x)
    _assert_same_bits(got[2:], want[2:])  # the dropout mask, the next key, uniform draws: the very bits
    # the normal noise is the same bits through erf_inv, float math XLA may round 1 ulp apart per compile
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-6)
    assert len({s.device for s in run.executable.segments}) > 1  # it ran split across devices


def _carry_key_step(key: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A training-loop step: the key comes in, a fresh one goes out."""
    key, sub = jax.random.split(key)
    return key, x * jax.random.uniform(sub, x.shape)


def test_a_key_argument_is_a_key_input_and_threads_through_steps() -> None:
    x = jnp.arange(4.0)
    lowered = lower_function(_carry_key_step, jax.random.key(7), x)
    assert lowered.graph.inputs[0].type == TensorType("key<threefry2x32>", ())
    _round_trips(str(lowered.graph))
    run = pesto_ir.parallelize(_carry_key_step, devices=jax.devices()[:2], compiler_options=FAST, autotune=False)
    jitted = jax.jit(_carry_key_step)
    k1 = k2 = jax.random.key(7)
    for _ in range(3):
        (k1, y1), (k2, y2) = run(k1, x), jitted(k2, x)
        _assert_same_bits((k1, y1), (k2, y2))
    _assert_same_bits(lowered(jax.random.key(7), x), jitted(jax.random.key(7), x))
    with pytest.raises(pesto_ir.PestoError, match=r"input %key .* is key<threefry2x32>\[\], got uint32\[2\]"):
        lowered(jax.random.PRNGKey(7), x)
    with pytest.raises(pesto_ir.PestoError, match=r"got key<rbg>\[\]"):
        lowered(jax.random.key(7, impl="rbg"), x)


def test_raw_uint32_keys_still_work() -> None:
    """Old-style `PRNGKey` keys are u32[2] arrays; JAX wraps them into typed keys inside."""

    def step(raw: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        a, b = jax.random.split(raw)
        return x + jax.random.normal(a, x.shape), b

    raw, x = jax.random.PRNGKey(3), jnp.zeros(3)
    lowered = lower_function(step, raw, x)
    text = str(lowered.graph)
    assert lowered.graph.inputs[0].type == TensorType("u32", (2,))
    assert "random_wrap(%raw) {impl = \"threefry2x32\"}" in text and "random_unwrap(" in text
    _round_trips(text)
    _assert_same_bits(lowered(raw, x), jax.jit(step)(raw, x))


@pytest.mark.parametrize("impl", ["rbg", "philox4x32", "threefry4x32"])
def test_other_jax_implementations_lower_and_match(impl: str) -> None:
    def step(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.random.bits(jax.random.fold_in(key, 3), (2,)), jax.random.split(key, 3)

    key = jax.random.key(11, impl=impl)
    lowered = lower_function(step, key)
    text = str(lowered.graph)
    assert f"%key: key<{impl}>[]" in text and f": key<{impl}>[3]" in text
    _round_trips(text)
    _assert_same_bits(lowered(key), jax.jit(step)(key))


def test_a_user_defined_implementation_lowers_by_name_and_an_unnamed_one_is_refused() -> None:
    from jax.extend.random import define_prng_impl
    from jax.extend.random import threefry_prng_impl as base

    def step(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.random.bits(jax.random.split(key)[0], (3,)), jax.random.fold_in(key, 2)

    parts = {"key_shape": (2,), "seed": base.seed, "split": base.split, "random_bits": base.random_bits,
             "fold_in": base.fold_in}
    key = jax.random.key(3, impl=define_prng_impl(**parts, name="test_threefry", tag="tf"))
    lowered = lower_function(step, key)
    assert lowered.graph.inputs[0].type == TensorType("key<test_threefry>", ())
    _round_trips(str(lowered.graph))
    _assert_same_bits(lowered(key), jax.jit(step)(key))
    with pytest.raises(LoweringError, match="a PRNG implementation name must be letters, digits and '_'"):
        lower(step, jax.random.key(3, impl=define_prng_impl(**parts)))  # named '<unnamed>'
    with pytest.raises(LoweringError, match="'rbg' is not the one JAX registers under that name"):
        lower(step, jax.random.key(3, impl=define_prng_impl(**parts, name="rbg")))


def test_keys_through_scan_and_the_emitted_python(tmp_path: Path) -> None:
    """Keys as a scan's per-step inputs (a nested graph with a key input) and key data out."""

    def step(w: jax.Array, x: jax.Array, key: jax.Array) -> Any:
        def body(h: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
            h = jnp.tanh(h @ w)
            return jnp.where(jax.random.bernoulli(k, 0.8, h.shape), h, 0.0), jax.random.key_data(k)

        keys = jax.random.split(key, 3)
        h, data = jax.lax.scan(body, x, keys)
        return h, data, jax.random.wrap_key_data(data[-1])

    args = (jnp.full((3, 3), 0.3), jnp.arange(6.0).reshape(2, 3), jax.random.key(5))
    lowered = lower_function(step, *args)
    _round_trips(str(lowered.graph))
    want = jax.jit(step)(*args)
    _assert_same_bits(lowered(*args), want)

    cluster = Cluster.from_jax_devices(jax.devices()[:2])
    placed = PassManager("annotate-costs{model=roofline},coarsen,place{algo=m-topo},expand,simulate").run(
        lowered.graph, PassContext(cluster=cluster, quiet=True))
    source = emit_python(placed)
    assert "_dtype('key<threefry2x32>')" in source and "impl=_prng_impl('threefry2x32')" in source
    path = tmp_path / "keys_plan.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("emitted_keys", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    outs = module.run(*lowered.flat_inputs(*args), devices=jax.devices()[:2])
    _assert_same_bits(jax.tree_util.tree_unflatten(lowered.out_tree, outs), want)
    example = module._example((2,), "key<threefry2x32>")
    assert example.shape == (2,) and not (_bits(example)[0] == _bits(example)[1]).all()


# ---------------------------------------------------------------- dropout in real libraries

def _flax_linen() -> tuple[Callable[..., Any], tuple[Any, ...], int]:
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array, train: bool) -> jax.Array:
            x = nn.relu(nn.Dense(8)(x))
            x = nn.Dropout(0.5, deterministic=not train)(x)
            return nn.Dense(2)(x)

    net, x = MLP(), jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    variables = net.init(jax.random.key(0), x, False)

    def forward(variables: Any, x: jax.Array, key: jax.Array) -> jax.Array:
        return net.apply(variables, x, True, rngs={"dropout": key})

    return forward, (variables, x, jax.random.key(1)), 0


def _flax_nnx() -> tuple[Callable[..., Any], tuple[Any, ...], int]:
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.linear = nnx.Linear(3, 8, rngs=rngs)
            self.dropout = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.dropout(self.linear(x))

    graphdef, state = nnx.split(Block(nnx.Rngs(params=0, dropout=1)))

    def forward(state: Any, x: jax.Array) -> tuple[jax.Array, Any]:
        block = nnx.merge(graphdef, state)
        return block(x), nnx.state(block)  # the dropout stream's key and its advanced count

    return forward, (state, jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)), 0


def _equinox() -> tuple[Callable[..., Any], tuple[Any, ...], int]:
    import equinox as eqx

    dropout = eqx.nn.Dropout(0.5)

    def forward(x: jax.Array, key: jax.Array) -> jax.Array:
        return dropout(x, key=key)

    return forward, (jnp.linspace(-1.0, 1.0, 12).reshape(4, 3), jax.random.key(2)), 1


def _haiku() -> tuple[Callable[..., Any], tuple[Any, ...], int]:
    import haiku as hk

    def net(x: jax.Array) -> jax.Array:
        return hk.dropout(hk.next_rng_key(), 0.5, hk.Linear(8)(x))

    model = hk.transform(net)
    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    params = model.init(jax.random.key(0), x)

    def forward(params: Any, x: jax.Array, key: jax.Array) -> jax.Array:
        return model.apply(params, key, x)

    return forward, (params, x, jax.random.key(1)), 0


LIBRARIES = [_flax_linen, _flax_nnx, _haiku, _equinox]
LIBRARY_IDS = ["linen", "nnx", "haiku", "equinox"]


@pytest.mark.parametrize("model", LIBRARIES, ids=LIBRARY_IDS)
@pytest.mark.slow
def test_library_dropout_lowers_and_equals_jit(model: Callable[[], tuple[Callable[..., Any], tuple[Any, ...], int]]
                                               ) -> None:
    fn, args, key_arg = model()
    lowered = lower_function(fn, *args, param_argnums=0 if key_arg else ())
    text = str(lowered.graph)
    assert "key<threefry2x32>" in text and "random_bits(" in text
    _round_trips(text)
    want = jax.jit(fn)(*args)
    _assert_same_bits(lowered(*args), want)
    mask = np.asarray(jax.tree_util.tree_leaves(want)[0]) == 0
    assert mask.any() and not mask.all()  # dropout did drop, and kept


@pytest.mark.parametrize("model", LIBRARIES, ids=LIBRARY_IDS)
def test_library_dropout_runs_under_parallelize_on_4_devices(
        model: Callable[[], tuple[Callable[..., Any], tuple[Any, ...], int]]) -> None:
    fn, args, key_arg = model()
    run = pesto_ir.parallelize(fn, devices=jax.devices()[:4], param_argnums=0 if key_arg else (),
                               compiler_options=FAST, autotune=False)
    got, want = jax.tree_util.tree_leaves(run(*args)), jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    np.testing.assert_array_equal(np.asarray(got[0]) == 0, np.asarray(want[0]) == 0)  # the same units dropped
    for a, b in zip(got, want):
        if jnp.issubdtype(b.dtype, jax.dtypes.prng_key):  # nnx hands back its advanced dropout key
            _assert_same_bits(a, b)
        else:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


# ---------------------------------------------------------------- .pir text, types and costs

HAND_WRITTEN = """\
graph @keys(%k: key<threefry2x32>[], %m: u32[]) {
  %ks = random_split(%k) {shape = [2]} : key<threefry2x32>[2]
  %f = random_fold_in(%ks, %m) : key<threefry2x32>[2]
  %bits = random_bits(%f) {bit_width = 32, shape = [3]} : u32[2,3]
  %data = random_unwrap(%f) : u32[2,2]
  %again = random_wrap(%data) {impl = "threefry2x32"} : key<threefry2x32>[2]
  return %bits, %again
}
"""


def test_hand_written_key_types_parse_verify_and_evaluate() -> None:
    graph = pesto_ir.parse(HAND_WRITTEN, "keys.pir")
    pesto_ir.verify(graph)
    assert str(graph) == HAND_WRITTEN
    k, m = jax.random.key(4), jnp.uint32(9)
    bits, again = evaluate(graph, k, m)
    folded = jax.vmap(jax.random.fold_in, in_axes=(0, None))(jax.random.split(k), m)
    np.testing.assert_array_equal(np.asarray(bits), np.asarray(jax.vmap(lambda f: jax.random.bits(f, (3,)))(folded)))
    _assert_same_bits(again, folded)
    assert graph.inputs[0].type.nbytes == 8 and graph.ops[0].result.type.nbytes == 16
    assert TensorType("key<rbg>", (3,)).nbytes == 48


@pytest.mark.parametrize(("bad", "message"), [
    ("key<nosuchimpl>[2]", "unknown PRNG implementation 'nosuchimpl' in type 'key<nosuchimpl>[2]' (known: threefry2x32"),
    ("key[2]", "a key type names its PRNG implementation: key<threefry2x32>[2]"),
    ("f32<rbg>[2]", "only key types name an implementation in <...>"),
])
@pytest.mark.parametrize("engine", ["fast", "lark"])
def test_malformed_key_types_are_clear_errors(bad: str, message: str, engine: str) -> None:
    text = HAND_WRITTEN.replace("%ks = random_split(%k) {shape = [2]} : key<threefry2x32>[2]",
                                f"%ks = random_split(%k) {{shape = [2]}} : {bad}")
    with pytest.raises(pesto_ir.PestoError) as info:
        pesto_ir.parse(text, "keys.pir", engine=engine)
    col = text.splitlines()[1].index(bad) + 1
    assert str(info.value).startswith(f"keys.pir:2:{col}: {message}")


@pytest.mark.parametrize(("line", "message"), [
    ("%ks = random_split(%k) {shape = [3]} : key<threefry2x32>[2]", r"key<threefry2x32>\[3\]"),
    ("%ks = random_split(%m) {shape = [2]} : key<threefry2x32>[2]", "not an array of PRNG keys"),
    ("%ks = random_seed(%m) {impl = \"rbg\"} : key<threefry2x32>[2]", r"key<rbg>\[\]"),
])
def test_key_ops_are_shape_checked(line: str, message: str) -> None:
    text = HAND_WRITTEN.replace("%ks = random_split(%k) {shape = [2]} : key<threefry2x32>[2]", line)
    with pytest.raises(pesto_ir.PestoError, match=message):
        pesto_ir.verify(pesto_ir.parse(text, "keys.pir"))


def test_the_key_implementations_match_jax() -> None:
    from jax._src.random import prng

    assert {name: tuple(impl.key_shape) for name, impl in prng.prngs.items()} == \
        {name: shape for name, shape in KEY_IMPLS.items() if name in prng.prngs}
    for name in prng.prngs:
        assert TensorType(f"key<{name}>", ()).nbytes == jax.random.key(0, impl=name).dtype.itemsize


def test_key_ops_are_costed_by_key_bytes() -> None:
    graph = pesto_ir.parse(HAND_WRITTEN)
    split, fold_in, bits, unwrap, wrap = graph.ops
    work = op_work(split)
    assert (work.flops, work.bytes) == (2, 8 + 16)  # two new keys; one key read, two written
    assert op_work(bits).flops == 6 and op_work(bits).bytes == 16 + 24
    assert op_work(fold_in).bytes == 16 + 4 + 16
    device = Cluster.from_jax_devices(jax.devices()[:1]).devices[0]
    assert op_time(split, device) > 0 and op_time(wrap, device) == 0 and op_time(unwrap, device) == 0


def test_profiling_examples_of_key_values_are_distinct_keys() -> None:
    from pesto_ir.jaxrt.profile import example_arrays

    graph = pesto_ir.parse(HAND_WRITTEN)
    k, m = example_arrays(graph.inputs, jax.devices()[0], "test")
    assert k.dtype == jax.random.key(0).dtype and k.shape == () and m.dtype == jnp.uint32
    (split_keys,) = example_arrays([graph.ops[0].result], jax.devices()[0], "test")
    assert split_keys.shape == (2,) and not (_bits(split_keys)[0] == _bits(split_keys)[1]).all()


# ---------------------------------------------------------------- shard_map and pmap refused

_REFUSAL = ("inside the step: pesto_ir places the step itself across devices, so the step cannot also split "
            "itself; call the function without shard_map/pmap")


def test_shard_map_inside_a_step_is_refused_with_its_location() -> None:
    from jax.sharding import PartitionSpec

    mesh = jax.make_mesh((4,), ("i",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    doubled = jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=PartitionSpec("i"), out_specs=PartitionSpec("i"))

    def step(x: jax.Array) -> jax.Array:
        return doubled(x) + 1

    with pytest.raises(LoweringError) as info:
        lower(step, jnp.ones(8))
    message = str(info.value)
    assert "primitive 'shard_map' (from jax.shard_map or jax.pmap, mesh axes 'i') " + _REFUSAL in message
    assert message.startswith(f"{__file__}:")


def test_pmap_inside_a_step_is_refused() -> None:
    mapped = jax.pmap(lambda x: x * 2, devices=jax.devices()[:4])

    def step(x: jax.Array) -> jax.Array:
        return mapped(x).sum()

    with pytest.raises(LoweringError, match=r"primitive 'shard_map' \(from jax\.pmap\) inside the step"):
        lower(step, jnp.ones((4, 2)))
    with pytest.raises(pesto_ir.PestoError, match="call the function without shard_map/pmap"):
        pesto_ir.parallelize(step, devices=jax.devices()[:2])(jnp.ones((4, 2)))
