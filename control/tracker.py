"""tracker.py: non-blocking tracking of one control op at one instance.

Same interface as ``alignment``'s states, but nothing is ever blocked: data
keeps flowing on every input while the op's handlers run on first, each and
last arrival.
"""

from __future__ import annotations

import dataclasses

from .alignment import AlignmentState

__all__ = ["Tracking"]


@dataclasses.dataclass(frozen=True, slots=True)
class Tracking(AlignmentState):
    """A non-blocking op's progress: like alignment, with ``blocked`` always empty."""

    @property
    def blocked(self) -> frozenset:
        return frozenset()

    def _next(self, arrived: frozenset, expected: frozenset) -> "AlignmentState":
        return Tracking(expected, arrived)
