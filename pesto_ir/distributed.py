"""Several processes, one plan: JAX's multi-controller runtime, as Pesto IR uses it.

One process runs per host (or per group of devices), each the same program; after
`initialize()` every process sees the devices of all of them (`jax.devices()`), and its own
(`jax.local_devices()`). A plan over devices of several processes runs in every process at once:
each dispatches the segments of its own devices and takes part in each copy that leaves or
reaches one of them, in the same order everywhere (`pesto_ir/jaxrt/cross_process.py`). Planning is not
repeated: process 0 plans and the others read its placed graph from the runtime's key-value store
(`shared_text`), so all of them run the very same plan, whatever the time-limited solvers found.

`initialize()` wraps `jax.distributed.initialize` and also switches on what copies between
processes need (a transfer server per process, `jax_cross_host_transfer_socket_address`), with
short failure timeouts: a process that dies is noticed by the others within
`heartbeat_timeout_seconds`, and a copy that waits for a dead peer fails after
`transfer_timeout_seconds`, instead of hanging. Without arguments it reads what `python -m
pesto_ir.launch` sets (`PESTO_COORDINATOR`, `PESTO_NUM_PROCESSES`, `PESTO_PROCESS_ID`), else leaves
the detection to JAX (SLURM, Open MPI, Kubernetes jobs, Cloud TPU).
"""

from __future__ import annotations

import os
from typing import Any

from pesto_ir.util.errors import PestoError

ENV_COORDINATOR = "PESTO_COORDINATOR"  # host:port of process 0's coordination service
ENV_PROCESSES = "PESTO_NUM_PROCESSES"
ENV_PROCESS_ID = "PESTO_PROCESS_ID"
ENV_TRANSFER_ADDRESS = "PESTO_TRANSFER_ADDRESS"  # host:port this process serves copies on
HEARTBEAT_SECONDS = 20  # a silent process is declared dead after this long (JAX's default: 100 s)
TRANSFER_SECONDS = 30  # a copy between processes fails after waiting this long for its peer
SHUTDOWN_SECONDS = 10  # at exit, how long a process waits for the others (JAX's default: 300 s, so a
# process that failed with an exception hung that long before its launcher could stop the rest)
KEY_SECONDS = 600  # how long a process waits for process 0's plan (planning can take minutes)


