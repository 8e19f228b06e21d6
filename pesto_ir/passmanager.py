"""Passes, pipelines and the pass manager.

A pass is a frozen dataclass: its fields are its options, `name` its kebab-case name. A pipeline
string such as `verify,annotate-costs{model=roofline},coarsen{target=200}` parses into pass
objects and prints back as written. The manager verifies after every pass, can print the IR
after each, times each, and reports a failure as "error in pass X (after a, b)".
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TextIO

from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.verifier import verify
from pesto_ir.util.errors import ParseError, PassError, PestoError, SourceSpan
from pesto_ir.util.loader import ArgumentError, seed_problem


@dataclass
class PassContext:
    """What passes share besides the graph: the target cluster and where progress goes."""

    cluster: Cluster | None = None
    quiet: bool = False
    log: TextIO = field(default_factory=lambda: sys.stderr)
    seed: int = 0
    # A plan a pass recorded on the graph as its last change, simulated and validated: a
    # `passes/placement/expansion.TimedPlan`, which the next pass may take instead of timing the
    # recorded plan again. A pass sets `recorded`; `PassManager.run` hands it to the next pass
    # alone as `checked` (nothing else has run on the graph since), and to none after the run.
    recorded: Any = field(default=None, init=False, repr=False, compare=False)
    checked: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.cluster is not None and not isinstance(self.cluster, Cluster):
            raise ArgumentError(f"PassContext(cluster=...) takes a Cluster or None, not {type(self.cluster).__name__}")
        if not isinstance(self.quiet, bool):
            raise ArgumentError(f"PassContext(quiet=...) takes True or False, not {self.quiet!r}")
        if not callable(getattr(self.log, "write", None)):
            raise ArgumentError(f"PassContext(log=...) takes a text stream, not {type(self.log).__name__}")
        if (why := seed_problem(self.seed)) is not None:
            raise ArgumentError(f"PassContext(seed=...) {why}")

    def progress(self, message: str) -> None:
        if not self.quiet:
            print(message, file=self.log, flush=True)


@dataclass(frozen=True)
class Pass(ABC):
    """Base of every pass. Subclasses are frozen dataclasses whose fields are options."""

    name: ClassVar[str] = ""

    @abstractmethod
    def run(self, graph: Graph, ctx: PassContext) -> Graph | None:
        """Transform `graph` in place (return None) or return a new graph."""

    @classmethod
    def options(cls) -> dict[str, dataclasses.Field[Any]]:
        return {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}


# The passes a pipeline string can name, by name: `pesto_ir.passes` fills it with the built-in passes
# (`import pesto_ir` imports that package, so they are always there); `register_pass` adds one. The
# passes build on this module, so it does not import them.
PASS_REGISTRY: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Make pipelines able to name `cls` (by `cls.name`); returns `cls`, so it works as a decorator."""
    if not cls.name:
        raise ArgumentError(f"register_pass() takes a Pass subclass with a `name`, got {cls.__name__}")
    PASS_REGISTRY[cls.name] = cls
    return cls


def changed_options(p: Pass) -> tuple[str, ...]:
    """Option keys of `p` whose value differs from the field default."""
    keys = []
    for key, f in type(p).options().items():
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            keys.append(key)
            continue
        if getattr(p, f.name) != default:
            keys.append(key)
    return tuple(keys)


def pass_spec(p: Pass, keys: Iterable[str] | None = None) -> str:
    """`name{opt=value ...}` for the given option keys (default: options that differ from default)."""
    wanted = set(changed_options(p) if keys is None else keys)
    opts = [f"{key}={_format_option(getattr(p, f.name))}" for key, f in type(p).options().items() if key in wanted]
    return p.name + ("{" + " ".join(opts) + "}" if opts else "")


