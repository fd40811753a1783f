"""tracker.py: non-blocking tracking of one control op at one instance.

Same interface as ``alignment``'s states; the processor blocks nothing for it:
data keeps flowing on every input while the op's handlers run on first, each
and last arrival.
"""

from __future__ import annotations

from .alignment import AlignmentState

__all__ = ["Tracking"]


class Tracking(AlignmentState):
    """A non-blocking op's progress: like alignment; the processor holds back no input for it."""

    __slots__ = ()

    def _next(self) -> "AlignmentState":
        return self
