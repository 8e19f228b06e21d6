"""The time a search may spend, as one object: where it started and how long it has, on the
work clock (`util/work.py`: work counted, so that the same input stops at the same points on a
quiet or a busy machine).

Searches split their time limit into shares (the heuristics' floor, the coarse solve, refinement,
justification) and stop stages at points inside it. A `Budget` says each of those once (`at`,
`share`, `left`, `spent`) instead of each stage keeping its own start time and adding seconds to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pesto_ir.util import work


@dataclass(frozen=True)
class Budget:
    """`seconds` of work from `started` (a `work.now()` reading)."""

    seconds: float
    started: float

    @staticmethod
    def start(seconds: float) -> Budget:
        """A budget of `seconds` starting now."""
        return Budget(seconds, work.now())

    @property
    def deadline(self) -> float:
        """The clock reading at which the budget is spent."""
        return self.started + self.seconds

    def at(self, share: float) -> float:
        """The clock reading when `share` of the budget (0 to 1) has passed."""
        return self.started + self.seconds * share

    def share(self, fraction: float) -> float:
        """`fraction` of the budget, in seconds."""
        return self.seconds * fraction

    def spent(self) -> float:
        """Seconds since the budget started."""
        return work.now() - self.started

    def left(self) -> float:
        """Seconds until the deadline (negative once past it)."""
        return self.deadline - work.now()
