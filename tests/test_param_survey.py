"""The primitives JAX 0.10 can put in a step's jaxpr, surveyed: each lowers, prints and parses back
to the very same `.pir` text with every parameter decoding to the value JAX had, and computes what
`jax.jit` computes; or is refused by name, with the reason; or is internal to JAX and never reaches
a step. The last test walks JAX's modules for every `Primitive` they define and fails, naming
them, on any primitive none of the three lists has: a new JAX version's new primitives must be
surveyed before they are met in a user's step. The lists (CASES, REFUSED, INTERNAL) and the functions
they hold live in param_survey_cases.py; the tests and their helpers are here.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import jax
import jax.extend.core as jex
import numpy as np
import pytest
from jax import lax
from param_survey_cases import CASES, COVERED, INTERNAL, REFUSED, Refusal, X

import pesto_ir
from pesto_ir.frontends.jax import (
    INLINE_RULES,
    LoweringError,
    lower_function,
    lower_jaxpr,
    plain_arrays,
    sub_jaxprs,
    without_dead_code,
)
from pesto_ir.frontends.text import ENGINES
from pesto_ir.jaxrt.interpreter import as_function
from pesto_ir.jaxrt.params import DERIVED_PARAMS, codec_for, encode_param

FAST = {"xla_backend_optimization_level": 0}  # compile both sides alike, quickly


# ---------------------------------------------------------------- helpers

def _primitives(jaxpr: Any) -> set[str]:
    """Every primitive in `jaxpr`, nested bodies included."""
    out: set[str] = set()
    for eqn in jaxpr.eqns:
        out.add(eqn.primitive.name)
        for sub in sub_jaxprs(eqn.params):
            out |= _primitives(sub)
    return out


def _opcodes(graph: pesto_ir.Graph) -> set[str]:
    out: set[str] = set()
    for op in graph.ops:
        out.add(op.opcode)
        for sub in op.subgraphs():
            out |= _opcodes(sub)
    return out


def _is_jaxpr_param(value: Any) -> bool:
    items = value if isinstance(value, tuple) else (value,)
    return any(isinstance(v, (jex.Jaxpr, jex.ClosedJaxpr)) for v in items)


def _same(a: Any, b: Any) -> bool:
    """A decoded parameter equals JAX's: tuples item by item, NaN as NaN, dtypes by dtype."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a):
        return bool(np.isnan(b))
    if isinstance(a, type) or isinstance(a, np.dtype):
        return isinstance(b, (type, np.dtype)) and np.dtype(a) == np.dtype(b)
    return bool(a == b)


def _params_round_trip(jaxpr: Any) -> None:
    """Every parameter the frontend prints parses back to the same attribute and decodes to JAX's value."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in INLINE_RULES:  # the body the frontend inlines: its equations become ops
            body = INLINE_RULES[name](eqn)[0]
            _params_round_trip(body.jaxpr if isinstance(body, jex.ClosedJaxpr) else body)
            continue
        for sub in sub_jaxprs(eqn.params):
            _params_round_trip(sub)
        for key, value in eqn.params.items():
            if key in DERIVED_PARAMS.get(name, {}) or _is_jaxpr_param(value):
                continue
            attr = encode_param(name, key, value)
            again = pesto_ir.parse(f"graph @g() {{\n  @o p() {{v = {attr}}}\n}}\n").op("o").attrs["v"]
            assert again == attr, (name, key)
            assert _same(value, codec_for(name, key).decode(again)), (name, key, value)


def _values(tree: Any) -> list[np.ndarray]:
    """The leaves of a result as numpy arrays; PRNG keys by their key data."""
    out = []
    for leaf in jax.tree_util.tree_leaves(tree):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out.append(np.asarray(leaf))
    return out


# ---------------------------------------------------------------- the tests

@pytest.mark.parametrize("name", list(CASES))
def test_covered_primitives_lower_round_trip_and_compute_like_jit(name: str) -> None:
    case = CASES[name]
    lowered = lower_function(case.fn, *case.args)
    traced = _primitives(lowered.jaxpr.jaxpr)
    assert set(case.prims) <= traced, f"{name} does not produce {sorted(set(case.prims) - traced)}"

    # what lowering reads: calls are inlined, references and hijax values made plain; the rest are ops
    plain = without_dead_code(plain_arrays(lowered.jaxpr).jaxpr)
    ops = _opcodes(lowered.graph)
    for prim in case.prims:
        if prim in INLINE_RULES:
            assert prim not in ops
        elif prim in _primitives(plain):
            assert prim in ops, f"{prim} was not lowered to an op"
    _params_round_trip(plain)

    text = str(lowered.graph)
    for engine in ENGINES:
        assert str(pesto_ir.parse(text, f"{name}.pir", engine=engine)) == text
    parsed = pesto_ir.parse(text, f"{name}.pir")
    pesto_ir.verify(parsed)
    got = jax.jit(as_function(parsed), compiler_options=FAST)(*lowered.flat_inputs(*case.args))
    want = _values(jax.jit(case.fn, compiler_options=FAST)(*case.args))
    assert [(g.shape, g.dtype) for g in _values(got)] == [(w.shape, w.dtype) for w in want]
    if case.exact:
        for g, w in zip(_values(got), want):
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6, err_msg=name)


def _refused_jaxpr(r: Refusal) -> Any:
    """The jaxpr the refusal is about (traced over axis 'i' when it needs one)."""
    if r.in_shard_map is not None:
        from jax.sharding import PartitionSpec as P

        mesh = jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:2])
        outer = jax.make_jaxpr(jax.shard_map(r.fn, mesh=mesh, in_specs=P(*r.in_shard_map), out_specs=P("i"),
                                             check_vma=True))(*r.args)
        (eqn,) = [e for e in outer.jaxpr.eqns if e.primitive.name == "shard_map"]
        body = eqn.params["jaxpr"]
        return body if isinstance(body, jex.ClosedJaxpr) else jex.ClosedJaxpr(body, ())
    return jax.make_jaxpr(r.fn, axis_env=[("i", 2)] if r.axis_env else None)(*r.args)


@pytest.mark.parametrize("prim", list(REFUSED))
def test_refused_primitives_fail_naming_the_primitive(prim: str) -> None:
    """A clear LoweringError (a PestoError: the CLI prints it without a traceback), one line naming
    the primitive, with the reason."""
    r = REFUSED[prim]
    closed = _refused_jaxpr(r)
    assert prim in _primitives(closed.jaxpr)
    with pytest.raises(LoweringError) as info:
        if r.axis_env or r.in_shard_map is not None:
            lower_jaxpr(closed)
        else:
            lower_function(r.fn, *r.args)
    message = str(info.value)
    assert f"'{prim}'" in message and "\n" not in message, message
    assert r.says in message


def test_a_collective_outside_any_mesh_is_a_lowering_error() -> None:
    """JAX itself cannot trace psum with no axis named 'i': its NameError becomes a LoweringError."""
    with pytest.raises(LoweringError, match="unbound axis name: i.*psum.*pesto_ir places the step itself"):
        lower_function(lambda x: lax.psum(x, "i"), X)


def test_a_mutable_reference_as_a_step_input_is_refused() -> None:
    """The caller's own mutable buffers cannot be updated by a planned step."""
    with pytest.raises(LoweringError, match=r"input 0 of the step is Ref\{float32\[3,4\]\}, not an array"):
        lower_jaxpr(jax.make_jaxpr(lambda r: r[...] * 2)(jax.new_ref(X)))


