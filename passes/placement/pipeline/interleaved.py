"""Interleaved layouts of a pipeline: chunks of consecutive forward units dealt round the devices.

Contiguous stages balance the devices only as finely as k runs of whole units can, and each
device waits for the pipeline to fill before its first work and to drain after its last.
`interleaved_layouts` deals chunks of consecutive forward units round the devices (v chunks per
device for several v, round robin or snake, filled from either end), which puts work on every
device early and late in the step and balances at a finer grain. `pipeline_plan`
(`schedules.py`) simulates and justifies their eager schedules.
"""

from __future__ import annotations

from collections.abc import Sequence

CHUNKS_PER_DEVICE = (1, 2, 3, 4, 6, 8)  # interleaved layouts: chunks per device ...
SLACKS = (1.1, 1.25)  # ... and how far past total / k a device's chunks may take it (the second if the first fails)


def interleaved_layouts(weights: list[list[float]], k: int, alike: bool = False) -> list[tuple[str, list[int]]]:
    """Distinct layouts of the forward units (their owned units' `weights` per device, in forward
    order) over k devices: `interleaved_cut` for each count of chunks per device and device order
    (round robin: 0, 1, .., k-1, 0, ..; snake: 0, .., k-1, k-1, .., 0, ..), with the first slack
    that gives one, filled from the first unit and from the last (a large last layer gets its
    device first, the units before it fill what is left). With `alike` devices (and links) a layout
    that only renames the devices of another is left out."""
    orders = {"round-robin": list(range(k)), "snake": [*range(k), *reversed(range(k))]}
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[str, list[int]]] = []
    for start in ("", " from the end"):
        for per_device in CHUNKS_PER_DEVICE:
            for name, order in orders.items():
                found = _first_cut(weights[::-1] if start else weights, order, per_device)
                if found is None:
                    continue
                found = found[::-1] if start else found
                key = _renamed(found) if alike else tuple(found)
                if key in seen:
                    continue
                seen.add(key)
                chunks = 1 + sum(1 for a, b in zip(found, found[1:]) if a != b)
                out.append((f"{chunks} chunks in {name} order{start}", found))
    return out


def _first_cut(weights: list[list[float]], order: Sequence[int], per_device: int) -> list[int] | None:
    """`interleaved_cut` with the first of `SLACKS` that gives one."""
    for slack in SLACKS:
        found = interleaved_cut(weights, order, per_device, slack)
        if found is not None:
            return found
    return None


def _renamed(devices: list[int]) -> tuple[int, ...]:
    """`devices` with the devices numbered in the order they first appear."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(d, len(first)) for d in devices)


def interleaved_cut(weights: list[list[float]], order: Sequence[int], per_device: int, slack: float
                    ) -> list[int] | None:
    """The device of each item (`weights[i][d]`, in order): items fill chunks of about the mean
    total / (k x `per_device`) each, chunk c going to the next device of the cycle `order` that
    stays within `slack` x the mean total / k; None when no device can take an item. A layout that
    puts every device's work early and late in the step: it fills and drains a pipeline sooner
    than k contiguous stages (Megatron-LM's interleaved stages), and balances it at a finer grain."""
    k = len(weights[0]) if weights else 1
    total = sum(sum(w) / k for w in weights)
    target, cap = total / (k * per_device), slack * total / k
    load = [0.0] * k
    out: list[int] = []
    c, chunk = 0, 0.0
    for w in weights:
        mean = sum(w) / k
        if chunk > 0 and chunk + mean / 2 > target:  # this chunk is full: the next device
            c, chunk = c + 1, 0.0
        for _ in range(len(order)):  # past devices without room for the item
            if load[order[c % len(order)]] + w[order[c % len(order)]] <= cap * (1 + 1e-12):
                break
            c, chunk = c + 1, 0.0
        else:
            return None
        d = order[c % len(order)]
        out.append(d)
        load[d] += w[d]
        chunk += mean
    return out
