"""JAX primitive parameters as printed attributes, and back; JAX primitives by name.

A lowered op carries its primitive's parameters as attributes, so the `.pir` text is the whole
program: the interpreter (and any JAX backend) decodes them back to the values JAX binds with.
The codec of a parameter is looked up by (primitive, parameter), then by parameter name, then the
explicit default (numbers, strings, tuples, dtypes, nested graphs). A value no codec can print is
an error naming the primitive and the parameter, never a silent loss.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as _jax_core  # MemorySpace has no public name in jax 0.10
from jax._src import dispatch as _dispatch  # nor has device_put's ArrayCopySemantics

from pesto_ir.ir.attributes import (
    Attr,
    BoolAttr,
    DictAttr,
    DtypeAttr,
    FloatAttr,
    GraphAttr,
    IntAttr,
    ListAttr,
    NoneAttr,
    StringAttr,
)
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.types import DTYPES, dtype_short_name, key_dtype, key_impl_of, register_key_impl
from pesto_ir.util.errors import PestoError


@dataclass(frozen=True, slots=True)
class ParamCodec:
    """How one JAX parameter prints as an attribute, and how the attribute is read back."""

    encode: Callable[[Any], Attr]
    decode: Callable[[Attr], Any]


class ParamEncodeError(PestoError):
    """A parameter value has no printed form (an unknown JAX object, a sharding, a callable)."""


# ---------------------------------------------------------------- the default codec

def jax_dtype(short: str) -> Any:
    """The numpy dtype of a `.pir` element type (bf16 and the fp8 types need ml_dtypes); JAX's key
    dtype for a typed PRNG key type (`key<threefry2x32>`)."""
    if short in DTYPES:
        return jnp.dtype(DTYPES[short])
    impl = key_impl_of(short)
    if impl is None:
        raise PestoError(f"unknown element type {short!r}")
    return _key_ty(prng_impl(impl))


# ---------------------------------------------------------------- typed PRNG keys

# Implementations met while lowering that JAX's registry does not hold by name (made with
# `jax.extend.random.define_prng_impl`): graphs using them evaluate in the process that lowered them.
_SEEN_PRNG_IMPLS: dict[str, Any] = {}


def _prng_registry() -> dict[str, Any]:
    from jax._src.random import prng  # JAX's registry of PRNG implementations by name; no public name

    return prng.prngs


def _key_ty(impl: Any) -> Any:
    from jax._src.random import prng

    return prng.KeyTy(impl)


def is_key_dtype(dtype: Any) -> bool:
    """True for JAX's dtype of typed PRNG keys (`key<fry>`)."""
    import jax

    try:
        # public (documented) in jax.dtypes, but imported there without an explicit re-export
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))  # type: ignore[attr-defined]
    except TypeError:
        return False


def key_type_name(dtype: Any) -> str:
    """The `.pir` element type of a JAX key dtype: `key<threefry2x32>` (the implementation's name,
    which `prng_impl` resolves back); the implementation is remembered when JAX does not know it by
    name. A ParamEncodeError when it cannot be named."""
    impl = dtype._impl  # KeyTy holds its PRNGImpl; JAX has no public accessor on the dtype
    name = impl.name
    registered = _prng_registry().get(name)
    if registered is not None and registered != impl:
        raise ParamEncodeError(f"PRNG implementation {name!r} is not the one JAX registers under that name; "
                               f"give it a name of its own")
    try:
        register_key_impl(name, tuple(impl.key_shape))
    except ValueError as e:
        raise ParamEncodeError(str(e)) from None
    if registered is None:
        seen = _SEEN_PRNG_IMPLS.setdefault(name, impl)
        if seen != impl:
            raise ParamEncodeError(f"two different PRNG implementations are named {name!r}; give each a name "
                                   f"of its own")
    return key_dtype(name)


def prng_impl(name: str) -> Any:
    """JAX's PRNG implementation called `name` (`threefry2x32`, `rbg`, ...)."""
    impl = _prng_registry().get(name) or _SEEN_PRNG_IMPLS.get(name)
    if impl is None:
        known = sorted({*_prng_registry(), *_SEEN_PRNG_IMPLS})
        raise PestoError(f"no PRNG implementation named {name!r} in JAX (known: {', '.join(known)})")
    return impl