def test_a_device_put_to_a_device_is_refused_by_name() -> None:
    with pytest.raises(LoweringError, match="'device_put': cannot print parameter 'devices': device_put to cpu:1"):
        lower_function(lambda x: jax.device_put(x, jax.devices()[1]) + 1, X)


# ---------------------------------------------------------------- the survey is complete

# Packages and modules of JAX's internals not walked (nor imported: importing Pallas's TPU backend
# registers PRNG implementations of its own), and why.
NOT_WALKED: dict[str, str] = {
    "jax._src.pallas": "the Pallas kernel language: its primitives live inside a kernel's jaxpr, never in a step's "
                       "(pallas_call itself is walked: EXTRA_MODULES)",
    "jax._src.cudnn": "cuDNN kernels: GPU only, they do not trace without cuDNN",
    "jax._src.internal_test_util": "JAX's own test harnesses",
    "jax._src.test_util": "JAX's own test utilities",
    "jax._src.public_test_util": "JAX's own test utilities",
}
EXTRA_MODULES: tuple[str, ...] = ("jax._src.pallas.pallas_call",)


def _walked(name: str) -> bool:
    return not any(name == skip or name.startswith(skip + ".") for skip in NOT_WALKED)


def _module_names(package: str, path: Any) -> list[str]:
    """The modules of a package, its subpackages' included, except NOT_WALKED (which are not imported:
    pkgutil.walk_packages would import every package to look inside)."""
    out: list[str] = []
    for info in pkgutil.iter_modules(path, package + "."):
        if not _walked(info.name):
            continue
        out.append(info.name)
        if info.ispkg:
            try:
                sub = importlib.import_module(info.name)
            except ImportError:
                continue
            out += _module_names(info.name, sub.__path__)
    return out


def survey_primitives() -> dict[str, set[str]]:
    """Every primitive defined by a module of `jax._src` (save NOT_WALKED), with the modules that hold it.

    A module that needs an optional dependency which is not installed is skipped (it cannot be in a
    step either)."""
    import jax._src

    found: dict[str, set[str]] = {}
    for name in _module_names("jax._src", jax._src.__path__) + list(EXTRA_MODULES):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, jex.Primitive):
                found.setdefault(value.name, set()).add(name)
    return found


def test_the_lists_cover_every_primitive_jax_defines() -> None:
    found = survey_primitives()
    assert not COVERED & set(REFUSED) and not COVERED & INTERNAL and not set(REFUSED) & INTERNAL
    listed = COVERED | set(REFUSED) | INTERNAL
    missing = {p: sorted(found[p]) for p in sorted(set(found) - listed)}
    assert not missing, f"primitives of this JAX version the survey does not list (primitive: modules): {missing}"
    stale = sorted(listed - set(found))
    assert not stale, f"listed primitives this JAX version does not define: {stale}"
    assert len(found) > 250  # the walk did reach lax, random, state, the collectives, ...
