"""The MILP runs in a process of its own (`python -m pesto_ir.passes.placement.exact.ilp_worker`).

CBC is native code: a crash in it (a NaN that slipped into a coefficient once aborted with SIGABRT
and a C stack trace) took the whole command down, and it only looks at Python's signals between
its own steps, so Ctrl-C took 12-19 s and lost the best plan found. Here the caller sends the
graph (as `.pir` text), the cluster (`pesto-cluster/1`), the options and the warm start
(`pesto-plan/1`) to a worker, which solves with `place_ilp` and sends back its progress lines,
every better plan as it finds it, and the final plan. The caller keeps the best plan it has heard
of, so:

- Ctrl-C stops the worker at once and returns that plan, with a note saying it was interrupted;
- a worker that dies (a native crash, killed) is a clear error naming how it died, unless a plan
  was already heard of, which is returned with a note saying so.

Messages are the CP-SAT worker's: pickles with a length prefix (`cpsat_worker.write_message`).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any

from pesto_ir.cluster.figures import FIGURE_RANGES
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.text import parse
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.exact.cpsat_worker import exit_with_parent, read_message, write_message
from pesto_ir.passes.placement.exact.ilp import place_ilp
from pesto_ir.passes.placement.exact.ilp_model import MIN_CBC_SECONDS
from pesto_ir.passes.placement.options import Incumbent, PlaceOptions
from pesto_ir.schedule.plan import Plan
from pesto_ir.util import work
from pesto_ir.util.errors import PestoError

POLL_SECONDS = 0.2  # the caller wakes this often, so Ctrl-C is seen at once
# Past the time limit by this much (the larger), counted from when the worker starts solving, the
# caller stops it and keeps the best plan it has heard of: CBC checks its clock only between its
# own phases, and on a 200-group ResNet-50 layer graph over 6 devices (22k integers) the solve under
# place's 5 s limit ended at 8.7 s, and under its default 22 s at 40 s.
OVERRUN_SECONDS = 1.5
OVERRUN_SHARE = 0.1
STARTUP_SECONDS = 30.0  # for the worker's imports and reading the request, before it says it started
DRAIN_SECONDS = 0.5  # once late, what the worker sent already is still read (a plan in time stands)
CRASH_ENV = "PESTO_ILP_WORKER_ABORT"  # tests: "progress" or "incumbent": abort() once one is sent
HANG_ENV = "PESTO_ILP_WORKER_HANG"  # tests: "progress" or "incumbent": stop answering once one is sent


class IlpWorkerError(PestoError):
    pass


@dataclass(frozen=True)
class IlpRequest:
    graph: str  # .pir text
    cluster: dict[str, Any]  # pesto-cluster/1
    warm_start: dict[str, Any] | None  # pesto-plan/1
    time_limit: float
    seed: int
    solver: str
    threads: int


# ---------------------------------------------------------------- the caller's side

def _finite_memory(cluster: Cluster) -> Cluster:
    """`cluster` with infinite memory (no limit) written as the largest a file may hold, which no
    graph reaches: a cluster file, the worker's request, holds finite figures only."""
    devices = [replace(d, memory=min(d.memory, FIGURE_RANGES["memory"][1])) for d in cluster.devices]
    return replace(cluster, devices=devices)


