"""inflight.py: calls in flight per receiver, a window of them at most, what comes meanwhile coalesced.

It sits in the bottom layer because every layer above uses it: a host's
transport (one call per peer), the controller's injections (one call per
host), the driver's op sender (one call per controller) and a Spark task's
pushes (``window`` per reader). A Ray call costs far more than what it
carries, so a busy receiver gets fewer, fuller calls; an idle one gets its
item at once. The window only keeps the books: callers make the calls, wait
for them and say when each returned.

Example:
    >>> calls = CallWindow(merge=concat)
    >>> calls.offer("host", [1])  # nothing in flight: goes now
    [1]
    >>> calls.offer("host", [2]) is None and calls.offer("host", [3]) is None  # coalesced
    True
    >>> calls.returned("host"), calls.take("host")  # the call came back: what waited goes
    (True, [2, 3])
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Callable, Generic, TypeVar

from chiray.operators.validation import _require

__all__ = ["CallWindow", "concat"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
X = TypeVar("X")


def concat(queued: list[X], more: list[X]) -> list[X]:
    """A ``merge`` for lists: ``more`` appended to ``queued`` (in place; the window owns what is queued)."""
    queued.extend(more)
    return queued


class CallWindow(Generic[K, T]):
    """Per receiver: at most ``window`` calls in flight; what is put meanwhile waits, merged into one item.

    Args:
        merge: ``merge(queued, item)`` folds ``item`` into what already waits for the same receiver
            (in the order put) and returns the result; it may change ``queued`` in place. ``None``:
            items are never coalesced, the caller puts only while the receiver has room (see ``full``).
        window: calls in flight per receiver (1: one call at a time).

    Raises:
        ValueError: ``window`` is not an int >= 1.

    Lifecycle: per receiver, ``put`` queues, ``take`` claims a call for what is queued (when there is
    room), ``returned`` gives the call's room back; ``forget`` and ``clear`` drop receivers, and a
    later ``returned`` for them is ignored. Only its owner touches a window (one event loop, or
    under the owner's lock); it makes no calls, waits for nothing and never blocks.
    """

    def __init__(self, merge: Callable[[T, T], T] | None = None, window: int = 1) -> None:
        _require("window", window)
        self._merge = merge
        self._window = window
        self._queued: dict[K, T] = {}  # receiver -> what waits for its next call (insertion order)
        self._calls: dict[K, int] = {}  # receiver -> calls in flight (absent: none)

    @property
    def idle(self) -> bool:
        """Nothing waits to be sent (calls may still be in flight)."""
        return not self._queued

    def put(self, key: K, item: T) -> None:
        """Queue ``item`` for ``key``, merged into what already waits there."""
        if key not in self._queued:
            self._queued[key] = item
        elif self._merge is None:
            raise RuntimeError(f"bug in the caller of CallWindow: a second item for {key!r} with no merge")
        else:
            self._queued[key] = self._merge(self._queued[key], item)

    def take(self, key: K, spare: int = 0) -> T | None:
        """What waits for ``key`` if it has room for a call (then counted in flight), else None. ``spare``:
        calls beyond the window that this take may use (for what must not wait behind the calls in flight)."""
        if key not in self._queued or self._calls.get(key, 0) >= self._window + spare:
            return None
        self._calls[key] = self._calls.get(key, 0) + 1
        return self._queued.pop(key)

    def offer(self, key: K, item: T) -> T | None:
        """``put`` then ``take``: what to send to ``key`` now, or None (it waits for a call to return)."""
        self.put(key, item)
        return self.take(key)

    def returned(self, key: K) -> bool:
        """A call to ``key`` returned (or failed): its room is free. False: none was in flight (forgotten)."""
        calls = self._calls.get(key, 0)
        if calls == 0:
            return False
        if calls == 1:
            del self._calls[key]
        else:
            self._calls[key] = calls - 1
        return True

    def ready(self) -> list[K]:
        """The receivers that have something waiting and room for a call, in the order they were queued."""
        return [key for key in self._queued if self._calls.get(key, 0) < self._window]

    def queued(self, key: K) -> bool:
        """Something waits for ``key``."""
        return key in self._queued

    def waiting(self, key: K) -> T | None:
        """What waits for ``key`` (not taken), or None."""
        return self._queued.get(key)

    def in_flight(self, key: K) -> int:
        """Calls to ``key`` in flight."""
        return self._calls.get(key, 0)

    def full(self, key: K) -> bool:
        """``key`` has ``window`` calls in flight: what is put waits."""
        return self._calls.get(key, 0) >= self._window

    def forget(self, key: K) -> None:
        """Drop ``key``: what waits for it, and its calls in flight (their returns are ignored)."""
        self._queued.pop(key, None)
        self._calls.pop(key, None)

    def clear(self) -> None:
        """Drop every receiver (``forget`` each). Idempotent."""
        self._queued.clear()
        self._calls.clear()
