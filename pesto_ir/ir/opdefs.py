"""Op definitions: every fact about an opcode, one `OpDef` record each, in one registry (`OPDEFS`).

An opcode is a JAX primitive name (or one of Pesto IR's own: `constant`, the ops across replicas).
Its record says, as plain data, what each layer needs to know about it: its result-type rule,
what work it does and which kind of kernel runs it, how XLA fuses it, whether it runs at all or
communicates across replicas, how its nested graphs run, how micro-batching splits it, and how the
interpreter runs it. Most facts name a kind from a small vocabulary (below); the layers above keep
one implementation per kind and look an op's kind up here, as JAX registers rules beside a
primitive:

* `shape`: the verifier, `pesto_ir/ir/shape_rules.py` (`SHAPE_KINDS`, `TYPE_KINDS`);
* `work`, `family`, `kernel`, `collective`, `identity_init`, `nested`: the cost model,
  `pesto_ir/cost/roofline.py` (`WORK_KINDS`, `NESTED_KINDS`);
* `fusion`, `elementwise`: the fusion analysis, `pesto_ir/cost/fusion.py`;
* `batch`: micro-batching and data parallelism, `passes/rewrite/batch_axes.py` (`BATCH_KINDS`);
* `run`: the interpreter and the backends built on it, `pesto_ir/jaxrt/interpreter.py` (`RUN_KINDS`).

Each of those modules checks, when imported, that it implements every kind the definitions use
(`check_kinds`), and derives its tables by opcode from `OPDEFS`. Every opcode is defined once, at
the end of this module, grouped by family. An opcode defined nowhere is opaque: `opdef` gives it
the default record (declared result types trusted, the roofline's default cost, a kernel of its
own, no batch rule, bound as the JAX primitive of its name).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pesto_ir.util.errors import PestoError

# ---------------------------------------------------------------- vocabularies

# What an op computes, for its FLOPs and bytes (one rule each in `roofline.WORK_KINDS`).
WORK_KINDS: dict[str, str] = {
    "elementwise": "one FLOP per result element, every operand and result byte once",
    "movement": "no FLOPs: reads its operands and writes its results (layout, copies, conversions)",
    "indexed_read": "reads only what it returns, plus the indices (gather, dynamic slices)",
    "indexed_update": "reads and writes only the updated part (scatter, dynamic updates)",
    "reduction": "one FLOP per input element",
    "window": "one FLOP per result element per window element (pooling)",
    "select_and_scatter": "one FLOP per source element per window element (max-pool gradient)",
    "dot": "two FLOPs per result element per contracted element",
    "conv": "two FLOPs per result element per kernel element of one output feature",
    "free": "writes its results, computes nothing worth costing (iota, constants, hints)",
}
# The kind of kernel an op runs, whose measured speed as a fraction of the roofline differs
# (`pesto_ir.cluster.devices.OP_FAMILIES`; the gradient families are told apart by the cost model).
FAMILIES: tuple[str, ...] = ("matmul", "conv", "elementwise", "reduction", "window", "scatter", "movement", "other")
# What XLA's fusion does with an op (`pesto_ir.cost.fusion`).
FUSION_CLASSES: dict[str, str] = {
    "loop": "fused into its consumers' loop (elementwise and layout ops)",
    "duplicated": "recomputed inside every kernel that reads it (broadcasts, iota, constants, identities)",
    "reduction": "takes its elementwise producers in (input fusion) and is its kernel's hero",
    "contraction": "a matmul or convolution: takes an elementwise epilogue and is its kernel's hero",
    "none": "a kernel of its own (scatter, sort, windows, control flow, collectives, unknown ops)",
}
# How an op holding nested graphs runs them (`roofline.NESTED_KINDS`); an op with graphs and no
# kind runs each once (a call).
NESTED_KINDS: dict[str, str] = {
    "length": "every graph, `length` times (scan)",
    "trip_count": "every graph, `trip_count` times, 1 when unknown (while)",
    "one_of": "one of its graphs, the most expensive (cond)",
}
# How an op passes the batch on when a step is split into micro-batches (`batch_axes.BATCH_KINDS`).
BATCH_KINDS: tuple[str, ...] = (
    "elementwise", "broadcast", "reshape", "transpose", "squeeze", "expand_dims", "reduce", "cumulative", "rev",
    "pad", "concatenate", "stack", "unstack", "split", "slice", "dot_general", "conv", "window", "gather",
    "scatter_add",
)
# How the interpreter runs an op that is not the JAX primitive of its name (`interpreter.RUN_KINDS`).
RUN_KINDS: dict[str, str] = {
    "constant": "its `value` attribute, broadcast to its result type",
    "replicas": "the identity over one data-parallel replica; the collective of the replicas' mesh axis over more",
}


class OpDefError(PestoError):
    """An opcode defined twice, or with a fact outside its vocabulary."""


@dataclass(frozen=True)
class OpDef:
    """Everything the layers know about one opcode; the defaults are an opaque op's."""

    name: str
    shape: str | None = None  # its result-type rule, by name (`shape_rules`); None: declared types trusted
    work: str | None = None  # `WORK_KINDS`; None: the roofline's default (elementwise), reported as unknown
    family: str = "other"  # `FAMILIES`
    fusion: str = "none"  # `FUSION_CLASSES`
    elementwise: bool = False  # each result element comes from the operands' elements at its index
    identity_init: bool = False  # a reduction starting from its identity: over size-1 axes, a reshape
    kernel: bool = True  # False: runs nothing, takes no time (folded or an identity to the compiler)
    collective: bool = False  # communicates across data-parallel replicas: timed by the link model
    nested: str | None = None  # `NESTED_KINDS`
    batch: str | None = None  # `BATCH_KINDS`; None: micro-batching refuses it when it meets the batch
    run: str | None = None  # `RUN_KINDS`; None: bind the JAX primitive of its name

    def __post_init__(self) -> None:
        for field, vocabulary in VOCABULARIES.items():
            value = getattr(self, field)
            if value is not None and value not in vocabulary:
                raise OpDefError(f"op '{self.name}': {field} {value!r} is none of {', '.join(vocabulary)}")
        if not self.kernel and self.fusion != "duplicated":
            raise OpDefError(f"op '{self.name}' runs no kernel, so every reader has it: its fusion is 'duplicated'")
        if self.identity_init and self.fusion != "reduction":
            raise OpDefError(f"op '{self.name}': identity_init is a fact of fused reductions")


