"""A JAX model named on the command line: `path/to/model.py:make_step`.

`make_step()` (any function of the file, called with no arguments) returns the step function and
example arguments, in one of these shapes:

* a tuple `(fn, args)` or `(fn, args, param_argnums)`;
* a dict `{"fn": fn, "args": args, "param_argnums": (0, 1), "batch_argnums": ..., "kwargs": {...}}`
  (`step` for `fn` works too; only `fn` and `args` are needed);
* any object with those attributes (a dataclass, a namedtuple).

`args` is a tuple or list of example arguments: arrays, or `jax.ShapeDtypeStruct`s (nothing is
computed: lowering traces shapes), in pytrees. The function is lowered with `pesto_ir.frontends.jax.lower`
(parameters marked by `param_argnums`, the batch by `batch_argnums`, by default every other argument).

Everything that can go wrong is a `ScriptError` naming the file and, where the user's code failed,
its line (`file:line:col: error: ...`), never a traceback.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pesto_ir.ir.graph import Graph
from pesto_ir.util.errors import PestoError, SourceSpan, clipped
from pesto_ir.util.loader import SOURCE_LIMIT, UnreadableFile, read_text_file

SUFFIX = ".py"
DEFAULT_FUNCTION = "make_step"


class ScriptError(PestoError):
    """`file:line:col: error: message`, with the source line and a caret where the file has it."""

    def __init__(self, message: str, span: SourceSpan | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.span = span
        if span is not None and span.text is None:
            try:
                span.text = read_text_file(span.file, SOURCE_LIMIT)
            except UnreadableFile:
                pass  # no excerpt: the message stands alone

    def format(self) -> str:
        if self.span is None:
            return clipped(f"error: {self.message}")
        excerpt = self.span.excerpt() if self.span.line > 1 or self.span.col > 1 else ""
        return clipped(f"{self.span}: error: {self.message}") + (f"\n{excerpt}" if excerpt else "")

    def __str__(self) -> str:
        return f"{self.span}: {self.message}" if self.span is not None else self.message


def is_script(spec: str | os.PathLike[str]) -> bool:
    """Whether `spec` names a Python model: `model.py` or `model.py:function`."""
    text = os.fspath(spec)
    return split_spec(text)[0].endswith(SUFFIX)


def split_spec(spec: str) -> tuple[str, str]:
    """(`model.py`, `make_step`) of `model.py:make_step`; the function defaults to `make_step`."""
    path, sep, name = spec.rpartition(":")
    if sep and path.endswith(SUFFIX):
        return path, name
    return spec, DEFAULT_FUNCTION


def script_path(spec: str | os.PathLike[str]) -> str:
    """The file of a model spec (the spec itself for any other input)."""
    text = os.fspath(spec)
    path, _ = split_spec(text)
    return path if path.endswith(SUFFIX) else text


@dataclass
class Step:
    """What `make_step()` returned, normalised."""

    fn: Any
    args: tuple[Any, ...]
    param_argnums: tuple[int, ...] = ()
    batch_argnums: tuple[int, ...] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


def load_script(spec: str | os.PathLike[str]) -> Graph:
    """The graph of the step `spec` (`model.py:make_step`) makes, lowered from JAX."""
    from pesto_ir.util.loader import check_source_file

    path, name = split_spec(os.fspath(spec))
    if not name.isidentifier():
        raise ScriptError(f"'{name}' is not a Python function name: give the model as path/to/model.py:make_step",
                          SourceSpan(path, 1, 1))
    check_source_file(path)
    module = _import(path)
    maker = getattr(module, name, None)
    if maker is None:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ScriptError(f"no function '{name}' in {path}"
                          + (f" (it defines: {', '.join(found)})" if found else ""), SourceSpan(path, 1, 1))
    if not callable(maker):
        raise ScriptError(f"'{name}' in {path} is of type {type(maker).__name__}, not a function", SourceSpan(path, 1, 1))
    try:
        made = maker()
    except PestoError:
        raise
    except Exception as e:
        raise _user_error(f"{name}() raised", e, path) from None
    step = _normalised(made, f"{path}:{name}()")
    return _lowered(step, path, name)


def _import(path: str) -> ModuleType:
    """The module of `path`, run as a script's module is (its folder first on `sys.path`, so that
    it imports its neighbours)."""
    module_name = f"_pesto_model_{abs(hash(os.path.realpath(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ScriptError(f"cannot import {path} as a Python module", SourceSpan(path, 1, 1))
    module = importlib.util.module_from_spec(spec)
    folder = str(Path(path).resolve().parent)
    sys.path.insert(0, folder)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ScriptError(f"syntax error: {e.msg}", SourceSpan(path, e.lineno or 1, e.offset or 1)) from None
    except PestoError:
        raise
    except Exception as e:
        raise _user_error("importing it raised", e, path) from None
    finally:
        if sys.path and sys.path[0] == folder:
            del sys.path[0]
    return module


def _user_error(what: str, e: BaseException, path: str) -> ScriptError:
    """`e`, raised by the user's code, located at the deepest frame of `path` (else the file)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if os.path.realpath(f.filename) == os.path.realpath(path)]
    span = SourceSpan(path, frames[-1].lineno or 1, (frames[-1].colno or 0) + 1) if frames else SourceSpan(path, 1, 1)
    message = str(e).splitlines()[0] if str(e) else ""
    return ScriptError(f"{what} {type(e).__name__}" + (f": {message}" if message else ""), span)