def _encode_prng_impl(v: Any) -> Attr:
    """`random_seed` / `random_wrap`'s `impl` prints as its name: `impl = "threefry2x32"`."""
    if not hasattr(v, "key_shape") or not hasattr(v, "name"):
        raise ParamEncodeError(f"not a PRNG implementation: {v!r:.80}")
    key_type_name(_key_ty(v))  # checks that the name resolves back to this implementation
    return StringAttr(v.name)


PRNG_IMPL_CODEC = ParamCodec(_encode_prng_impl, lambda a: prng_impl(a.value))


def _encode_dtype(v: Any) -> Attr:
    try:
        return DtypeAttr(dtype_short_name(v))
    except ValueError as e:
        raise ParamEncodeError(str(e)) from None


def _encode_tuple(v: tuple[Any, ...]) -> Attr:
    return ListAttr(tuple(encode_plain(x) for x in v))


def _encode_scalar_type(v: type) -> Attr:
    """A scalar type given where a dtype goes (`lax.empty(shape, jnp.float32)`) prints as its dtype."""
    dtype = getattr(v, "dtype", None)
    if isinstance(dtype, np.dtype) or issubclass(v, np.generic):
        return _encode_dtype(np.dtype(v))
    raise ParamEncodeError(f"no printed form for the type {v.__name__}")


_PLAIN_BY_TYPE: dict[type, Callable[[Any], Attr]] = {
    type(None): lambda v: NoneAttr(),
    bool: BoolAttr,
    int: IntAttr,
    float: FloatAttr,
    str: StringAttr,
    tuple: _encode_tuple,
    list: _encode_tuple,
}

# Subclasses (numpy scalars, JAX's dtype classes), tried in order when the exact type is not above.
_PLAIN_BY_BASE: tuple[tuple[type, Callable[[Any], Attr]], ...] = (
    (np.dtype, _encode_dtype),
    (np.bool_, lambda v: BoolAttr(bool(v))),
    (np.integer, lambda v: IntAttr(int(v))),
    (np.floating, lambda v: FloatAttr(float(v))),
    (tuple, _encode_tuple),
    (type, _encode_scalar_type),
)


def encode_plain(v: Any) -> Attr:
    """The default encoding: None, bools, numbers, strings, dtypes and tuples of them."""
    enc = _PLAIN_BY_TYPE.get(type(v))
    if enc is not None:
        return enc(v)
    for base, enc in _PLAIN_BY_BASE:
        if isinstance(v, base):
            return enc(v)
    raise ParamEncodeError(f"no printed form for a {type(v).__name__}: {v!r:.80}")


def _decode_list(a: ListAttr) -> tuple[Any, ...]:
    return tuple(decode_plain(x) for x in a.items)


# How a nested graph (a GraphAttr: a scan's body, a pjit's jaxpr) becomes a ClosedJaxpr: by tracing
# the interpreter over it. The interpreter, which decodes params with this module, sets it when it
# is imported (it is the module that evaluates graphs), so that this module does not import it back.
_graph_decoder: Callable[[Graph], Any] | None = None


def set_graph_decoder(decoder: Callable[[Graph], Any]) -> None:
    """Make `decoder` turn nested graphs into ClosedJaxprs (`pesto_ir.jaxrt.interpreter` sets it)."""
    global _graph_decoder
    _graph_decoder = decoder


def _decode_graph(a: GraphAttr) -> Any:
    if _graph_decoder is None:
        raise PestoError(f"cannot decode the nested graph '{a.graph.name}': import pesto_ir.jaxrt.interpreter, "
                         "which traces nested graphs to jaxprs")
    return _graph_decoder(a.graph)


_PLAIN_DECODERS: dict[type, Callable[[Any], Any]] = {
    ListAttr: _decode_list,
    DtypeAttr: lambda a: jax_dtype(a.dtype),
    GraphAttr: _decode_graph,
    DictAttr: lambda a: {k: decode_plain(x) for k, x in a.entries},
}


def decode_plain(a: Attr) -> Any:
    """Inverse of `encode_plain`; nested graphs come back as closed jaxprs."""
    dec = _PLAIN_DECODERS.get(type(a))
    return dec(a) if dec is not None else a.value


