"""Pausing Python's cyclic garbage collector while building large graphs.

Lowering or parsing allocates millions of small objects and frees almost none; the collector
would rescan the growing heap again and again (2-3x the build time at 10k-100k ops).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