class DistributedError(PestoError):
    """The processes could not start together, or one of them failed."""


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, transfer_address: str | None = None,
               heartbeat_timeout_seconds: int = HEARTBEAT_SECONDS,
               transfer_timeout_seconds: int = TRANSFER_SECONDS, shutdown_timeout_seconds: int = SHUTDOWN_SECONDS,
               initialization_timeout: int = 120) -> None:
    """Join the processes of one job (call it once per process, before any other use of JAX).

    Arguments left out come from the launcher's environment variables, then from JAX's own
    cluster detection. `transfer_address` is the host:port this process serves copies to the
    others on (default: this host as the coordinator reaches it, a port free now)."""
    import jax

    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR)
    num_processes = num_processes if num_processes is not None else _env_int(ENV_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    for name, value in (("num_processes", num_processes), ("process_id", process_id)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise DistributedError(f"{name} must be a whole number >= 0, got {value!r}")
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise DistributedError(f"process_id {process_id} is not below num_processes {num_processes}")
    for name, value in (("heartbeat_timeout_seconds", heartbeat_timeout_seconds),
                        ("transfer_timeout_seconds", transfer_timeout_seconds),
                        ("shutdown_timeout_seconds", shutdown_timeout_seconds),
                        ("initialization_timeout", initialization_timeout)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DistributedError(f"{name} must be a whole number of seconds >= 1, got {value!r}")
    address = transfer_address or os.environ.get(ENV_TRANSFER_ADDRESS) or _address(_local_host(coordinator_address))
    if coordinator_address and process_id not in (None, 0):
        # JAX aborts the process (a native stack trace) when the coordinator never answers: look first
        _wait_for_coordinator(coordinator_address, process_id, initialization_timeout)
    jax.config.update("jax_cross_host_transfer_socket_address", address)
    jax.config.update("jax_cross_host_transfer_timeout_seconds", transfer_timeout_seconds)
    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                   initialization_timeout=initialization_timeout,
                                   heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                                   shutdown_timeout_seconds=shutdown_timeout_seconds)
    except Exception as e:  # JAX raises RuntimeError/ValueError/XlaRuntimeError with long texts
        where = coordinator_address or "the address JAX detected"
        raise DistributedError(f"process {process_id if process_id is not None else '?'} could not join the "
                               f"job at {where}: {_first_line(e)}") from None


def is_multiprocess(devices: Any) -> bool:
    """Whether `devices` (JAX devices) belong to more than one process."""
    return len({d.process_index for d in devices}) > 1


_shared_count: dict[str, int] = {}


def shared_text(name: str, make: Any) -> str:
    """`make()` run in process 0, its text given to every process (the n-th call with `name` in
    each process gets the n-th text process 0 made under it)."""
    import jax
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None or jax.process_count() == 1:
        return str(make())
    n = _shared_count[name] = _shared_count.get(name, 0) + 1
    key = f"pesto/{name}/{n}"
    if jax.process_index() == 0:
        try:
            text = str(make())
        except BaseException as e:  # the others must not wait for a plan that will never come
            client.key_value_set(key, "\0error\0" + _first_line(e))
            raise
        client.key_value_set(key, text)
        return text
    try:
        text = client.blocking_key_value_get(key, KEY_SECONDS * 1000)
    except Exception as e:
        raise DistributedError(f"process {jax.process_index()} got no {name} from process 0 within "
                               f"{KEY_SECONDS} s: {_first_line(e)}") from None
    if text.startswith("\0error\0"):
        raise DistributedError(f"process 0 failed making the {name}: {text[len(chr(0) + 'error' + chr(0)):]}")
    return str(text)


def fetch(tree: Any) -> Any:
    """Every leaf of `tree` as a NumPy array in every process (a collective: every process must
    call it, with the same structure). A leaf that lives on another process's device is copied
    here; arrays this process holds (or holds a full replica of) are read as they are."""
    import jax
    import numpy as np

    from pesto_ir.jaxrt.cross_process import copy_to_every_process, resident_device  # start-up: JAX

    everyone = set(range(jax.process_count()))

    def one(x: Any) -> Any:
        # decided on what every process sees alike, so that all of them copy, or none
        if not isinstance(x, jax.Array) or (resident_device(x) is None and x.is_fully_addressable):
            return np.asarray(x)  # this process's own array (each has one)
        # annotated: JAX's own annotation of `device_set` names a Device class mypy cannot resolve
        holders: set[jax.Device] = x.sharding.device_set
        if x.is_fully_replicated and {d.process_index for d in holders} == everyone:
            return np.asarray(x.addressable_data(0))
        return np.asarray(copy_to_every_process(x))

    return jax.tree_util.tree_map(one, tree)


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(f"{name}={raw!r} is not a whole number") from None


def _local_host(coordinator: str | None) -> str:
    """This host's address as seen on the way to the coordinator (loopback for a local one)."""
    import socket

    host = (coordinator or "").rsplit(":", 1)[0].strip("[]")
    if not host or host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 1))  # no packet is sent: this only picks the outgoing interface
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _wait_for_coordinator(address: str, process_id: int, seconds: int) -> None:
    """Return once `address` accepts a connection; DistributedError if it does not within `seconds`."""
    import socket
    import time

    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise DistributedError(f"the coordinator address {address!r} is not host:port")
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise DistributedError(f"process {process_id} could not reach the coordinator (process 0) at "
                                       f"{address} within {seconds} s: {e.strerror or e}") from None
        time.sleep(0.2)


def _address(host: str) -> str:
    return f"{host}:{free_port(host)}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of `host` free now (the coordinator's, or a transfer server's: port 0 will not
    do for the latter, as the server announces the address it was given, and peers cannot reach
    port 0, so copies wait for ever)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
