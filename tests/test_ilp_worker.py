"""The MILP in a worker process (passes/placement/exact/ilp_worker.py): a crash or Ctrl-C keeps the best plan."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import pesto_ir
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import Graph
from pesto_ir.passes.placement.exact.ilp_worker import (
    CRASH_ENV,
    HANG_ENV,
    OVERRUN_SECONDS,
    IlpWorkerError,
    place_ilp_in_worker,
)
from pesto_ir.passes.placement.heuristics.portfolio import best_heuristic_plan
from pesto_ir.passes.placement.options import PlaceOptions
from pesto_ir.passmanager import PassContext, PassManager
from pesto_ir.schedule.validate import check_plan

MLP = Path(__file__).resolve().parents[1] / "examples" / "mlp_train_step.pir"
MSR = Path(__file__).resolve().parents[1] / "graphs" / "msr" / "bert24_training_layer.json"


def costed_mlp() -> tuple[Graph, Cluster]:
    cluster = Cluster.homogeneous(2, "h100")
    graph = PassManager("annotate-costs").run(pesto_ir.load(MLP), PassContext(cluster=cluster, quiet=True))
    return graph, cluster


@pytest.mark.slow
def test_the_worker_returns_a_valid_plan_no_slower_than_its_warm_start() -> None:
    graph, cluster = costed_mlp()
    warm = best_heuristic_plan(graph, cluster, PlaceOptions(quiet=True))
    plan = place_ilp_in_worker(graph, cluster, PlaceOptions(time_limit=2, quiet=True, warm_start=warm))
    check_plan(graph, cluster, plan)
    assert plan.algorithm == "ilp" and plan.makespan <= warm.makespan * (1 + 1e-12)
    assert plan.solver["status"] in ("optimal", "feasible")


def test_a_crashed_worker_keeps_the_best_plan_and_says_how_it_died(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, cluster = costed_mlp()
    warm = best_heuristic_plan(graph, cluster, PlaceOptions(quiet=True))
    monkeypatch.setenv(CRASH_ENV, "progress")
    plan = place_ilp_in_worker(graph, cluster, PlaceOptions(time_limit=5, quiet=True, warm_start=warm))
    check_plan(graph, cluster, plan)
    assert plan.makespan == warm.makespan and plan.solver["status"] == "worker-failed"
    assert "killed by SIGABRT" in plan.notes[-1] and "best plan found before" in plan.notes[-1]
    with pytest.raises(IlpWorkerError, match="the MILP gave no plan: the MILP worker was killed by SIGABRT"):
        place_ilp_in_worker(graph, cluster, PlaceOptions(time_limit=5, quiet=True))


@pytest.mark.slow
def test_a_solve_that_overruns_its_time_limit_is_stopped_and_keeps_the_best_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CBC checks its clock only between its phases; a worker still busy past the time limit (and
    the grace) is stopped, and the warm start stands, saying why."""
    graph, cluster = costed_mlp()
    warm = best_heuristic_plan(graph, cluster, PlaceOptions(quiet=True))
    monkeypatch.setenv(HANG_ENV, "progress")
    started = time.monotonic()
    plan = place_ilp_in_worker(graph, cluster, PlaceOptions(time_limit=1, quiet=True, warm_start=warm))
    assert time.monotonic() - started < 1 + OVERRUN_SECONDS + 10  # not the worker's hour of sleep
    check_plan(graph, cluster, plan)
    assert plan.makespan == warm.makespan and plan.solver["status"] == "stopped"
    assert "the MILP had not finished 1.5 s past its time limit of 1 s, so it was stopped" in plan.notes[-1]
    with pytest.raises(IlpWorkerError, match="the MILP gave no plan: the MILP had not finished"):
        place_ilp_in_worker(graph, cluster, PlaceOptions(time_limit=1, quiet=True))