DEFAULT_CODEC = ParamCodec(encode_plain, decode_plain)


# ---------------------------------------------------------------- codecs for JAX's own types

def enum_codec(cls: type[enum.Enum]) -> ParamCodec:
    """An enum member prints as its name: `mode = "FILL_OR_DROP"`; none stays none."""

    def encode(v: Any) -> Attr:
        return NoneAttr() if v is None else StringAttr(cls(v).name)

    def decode(a: Attr) -> Any:
        return None if isinstance(a, NoneAttr) else cls[a.value]

    return ParamCodec(encode, decode)


def namedtuple_codec(cls: Any) -> ParamCodec:
    """A NamedTuple (or frozen dataclass) of int tuples prints as a dict of lists:
    `{lhs_spec = [0, 1, 2, 3], ...}`."""
    import dataclasses

    fields = cls._fields if hasattr(cls, "_fields") else tuple(f.name for f in dataclasses.fields(cls))

    def encode(v: Any) -> Attr:
        if v is None:
            return NoneAttr()
        return DictAttr(tuple((f, encode_plain(tuple(getattr(v, f)))) for f in fields))

    def decode(a: Attr) -> Any:
        if isinstance(a, NoneAttr):
            return None
        assert isinstance(a, DictAttr)
        return cls(**{k: decode_plain(x) for k, x in a.entries})

    return ParamCodec(encode, decode)


def _encode_treedef(v: Any) -> Attr:
    """A pytree structure of tuples, lists, dicts and None prints as JAX shows it,
    `"PyTreeDef(((*,), {'y': *}))"`; one with other nodes (a dataclass, a namedtuple) has no
    printed form that reads back, and says so."""
    text = str(v)
    try:
        same = _decode_treedef(StringAttr(text)) == v
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise ParamEncodeError(f"no printed form for a pytree structure with nodes other than tuples, lists, dicts "
                               f"and None: {text[:200]}")
    return StringAttr(text)


def _decode_treedef(a: Attr) -> Any:
    import ast

    import jax

    text = str(a.value)
    if not (text.startswith("PyTreeDef(") and text.endswith(")")):
        raise ValueError(f"not a pytree structure: {text[:80]!r}")
    example = ast.literal_eval(text[len("PyTreeDef("):-1].replace("*", "0"))  # every leaf a 0
    return jax.tree_util.tree_structure(example)


TREEDEF_CODEC = ParamCodec(_encode_treedef, _decode_treedef)


def _encode_precision(v: Any) -> Attr:
    """None, a Precision, a pair of them, a DotAlgorithmPreset or a DotAlgorithm."""
    if v is None:
        return NoneAttr()
    if isinstance(v, lax.Precision):
        return StringAttr(v.name)
    if isinstance(v, lax.DotAlgorithmPreset):
        return DictAttr((("algorithm_preset", StringAttr(v.name)),))
    if isinstance(v, lax.DotAlgorithm):
        return DictAttr((("algorithm", DictAttr(tuple((f, encode_plain(getattr(v, f)))
                                                      for f in lax.DotAlgorithm._fields))),))
    if isinstance(v, tuple):
        return ListAttr(tuple(_encode_precision(x) for x in v))
    raise ParamEncodeError(f"unknown precision {v!r}")


def _decode_precision(a: Attr) -> Any:
    if isinstance(a, NoneAttr):
        return None
    if isinstance(a, StringAttr):
        return lax.Precision[a.v]
    if isinstance(a, ListAttr):
        return tuple(_decode_precision(x) for x in a.items)
    assert isinstance(a, DictAttr)
    preset = a.get("algorithm_preset")
    if preset is not None:
        return lax.DotAlgorithmPreset[preset.value]
    algo = a.get("algorithm")
    assert isinstance(algo, DictAttr)
    return lax.DotAlgorithm(**{k: decode_plain(x) for k, x in algo.entries})


def _encode_accuracy(v: Any) -> Attr:
    if v is None:
        return NoneAttr()
    if isinstance(v, lax.AccuracyMode):
        return StringAttr(v.name)
    if isinstance(v, lax.Tolerance):
        return DictAttr((("atol", FloatAttr(float(v.atol))), ("rtol", FloatAttr(float(v.rtol))),
                         ("ulps", IntAttr(int(v.ulps)))))
    raise ParamEncodeError(f"unknown accuracy {v!r}")