def _normalised(made: Any, where: str) -> Step:
    """`make_step()`'s result as a Step; a ScriptError saying what shape it must have."""
    shape = ("return (step_fn, example_args), (step_fn, example_args, param_argnums), a dict with 'fn' and "
             "'args', or an object with those attributes")
    fields: dict[str, Any]
    if isinstance(made, tuple) and not hasattr(made, "_fields"):
        if len(made) not in (2, 3):
            raise ScriptError(f"{where} returned a tuple of {len(made)}: {shape}")
        fields = {"fn": made[0], "args": made[1], **({"param_argnums": made[2]} if len(made) == 3 else {})}
    elif isinstance(made, Mapping):
        fields = dict(made)
    elif hasattr(made, "args") and (hasattr(made, "fn") or hasattr(made, "step")):
        fields = {k: getattr(made, k) for k in ("fn", "step", "args", "param_argnums", "batch_argnums", "kwargs")
                  if hasattr(made, k)}
    else:
        raise ScriptError(f"{where} returned a value of type {type(made).__name__}: {shape}")
    fn = fields.get("fn", fields.get("step"))
    unknown = sorted(set(fields) - {"fn", "step", "args", "param_argnums", "batch_argnums", "kwargs"})
    if unknown:
        raise ScriptError(f"{where} returned unknown field(s) {', '.join(map(repr, unknown))}: the fields are "
                          "fn (or step), args, param_argnums, batch_argnums, kwargs")
    if not callable(fn):
        raise ScriptError(f"{where}: the step function is {'missing' if fn is None else type(fn).__name__}, "
                          f"not a function: {shape}")
    args = fields.get("args")
    if not isinstance(args, (tuple, list)):
        raise ScriptError(f"{where}: the example arguments must be a tuple or list (one entry per positional "
                          f"argument of the step), not {type(args).__name__}")
    kwargs = fields.get("kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ScriptError(f"{where}: kwargs must be a dict, not {type(kwargs).__name__}")
    params = _argnums(fields.get("param_argnums", ()), len(args), "param_argnums", where)
    batch = fields.get("batch_argnums")
    return Step(fn, tuple(args), params, None if batch is None else _argnums(batch, len(args), "batch_argnums", where),
                dict(kwargs))


def _argnums(value: Any, n: int, what: str, where: str) -> tuple[int, ...]:
    nums = (value,) if isinstance(value, int) else value
    if not isinstance(nums, Sequence) or not all(isinstance(i, int) and not isinstance(i, bool) for i in nums):
        raise ScriptError(f"{where}: {what} must be an int or a sequence of ints, not {value!r}")
    bad = [i for i in nums if not -n <= i < n]
    if bad:
        raise ScriptError(f"{where}: {what} {bad[0]} is out of range for {n} example argument(s)")
    return tuple(i % n for i in nums)


def _lowered(step: Step, path: str, name: str) -> Graph:
    from pesto_ir.frontends.jax import lower  # start-up: JAX

    try:
        return lower(step.fn, *step.args, param_argnums=step.param_argnums, batch_argnums=step.batch_argnums,
                     **step.kwargs)
    except PestoError:
        raise
    except Exception as e:  # the user's step failed to trace: point at its line
        where = getattr(step.fn, "__code__", None)
        fn_path = where.co_filename if where is not None else path
        error = _user_error(f"tracing the step of {name}() raised", e, fn_path)
        if error.span is not None and error.span.line == 1 and fn_path != path:
            error = _user_error(f"tracing the step of {name}() raised", e, path)
        raise error from None
