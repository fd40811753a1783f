"""scheduler.py: which of a host's instances runs next: candidates in turn, timers, injected sources.

An instance becomes a *candidate* whenever something it may wait for
changes (a delivery, credit, a control message); the scheduler asks
candidates in turn whether they can run, and puts one that can at the back
of the line. A paced source whose next batch is not due gets a timer
instead; a source that was given a control message (an op injected at
hundreds of sources at once) is on the *injected* fast path, taken before
anything else.

What it needs of an instance is :class:`Schedulable`. Only the owning host
touches a scheduler, and it reads no clock: ``now`` comes with every call.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from typing import Generic, Hashable, Iterable, Protocol, TypeVar

__all__ = ["RECHECK_S", "Schedulable", "Scheduler"]

RECHECK_S = 0.05
"""A source whose next batch is not due is looked at again after at most this long."""


class Schedulable(Hashable, Protocol):
    """What the scheduler asks of an instance."""

    is_source: bool

    @property
    def finished(self) -> bool:
        """Its input ended and its final output went out."""

    @property
    def halted(self) -> bool:
        """A source that reads nothing until resumed."""

    @property
    def exhausted(self) -> bool:
        """A source that read its last batch (held open, it waits for a control op)."""

    def runnable(self, now: float) -> bool:
        """Work to do and credit on every output."""

    def wake_time(self) -> float | None:
        """For a paced source: when its next batch is due."""

    def outputs_blocked(self) -> bool:
        """Some output channel holds messages waiting for credit."""


T = TypeVar("T", bound=Schedulable)


class Scheduler(Generic[T]):
    """Candidates in turn (ordered, each at most once), one live timer per instance, injected sources."""

    def __init__(self, instances: list[T]):
        self._candidates: collections.OrderedDict[T, None] = collections.OrderedDict.fromkeys(instances)
        self._timers: list[tuple[float, int, T]] = []
        self._timer_due: dict[T, float] = {}  # each instance's one live timer (other entries are stale)
        self._seq = itertools.count()
        self._injected: dict[T, None] = {}

    def wake(self, inst: T) -> None:
        """``inst`` may be runnable: ask it in turn."""
        self._candidates[inst] = None

    def injected(self, inst: T) -> None:
        """``inst`` (a source) was given a control message: the host's next step takes it first."""
        self._injected[inst] = None

    def take_injected(self) -> Iterable[T]:
        """The sources given control messages since the last call."""
        if not self._injected:
            return ()
        out, self._injected = self._injected, {}
        return out

    def forget(self, inst: T) -> None:
        """``inst`` left the host."""
        self._candidates.pop(inst, None)
        self._timer_due.pop(inst, None)
        self._injected.pop(inst, None)

    def next_runnable(self, now: float) -> T | None:
        """The next candidate that can run at ``now`` (it goes to the back of the line), or None."""
        while self._timers and self._timers[0][0] <= now:
            due, _, inst = heapq.heappop(self._timers)
            if self._timer_due.get(inst) == due:
                del self._timer_due[inst]
                self._candidates[inst] = None
        candidates = self._candidates
        while candidates:
            inst = candidates.popitem(last=False)[0]
            if inst.runnable(now):
                candidates[inst] = None  # it may have more: back of the line
                return inst
            wake = inst.wake_time()
            if wake is not None and wake > now:
                # Re-check a paced source at least every RECHECK_S: what it waits for may change.
                self.set_timer(inst, min(wake, now + RECHECK_S))
            elif (inst.is_source and not inst.finished and not inst.halted and not inst.exhausted
                  and not inst.outputs_blocked()):
                # It became due between the two questions (a reader waiting on another process):
                # look again at the next step rather than never. A halted or an exhausted one waits for a
                # control op instead (a resume, or the op it is held open for), which wakes it: no timer.
                self.set_timer(inst, now)
        return None

    def set_timer(self, inst: T, due: float) -> None:
        """Look at ``inst`` again at ``due``, unless it has a timer due no later: one live timer per
        instance, however often it is found waiting (each op makes every source a candidate once)."""
        current = self._timer_due.get(inst)
        if current is not None and current <= due:
            return
        self._timer_due[inst] = due  # an entry due later, if any, is now stale
        heapq.heappush(self._timers, (due, next(self._seq), inst))

    @property
    def pending_timers(self) -> int:
        """Timer entries waiting (stale ones included)."""
        return len(self._timers)

    @property
    def next_timer(self) -> float | None:
        """When the earliest timer is due (possibly a stale one: waking early is harmless)."""
        return self._timers[0][0] if self._timers else None
