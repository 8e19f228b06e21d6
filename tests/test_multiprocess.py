"""Plans across processes: two processes of four CPU devices each on 127.0.0.1, through the
launcher (`python -m pesto_ir.launch`), train like jax.jit; a process that dies ends the job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pesto_ir.distributed
from pesto_ir.distributed import free_port
from pesto_ir.launch import main as launch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_multiprocess.py"
DIES = Path(__file__).resolve().parent / "multiprocess" / "die_mid_step.py"
SMALL_OUTPUTS = Path(__file__).resolve().parent / "multiprocess" / "small_outputs.py"


def _launch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the launcher sets the device count
    return subprocess.run([sys.executable, "-m", "pesto_ir.launch", "--processes", "2", "--local-devices", "4",
                           *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.parametrize("model,optimizer", [("mlp", "adam"), ("gpt", "sgd")])
@pytest.mark.slow
def test_stages_and_replicas_across_two_processes_train_like_jax_jit(model: str, optimizer: str) -> None:
    """Data-parallel 1: `expert` stages over all 8 devices, so activations and gradients cross
    between the processes every step; data-parallel 2: one replica per process, the gradients
    all-reduced across them. Three steps each, losses and parameters equal to jax.jit's. The GPT
    trains with SGD: with Adam its attention key bias, whose gradient is rounding noise, ended
    1.1e-4 from jax.jit's with two replicas on one machine (and within 1e-4 on another)."""
    proc = _launch(str(EXAMPLE), "--model", model, "--data-parallel", "1,2", "--steps", "3", "--optimizer", optimizer)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    for d in (1, 2):
        for p in (0, 1):
            assert f"[p{p}] process {p}, {model}, data-parallel {d}: same as jax.jit" in out, out[-3000:]
    staged = re.search(rf"{model}, data-parallel 1: .* over 8 devices of processes \[0, 1\].*; (\d+) copies between "
                       "processes per step", out)
    assert staged is not None and int(staged.group(1)) > 0, out[-3000:]
    assert re.search(rf"{model}, data-parallel 2: .*2 replica\(s\) over 8 devices of processes \[0, 1\].*all-reduces "
                     "across the replicas", out), out[-3000:]


@pytest.mark.slow
def test_small_outputs_are_read_in_every_process_and_parameters_stay() -> None:
    """Stages over both processes, then one replica per process: in each process the loss, a metric of
    the first stage, per-example losses and a learning rate fed back read as they are (float,
    np.asarray, process_allgather) and equal jax.jit's, though half of them were made on the other
    process's devices; parameters and a 128 KiB activation stay where they were made. The default
    does not autotune across processes; autotune=True is refused there (the script checks both)."""
    proc = _launch(str(SMALL_OUTPUTS))
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    for p in (0, 1):
        assert f"[p{p}] process {p}: small outputs made on processes [0, 1]" in out, out[-3000:]
        for d in (1, 2):
            assert f"[p{p}] process {p}: data-parallel {d}: outputs ok" in out, out[-3000:]


@pytest.mark.slow
def test_a_dead_process_ends_the_others_within_a_minute() -> None:
    """Started as a cluster's own launcher would (no pesto launcher to stop the rest): process 1 dies
    before its second step; process 0, waiting for it mid-step, is ended by JAX's runtime within the
    heartbeat timeout (5 s here), with a message that names task 1."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PESTO_NUM_PROCESSES": "2",
           "PYTHONUNBUFFERED": "1",
           "PESTO_COORDINATOR": f"127.0.0.1:{free_port()}"}
    procs = [subprocess.Popen([sys.executable, str(DIES)], env={**env, "PESTO_PROCESS_ID": str(i)}, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    started = time.monotonic()
    try:
        out, err = procs[0].communicate(timeout=60)
        ended = time.monotonic() - started
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert "finished" not in out
    assert procs[0].returncode != 0 and ended < 60
    assert "stopped sending heartbeats" in err and re.search(r"heartbeats\):\s*1\b", err), err[-2000:]


@pytest.mark.slow
def test_the_launcher_stops_the_others_when_one_fails_and_says_which() -> None:
    proc = _launch(str(DIES), timeout=120)
    assert proc.returncode == 9, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[p1] process 1: dying mid-step" in proc.stdout
    assert "pesto launch: process 1 exited with status 9; stopping the others" in proc.stderr


@pytest.mark.parametrize("argv", [["--processes", "0", "x.py"], ["--processes", "two", "x.py"],
                                  ["--processes", "2", "--local-devices", "-1", "x.py"], ["--processes", "2"]])
def test_the_launcher_refuses_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        launch(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_an_unreachable_coordinator_is_a_clear_error_not_an_abort() -> None:
    port = free_port()
    with pytest.raises(pesto_ir.distributed.DistributedError,
                       match=rf"process 1 could not reach the coordinator \(process 0\) at 127.0.0.1:{port} within 1 s"):
        pesto_ir.distributed.initialize(f"127.0.0.1:{port}", 2, 1, initialization_timeout=1)


@pytest.mark.parametrize("kwargs, message", [({"num_processes": 2, "process_id": 2}, "not below num_processes"),
                                             ({"num_processes": -1}, "num_processes must be"),
                                             ({"heartbeat_timeout_seconds": 0}, "heartbeat_timeout_seconds must be")])
def test_initialize_checks_its_numbers(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(pesto_ir.distributed.DistributedError, match=message):
        pesto_ir.distributed.initialize("127.0.0.1:1", **kwargs)


