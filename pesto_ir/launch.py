"""`python -m pesto_ir.launch --processes P --local-devices N script.py [args...]`: try a
multi-process job on one machine.

It starts P copies of the script, each with N CPU devices of its own, as processes 0 .. P-1 of one
JAX job whose coordinator listens on a free port of 127.0.0.1 (`pesto_ir.distributed.initialize()`
in the script reads where from the environment). Each line a process prints comes out prefixed
with its number; when one process fails, the others are stopped, and the launcher exits with the
first non-zero status (128 + the signal's number for a process killed by a signal). Ctrl-C stops
them all. On a real cluster the cluster's own launcher (SLURM's srun, mpirun, a Kubernetes job)
starts the processes instead, and `initialize()` finds the job through JAX's detection or its
arguments (README, "Beyond one machine").
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from pesto_ir.distributed import ENV_COORDINATOR, ENV_PROCESS_ID, ENV_PROCESSES, free_port

STOP_GRACE_SECONDS = 5.0  # after SIGTERM, before SIGKILL
MAX_PROCESSES = 64


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    port = args.port or free_port()
    procs = [_start(args, i, port) for i in range(args.processes)]
    forwarders = [threading.Thread(target=_forward, args=(p.stdout, i), daemon=True) for i, p in enumerate(procs)]
    for t in forwarders:
        t.start()
    try:
        status = _wait(procs)
    except KeyboardInterrupt:
        _stop(procs, signal.SIGINT)
        status = 130
    for t in forwarders:
        t.join(timeout=1.0)
    return status


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pesto_ir.launch",
                                description="Run a script as several processes of one JAX job on this machine.")
    p.add_argument("--processes", type=_count("--processes", MAX_PROCESSES), required=True,
                   help="how many processes to start")
    p.add_argument("--local-devices", type=_count("--local-devices", 512), default=None,
                   help="CPU devices per process (sets XLA_FLAGS=--xla_force_host_platform_device_count)")
    p.add_argument("--port", type=_count("--port", 65535), default=None,
                   help="the coordinator's port on 127.0.0.1 (default: a free one)")
    p.add_argument("script", help="the Python script each process runs")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _count(flag: str, most: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or not 1 <= int(text) <= most:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {most}")
        return int(text)

    parse.__name__ = flag
    return parse


def _start(args: argparse.Namespace, i: int, port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update({ENV_COORDINATOR: f"127.0.0.1:{port}", ENV_PROCESSES: str(args.processes), ENV_PROCESS_ID: str(i),
                "PYTHONUNBUFFERED": "1"})
    if args.local_devices is not None:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={args.local_devices}"])
    return subprocess.Popen([sys.executable, args.script, *args.script_args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _forward(stream: IO[bytes] | None, i: int) -> None:
    """Copy a process's output to ours, a line at a time, prefixed with its number."""
    assert stream is not None
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"[p{i}] " + line.decode("utf-8", "replace"))
        sys.stdout.flush()


def _wait(procs: list[subprocess.Popen[bytes]]) -> int:
    """0 when every process ends well; else the first failure's status, the others stopped."""
    running = set(range(len(procs)))
    while running:
        for i in sorted(running):
            code = procs[i].poll()
            if code is None:
                continue
            running.discard(i)
            if code != 0:
                print(f"pesto launch: process {i} {_how(code)}; stopping the others", file=sys.stderr, flush=True)
                _stop([procs[j] for j in running], signal.SIGTERM)
                return 128 - code if code < 0 else code
        time.sleep(0.05)
    return 0


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _stop(procs: Sequence[subprocess.Popen[bytes]], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, sig)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