VOCABULARIES: dict[str, Iterable[str]] = {"work": WORK_KINDS, "family": FAMILIES, "fusion": FUSION_CLASSES,
                                          "nested": NESTED_KINDS, "batch": BATCH_KINDS, "run": RUN_KINDS}

OPDEFS: dict[str, OpDef] = {}


def define(name: str, **facts: Any) -> OpDef:
    """Define opcode `name` by its facts (`OpDef`'s fields; the others keep their defaults)."""
    if name in OPDEFS:
        raise OpDefError(f"op '{name}' is defined twice")
    OPDEFS[name] = d = OpDef(name, **facts)
    return d


_OPAQUE: dict[str, OpDef] = {}  # the default records given so far, by opcode


def opdef(name: str) -> OpDef:
    """The record of opcode `name`: its definition, or the default record of an opaque op."""
    found = OPDEFS.get(name)
    if found is None:
        found = _OPAQUE.get(name)
        if found is None:
            found = _OPAQUE[name] = OpDef(name)
    return found


def opcodes(**facts: Any) -> frozenset[str]:
    """The defined opcodes whose records have all these field values: `opcodes(fusion="loop")`."""
    return frozenset(d.name for d in OPDEFS.values() if all(getattr(d, k) == v for k, v in facts.items()))


def check_kinds(field: str, implemented: Iterable[str]) -> None:
    """Raise unless a layer implements every kind of `field` the ops' definitions use; called where
    the kinds are implemented, when that module is imported."""
    missing = {getattr(d, field) for d in OPDEFS.values()} - {None} - set(implemented)
    if missing:
        raise OpDefError(f"{field} {', '.join(sorted(missing))} of some op definitions has no implementation here")


# ---------------------------------------------------------------- the ops, by family

def _pointwise(*names: str, **facts: Any) -> None:
    """Elementwise maths: one FLOP per element, fused into loops, the batch wherever the operands'
    is; `facts` are where an op differs."""
    for name in names:
        define(name, **{"work": "elementwise", "family": "elementwise", "fusion": "loop", "elementwise": True,
                        "batch": "elementwise", **facts})


def _layout(*names: str, **facts: Any) -> None:
    """Layout ops: move data, compute nothing, fused into loops."""
    for name in names:
        define(name, **{"work": "movement", "family": "movement", "fusion": "loop", **facts})


def _reduction(*names: str, **facts: Any) -> None:
    """Reductions: one FLOP per input element; XLA fuses them with their elementwise producers."""
    for name in names:
        define(name, **{"work": "reduction", "family": "reduction", "fusion": "reduction", **facts})


# Unary, binary and comparison maths.
_pointwise("neg", "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt", "cbrt", "sign",
           "floor", "ceil", "round", "sin", "cos", "tan", "not", "integer_pow", "erf", "erfc", "erf_inv", "square",
           "reduce_precision", shape="unary")
_pointwise("abs", shape="abs")  # |z| of a complex tensor is real
_pointwise("add", "sub", "mul", "div", "max", "min", "rem", "atan2", "and", "or", "xor", "nextafter", "add_any",
           "shift_left", "shift_right_logical", "shift_right_arithmetic", shape="binary")
_pointwise("pow", shape="pow")
_pointwise("eq", "ne", "lt", "le", "gt", "ge", shape="compare")
_pointwise("select_n", shape="select_n")
_pointwise("clamp", "is_finite", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "lgamma",
           "digamma", "imag", "real", "conj", "population_count", "clz")
