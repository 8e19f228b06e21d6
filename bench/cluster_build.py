"""How long a cluster of nodes of 8 devices takes to build, write and read back, from 8 to 512 devices.

    python -m bench.cluster_build [--kind h100] [--per-host 8] [--repeats 3]

Every pair of devices has a link (512 devices: 261,632), and planners ask for clusters of up to
`MAX_DEVICES` devices, so building one (`Cluster.homogeneous(n, kind, devices_per_host=p)`),
writing it as pesto-cluster/1 (`to_json` and `json.dumps`) and reading that text back
(`json.loads` and `from_json`) must each stay well under a second. Prints the best of `--repeats`
runs of each, in seconds, and the size of the file.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from pesto_ir.cluster.model import MAX_DEVICES, Cluster


def best(repeats: int, work: Callable[[], Any]) -> tuple[float, Any]:
    """The shortest of `repeats` runs of `work`, in seconds, and what the last run returned."""
    times, out = [], None
    for _ in range(repeats):
        out = None  # free the last run's cluster (261,632 links at 512 devices) outside the timing
        start = time.perf_counter()
        out = work()
        times.append(time.perf_counter() - start)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster_build", description=__doc__.split("\n")[0])
    ap.add_argument("--kind", default="h100", help="built-in device kind (default h100)")
    ap.add_argument("--per-host", type=int, default=8, help="devices per node (default 8)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each step; the best is shown (default 3)")
    args = ap.parse_args(argv)
    sizes = [n for n in (8, 16, 32, 64, 128, 256, 512) if n % args.per_host == 0 and n <= MAX_DEVICES]
    print(f"{'devices':>7} {'links':>7} {'build s':>8} {'to_json s':>9} {'from_json s':>11} {'file KiB':>8}")
    for n in sizes:
        build, cluster = best(args.repeats, lambda n=n: Cluster.homogeneous(n, args.kind, devices_per_host=args.per_host))
        write, text = best(args.repeats, lambda c=cluster: json.dumps(c.to_json()))
        read, back = best(args.repeats, lambda t=text: Cluster.from_json(json.loads(t)))
        assert back.devices == cluster.devices and back.links == cluster.links
        print(f"{n:>7} {len(cluster.links):>7} {build:>8.3f} {write:>9.3f} {read:>11.3f} {len(text) / 1024:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
