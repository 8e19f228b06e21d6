"""Value types of Pesto IR: dense tensors (dtype + shape) and opaque blobs (bytes only).

A tensor's element type is a number type (`f32`) or a typed PRNG key, `key<threefry2x32>`: JAX's
`jax.random.key` arrays are arrays of keys, sliced, reshaped, selected and carried through loops
like any array, so they are tensors whose element is one key (8 bytes for threefry2x32).

Types are frozen: two values with equal types can share one instance, and a type can be a
dictionary key (the cost model caches by op signature).
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike

# Short printed name -> numpy dtype name. The short names are what `.pir` files use.
DTYPES: dict[str, str] = {
    "bool": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "c64": "complex64",
    "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn",
    "f8e5m2": "float8_e5m2",
    "i4": "int4",
    "u4": "uint4",
    # the other narrow types JAX 0.10 has (ml_dtypes): scaled_dot's e8m0 scales, fp4, 2-bit ints
    "f8e4m3": "float8_e4m3",
    "f8e3m4": "float8_e3m4",
    "f8e4m3fnuz": "float8_e4m3fnuz",
    "f8e4m3b11fnuz": "float8_e4m3b11fnuz",
    "f8e5m2fnuz": "float8_e5m2fnuz",
    "f8e8m0fnu": "float8_e8m0fnu",
    "f4e2m1fn": "float4_e2m1fn",
    "i2": "int2",
    "u2": "uint2",
}
SHORT_DTYPE: dict[str, str] = {v: k for k, v in DTYPES.items()}

# Bits per element; sub-byte types round up when a whole tensor is sized.
_BITS: dict[str, int] = {
    "bool": 8, "i8": 8, "i16": 16, "i32": 32, "i64": 64, "u8": 8, "u16": 16, "u32": 32,
    "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f8e4m3fn": 8, "f8e5m2": 8, "i4": 4, "u4": 4, "f8e4m3": 8, "f8e3m4": 8, "f8e4m3fnuz": 8,
    "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8, "f8e8m0fnu": 8, "f4e2m1fn": 4, "i2": 2, "u2": 2,
}


# Typed PRNG keys: implementation name -> the shape of one key's data in uint32 words (JAX's
# `PRNGImpl.key_shape`). These are JAX's own implementations (checked against `jax._src.random.prng`
# by the tests); the JAX frontend registers any other implementation it meets (`register_key_impl`).
KEY_IMPLS: dict[str, tuple[int, ...]] = {
    "threefry2x32": (2,),
    "threefry4x32": (4,),
    "philox2x32": (1,),
    "philox4x32": (2,),
    "rbg": (4,),
    "unsafe_rbg": (4,),
}
KEY_DATA_DTYPE = "u32"  # what a key is made of (`jax.random.key_data`)
_KEY_DTYPE_RE = re.compile(r"key<([A-Za-z0-9_]+)>")


def key_dtype(impl: str) -> str:
    """The element type of keys of PRNG implementation `impl`: `key<threefry2x32>`."""
    if impl not in KEY_IMPLS:
        raise ValueError(f"unknown PRNG implementation {impl!r} (known: {', '.join(KEY_IMPLS)})")
    return f"key<{impl}>"


def key_impl_of(dtype: str) -> str | None:
    """The PRNG implementation named by a key element type (`key<rbg>` -> `rbg`); None for others."""
    m = _KEY_DTYPE_RE.fullmatch(dtype)
    return m.group(1) if m is not None else None


def register_key_impl(name: str, key_shape: tuple[int, ...]) -> None:
    """Make `key<name>` an element type (a PRNG implementation JAX does not ship). The name must
    print inside `key<...>`, and a name is one implementation: redefining it is an error."""
    if not _KEY_DTYPE_RE.fullmatch(f"key<{name}>"):
        raise ValueError(f"a PRNG implementation name must be letters, digits and '_' to be printed as "
                         f"key<name>, got {name!r}")
    shape = tuple(int(d) for d in key_shape)
    if any(d < 1 for d in shape):
        raise ValueError(f"bad key shape {key_shape!r} for PRNG implementation {name!r}")
    known = KEY_IMPLS.get(name)
    if known is not None and known != shape:
        raise ValueError(f"PRNG implementation {name!r} is already known with keys of shape {known}, not {shape}")
    KEY_IMPLS[name] = shape


def is_dtype(dtype: str) -> bool:
    """True for a number element type (`f32`) and a key type of a known implementation."""
    if dtype in DTYPES:
        return True
    impl = key_impl_of(dtype)
    return impl is not None and impl in KEY_IMPLS


def element_bits(dtype: str) -> int:
    """Bits one element takes; a key takes its implementation's words of key data."""
    bits = _BITS.get(dtype)
    if bits is not None:
        return bits
    impl = key_impl_of(dtype)
    if impl is None or impl not in KEY_IMPLS:
        raise ValueError(f"unknown dtype {dtype!r}")
    return math.prod(KEY_IMPLS[impl]) * _BITS[KEY_DATA_DTYPE]


def dtype_short_name(dtype: DTypeLike) -> str:
    """The `.pir` name of a numpy/JAX dtype (or of a name already short)."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name in DTYPES:
        return name
    if name in SHORT_DTYPE:
        return SHORT_DTYPE[name]
    if is_dtype(name):
        return name
    raise ValueError(f"unsupported dtype {name!r}")


class Type(ABC):
    """Base of every value type."""

    __slots__ = ()

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes one value of this type occupies (and costs to send)."""


@dataclass(frozen=True, slots=True)
class TensorType(Type):
    """A dense array: `f32[64,784]`; a scalar is `f32[]`; two typed PRNG keys `key<threefry2x32>[2]`."""

    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not is_dtype(self.dtype):
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if any((not isinstance(d, int)) or d < 0 for d in self.shape):
            raise ValueError(f"bad shape {self.shape!r}")

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return (self.size * (_BITS.get(self.dtype) or element_bits(self.dtype)) + 7) // 8

    @property
    def key_impl(self) -> str | None:
        """The PRNG implementation of a key array (`threefry2x32`); None for numbers."""
        return None if self.dtype in DTYPES else key_impl_of(self.dtype)

    @property
    def numpy_dtype(self) -> str:
        if self.dtype not in DTYPES:
            raise ValueError(f"{self} is an array of PRNG keys, which has no numpy dtype")
        return DTYPES[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True, slots=True)
class BlobType(Type):
    """Opaque data of a known size, for cost-only graphs: `blob[4194304]` (bytes)."""

    size_bytes: int

    def __post_init__(self) -> None:
        if not isinstance(self.size_bytes, int) or self.size_bytes < 0:
            raise ValueError(f"bad blob size {self.size_bytes!r}")

    @property
    def nbytes(self) -> int:
        return self.size_bytes

    def __str__(self) -> str:
        return f"blob[{self.size_bytes}]"
