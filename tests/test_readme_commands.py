"""Every `pesto-compile` command in the README's usage sections (Quick start, Using it) runs as
written, from a folder of its own that sees the checkout's `examples/` and `graphs/`; commands that
place get a short `--time-limit` unless they give one. The quick start prints what the README
says it prints."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pesto_ir.cli import main

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
USAGE_SECTIONS = ("Quick start", "Using it")
SHORT_LIMIT = "2"


def usage_commands() -> list[str]:
    """The `pesto-compile` command lines of the ```sh blocks in the usage sections, with their
    backslash continuations joined."""
    text = README.read_text()
    commands: list[str] = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title = section.splitlines()[0].strip()
        if title not in USAGE_SECTIONS:
            continue
        for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
            joined = block.replace("\\\n", " ")
            commands += [line.strip() for line in joined.splitlines() if line.strip().startswith("pesto-compile ")]
    return commands


def test_the_readme_has_usage_commands() -> None:
    commands = usage_commands()
    assert any("examples/mlp_train_step.pir" in c for c in commands)
    assert any(":make_step" in c for c in commands) and any("graphs/msr/" in c for c in commands)


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)[1:]
    pipeline = argv[argv.index("-p") + 1] if "-p" in argv else "place"
    if "place" in pipeline and "--time-limit" not in argv:
        argv += ["--time-limit", SHORT_LIMIT]
    return argv


@pytest.mark.parametrize("command", usage_commands())  # all of them: about 15 s
def test_every_usage_command_runs_as_written(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    for folder in ("examples", "graphs"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("/tmp/pesto-ci-out.pir", str(tmp_path / "out.pir")) for a in _argv(command)]
    assert main(argv) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    if "-o" in argv and argv[argv.index("-o") + 1] == "-":
        assert "graph @" in out
    elif "-p" not in argv:
        assert err.strip().splitlines()[-1].startswith("answer: step time ")
    for flag in ("--plan-json", "--gantt", "-o"):
        if flag in argv and argv[argv.index(flag) + 1] != "-":
            assert Path(argv[argv.index(flag) + 1]).stat().st_size > 0


def test_the_quick_start_prints_what_the_readme_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """As written (its own time limit): auto's plan, on both devices, and the README's answer line."""
    command = next(c for c in usage_commands() if "examples/mlp_train_step.pir -o" in c)
    argv = [a.replace("/tmp/pesto-ci-out.pir", str(tmp_path / "out.pir")) for a in shlex.split(command)[1:]]
    monkeypatch.chdir(ROOT)
    assert main([*argv, "--plan-json", str(tmp_path / "plan.json")]) == 0
    err = capsys.readouterr().err
    answer = err.strip().splitlines()[-1]
    assert answer.startswith("answer: ") and "one batch on 2 of 2 devices; plan by auto" in answer
    if "cut the search short" not in err:  # a machine too busy for the work the limit counts on
        assert answer in README.read_text().splitlines()