_pointwise("threefry2x32", batch=None)
_pointwise("convert_element_type", shape="convert", work="movement")  # costed as the bytes it moves
_pointwise("copy", shape="unary", work="movement", family="movement")  # elementwise, and moves data only
_pointwise("stop_gradient", shape="unary", fusion="duplicated", kernel=False)  # an identity to the compiler

# Typed PRNG keys: hashing keys and drawing bits are cheap elementwise work (one FLOP per key or
# word made); wrapping u32 data as keys and back lowers to the data itself and runs nothing.
_pointwise("random_seed", shape="random_seed", batch=None)
_pointwise("random_split", shape="random_split", batch=None)
_pointwise("random_fold_in", shape="random_fold_in", batch=None)
_pointwise("random_bits", shape="random_bits", batch=None)
_layout("random_wrap", shape="random_wrap", fusion="duplicated", kernel=False)
_layout("random_unwrap", shape="random_unwrap", fusion="duplicated", kernel=False)

# Layout.
_layout("transpose", shape="transpose", batch="transpose")
_layout("reshape", shape="reshape", batch="reshape")
_layout("broadcast_in_dim", shape="broadcast_in_dim", batch="broadcast", fusion="duplicated")
_layout("squeeze", shape="squeeze", batch="squeeze")
_layout("expand_dims", batch="expand_dims")
_layout("concatenate", shape="concatenate", batch="concatenate")
_layout("slice", shape="slice", batch="slice")
_layout("pad", batch="pad")
_layout("rev", batch="rev")
_layout("split", batch="split")
_layout("bitcast_convert_type")
_layout("copy_p", "device_put", fusion="none")  # copies to another buffer or device: kernels of their own
define("stack", batch="stack")
define("unstack", batch="unstack")

# Reductions; scans, sorts and top-k run kernels of their own.
_reduction("reduce_sum", "reduce_max", "reduce_min", shape="reduce", batch="reduce", identity_init=True)
_reduction("reduce_prod", shape="reduce", identity_init=True)
_reduction("reduce_and", "reduce_or", "reduce_xor", identity_init=True)
_reduction("argmax", "argmin", shape="argreduce", batch="reduce")
_reduction("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", fusion="none", batch="cumulative")
_reduction("reduce_precision_sum", "sort", "top_k", fusion="none")

# Windows: pooling and its gradient. XLA's CPU backend runs them as plain loops over every window,
# at a few percent of the memory roofline where a fused reduction reaches a good part of it.
define("reduce_window_sum", work="window", family="window", batch="window")
define("reduce_window_max", work="window", family="window", batch="window")
define("reduce_window_min", work="window", family="window", batch="window")
define("reduce_window", work="window", family="window")
define("select_and_scatter_add", work="select_and_scatter", family="window", batch="window")

# Contractions.
define("dot_general", shape="dot_general", work="dot", family="matmul", fusion="contraction", batch="dot_general")
define("conv_general_dilated", work="conv", family="conv", fusion="contraction", batch="conv")

# Indexed reads and writes: kernels of their own, costed by the part they touch.
define("gather", work="indexed_read", family="movement", batch="gather")
define("dynamic_slice", work="indexed_read", family="movement")
define("dynamic_update_slice", work="indexed_update", family="movement")
define("scatter", work="indexed_update", family="scatter")
define("scatter-add", work="indexed_update", family="scatter", batch="scatter_add")
define("scatter_add", work="indexed_update", family="scatter", batch="scatter_add")

# Values with nothing to compute, recomputed by every reader; constants are folded into their
# readers and sharding hints are identities, so neither runs.
define("iota", work="free", family="movement", fusion="duplicated")
define("constant", work="free", family="movement", fusion="duplicated", kernel=False, run="constant")
define("sharding_constraint", work="free", family="movement", fusion="duplicated", kernel=False)

# Control flow, costed from its nested graphs.
define("scan", nested="length")
define("while", nested="trip_count")
define("cond", nested="one_of")

# Across data-parallel replicas (Pesto IR's own ops): the collectives communicate, timed by the
# link model (their `cost` is their ring time); `replica_slice` takes the replica's own block, and
# `block_indices` turns indices into a whole axis of `size` into indices into the replica's block of
# it (those of other blocks fall outside it: a gather fills them, a scatter drops them).
define("all_reduce", shape="all_reduce", collective=True, run="replicas")
define("reduce_scatter", shape="reduce_scatter", collective=True, run="replicas")
define("all_gather", shape="all_gather", collective=True, run="replicas")
define("replica_slice", shape="replica_slice", work="indexed_read", family="movement", run="replicas")
define("block_indices", shape="block_indices", work="elementwise", family="elementwise", fusion="loop", elementwise=True,
       batch="elementwise",
       run="replicas")
