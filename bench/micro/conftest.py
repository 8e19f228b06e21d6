"""Setup for the hot-path micro-benchmarks.

The backend benchmarks place a graph on 4 CPU devices, so JAX must present several host devices
and must not look for accelerators. Both are read when JAX is first imported, so they are set here,
before the test module imports anything (as tests/conftest.py does for the test suite).
"""

import os

_DEVICE_COUNT = "--xla_force_host_platform_device_count=8"

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} {_DEVICE_COUNT}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
