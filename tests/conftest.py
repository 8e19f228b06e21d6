"""Test setup shared by every test file.

JAX must see several (CPU) devices for the multi-device tests, and must not look for
accelerators; both are fixed at import time, so they are set before anything imports JAX.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

BERT24 = Path("/work/shared/graphs/msr/bert24_training_layer.json")


@pytest.fixture(scope="module")
def bert24():  # type: ignore[no-untyped-def]
    """The MSR BERT-24 training layer graph (64 layers' worth of ops, measured costs)."""
    import pesto_ir

    if not BERT24.exists():
        pytest.skip(f"{BERT24} is not here")
    return pesto_ir.load(BERT24)


@pytest.fixture(scope="module")
def resnet50_layer():  # type: ignore[no-untyped-def]
    """The MSR ResNet-50 training layer graph (354 ops, measured costs)."""
    import pesto_ir

    path = BERT24.parent / "resnet50_training_layer.json"
    if not path.exists():
        pytest.skip(f"{path} is not here")
    return pesto_ir.load(path)
