"""What a list scheduler counts as it goes: its transfers on FIFO links (`LinkQueues`), the
inputs it looks up to time a pair, and the checkpoints where it charges them to the work clock and
stops at its caller's deadline or the time limit's cap (`checkpoint`)."""

from __future__ import annotations

from pesto_ir.passes.placement.common import PlaceGraph, PlacementError
from pesto_ir.util import work

CHECK_EVERY = 256  # steps of a heuristic between readings of the work it did and of the clocks


def checkpoint(algorithm: str, placed: int, step: int | None = None, links: LinkQueues | None = None) -> None:
    """Every `CHECK_EVERY` steps of a heuristic (ops placed, unless its loop counts its `step`s
    otherwise): charge the inputs its `links` looked up since the last checkpoint, and stop it once
    the work clock passes its caller's deadline (`work.stopping_at`) or the time limit's wall-clock
    cap has passed (`work.was_cut`). The list schedules read no clock, and over a large graph and
    many devices one runs for minutes (m-SCT on alpa-gpt-39B's one batch over 64 devices: 139 s)."""
    if (placed if step is None else step) % CHECK_EVERY:
        return
    if links is not None:
        links.charge()
    if work.was_cut():
        raise PlacementError(f"{algorithm}: stopped by the time limit after placing {placed} ops")
    if work.past_stop():
        raise PlacementError(f"{algorithm}: stopped at the end of the work it was given, after placing {placed} ops")


class LinkQueues:
    """When tensors reach devices as a list scheduler commits ops: each tensor is sent once per
    destination, the sends of one link queued first come, first served (FIFO), in the order their
    producers end. `device_of[p]` and `end[p]` are the scheduler's own lists, read as it fills them."""

    def __init__(self, pg: PlaceGraph, device_of: list[int], end: list[float]) -> None:
        self.pg = pg
        self.device_of = device_of
        self.end = end
        self.link_free = [[0.0] * pg.k for _ in range(pg.k)]
        self.arrival: dict[tuple[int, int], float] = {}  # (producer, device) -> when its data is there
        self.looked_up = 0  # inputs looked up: a call, plus the producers it reads (`data-ready` work)
        self.charged = 0  # ... of them charged to the work clock

    def charge(self) -> None:
        """Charge the work clock the inputs looked up since the last charge."""
        work.charge("data-ready", self.looked_up - self.charged)
        self.charged = self.looked_up

    def data_ready(self, v: int, d: int, commit: bool = False) -> float:
        """When every input of op v can be on device d (transfers queued on their links); `commit`
        books the transfers this needs."""
        preds = self.pg.preds[v]
        self.looked_up += 1 + len(preds)
        if not preds:
            return 0.0
        pg = self.pg
        t = 0.0
        pending: dict[int, list[tuple[float, int, int]]] = {}
        for p, nbytes in preds:
            dp = self.device_of[p]
            if dp == d:
                t = max(t, self.end[p])
                continue
            at = self.arrival.get((p, d))
            if at is not None:
                t = max(t, at)
            else:
                pending.setdefault(dp, []).append((self.end[p], p, nbytes))
        for dp, sends in pending.items():
            free = self.link_free[dp][d]
            for ready, p, nbytes in sorted(sends):
                free = max(ready, free) + pg.transfer_time(dp, d, nbytes)
                if commit:
                    self.arrival[(p, d)] = free
                t = max(t, free)
            if commit:
                self.link_free[dp][d] = free
        return t
