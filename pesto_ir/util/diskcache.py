"""A small on-disk JSON cache for measurements (profiled op times, fitted link figures).

Measuring on real devices is slow, and the answers only change with the op and the machine
(`pesto_ir.cluster.host.machine_key`: device kind, processor, cores, JAX version), so they are kept under `$PESTO_CACHE` (default `~/.cache/pesto-ir`), one small
JSON file per key, each written atomically. A broken or unreadable entry counts as missing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pesto_ir.util.loader import write_atomic


def cache_dir() -> Path:
    """Where measurements are kept: `$PESTO_CACHE`, else `~/.cache/pesto-ir`."""
    env = os.environ.get("PESTO_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pesto-ir"


def _path(namespace: str, key: str) -> Path:
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
    return cache_dir() / namespace / f"{digest}.json"


def cache_get(namespace: str, key: str) -> Any | None:
    """The value stored under `key`, or None when there is none (or it cannot be read)."""
    p = _path(namespace, key)
    try:
        entry = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None  # a hash collision or a foreign file: treat as missing
    return entry.get("value")


def cache_put(namespace: str, key: str, value: Any) -> None:
    """Store `value` (JSON-able) under `key`; a cache that cannot be written is skipped silently."""
    p = _path(namespace, key)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, json.dumps({"key": key, "value": value}))
    except OSError:
        pass
