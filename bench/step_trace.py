"""Where a jitted step's time goes, per op family, measured inside the step.

Kernels timed alone are not the kernels of a step: alone, each pays a dispatch and works on its
own buffers; inside one executable XLA may lay it out, fuse it and expand it differently. So this
measures each step from the inside (`bench_costs --families`): a
`jax.profiler.trace` of a few runs gives every thunk XLA's runtime executed with its duration
and its HLO instruction (`hlo_op`), and the compiled module's text says what each instruction
computes: the ops of its fused computation. Each instruction gets the op family of
`pesto_ir.cost.roofline.op_family` its hero would have (a convolution, a dot, a pooling window, a
reduction, ...), so a step's measured seconds per family can be set against its roofline seconds
per family (`pesto_ir.cost.fusion` kernels), family by family instead of only as one total.

Gradient families are not told apart here (`PARENT_FAMILY`: a filter gradient counts as a
convolution, a weight gradient as a matmul): that needs the operands' layouts, which the kernels
timed alone already separate.
"""

from __future__ import annotations

import glob
import gzip
import json
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pesto_ir.cluster.devices import PARENT_FAMILY

# What an HLO instruction runs, from the opcodes of its fused computation, first match wins; the
# families are `OP_FAMILIES`' forward families.
HERO_FAMILIES: tuple[tuple[str, frozenset[str]], ...] = (
    ("conv", frozenset({"convolution"})),
    ("matmul", frozenset({"dot"})),
    ("window", frozenset({"reduce-window", "select-and-scatter"})),
    ("scatter", frozenset({"scatter"})),
    ("other", frozenset({"sort", "while", "conditional", "call", "custom-call", "all-reduce", "rng"})),
    ("reduction", frozenset({"reduce"})),
)
# Ops that only move or make data: an instruction of nothing else is `movement`.
MOVEMENT_OPS = frozenset({"copy", "transpose", "bitcast", "broadcast", "slice", "concatenate", "pad", "reshape",
                          "dynamic-slice", "dynamic-update-slice", "gather", "iota", "parameter", "constant",
                          "tuple", "get-tuple-element", "reverse", "bitcast-convert"})
# What an instruction that only makes data computes (its thunk stands for its readers' work).
MAKES_DATA = frozenset({"iota", "broadcast", "constant", "parameter", "fusion", "bitcast", "reshape"})
# Entry instructions that run no thunk.
NO_THUNK = frozenset({"parameter", "constant", "bitcast", "tuple", "get-tuple-element"})

_HEADER = re.compile(r"^(ENTRY )?%(\S+) ")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = ")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%([^\s,}]+)")


@dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    calls: tuple[str, ...]
    operands: tuple[str, ...] = ()


