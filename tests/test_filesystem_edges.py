"""pesto-compile at the edges of the file system (issue 45): paths that name no file to read or
write are refused by name, before any work; stdout closed or full is a clear error; SIGTERM is
taken as Ctrl-C is, and no output or temporary file is left behind by a refused or stopped run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

import pesto_ir
import pesto_ir.cli
import pesto_ir.util.loader
from pesto_ir.cli import main, sigterm_as_ctrl_c
from pesto_ir.cluster.model import Cluster
from pesto_ir.util.loader import AtomicWrites, SizeLimit, UnreadableFile, read_text_file

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mlp_train_step.pir"
FAST = ["--devices", "1", "-p", "annotate-costs,simulate", "-q"]  # one device: no placement to wait for
PLACED = ["--algo", "m-etf", "-q"]  # a quick placement, for runs that need a plan


@pytest.fixture
def deadline() -> Iterator[None]:
    """Fail the test, rather than hang the run, if it takes over 10 s: a FIFO nobody writes or reads
    blocked `open` for good. The alarm interrupts a blocked system call."""
    def late(signum: int, frame: FrameType | None) -> None:
        pytest.fail("still running after 10 s: a blocked open or read?")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line the refusal printed (no traceback, nothing else)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


# 1. inputs: symbolic link loops, FIFOs, devices, folders, sizes -------------------------------------------


def _bad_input(kind: str, tmp_path: Path) -> Path:
    if kind == "symlink loop":
        (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
        (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
        return tmp_path / "a.json"
    if kind == "FIFO":
        os.mkfifo(tmp_path / "fifo.json")
        return tmp_path / "fifo.json"
    if kind == "/dev/zero":
        return Path("/dev/zero")
    return tmp_path  # a folder


WHY = {"symlink loop": "it is a symbolic link loop", "FIFO": "it is a FIFO (named pipe), not a regular file",
       "/dev/zero": "it is a character device, not a regular file", "folder": "it is a folder, not a regular file"}


@pytest.mark.usefixtures("deadline")
@pytest.mark.parametrize("kind", list(WHY))
@pytest.mark.parametrize("flag", ["model", "--cluster", "--start"])
def test_an_input_that_is_no_regular_file_is_refused_by_name_before_any_work(
        flag: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A symlink loop crashed (RuntimeError), /dev/zero filled the memory, a FIFO nobody writes hung."""
    bad = _bad_input(kind, tmp_path)
    monkeypatch.setattr(pesto_ir.cli, "load", lambda *a: pytest.fail("the model was loaded"))
    argv = [str(bad)] if flag == "model" else [str(EXAMPLE), flag, str(bad)]
    assert main([*argv, *PLACED, "-o", str(tmp_path / "out.pir")]) == 1
    line = _error_line(capsys)
    noun = "cluster file" if flag == "--cluster" else "file"
    assert str(bad) in line and f"cannot read {noun}: {WHY[kind]}" in line
    assert not (tmp_path / "out.pir").exists()


@pytest.mark.parametrize("reader", ["model", "cluster"])
def test_an_input_over_its_size_limit_is_refused_without_reading_it(reader: str, tmp_path: Path) -> None:
    """A sparse file just past the limit: refused by its size, said with the limit."""
    path = tmp_path / ("huge.pir" if reader == "model" else "huge.json")
    limit = 256 if reader == "model" else 64
    with open(path, "wb") as f:
        f.truncate((limit + 1) * 2**20)
    if reader == "model":
        with pytest.raises(pesto_ir.ParseError) as e:
            pesto_ir.load(path)
        message = str(e.value)
    else:
        with pytest.raises(pesto_ir.PestoError) as e:
            Cluster.load(path)
        message = str(e.value)
    what = "a model or plan" if reader == "model" else "a cluster file"
    assert f"it is {limit + 1} MiB, more than {what} may be ({limit} MiB, as it is read whole)" in message


def test_reading_keeps_text_modes_line_ends_and_names_bad_utf8(tmp_path: Path) -> None:
    path = tmp_path / "t.pir"
    path.write_bytes(b"a\r\nb\rc\n")
    assert read_text_file(path, SizeLimit("a test", 100)) == "a\nb\nc\n"
    path.write_bytes(b"ab\xff")
    with pytest.raises(UnreadableFile, match=r"file is not UTF-8 text \(invalid start byte at byte 2\)"):
        read_text_file(path, SizeLimit("a test", 100))


# 2. outputs: under a file, dangling links, loops, FIFOs, stdout ------------------------------------------


def _output_case(case: str, tmp_path: Path) -> tuple[str, str]:
    """(the -o path, what the error must say) for each kind of output path that names no file."""
    if case == "under a file":
        (tmp_path / "file.pir").write_text("x")
        return str(tmp_path / "file.pir" / "out.pir"), f"'{tmp_path / 'file.pir'}' is a file, not a folder"
    if case == "dangling symlink":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "link.pir").symlink_to(tmp_path / "missing" / "x.pir")
        return (str(tmp_path / "out" / "link.pir"),
                f"is a symbolic link to '{tmp_path / 'missing' / 'x.pir'}', in folder '{tmp_path / 'missing'}', "
                "which does not exist")
    (tmp_path / "loop.pir").symlink_to(tmp_path / "loop.pir")
    return str(tmp_path / "loop.pir"), "is a symbolic link loop"


