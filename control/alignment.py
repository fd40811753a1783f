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

Each arrival costs O(1): the states share one ``arrived`` set and count the
inputs still missing, so an instance with thousands of inputs aligns in
linear, not quadratic, time. Only the owning instance touches a state.
"""

from __future__ import annotations

import collections
from typing import Collection, Hashable, Iterable

__all__ = ["AlignmentState", "WaitingForFirst", "Collecting", "Aligned"]


class AlignmentState:
    """Where one op's alignment stands.

    Attributes:
        expected: the inputs (channel ids, or extra-edge senders) the message must arrive on.
        arrived: the inputs it has arrived on (shared with the states that follow).
        missing: how many expected inputs it has not arrived on yet.
    """

    __slots__ = ("expected", "arrived", "missing")

    def __init__(self, expected: Iterable[Hashable], arrived: set | None = None, missing: int | None = None):
        self.expected = expected if isinstance(expected, frozenset) else frozenset(expected)
        self.arrived = arrived if arrived is not None else set()
        self.missing = len(self.expected - self.arrived) if missing is None else missing

    def __repr__(self) -> str:
        return f"{type(self).__name__}(arrived {len(self.arrived)}, missing {self.missing})"

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def _next(self) -> "AlignmentState":
        kind = Aligned if self.missing == 0 else Collecting
        return self if type(self) is kind else kind(self.expected, self.arrived, self.missing)

    def arrive(self, source: Hashable) -> "AlignmentState":
        """The message arrived on ``source``.

        Raises:
            RuntimeError: it arrived twice on one input, or on an unexpected one (a bug).
        """
        if source in self.arrived:
            raise RuntimeError(f"bug in alignment: control message arrived twice on {source!r}")
        if source not in self.expected:
            raise RuntimeError(f"bug in alignment: control message arrived on unexpected input {source!r}")
        self.arrived.add(source)
        self.missing -= 1
        return self._next()

    def arrive_all(self, sources: Collection[Hashable]) -> "AlignmentState":
        """The message arrived on each of ``sources`` at once: the same as ``arrive`` on each in turn,
        in one set operation (an instance with thousands of inputs counts a batch of them in one step).

        Raises:
            RuntimeError: it arrived twice on one input, or on an unexpected one (a bug).
        """
        new = set(sources)
        if len(new) != len(sources) or not self.arrived.isdisjoint(new):
            twice = (new & self.arrived) | {s for s, n in collections.Counter(sources).items() if n > 1}
            raise RuntimeError("bug in alignment: control message arrived twice on "
                               f"{', '.join(sorted(map(repr, twice))[:5])}")
        if not new <= self.expected:
            raise RuntimeError("bug in alignment: control message arrived on unexpected input "
                               f"{', '.join(sorted(map(repr, new - self.expected))[:5])}")
        self.arrived |= new
        self.missing -= len(new)
        return self._next()

    def input_ended(self, source: Hashable) -> "AlignmentState":
        """``source`` ended before the message arrived on it: stop expecting it."""
        if source in self.arrived or source not in self.expected:
            return self
        self.expected = self.expected - {source}
        self.missing -= 1
        return self._next()


class WaitingForFirst(AlignmentState):
    """Nothing has arrived yet."""

    __slots__ = ()


class Collecting(AlignmentState):
    """Arrived on some inputs; those are blocked."""

    __slots__ = ()


class Aligned(AlignmentState):
    """Arrived on every expected input: run ``on_complete``, then unblock."""

    __slots__ = ()
