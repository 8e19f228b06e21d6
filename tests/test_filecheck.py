"""Golden pass tests in the style of LLVM/MLIR lit tests, checked with FileCheck.

Each `tests/filecheck/*.pir` file is a model and its own test. Its `// RUN:` lines say what to
run, its `// CHECK...:` lines what must come out (the `filecheck` package, a Python clone of
LLVM FileCheck, does the matching). A RUN line is a lit-style pipeline of this one shape:

    // RUN: [not] pesto-compile ARGS [2>&1] | filecheck %s [FILECHECK-ARGS]

- `%s` is the test file, `%S` its folder; a line ending in `\\` continues on the next RUN line.
- `not` expects pesto-compile to fail (a non-zero status), as lit's `not` does; without it, the
  compile must succeed. `2>&1` sends its stderr (errors, progress) into filecheck too.
- Several RUN lines run one after another (use `--check-prefix` to give each its own checks).

Everything else (`.pir` comments start with `//`) is ignored by the parser, so a test file is a
valid model: `pesto-compile tests/filecheck/dce.pir -p dce -o -` shows what a test sees.

pesto-compile runs in-process (`pesto_ir.cli.main`, stdout and stderr captured), which keeps the
whole suite to a few seconds; `PESTO_FILECHECK_SUBPROCESS=1` runs the installed console script
instead. filecheck always runs as its own command (`python -m filecheck CHECKFILE`, input on stdin),
and a failed match fails the test with filecheck's own message.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("filecheck", reason="the filecheck package is a dev dependency: pip install -e '.[dev]'")

from pesto_ir.cli import main as pesto_compile  # noqa: E402

HERE = Path(__file__).resolve().parent / "filecheck"
CASES = sorted(HERE.glob("*.pir"))
RUN_LINE = re.compile(r"^\s*//\s*RUN:(.*)$")


class RunLineError(Exception):
    """A RUN line this harness does not understand."""


@dataclass(frozen=True)
class Run:
    """One RUN line: `[not] pesto-compile ARGS [2>&1] | filecheck %s [FILECHECK-ARGS]`."""

    expect_failure: bool
    compile_args: list[str]
    merge_stderr: bool
    filecheck_args: list[str]
    text: str


def run_lines(path: Path) -> list[str]:
    """The RUN commands of `path`, continuation lines (`\\` at the end) joined."""
    commands: list[str] = []
    pending = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        m = RUN_LINE.match(line)
        if not m:
            if pending:
                raise RunLineError(f"{path.name}: a RUN line ends in '\\' but no RUN line follows")
            continue
        body = m.group(1).strip()
        if body.endswith("\\"):
            pending += body[:-1] + " "
            continue
        commands.append(pending + body)
        pending = ""
    if pending:
        raise RunLineError(f"{path.name}: the last RUN line ends in '\\'")
    return commands


def parse_run(command: str, path: Path) -> Run:
    def substitute(word: str) -> str:
        return word.replace("%s", str(path)).replace("%S", str(path.parent))

    if command.count("|") != 1:
        raise RunLineError(f"{path.name}: expected 'pesto-compile ... | filecheck %s ...', got: {command}")
    left, right = (shlex.split(part) for part in command.split("|"))
    expect_failure = bool(left) and left[0] == "not"
    if expect_failure:
        left = left[1:]
    merge_stderr = bool(left) and left[-1] == "2>&1"
    if merge_stderr:
        left = left[:-1]
    if not left or left[0] != "pesto-compile":
        raise RunLineError(f"{path.name}: a RUN line must run pesto-compile, got: {command}")
    if len(right) < 2 or right[0] != "filecheck" or right[1] != "%s":
        raise RunLineError(f"{path.name}: a RUN line must pipe into 'filecheck %s', got: {command}")
    return Run(expect_failure, [substitute(w) for w in left[1:]], merge_stderr,
               [substitute(w) for w in right[2:]], command)


def compile_in_process(args: list[str], merge_stderr: bool) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out if merge_stderr else err):
        status = pesto_compile(args)
    return status, out.getvalue(), err.getvalue()


def compile_subprocess(args: list[str], merge_stderr: bool) -> tuple[int, str, str]:
    proc = subprocess.run(["pesto-compile", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr or ""


def run_case(path: Path) -> None:
    """Run every RUN line of `path`; raise AssertionError with filecheck's message on a mismatch."""
    commands = run_lines(path)
    if not commands:
        raise RunLineError(f"{path.name}: no '// RUN:' line")
    compile_ = compile_subprocess if os.environ.get("PESTO_FILECHECK_SUBPROCESS") else compile_in_process
    for command in commands:
        run = parse_run(command, path)
        status, out, err = compile_(run.compile_args, run.merge_stderr)
        if run.expect_failure and status == 0:
            raise AssertionError(f"{path.name}: RUN: {run.text}\npesto-compile succeeded, but 'not' expects "
                                 f"it to fail; its output:\n{out}")
        if not run.expect_failure and status != 0:
            raise AssertionError(f"{path.name}: RUN: {run.text}\npesto-compile exited with {status}:\n{err or out}")
        fc = subprocess.run([sys.executable, "-m", "filecheck", str(path), *run.filecheck_args],
                            input=out, capture_output=True, text=True, timeout=60)
        if fc.returncode != 0:
            raise AssertionError(f"{path.name}: RUN: {run.text}\nfilecheck failed (exit {fc.returncode}):\n"
                                 f"{fc.stdout}{fc.stderr}")


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_filecheck(path: Path) -> None:
    run_case(path)


def test_every_pass_has_a_filecheck_test() -> None:
    from pesto_ir.passes import PASSES

    tested = set()
    for path in CASES:
        for command in run_lines(path):
            words = shlex.split(command.split("|")[0])
            for flag, value in zip(words, words[1:]):
                if flag in ("-p", "--pipeline"):
                    tested.update(re.findall(r"(?:^|,)\s*([\w.-]+)", re.sub(r"\{[^}]*\}", "", value)))
    assert set(PASSES) <= tested, f"passes without a FileCheck test: {sorted(set(PASSES) - tested)}"


# ---------------------------------------------------------------- the harness cannot pass vacuously

NEGATIVE = HERE / "negative"


def test_a_wrong_check_fails_with_filecheck_message() -> None:
    with pytest.raises(AssertionError) as failure:
        run_case(NEGATIVE / "wrong-check.pir")
    message = str(failure.value)
    assert "filecheck failed" in message
    assert "%dead = neg" in message  # filecheck names the check that did not match


def test_a_check_not_that_matches_fails() -> None:
    with pytest.raises(AssertionError) as failure:
        run_case(NEGATIVE / "check-not-matches.pir")
    assert "filecheck failed" in str(failure.value)
    assert "%used" in str(failure.value)


def test_a_file_without_checks_fails() -> None:
    with pytest.raises(AssertionError, match="No check strings found"):
        run_case(NEGATIVE / "no-checks.pir")


def test_an_unexpected_compile_failure_fails() -> None:
    with pytest.raises(AssertionError, match="pesto-compile exited with 1"):
        run_case(NEGATIVE / "compile-fails.pir")


def test_not_requires_a_failure() -> None:
    with pytest.raises(AssertionError, match="'not' expects it to fail"):
        run_case(NEGATIVE / "not-but-succeeds.pir")


def test_a_file_without_run_lines_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "bare.pir"
    bare.write_text("// CHECK: graph\ngraph @g() {\n}\n")
    with pytest.raises(RunLineError, match="no '// RUN:' line"):
        run_case(bare)