@pytest.mark.parametrize("case", ["under a file", "dangling symlink", "symlink loop"])
def test_an_output_path_that_names_no_file_is_refused_and_leaves_nothing(case: str, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path, why = _output_case(case, tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main([str(EXAMPLE), *FAST, "-o", path]) == 1
    line = _error_line(capsys)
    assert line.startswith(f"error: -o '{path}'") and why in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.usefixtures("deadline")
def test_an_output_fifo_nobody_reads_is_an_error_and_no_other_output_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """It waits a while for a reader (`cat pipe` started after the command), then gives up."""
    monkeypatch.setattr(pesto_ir.util.loader, "FIFO_READER_SECONDS", 0.2)
    os.mkfifo(tmp_path / "plan.json")
    assert main([str(EXAMPLE), *PLACED, "-o", str(tmp_path / "out.pir"), "--plan-json", str(tmp_path / "plan.json")]) == 1
    assert "plan.json: it is a FIFO (named pipe) that nothing read within 0.2 s" in _error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


@pytest.mark.usefixtures("deadline")
def test_an_output_to_a_shell_process_substitution_is_written_through_its_pipe() -> None:
    """`--plan-json >(cmd)` names /dev/fd/N, a link to an anonymous pipe with no real path: the
    write went to '/proc/PID/fd/pipe:[...]' and failed with 'No such file or directory'."""
    command = [sys.executable, "-m", "pesto_ir.cli", str(EXAMPLE), *PLACED, "-o", "/dev/null"]
    proc = subprocess.run(["bash", "-c", 'exec "$@" --plan-json >(wc -c)', "bash", *command],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert int(proc.stdout.split()[0]) > 1000, proc.stdout  # the plan, counted by `wc` (run() reads to EOF)


def test_stdout_closed_is_refused_before_any_work(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Python starts with `sys.stdout = None` when fd 1 is closed: `-o -` crashed (AttributeError)."""
    monkeypatch.setattr(pesto_ir.cli, "load", lambda *a: pytest.fail("the model was loaded"))
    monkeypatch.setattr(sys, "stdout", None)
    assert main([str(EXAMPLE), *FAST, "-o", "-"]) == 1
    assert _error_line(capsys) == "error: -o - writes to stdout, which is closed"


@pytest.mark.parametrize("flag", ["-o", "--plan-json"])
def test_a_full_stdout_is_a_clear_error_and_the_other_outputs_are_not_written(
        flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = "--plan-json" if flag == "-o" else "-o"
    with open("/dev/full", "w") as full:
        sys.stdout, real = full, sys.stdout
        try:
            code = main([str(EXAMPLE), *PLACED, flag, "-", other, str(tmp_path / "other")])
        finally:
            sys.stdout = real
    assert code == 1
    assert _error_line(capsys) == f"error: {flag} -: cannot write to stdout: No space left on device"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stdout", ["closed", "/dev/full"])
def test_the_command_with_stdout_closed_or_full_prints_one_line_and_exits_1(stdout: str) -> None:
    """As a process: nothing more at exit (Python flushing stdout again printed "Exception ignored").
    The shell closes stdout (`>&-`): no fork of this process, which has JAX's threads."""
    command = [sys.executable, "-m", "pesto_ir.cli", str(EXAMPLE), *FAST, "-o", "-"]
    redirect = ">&-" if stdout == "closed" else f">{stdout}"
    proc = subprocess.run(["sh", "-c", f'exec "$@" {redirect}', "sh", *command], stderr=subprocess.PIPE,
                          text=True, timeout=60)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: -o -")


# 3. SIGTERM and temporary files --------------------------------------------------------------------------


SIGTERM_WHILE_WRITING = """
import os, signal, sys
real_fsync = os.fsync
def fsync(fd):  # the moment an output's temporary file holds its data
    real_fsync(fd)
    if os.fstat(fd).st_size:
        os.kill(os.getpid(), signal.SIGTERM)
os.fsync = fsync
from pesto_ir.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_while_the_outputs_are_written_stops_and_leaves_nothing(tmp_path: Path) -> None:
    """It exited -15 and left `.out.pir.<random>.tmp` beside the output."""
    proc = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_WRITING, str(EXAMPLE), *PLACED,
                           "-o", str(tmp_path / "out.pir"), "--plan-json", str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert proc.stderr.strip() == "terminated (SIGTERM)"
    assert list(tmp_path.iterdir()) == []


def test_sigterm_handling_is_only_for_the_command() -> None:
    """main() puts back the handler it found: a program calling it keeps its own."""
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_as_ctrl_c() as received:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at once; the sleep is not reached
        assert received == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) == before


def test_atomic_writes_interrupted_while_staging_leave_no_file(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every temporary file is listed before it is made: an interrupt at the worst moment (the file
    made, its descriptor not yet handed back) still leaves nothing."""
    real_open = os.open

    def open_then_interrupt(path: str, flags: int, *args: int) -> int:
        real_open(path, flags, *args)
        raise KeyboardInterrupt

    (tmp_path / "old.json").write_text("kept")
    with pytest.raises(KeyboardInterrupt), AtomicWrites() as files:
        files.stage(tmp_path / "a.pir", "first")
        monkeypatch.setattr(os, "open", open_then_interrupt)
        files.stage(tmp_path / "old.json", "second")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]
    assert (tmp_path / "old.json").read_text() == "kept"