def _format_option(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


@dataclass
class Pipeline:
    """An ordered list of passes, remembering which options were written explicitly."""

    passes: list[Pass]
    explicit: list[tuple[str, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.explicit:
            self.explicit = [changed_options(p) for p in self.passes]

    def __str__(self) -> str:
        return ",".join(pass_spec(p, keys) for p, keys in zip(self.passes, self.explicit))

    @staticmethod
    def parse(text: str, source: str = "<pipeline>") -> Pipeline:
        if not isinstance(text, str):
            raise ArgumentError(f"Pipeline.parse() takes the pipeline as a str such as "
                                f"'annotate-costs,place', got {type(text).__name__}")
        if not isinstance(source, str):
            raise ArgumentError(f"Pipeline.parse() takes the source name as a str, got {type(source).__name__}")
        return _PipelineParser(text, source).parse()


class _PipelineParser:
    """`item ("," item)*` where item is `name` or `name{key=value key=value}`."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.i = 0

    def error(self, message: str, at: int, width: int = 1, hint: str | None = None) -> ParseError:
        return ParseError(message, SourceSpan(self.source, 1, at + 1, self.text, width), hint)

    def skip_ws(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def word(self, what: str) -> tuple[str, int]:
        self.skip_ws()
        start = self.i
        while self.i < len(self.text) and (self.text[self.i].isalnum() or self.text[self.i] in "-_."):
            self.i += 1
        if self.i == start:
            got = repr(self.text[start]) if start < len(self.text) else "end of pipeline"
            raise self.error(f"expected {what}, found {got}", start)
        return self.text[start:self.i], start

    def value(self) -> tuple[str, int]:
        self.skip_ws()
        start = self.i
        while self.i < len(self.text) and not self.text[self.i].isspace() and self.text[self.i] not in "{}":
            self.i += 1
        if self.i == start:
            raise self.error("expected an option value", start)
        return self.text[start:self.i], start

    def parse(self) -> Pipeline:
        registry = PASS_REGISTRY
        passes: list[Pass] = []
        explicit: list[tuple[str, ...]] = []
        self.skip_ws()
        if self.i == len(self.text):  # most likely an unset shell variable: running nothing would hide it
            raise self.error("the pipeline is empty", self.i,
                             hint="give at least one pass: " + ", ".join(sorted(registry)))
        while True:
            name, at = self.word("a pass name")
            cls = registry.get(name)
            if cls is None:
                raise self.error(f"unknown pass '{name}'", at, len(name),
                                 hint="known passes: " + ", ".join(sorted(registry)))
            kwargs: dict[str, Any] = {}
            keys: list[str] = []
            nonfinite: list[tuple[str, str, int]] = []
            self.skip_ws()
            if self.i < len(self.text) and self.text[self.i] == "{":
                self.i += 1
                kwargs, keys, nonfinite = self.options(cls)
            try:
                passes.append(cls(**kwargs))
            except (TypeError, ValueError, PestoError) as e:
                raise self.error(f"bad options for pass '{name}': {e}", at, len(name)) from None
            if nonfinite:  # the pass's own check spoke first; this catches passes without one
                key, raw, vat = nonfinite[0]
                raise self.error(f"pass '{name}': bad value for option '{key}': expected a finite number, got '{raw}'",
                                 vat, len(raw))
            explicit.append(tuple(keys))
            self.skip_ws()
            if self.i == len(self.text):
                return Pipeline(passes, explicit)
            if self.text[self.i] != ",":
                raise self.error(f"expected ',' between passes, found {self.text[self.i]!r}", self.i)
            self.i += 1

    def options(self, cls: type[Pass]) -> tuple[dict[str, Any], list[str], list[tuple[str, str, int]]]:
        """The options up to '}', their keys, and (key, text, column) of each NaN or infinite number:
        NaN slips past every `x <= 0` check, and an infinite time limit means "never stop"."""
        fields = cls.options()
        kwargs: dict[str, Any] = {}
        keys: list[str] = []
        nonfinite: list[tuple[str, str, int]] = []
        while True:
            self.skip_ws()
            if self.i < len(self.text) and self.text[self.i] == "}":
                self.i += 1
                return kwargs, keys, nonfinite
            key, at = self.word("an option name or '}'")
            f = fields.get(key)
            if f is None:
                known = ", ".join(fields) or "none"
                raise self.error(f"unknown option '{key}' for pass '{cls.name}'", at, len(key),
                                 hint=f"options of {cls.name}: {known}")
            if key in keys:  # last-wins would silently drop what was written first
                raise self.error(f"option '{key}' given twice for pass '{cls.name}'", at, len(key))
            self.skip_ws()
            if self.i >= len(self.text) or self.text[self.i] != "=":
                raise self.error(f"expected '=' after option '{key}'", self.i)
            self.i += 1
            raw, vat = self.value()
            try:
                kwargs[f.name] = _convert_option(raw, f.type)
            except ValueError as e:
                raise self.error(f"pass '{cls.name}': bad value for option '{key}': {e}", vat, len(raw)) from None
            if isinstance(kwargs[f.name], float) and not math.isfinite(kwargs[f.name]):
                nonfinite.append((key, raw, vat))
            keys.append(key)


def _convert_option(raw: str, annotation: Any) -> Any:
    """Convert option text to the field's declared type (int, float, bool, str, or X | None)."""
    tp = annotation if not isinstance(annotation, str) else _eval_annotation(annotation)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if raw == "none":
            return None
        tp = args[0]
    if tp is bool:
        if raw in ("true", "1", "yes"):
            return True
        if raw in ("false", "0", "no"):
            return False
        raise ValueError(f"expected true or false, got '{raw}'")
    if tp is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got '{raw}'") from None
    if tp is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got '{raw}'") from None
    return raw


def _eval_annotation(text: str) -> Any:
    namespace = {"int": int, "float": float, "bool": bool, "str": str, "None": None}
    try:
        return eval(text, namespace)  # annotations of option fields are simple builtin types
    except Exception:
        return str


class PassManager:
    """Runs a pipeline on a graph: verify after each pass, optional IR dumps and timings."""

    def __init__(self, pipeline: Pipeline | str | Iterable[Pass], *, verify_each: bool = True,
                 print_ir_after_all: bool = False, time_passes: bool = False,
                 out: TextIO | None = None) -> None:
        if isinstance(pipeline, str):
            pipeline = Pipeline.parse(pipeline)
        elif not isinstance(pipeline, Pipeline):
            passes = list(pipeline) if isinstance(pipeline, Iterable) else None
            if passes is None or not all(isinstance(p, Pass) for p in passes):
                raise ArgumentError("PassManager() takes a pipeline: text such as 'annotate-costs,place', a "
                                    f"Pipeline or a list of passes, not {type(pipeline).__name__}"
                                    + ("" if passes is None else " holding " + ", ".join(
                                        sorted({type(p).__name__ for p in passes if not isinstance(p, Pass)}))))
            pipeline = Pipeline(passes)
        self.pipeline = pipeline
        self.verify_each = verify_each
        self.print_ir_after_all = print_ir_after_all
        self.time_passes = time_passes
        self.out = out
        self.timings: list[tuple[str, float]] = []

    def run(self, graph: Graph, ctx: PassContext | None = None) -> Graph:
        if not isinstance(graph, Graph):
            raise ArgumentError(f"PassManager.run() takes a Graph (pesto_ir.parse, load or from_jax), "
                                f"not {type(graph).__name__}")
        if ctx is not None and not isinstance(ctx, PassContext):
            raise ArgumentError(f"PassManager.run() takes a PassContext or None as ctx, not {type(ctx).__name__}")
        ctx = ctx or PassContext()
        out = self.out or ctx.log
        done: list[str] = []
        self.timings = []
        ctx.recorded = None
        try:
            for p in self.pipeline.passes:
                graph = self._run_pass(p, graph, ctx, done)
        finally:
            ctx.checked = ctx.recorded = None
        if self.time_passes:
            print(self.timing_report(), file=out)
        return graph

    def _run_pass(self, p: Pass, graph: Graph, ctx: PassContext, done: list[str]) -> Graph:
        """Run `p`, verify and print its result as asked, time it; the graph it leaves."""
        out = self.out or ctx.log
        t0 = time.perf_counter()
        ctx.checked, ctx.recorded = ctx.recorded, None  # what the pass before recorded, for this pass only
        try:
            result = p.run(graph, ctx)
            graph = result if result is not None else graph
            if self.verify_each:
                verify(graph, context=f"IR is invalid after pass {p.name}")
        except PestoError as e:
            raise PassError(p.name, done, e) from e
        finally:
            ctx.checked = None
        self.timings.append((p.name, time.perf_counter() - t0))
        done.append(p.name)
        if self.print_ir_after_all:
            print(f"// ----- IR after {pass_spec(p)} -----", file=out)
            print(graph, file=out, end="")
        return graph

    def timing_report(self) -> str:
        total = sum(t for _, t in self.timings) or 1e-12
        lines = ["===-------------------------------------------------------===",
                 "                    Pass execution timing report",
                 "===-------------------------------------------------------===",
                 f"  Total: {total:.4f} s", "   Wall time (s)   (%)   Name"]
        for name, t in self.timings:
            lines.append(f"   {t:12.4f}  {100 * t / total:5.1f}%   {name}")
        return "\n".join(lines)