@pytest.mark.usefixtures("sigint_reaches_python")
def test_ctrl_c_stops_the_solve_at_once_and_keeps_the_best_plan() -> None:
    graph, cluster = pesto_ir.load(MSR), Cluster.homogeneous(4, "v100", latency=1e-5, bandwidth=5e10)
    warm = best_heuristic_plan(graph, cluster, PlaceOptions(quiet=True))
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    started = time.monotonic()
    timer.start()
    try:
        plan = place_ilp_in_worker(graph, cluster, PlaceOptions(time_limit=60, quiet=True, warm_start=warm))
    except KeyboardInterrupt:  # the solve returned before the signal came: fail this test, not the session
        pytest.fail("the MILP finished before the interrupt, so the interrupt was not tested")
    finally:
        timer.cancel()
    assert time.monotonic() - started < 1.5 + 2.0  # stopped within 2 s of the signal
    check_plan(graph, cluster, plan)
    assert plan.solver["status"] == "interrupted" and "interrupted (Ctrl-C)" in plan.notes[-1]
    assert plan.makespan <= warm.makespan


@pytest.mark.slow
def test_plans_found_during_the_solve_reach_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """CBC's log capture points fd 1 at a pipe while it solves; the worker's messages go out on a
    descriptor of their own, so a better plan found then still reaches the caller (which keeps it
    when the worker dies right after)."""
    from pesto_ir.passes.placement.registry import ALGORITHMS

    graph, cluster = costed_mlp()
    poor = check_plan(graph, cluster, ALGORITHMS["single"].run(graph, cluster, PlaceOptions(quiet=True)))
    monkeypatch.setenv(CRASH_ENV, "incumbent")
    plan = place_ilp_in_worker(graph, cluster, PlaceOptions(time_limit=10, quiet=True, warm_start=poor))
    check_plan(graph, cluster, plan)
    assert plan.makespan < poor.makespan and "killed by SIGABRT" in plan.notes[-1]


@pytest.mark.slow
def test_the_solvers_live_progress_reaches_the_caller() -> None:
    """The progress CBC's log gives while it solves (read while fd 1 points at the log pipe) is
    forwarded to the caller's log."""
    import io
    import re

    graph, cluster = costed_mlp()
    warm = best_heuristic_plan(graph, cluster, PlaceOptions(quiet=True))
    log = io.StringIO()
    place_ilp_in_worker(graph, cluster, PlaceOptions(time_limit=3, log=log, warm_start=warm))
    assert re.search(r"ilp: +\d+\.\ds +incumbent .* bound", log.getvalue()), log.getvalue()


def _gone(pid: int) -> bool:
    """Whether process `pid` has exited (a zombie nobody reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads process states from /proc")
@pytest.mark.slow
def test_a_worker_whose_caller_is_killed_stops_on_its_own(tmp_path: Path) -> None:
    """A caller killed by SIGKILL (or SIGTERM: `timeout`) cannot stop its worker; the worker notices
    that its parent is gone and exits, instead of solving on alone until its time limit."""
    import subprocess
    import sys

    pid_file = tmp_path / "worker.pid"
    script = f"""
import subprocess
from pesto_ir.passes.placement.exact.ilp_worker import place_ilp_in_worker
from pesto_ir.passes.placement.options import PlaceOptions
from tests.test_ilp_worker import costed_mlp

class Recorded(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        open({str(pid_file)!r}, "w").write(str(self.pid))

subprocess.Popen = Recorded
graph, cluster = costed_mlp()
place_ilp_in_worker(graph, cluster, PlaceOptions(time_limit=600, quiet=True))
"""
    env = {**os.environ, HANG_ENV: "progress"}  # the worker then sleeps an hour: only its watch can end it
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1], env=env)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and caller.poll() is None, "the caller never started its worker"
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        time.sleep(2.0)  # the worker is up and hanging
        assert not _gone(worker)
        caller.kill()
        caller.wait()
        deadline = time.monotonic() + 15
        while not _gone(worker):
            assert time.monotonic() < deadline, "the worker outlived its caller"
            time.sleep(0.2)
    finally:
        caller.kill()
        if pid_file.exists() and pid_file.read_text() and not _gone(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
