"""Python source text for the modules `emit_python` writes (`backends/python_emit.py`): identifiers
for IR names (`Namespace`) and parameter values as source (`source`, a rule table over their types:
numbers, tuples, dtypes, lax enums and named tuples, primitives). A value no rule covers is an
`EmitError` naming it, never a silently wrong program.
"""

from __future__ import annotations

import enum
import keyword
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax.extend.core as jex
import numpy as np
from jax import lax

from pesto_ir.backends.replica_runtime import RUNTIME
from pesto_ir.ir.types import TensorType
from pesto_ir.jaxrt.params import jax_dtype, prng_impl
from pesto_ir.util.errors import PestoError


class EmitError(PestoError):
    """The placed graph has something the emitter cannot write as Python."""


# ---------------------------------------------------------------- names

RESERVED = frozenset({
    "jax", "jnp", "np", "lax", "os", "sys", "run", "main", "dev", "inputs", "devices", "float", "complex",
    "DEVICES", "INPUTS", "INPUT_HOMES", "SEGMENTS", "GRAPH",
})
# and in a module running replicas: the shared runtime's names, and what run() calls the meshes
REPLICA_RESERVED = RESERVED | {"Callable", "REPLICAS", "REPLICA_AXIS", "mesh", *(f.__name__ for f in RUNTIME)}


class Namespace:
    """Unique Python identifiers for IR names (`p.l1.w` -> `p_l1_w`)."""

    def __init__(self, reserved: frozenset[str] | set[str] = RESERVED) -> None:
        self.used: set[str] = set(reserved)
        self.of: dict[Any, str] = {}

    def name(self, key: Any, hint: str) -> str:
        found = self.of.get(key)
        if found is not None:
            return found
        base = re.sub(r"\W", "_", hint).lstrip("_") or "v"
        if base[0].isdigit():
            base = f"v{base}"
        if keyword.iskeyword(base):
            base += "_"
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        self.of[key] = name
        return name


# ---------------------------------------------------------------- parameter values as source

Source = Callable[[Any], str]


def _float_source(x: float) -> str:
    return repr(x) if math.isfinite(x) else f"float('{x}')"


def tuple_source(x: tuple[Any, ...]) -> str:
    items = [source(i) for i in x]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _lax_class(cls: type) -> str:
    if getattr(lax, cls.__name__, None) is not cls:
        raise EmitError(f"no public jax.lax name for {cls.__module__}.{cls.__name__}")
    return f"lax.{cls.__name__}"


def _namedtuple_source(x: Any) -> str:
    fields = ", ".join(f"{f}={source(getattr(x, f))}" for f in type(x)._fields)
    return f"{_lax_class(type(x))}({fields})"


def _tolerance_source(x: Any) -> str:
    return f"lax.Tolerance(atol={source(x.atol)}, rtol={source(x.rtol)}, ulps={source(x.ulps)})"


_SOURCE_BY_TYPE: dict[type, Source] = {
    type(None): repr,
    bool: repr,
    int: repr,
    str: repr,
    float: _float_source,
    tuple: tuple_source,
    list: tuple_source,
    dict: lambda x: "{" + ", ".join(f"{k!r}: {source(v)}" for k, v in x.items()) + "}",
}
if hasattr(lax, "Tolerance"):
    _SOURCE_BY_TYPE[lax.Tolerance] = _tolerance_source

# Tried in order when the exact type is not above (enums before ints: IntEnum members are ints).
_SOURCE_BY_BASE: tuple[tuple[Callable[[Any], bool], Source], ...] = (
    (lambda x: isinstance(x, enum.Enum), lambda x: f"{_lax_class(type(x))}.{x.name}"),
    (lambda x: isinstance(x, tuple) and hasattr(x, "key_shape") and hasattr(x, "random_bits"),
     lambda x: _prng_impl_source(x)),  # a PRNGImpl is a named tuple of functions: by name
    (lambda x: isinstance(x, tuple) and hasattr(type(x), "_fields"), _namedtuple_source),
    (lambda x: isinstance(x, np.dtype), lambda x: f"jnp.dtype({x.name!r})"),
    (lambda x: isinstance(x, type) and issubclass(x, np.generic), lambda x: f"jnp.dtype({np.dtype(x).name!r})"),
    (lambda x: isinstance(x, np.generic), lambda x: source(x.item())),
    (lambda x: isinstance(x, jex.Primitive), lambda x: f"_primitive({x.name!r})"),
)


def _prng_impl_source(impl: Any) -> str:
    """A PRNG implementation (`random_seed`'s `impl`) by name; JAX must know it by that name."""
    try:
        known = prng_impl(impl.name) == impl
    except PestoError:
        known = False
    if not known or impl.name not in _jax_prng_names():
        raise EmitError(f"PRNG implementation {impl.name!r} is not registered with JAX by name, so a module "
                        f"run on its own could not find it")
    return f"_prng_impl({impl.name!r})"


def _jax_prng_names() -> set[str]:
    from jax._src.random import prng  # JAX's registry of PRNG implementations; no public name

    return set(prng.prngs)


def dtype_name(t: TensorType) -> str:
    """The name `_dtype` reads back in the module: numpy's (`float32`), or the key type (`key<rbg>`)."""
    return t.dtype if t.key_impl is not None else np.dtype(jax_dtype(t.dtype)).name


def dtype_source(t: TensorType) -> str:
    return f"_dtype({t.dtype!r})" if t.key_impl is not None else f"jnp.dtype({dtype_name(t)!r})"


def source(x: Any) -> str:
    """Python source that evaluates to `x` in the emitted module."""
    rule = _SOURCE_BY_TYPE.get(type(x))
    if rule is not None:
        return rule(x)
    for test, rule in _SOURCE_BY_BASE:
        if test(x):
            return rule(x)
    raise EmitError(f"no Python source for a {type(x).__name__}: {x!r:.80}")


# Parameters JAX derives from others (see jax_params.DERIVED_PARAMS), as source over their sources.
DERIVED_SOURCE: dict[str, dict[str, Callable[[Mapping[str, str]], str]]] = {
    "reduce": {"computation": lambda src: f"_as_fun({src['jaxpr']})"},
}
