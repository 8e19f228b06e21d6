"""Value types of Pesto IR: dense tensors (dtype + shape) and opaque blobs (bytes only).

Types are frozen: two values with equal types can share one instance, and a type can be a
dictionary key (the cost model caches by op signature).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

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
}
SHORT_DTYPE: dict[str, str] = {v: k for k, v in DTYPES.items()}

# Bits per element; sub-byte types round up when a whole tensor is sized.
_BITS: dict[str, int] = {
    "bool": 8, "i8": 8, "i16": 16, "i32": 32, "i64": 64, "u8": 8, "u16": 16, "u32": 32,
    "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f8e4m3fn": 8, "f8e5m2": 8, "i4": 4, "u4": 4,
}


def dtype_short_name(dtype: object) -> str:
    """The `.pir` name of a numpy/JAX dtype (or of a name already short)."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name  # type: ignore[arg-type]
    if name in DTYPES:
        return name
    if name in SHORT_DTYPE:
        return SHORT_DTYPE[name]
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
    """A dense array: `f32[64,784]`; a scalar is `f32[]`."""

    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
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
        return (self.size * _BITS[self.dtype] + 7) // 8

    @property
    def numpy_dtype(self) -> str:
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