def _decode_accuracy(a: Attr) -> Any:
    if isinstance(a, NoneAttr):
        return None
    if isinstance(a, StringAttr):
        return lax.AccuracyMode[a.v]
    assert isinstance(a, DictAttr)
    return lax.Tolerance(**a.value)


def _decode_dot_dimension_numbers(a: Attr) -> Any:
    (lc, rc), (lb, rb) = decode_plain(a)
    return (tuple(lc), tuple(rc)), (tuple(lb), tuple(rb))


def _encode_primitive(v: Any) -> Attr:
    return StringAttr(v.name)


def _decode_open_jaxpr(a: Attr) -> Any:
    """A reduction body (scatter-add's `update_jaxpr`, reduce_window's `jaxpr`): an open jaxpr."""
    if isinstance(a, NoneAttr):
        return None
    assert isinstance(a, GraphAttr)
    closed = _decode_graph(a)
    if closed.consts:
        raise PestoError(f"body '{a.graph.name}' needs constants, which an open jaxpr cannot hold")
    return closed.jaxpr


def _encode_no_consts(v: Any) -> Attr:
    if v:
        raise ParamEncodeError("reduction bodies with captured constants are not supported")
    return ListAttr(())


def _encode_graph_param(v: Any) -> Attr:
    if v is None:
        return NoneAttr()
    if isinstance(v, GraphAttr):
        return v
    raise ParamEncodeError("a jaxpr parameter must be lowered to a sub-graph by the frontend")


def _encode_sharding(v: Any) -> Attr:
    """None, or a sharding over an empty mesh with no axis named (what a backward rule copies from an
    unsharded primal, e.g. in a mixed-precision cast): both mean "no constraint" and print as none."""
    if v is None:
        return NoneAttr()
    mesh, spec = getattr(v, "mesh", None), getattr(v, "spec", None)
    if mesh is not None and not mesh.shape and spec is not None and all(axis is None for axis in spec):
        return NoneAttr()
    raise ParamEncodeError(f"sharding constraints are not supported (Pesto places whole arrays): {v!r:.80}")


def _encode_devices(v: Any) -> Attr:
    """`device_put`'s targets: none (`jax.device_put(x)` in a step, a copy) prints; a device or a memory
    space is refused: pesto_ir decides where each op runs."""
    if isinstance(v, tuple) and all(x is None for x in v):
        return ListAttr(tuple(NoneAttr() for _ in v))
    raise ParamEncodeError(f"device_put to {', '.join(map(str, v))} inside the step: pesto_ir decides where each op "
                           f"runs and moves arrays itself; call jax.device_put(x) without a device, or outside "
                           f"the step")


def _list_codec(item: ParamCodec) -> ParamCodec:
    """A tuple whose items all use `item`."""
    def decode(a: Attr) -> tuple[Any, ...]:
        if not isinstance(a, ListAttr):
            raise TypeError(f"expected a list attribute, got {a}")
        return tuple(item.decode(x) for x in a.items)

    return ParamCodec(lambda v: ListAttr(tuple(item.encode(x) for x in v)), decode)


PRECISION_CODEC = ParamCodec(_encode_precision, _decode_precision)
ACCURACY_CODEC = ParamCodec(_encode_accuracy, _decode_accuracy)
PRIMITIVE_CODEC = ParamCodec(_encode_primitive, lambda a: lookup_primitive(a.value))
OPEN_JAXPR_CODEC = ParamCodec(_encode_graph_param, _decode_open_jaxpr)
NO_CONSTS_CODEC = ParamCodec(_encode_no_consts, lambda a: ())

SCATTERS = ("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max",
            "scatter_add", "scatter_sub", "scatter_mul", "scatter_min", "scatter_max")

