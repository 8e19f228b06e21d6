"""Test setup shared by every test file.

JAX must see several (CPU) devices for the multi-device tests, and must not look for
accelerators; both are fixed at import time, so they are set before anything imports JAX.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