def parse_hlo(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """The module's computations (name -> instructions) and the entry computation's name."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and line.rstrip().endswith("{"):
            current = computations.setdefault(header.group(2), [])
            entry = header.group(2) if header.group(1) else entry
            continue
        found = _INSTRUCTION.match(line)
        if found and current is not None:
            rest = line[found.end():]
            opcode, operands = _opcode(rest)
            current.append(Instruction(found.group(1), opcode, tuple(_CALLS.findall(rest)), operands))
    if not entry:
        raise ValueError("the HLO module has no ENTRY computation")
    return computations, entry


def _opcode(rest: str) -> tuple[str, tuple[str, ...]]:
    """The opcode and operand names after an instruction's result type (`f32[8]{0} add(%a, %b)`,
    `(f32[], s32[]) tuple(%x, %y)`)."""
    depth, end = 0, len(rest)
    for at, ch in enumerate(rest):  # skip the type, which may be a tuple with nested parentheses
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == " " and depth == 0:
            end = at
            break
    found = re.match(r"\s*([a-z][a-z0-9-]*)\(", rest[end:])
    if not found:
        return "", ()
    start = end + found.end()
    depth, close = 1, len(rest)
    for at in range(start, len(rest)):
        depth += {"(": 1, ")": -1}.get(rest[at], 0)
        if depth == 0:
            close = at
            break
    return found.group(1), tuple(re.findall(r"%([^\s,()]+)", rest[start:close]))


def instruction_families(text: str) -> dict[str, str]:
    """Each entry instruction that runs a thunk, by name: the op family of what it computes."""
    computations, entry = parse_hlo(text)

    def opcodes(inst: Instruction, seen: set[str]) -> set[str]:
        found = {inst.opcode}
        for callee in inst.calls:
            if callee not in seen:
                seen.add(callee)
                for inner in computations.get(callee, []):
                    found |= opcodes(inner, seen)
        return found

    out, makes_data, entry_ops = {}, set(), {i.name: i for i in computations[entry]}
    for inst in computations[entry]:
        if inst.opcode in NO_THUNK:
            continue
        ops = opcodes(inst, set())
        family = next((f for f, heroes in HERO_FAMILIES if ops & heroes), None)
        out[inst.name] = family or ("movement" if ops <= MOVEMENT_OPS | {"fusion"} else "elementwise")
        if ops <= MAKES_DATA:
            makes_data.add(inst.name)
    _attribute_expansions(out, makes_data, entry_ops)
    return out


def _attribute_expansions(families: dict[str, str], makes_data: set[str], entry: dict[str, Instruction]) -> None:
    """Give the thunks XLA makes when it expands an op the family of the op they stand for: a
    scatter that reads a pooling window's result is the max-pool gradient's (`select_and_scatter`
    becomes a variadic `reduce-window`, iotas, broadcasts and a scatter), and an instruction that
    only makes data (an iota, a broadcast) counts in its readers' family when they share one (our
    kernels recompute broadcasts inside their readers, `pesto_ir.cost.fusion.DUPLICATED`)."""
    def sources(name: str) -> set[str]:  # through get-tuple-element, bitcast and tuple, which run nothing
        inst = entry.get(name)
        if inst is None or inst.opcode not in NO_THUNK or inst.opcode == "parameter":
            return {name}
        return set().union(*(sources(o) for o in inst.operands))

    readers: dict[str, set[str]] = {}
    for name in families:
        for source in set().union(*(sources(o) for o in entry[name].operands)):
            readers.setdefault(source, set()).add(name)
    for name, family in families.items():
        if family == "scatter" and any(families.get(s) == "window" for s in
                                       set().union(*(sources(o) for o in entry[name].operands))):
            families[name] = "window"
    for name in makes_data:
        theirs = {families[r] for r in readers.get(name, set())}
        if len(theirs) == 1:
            families[name] = theirs.pop()


def thunk_seconds(trace: dict[str, Any], module: str) -> dict[str, float]:
    """Seconds each HLO instruction of `module` ran in the trace, summed over its thunks."""
    out: dict[str, float] = {}
    for event in trace.get("traceEvents", []):
        args = event.get("args") or {}
        if event.get("ph") == "X" and args.get("hlo_module") == module and event.get("name") == args.get("hlo_op"):
            out[event["name"]] = out.get(event["name"], 0.0) + float(event["dur"]) * 1e-6
    return out


@dataclass(frozen=True)
class FamilyTimes:
    """One step measured from the inside: seconds per run by (forward) op family, and thunks per run."""

    seconds: dict[str, float]
    thunks: dict[str, int]


def family_times(step: Callable[..., Any], args: Sequence[Any], runs: int) -> FamilyTimes:
    """`step(*args)` jitted, warmed up, then traced over `runs` runs: its thunks' seconds per run,
    summed by the op family of their instruction (`instruction_families`)."""
    import jax

    jitted = jax.jit(step)
    compiled = jitted.lower(*args).compile()
    text = compiled.as_text()
    families = instruction_families(text)
    module = text.split(None, 2)[1].rstrip(",")  # "HloModule jit_step, entry_computation_layout=..."
    for _ in range(2):
        jax.block_until_ready(jitted(*args))
    with tempfile.TemporaryDirectory() as out:
        with jax.profiler.trace(out):
            for _ in range(runs):
                jax.block_until_ready(jitted(*args))
        files = glob.glob(f"{out}/**/*.trace.json.gz", recursive=True)
        if not files:
            raise RuntimeError("jax.profiler.trace wrote no trace file")
        with gzip.open(files[0]) as f:
            trace = json.load(f)
    by_name = thunk_seconds(trace, module)
    seconds: dict[str, float] = {}
    thunks: dict[str, int] = {}
    for name, family in families.items():
        if name in by_name:
            seconds[family] = seconds.get(family, 0.0) + by_name[name] / runs
            thunks[family] = thunks.get(family, 0) + 1
    return FamilyTimes(seconds, thunks)


def forward_family(family: str) -> str:
    """The family a step trace counts `family` in (a gradient family in its forward family's)."""
    return PARENT_FAMILY.get(family, family)