# Codecs for one parameter of one primitive (checked first).
PRIMITIVE_PARAM_CODECS: dict[tuple[str, str], ParamCodec] = {
    ("dot_general", "dimension_numbers"): ParamCodec(encode_plain, _decode_dot_dimension_numbers),
    ("conv_general_dilated", "dimension_numbers"): namedtuple_codec(lax.ConvDimensionNumbers),
    ("gather", "dimension_numbers"): namedtuple_codec(lax.GatherDimensionNumbers),
    ("gather", "mode"): enum_codec(lax.GatherScatterMode),
    ("ragged_dot_general", "ragged_dot_dimension_numbers"): namedtuple_codec(lax.RaggedDotDimensionNumbers),
    ("device_put", "devices"): ParamCodec(_encode_devices, decode_plain),
    ("device_put", "srcs"): ParamCodec(_encode_devices, decode_plain),
    ("device_put", "copy_semantics"): _list_codec(enum_codec(_dispatch.ArrayCopySemantics)),
    ("random_seed", "impl"): PRNG_IMPL_CODEC,
    ("random_wrap", "impl"): PRNG_IMPL_CODEC,
    ("reduce_window", "jaxpr"): OPEN_JAXPR_CODEC,
    ("reduce_window", "consts"): NO_CONSTS_CODEC,
    ("select_and_scatter", "select_jaxpr"): OPEN_JAXPR_CODEC,
    ("select_and_scatter", "select_consts"): NO_CONSTS_CODEC,
    ("select_and_scatter", "scatter_jaxpr"): OPEN_JAXPR_CODEC,
    ("select_and_scatter", "scatter_consts"): NO_CONSTS_CODEC,
    **{(s, "dimension_numbers"): namedtuple_codec(lax.ScatterDimensionNumbers) for s in SCATTERS},
    **{(s, "mode"): enum_codec(lax.GatherScatterMode) for s in SCATTERS},
    **{(s, "update_jaxpr"): OPEN_JAXPR_CODEC for s in SCATTERS},
    **{(s, "update_consts"): NO_CONSTS_CODEC for s in SCATTERS},
}

# Codecs for a parameter name, whatever the primitive.
PARAM_CODECS: dict[str, ParamCodec] = {
    "precision": PRECISION_CODEC,
    "accuracy": ACCURACY_CODEC,
    "rounding_method": enum_codec(lax.RoundingMethod),
    "fft_type": enum_codec(lax.FftType),
    "algorithm": enum_codec(lax.RandomAlgorithm),
    "select_prim": PRIMITIVE_CODEC,
    "memory_space": enum_codec(_jax_core.MemorySpace),  # `empty2` in the gradient of a `cond`
    "in_tree": TREEDEF_CODEC,  # `debug_print`'s arguments
    "sharding": ParamCodec(_encode_sharding, decode_plain),
    "out_sharding": ParamCodec(_encode_sharding, decode_plain),
    "dst_sharding": ParamCodec(_encode_sharding, decode_plain),  # jax.sharding.reshard
}


def _flat_computation(params: Mapping[str, Any]) -> Callable[..., Any]:
    closed = params["jaxpr"]
    return lambda *args: jex.jaxpr_as_fun(closed)(*args)


# Parameters that are not printed because they follow from the others (a Python callable next
# to the jaxpr it was traced to); rebuilt when decoding.
DERIVED_PARAMS: dict[str, dict[str, Callable[[Mapping[str, Any]], Any]]] = {
    "reduce": {"computation": _flat_computation},
}

# Parameters a hand-written `.pir` op may leave out, with the value JAX's own API would pass.
_NO_ACCURACY = {"accuracy": None}
PARAM_DEFAULTS: dict[str, dict[str, Any]] = {
    "dot_general": {"precision": None, "preferred_element_type": None, "out_sharding": None},
    "conv_general_dilated": {"feature_group_count": 1,
                             "batch_group_count": 1, "precision": None, "preferred_element_type": None,
                             "out_sharding": None},
    "convert_element_type": {"weak_type": False, "sharding": None},
    "broadcast_in_dim": {"sharding": None},
    "reshape": {"dimensions": None, "sharding": None},
    "reduce_sum": {"out_sharding": None},
    "iota": {"dimension": 0, "sharding": None},
    "mul": {"out_dtype": None},
    "slice": {"strides": None},
    "cumsum": {"reverse": False}, "cumprod": {"reverse": False}, "cummax": {"reverse": False},
    "cummin": {"reverse": False}, "cumlogsumexp": {"reverse": False},
    "sort": {"is_stable": True, "num_keys": 1},
    "split": {"axis": 0},
    **{name: _NO_ACCURACY for name in ("exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin",
                                       "cos", "tan", "sqrt", "rsqrt", "cbrt")},
}


