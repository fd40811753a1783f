"""clock.py: the suite's fake clock, for code that takes a ``clock`` callable (trio's ``MockClock``).

Time moves only when a test moves it: set :attr:`FakeClock.now` or call
:meth:`FakeClock.advance`; the code under test reads it by calling the clock.
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A monotonic-clock stand-in: ``clock()`` returns :attr:`now`, which only the test changes.

    It starts away from zero (1000.0 by default), so code that mistakes a time for a duration shows.
    """

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` forward; the new time.

        Raises:
            ValueError: ``seconds`` is negative (a monotonic clock never goes back).
        """
        if seconds < 0:
            raise ValueError(f"a monotonic clock never goes back, got {seconds}")
        self.now += seconds
        return self.now
