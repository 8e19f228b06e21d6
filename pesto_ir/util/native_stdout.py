"""What native solvers (CBC, HiGHS) print on file descriptor 1, kept out of the command's output."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def native_stdout_silenced() -> Iterator[None]:
    """File descriptor 1 goes to /dev/null for the duration: what native solvers print there (CBC's
    simplex even at log level 0, HiGHS's banner) stays out of the command's output."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no usable descriptor 1 (embedded interpreters): nothing to silence
        yield
        return
    os.dup2(null, 1)
    os.close(null)
    try:
        yield
    finally:
        flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)


def flush_c_stdio() -> None:
    """Flush the C library's stdout buffer, so nothing a native solver printed lands after fd 1 is restored."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C runtime to reach: nothing was buffered through it
        pass