def register_param_codec(primitive: str | None, param: str, codec: ParamCodec) -> None:
    """Teach the frontend and the interpreter one more parameter (`primitive=None`: any primitive)."""
    if primitive is None:
        PARAM_CODECS[param] = codec
    else:
        PRIMITIVE_PARAM_CODECS[(primitive, param)] = codec


def codec_for(primitive: str, param: str) -> ParamCodec:
    return PRIMITIVE_PARAM_CODECS.get((primitive, param)) or PARAM_CODECS.get(param) or DEFAULT_CODEC


def encode_param(primitive: str, param: str, value: Any) -> Attr:
    """The attribute for one parameter; a `ParamEncodeError` names the primitive and parameter."""
    try:
        return codec_for(primitive, param).encode(value)
    except ParamEncodeError as e:
        raise ParamEncodeError(f"primitive '{primitive}': cannot print parameter '{param}': {e}") from None


def encode_params(primitive: str, params: Mapping[str, Any]) -> dict[str, Attr]:
    """Every printed parameter of a primitive (derived ones are left out)."""
    derived = DERIVED_PARAMS.get(primitive, {})
    return {k: encode_param(primitive, k, v) for k, v in params.items() if k not in derived}


def decode_params(primitive: str, attrs: Mapping[str, Attr]) -> dict[str, Any]:
    """The keyword arguments to bind `primitive` with, from its parameter attributes."""
    params = dict(PARAM_DEFAULTS.get(primitive, {}))
    params.update({k: codec_for(primitive, k).decode(a) for k, a in attrs.items()})
    for key, rebuild in DERIVED_PARAMS.get(primitive, {}).items():
        params[key] = rebuild(params)
    return params


# ---------------------------------------------------------------- primitives by name

_SEEN_PRIMITIVES: dict[str, jex.Primitive] = {}


def remember_primitive(prim: jex.Primitive) -> None:
    """Record a primitive met while lowering, so graphs using it evaluate without a search."""
    _SEEN_PRIMITIVES.setdefault(prim.name, prim)


@cache
def _public_primitives() -> dict[str, jex.Primitive]:
    """Primitives JAX exports: `jax.extend.core.primitives` and `jax.lax`."""
    import jax.extend.core.primitives as prims

    table: dict[str, jex.Primitive] = {}
    for module in (prims, lax):
        for v in vars(module).values():
            if isinstance(v, jex.Primitive):
                table.setdefault(v.name, v)
    return table


def _loaded_primitives() -> dict[str, jex.Primitive]:
    """Last resort: every primitive object in the JAX modules loaded so far (`split`, `random_wrap`)."""
    table: dict[str, jex.Primitive] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "jax" or name.startswith("jax.") or name.startswith("jax._src")):
            continue
        for v in list(vars(module).values()):
            if isinstance(v, jex.Primitive):
                table.setdefault(v.name, v)
    return table


def lookup_primitive(name: str) -> jex.Primitive:
    """The JAX primitive called `name`; PestoError when JAX has none."""
    prim = _SEEN_PRIMITIVES.get(name) or _public_primitives().get(name)
    if prim is None:
        prim = _loaded_primitives().get(name)
        if prim is not None:
            _SEEN_PRIMITIVES[name] = prim
    if prim is None:
        raise PestoError(f"no JAX primitive named '{name}'")
    return prim


__all__ = [
    "ParamCodec", "ParamEncodeError", "DEFAULT_CODEC", "PARAM_CODECS", "PRIMITIVE_PARAM_CODECS",
    "DERIVED_PARAMS", "PARAM_DEFAULTS", "codec_for", "encode_param", "encode_params", "decode_params",
    "encode_plain", "decode_plain", "enum_codec", "namedtuple_codec", "register_param_codec", "set_graph_decoder",
    "lookup_primitive", "remember_primitive", "jax_dtype", "is_key_dtype", "key_type_name", "prng_impl",
    "PRNG_IMPL_CODEC",
]