def place_ilp_in_worker(graph: Graph, cluster: Cluster, options: PlaceOptions) -> Plan:
    """`place_ilp` in a worker process: its plan, or on Ctrl-C or a worker crash the best plan
    it had sent (with a note), or an error when it had sent none."""
    request = IlpRequest(str(graph), _finite_memory(cluster).to_json(),
                         options.warm_start.to_json() if options.warm_start else None,
                         options.time_limit, options.seed, options.solver, options.threads)
    errors = tempfile.TemporaryFile()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.Popen([sys.executable, "-m", "pesto_ir.passes.placement.exact.ilp_worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=errors, env=env, bufsize=0,
                            start_new_session=True)  # Ctrl-C reaches the caller only; it stops the worker
    best = options.warm_start
    started = time.perf_counter()
    solving: float | None = None  # when the worker said it started solving
    allowed = max(options.time_limit, MIN_CBC_SECONDS) + max(OVERRUN_SECONDS, OVERRUN_SHARE * options.time_limit)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            write_message(proc.stdin, request)
            proc.stdin.close()
        except OSError:  # the worker died before it read the request
            proc.wait()
            return _fallback(best, _death(proc.returncode, errors))
        while True:
            now = time.perf_counter()
            due = started + STARTUP_SECONDS if solving is None else solving + allowed
            ready: list[Any] = []
            if now <= due + DRAIN_SECONDS:  # past it, a worker that keeps talking is stopped all the same
                ready, _, _ = select.select([proc.stdout], [], [], POLL_SECONDS if now < due else 0)
            if not ready:
                if now < due:
                    continue
                why = (f"the MILP worker had not started solving after {STARTUP_SECONDS:g} s" if solving is None else
                       f"the MILP had not finished {allowed - options.time_limit:.1f} s past its time limit of "
                       f"{options.time_limit:.3g} s")
                options.progress(f"ilp: {why}, so it was stopped" + ("; keeping the best plan found so far" if best else ""))
                return _fallback(best, f"{why}, so it was stopped", status="stopped")
            message = read_message(proc.stdout)
            if message is None:
                proc.wait()
                return _fallback(best, _death(proc.returncode, errors))
            kind, body = message
            if kind == "started":
                solving = time.perf_counter()
            elif kind == "progress":
                options.progress(body)
            elif kind == "incumbent":
                best = Plan.from_json(body)
            elif kind == "error":
                raise IlpWorkerError(body)
            elif kind == "plan":
                return Plan.from_json(body)
    except KeyboardInterrupt:
        seconds = time.perf_counter() - started
        options.progress(f"ilp: interrupted after {seconds:.1f}s; keeping the best plan found so far")
        return _fallback(best, f"interrupted (Ctrl-C) after {seconds:.1f}s of the MILP", status="interrupted")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        errors.close()
        work.charge("wall", time.perf_counter() - started)  # the worker's work is counted nowhere else


def _fallback(best: Plan | None, why: str, status: str = "worker-failed") -> Plan:
    if best is None:
        raise IlpWorkerError(f"the MILP gave no plan: {why}")
    solver = dict(best.solver or {})
    solver["status"] = status
    return replace(best, algorithm="ilp", solver=solver,
                   notes=[*best.notes, f"{why}; this is the best plan found before"])


def _death(returncode: int | None, errors: Any) -> str:
    """How the worker ended, in words, with the last of what it wrote to stderr."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        how = f"the MILP worker was killed by {name}"
    else:
        how = f"the MILP worker exited with status {returncode}"
    errors.seek(0)
    tail = errors.read()[-400:].decode("utf-8", "replace").strip().splitlines()
    return how + (f" ({tail[-1]})" if tail else "")


# ---------------------------------------------------------------- the worker's side

def serve() -> int:
    exit_with_parent()
    # Messages go out on a descriptor of their own: CBC's log capture points fd 1 at a pipe while it
    # solves, and a message written there would be lost in the log (or block on a full pipe).
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    request = read_message(sys.stdin.buffer)
    if request is None:
        return 0
    abort_after, hang_after = os.environ.get(CRASH_ENV), os.environ.get(HANG_ENV)

    def send(kind: str, body: Any) -> None:
        write_message(out, (kind, body))
        if kind == abort_after:
            os.abort()
        if kind == hang_after:
            time.sleep(3600)

    class Log:
        def write(self, text: str) -> None:
            for line in text.splitlines():
                if line.strip():
                    send("progress", line)

        def flush(self) -> None:
            pass

    def incumbent(plan: Plan) -> None:
        send("incumbent", plan.to_json())

    try:
        graph = parse(request.graph, "<ilp request>")
        cluster = Cluster.from_json(request.cluster)
        warm = Plan.from_json(request.warm_start) if request.warm_start is not None else None
        options = PlaceOptions(time_limit=request.time_limit, seed=request.seed, solver=request.solver,
                               threads=request.threads, warm_start=warm, quiet=False, log=Log(),  # type: ignore[arg-type]
                               incumbent=Incumbent(report=incumbent))
        send("started", None)
        plan = place_ilp(graph, cluster, options)
    except PestoError as e:
        send("error", str(e))
        return 1
    send("plan", plan.to_json())
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller stops the worker; it keeps the best plan
    raise SystemExit(serve())
