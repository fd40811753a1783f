"""alignment.py: blocking alignment of one control op at one instance, as small state objects.

Each state's ``arrive`` returns the next state. While collecting, the
channels the message already arrived on are *blocked*: the instance takes no
further message from them until the op completes there, so their buffers
fill and back-pressure reaches only those upstream instances (Chi's
asynchronous barrier; Flink's ``WaitingForFirstBarrier`` /
``CollectingBarriers``)::

    WaitingForFirst --arrive--> Collecting --arrive (last)--> Aligned

An input that ends (``End``) before the message arrives on it no longer
counts as expected, so an op always terminates.
"""

from __future__ import annotations

import dataclasses
from typing import Hashable

__all__ = ["AlignmentState", "WaitingForFirst", "Collecting", "Aligned"]


@dataclasses.dataclass(frozen=True, slots=True)
class AlignmentState:
    """Where one op's alignment stands.

    Attributes:
        expected: the inputs (channel ids, or extra-edge senders) the message must arrive on.
        arrived: the inputs it has arrived on.
    """

    expected: frozenset
    arrived: frozenset = frozenset()

    @property
    def complete(self) -> bool:
        return self.expected <= self.arrived

    @property
    def blocked(self) -> frozenset:
        """Inputs to hold back now."""
        return frozenset() if self.complete else self.arrived

    def _next(self, arrived: frozenset, expected: frozenset) -> "AlignmentState":
        if expected <= arrived:
            return Aligned(expected, arrived)
        return Collecting(expected, arrived)

    def arrive(self, source: Hashable) -> "AlignmentState":
        """The message arrived on ``source``.

        Raises:
            RuntimeError: it arrived twice on one input, or on an unexpected one (a bug).
        """
        if source in self.arrived:
            raise RuntimeError(f"bug in alignment: control message arrived twice on {source!r}")
        if source not in self.expected:
            raise RuntimeError(f"bug in alignment: control message arrived on unexpected input {source!r}")
        return self._next(self.arrived | {source}, self.expected)

    def input_ended(self, source: Hashable) -> "AlignmentState":
        """``source`` ended before the message arrived on it: stop expecting it."""
        if source in self.arrived or source not in self.expected:
            return self
        return self._next(self.arrived, self.expected - {source})


class WaitingForFirst(AlignmentState):
    """Nothing has arrived yet."""


class Collecting(AlignmentState):
    """Arrived on some inputs; those are blocked."""


class Aligned(AlignmentState):
    """Arrived on every expected input: run ``on_complete``, then unblock."""
