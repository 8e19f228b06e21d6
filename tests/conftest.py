"""Test setup shared by every test file.

JAX must see several (CPU) devices for the multi-device tests, and must not look for
accelerators; both are fixed at import time, so they are set before anything imports JAX.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

MSR = Path(__file__).resolve().parents[1] / "graphs" / "msr"  # the MSR graphs, in the repository
BERT24 = MSR / "bert24_training_layer.json"


def _msr_graph(name: str):  # type: ignore[no-untyped-def]
    """The MSR graph `name` (graphs/msr/NAME.json), loaded."""
    import pesto_ir

    return pesto_ir.load(MSR / f"{name}.json")


@pytest.fixture(scope="module")
def bert24():  # type: ignore[no-untyped-def]
    """The MSR BERT-24 training layer graph (64 layers' worth of ops, measured costs)."""
    return _msr_graph("bert24_training_layer")


@pytest.fixture(scope="module")
def resnet50_layer():  # type: ignore[no-untyped-def]
    """The MSR ResNet-50 training layer graph (354 ops, measured costs)."""
    return _msr_graph("resnet50_training_layer")


@pytest.fixture(scope="module")
def gnmt_layer():  # type: ignore[no-untyped-def]
    """The MSR GNMT-8 training layer graph (192 ops, measured costs)."""
    return _msr_graph("gnmt_training_layer")


@pytest.fixture
def sigint_reaches_python() -> Iterator[None]:
    """Takes JAX's and Hypothesis's garbage-collection callbacks out for a test that sends itself
    SIGINT. Both register one once other tests in this process have used them; a SIGINT that comes
    while one runs is printed and dropped ("Exception ignored in: <function _xla_gc_callback>", or
    hypothesis's `gc_callback`), and the interrupt under test is lost (1 run in 3 to 8 of
    tests/test_cli_hardening.py, with other work on the machine, for JAX's; once in a full run for
    Hypothesis's). `pesto-compile` imports neither on a cost graph. The list is changed in place:
    the collector holds it, not the module attribute. SIGINT gets Python's own handler for the test:
    a shell starts a background job (`pytest &`) with SIGINT ignored, and Python keeps it so."""
    import gc
    import signal

    theirs = [cb for cb in gc.callbacks
              if (getattr(cb, "__module__", "") or "").startswith(("jax", "hypothesis"))]
    for cb in theirs:
        gc.callbacks.remove(cb)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        gc.callbacks.extend(theirs)
