"""CP-SAT runs in a process of its own (`python -m pesto_ir.passes.placement.exact.cpsat_worker`).

OR-tools and python-mip's CBC (the `cbcbox` build) ship different builds of the same COIN-OR
libraries under the same soname (`libOsi.so.0`); whichever loads first in a process breaks the
other (`undefined symbol ...dfltRowColName...`). The MILP, the m-SCT heuristic and the tests use
CBC, so OR-tools' native code never loads in the calling process: it sends `Request`s (plain data)
to this worker through a pipe and reads back progress and a `Result`. One worker serves a whole
LNS run, so OR-tools is imported once per run.

Messages are pickles with an 8-byte length prefix; the worker exits when its input closes.
`shared_solver()` keeps one worker for the whole calling process (closed at exit), so only the
first solve pays for starting it and importing OR-tools (about a second).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from pesto_ir.passes.placement.exact.cpsat_problem import CpSatError, Request, Result, Solution, SolveInterrupted

HEADER = struct.Struct("<Q")
GRACE_SECONDS = 30.0  # beyond the request's own limit before a silent worker is given up on


def write_message(stream: IO[bytes], message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(HEADER.pack(len(body)) + body)
    while data:
        written = stream.write(data)
        data = data[written if written is not None else len(data):]
    stream.flush()


def read_message(stream: IO[bytes]) -> Any:
    head = _read_exactly(stream, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    data = _read_exactly(stream, size)
    if data is None:
        return None
    return pickle.loads(data)


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------------- the caller's side


_shared: SolverProcess | None = None
_shared_lock = threading.Lock()


def shared_solver() -> SolverProcess:
    """The calling process's CP-SAT worker (started on first use, closed at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SolverProcess()
            atexit.register(_shared.close)
        return _shared


class SolverProcess:
    """A CP-SAT worker process; started on first use (or by `start`), stopped by `close`.
    One request at a time: callers on several threads take turns."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.errors: IO[bytes] | None = None
        self.lock = threading.RLock()
        self.incumbent: Solution | None = None  # the request's best solution so far (when it asked for them)

    def __enter__(self) -> SolverProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> subprocess.Popen[bytes]:
        """Spawn the worker now, so that importing OR-tools overlaps the caller's own work
        (again if the last one has died since); the worker process."""
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        self.close()
        self.errors = tempfile.TemporaryFile()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        # Unbuffered: `select` must see every byte that has not been read yet.
        # A session of its own: a terminal's Ctrl-C reaches the caller only, which stops the worker
        # after reading the incumbents it sent.
        self.proc = subprocess.Popen([sys.executable, "-m", "pesto_ir.passes.placement.exact.cpsat_worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.errors, env=env, bufsize=0,
                                     start_new_session=True)
        return self.proc

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                _pipe(proc.stdin).close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        if self.errors is not None:
            self.errors.close()
            self.errors = None

    def kill(self) -> None:
        """Stop the worker at once, mid-solve (`close` lets it finish its request, up to 5 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.close()

    def peak_rss(self) -> int | None:
        """The worker's peak resident memory in bytes (Linux /proc), None when it is not running."""
        if self.proc is None:
            return None
        try:
            with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def solve(self, request: Request, report: Callable[[float, float], None] | None = None) -> Result:
        """Send `request`, pass its progress (objective, bound in ticks) to `report`, return its result."""
        with self.lock:
            return self._solve(request, report)

    def _solve(self, request: Request, report: Callable[[float, float], None] | None) -> Result:
        proc = self.start()
        try:
            write_message(_pipe(proc.stdin), ("solve", request, report is not None))
        except OSError:
            tail = self._stderr_tail()
            self.close()
            raise CpSatError(f"the CP-SAT worker process stopped: {tail}") from None
        self.incumbent = None
        started = time.perf_counter()
        try:
            return self._answer(proc, request, report)
        except KeyboardInterrupt:  # Ctrl-C: stop now; a late answer would be read as the next request's
            self.kill()
            raise SolveInterrupted(Result("interrupted", None, None, time.perf_counter() - started,
                                          self.incumbent)) from None

    def _answer(self, proc: subprocess.Popen[bytes], request: Request,
                report: Callable[[float, float], None] | None) -> Result:
        deadline = time.monotonic() + request.seconds + GRACE_SECONDS
        while True:
            if not self._wait_readable(_pipe(proc.stdout), deadline):
                self.kill()
                waited = request.seconds + GRACE_SECONDS
                return Result("no-solution", None, None, request.seconds, None,
                              note=f"the CP-SAT worker gave no answer within {waited:.0f}s; stopped it")
            message = read_message(_pipe(proc.stdout))
            if message is None:
                tail = self._stderr_tail()
                self.close()
                raise CpSatError(f"the CP-SAT worker process stopped: {tail}")
            kind = message[0]
            if kind == "progress" and report is not None:
                report(message[1], message[2])
            elif kind == "incumbent":
                self.incumbent = message[1]
            elif kind == "result":
                result: Result = message[1]
                return result
            elif kind == "error":
                raise CpSatError(f"CP-SAT failed: {message[1]}")

    def _wait_readable(self, stream: IO[bytes], deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([stream], [], [], left)
        return bool(ready)

    def _stderr_tail(self) -> str:
        if self.errors is None:
            return "(no error output)"
        self.errors.seek(0)
        lines = self.errors.read().decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else "(no error output)"


# ---------------------------------------------------------------------------- the worker's side

def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """A pipe of the worker process (started with stdin and stdout pipes: never None)."""
    assert stream is not None, "the CP-SAT worker has no pipe"
    return stream


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer `solve` messages until the input closes."""
    from pesto_ir.passes.placement.exact.cpsat_model import CpModel  # start-up: OR-tools (never beside CBC)

    while True:
        message = read_message(requests)
        if message is None:
            return
        _, request, wants_progress = message
        try:
            result = _solve(CpModel, request, answers if wants_progress else None, answers)
        except Exception as e:  # report any failure to the caller instead of dying silently
            write_message(answers, ("error", f"{type(e).__name__}: {e}"))
            continue
        write_message(answers, ("result", result))


def _solve(model_class: Any, request: Request, answers: IO[bytes] | None, sink: IO[bytes] | None = None) -> Result:
    started = time.perf_counter()
    model = model_class(request.problem, symmetry=request.symmetry, chains=request.chains)
    if request.hint is not None:
        model.hint(request.hint)
    built = time.perf_counter() - started
    request.seconds = max(0.05, request.deadline - time.monotonic())

    def report(objective: float, bound: float) -> None:
        assert answers is not None  # passed on only with a stream for progress
        write_message(answers, ("progress", objective, bound))

    def incumbent(solution: Solution) -> None:
        assert sink is not None  # passed on only with a stream for incumbents
        write_message(sink, ("incumbent", solution))

    result: Result = model.solve(request, report if answers is not None else None,
                         incumbent if request.incumbents and sink is not None else None)
    result.size = model.size()
    result.seconds += built
    result.setup_seconds = built
    return result


PARENT_POLL_SECONDS = 1.0  # how often a worker looks whether the process that started it is gone


def exit_with_parent() -> None:
    """Stop this worker once the process that started it is gone. A caller killed by SIGTERM or
    SIGKILL cannot stop its workers, and a solve runs in native code until its time limit: an ILP
    worker of a killed `pesto-compile` went on at 100% CPU alone. A thread watches the parent
    (the solvers release the GIL while they work)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main() -> None:
    exit_with_parent()
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing but messages may reach the caller's pipe, not even native code's output
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
