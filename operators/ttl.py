"""ttl.py: state time-to-live for keyed operators: when a key's state expires, and the counting of expiries.

A keyed operator given ``ttl=`` drops a key's state once the key has not been
written for that long, so that a job keyed by an unbounded domain (sessions,
users, devices) holds only its recent keys:

* ``ttl_time="processing"`` (the default): wall-clock time since the key's last
  write, read from :attr:`StateTTL.clock` (``time.time``; tests inject a fake).
* ``ttl_time="event"``: event time on column ``ttl_on``: a key expires once the
  operator's watermark reaches the largest time of its records plus ``ttl``.
  Durations follow :mod:`operators.eventtime` (a ``timedelta`` on a timestamp
  column, ticks on an integer one).

Expiry is checked when the instance takes a batch (before applying it: an
expired key that comes back starts afresh) and at each watermark; a check
scans the state only once the oldest touch it knows of is due, so an instance
whose keys stay fresh pays a comparison per batch. An expired key's drop is a
write to its bin (an incremental checkpoint records it as a deletion), its
count is the operator's ``expired_keys`` (``job.statistics()``), and with
``expired_side_output=True`` its last result goes to
``stream.side_output("expired")``.

Example:
    >>> import datetime
    >>> spec = state_ttl("operator 'count'", datetime.timedelta(minutes=5), "processing", None, False, None)
    >>> spec.time, spec.ttl
    ('processing', datetime.timedelta(seconds=300))
"""

from __future__ import annotations

import dataclasses
import datetime
from time import time as wall_time
from typing import Any, Callable, Literal, TypeAlias

import numpy as np
import pyarrow as pa

from .eventtime import Duration, check_time_field, show_duration, ticks, time_values

__all__ = ["EXPIRED", "TTLTime", "StateTTL", "state_ttl", "Expiry"]

EXPIRED = "expired"
"""The side output that receives the expired keys' last results."""

TTLTime: TypeAlias = Literal["processing", "event"]
"""What a TTL counts: wall-clock time since a key's last write, or event time behind the watermark."""

_TIMES = ("processing", "event")
_NO_WATERMARK = -(1 << 63)


@dataclasses.dataclass(frozen=True, slots=True)
class StateTTL:
    """How long a keyed operator keeps a key's state after its last write (checked by :func:`state_ttl`).

    Attributes:
        ttl: the time to live: a ``timedelta`` (processing time; event time on a timestamp column) or
            ticks of an integer event-time column.
        time: ``"processing"`` or ``"event"``.
        on: event time: the column whose largest value per key is the key's last time.
        side_output: also emit the expired keys' last results on the side output ``"expired"``.
        clock: processing time: seconds since the epoch (tests pass a fake clock).
    """

    ttl: Duration
    time: str = "processing"
    on: str | None = None
    side_output: bool = False
    clock: Callable[[], float] = wall_time


def state_ttl(where: str, ttl: Any, ttl_time: Any, ttl_on: Any, side_output: Any,
              schema: pa.Schema | None, clock: Callable[[], float] = wall_time) -> StateTTL | None:
    """The TTL a keyed verb was given (``None`` without ``ttl``), checked as early as the schema allows.

    Raises:
        ValueError: an unknown ``ttl_time``, a TTL that is not positive, ``ttl_on`` missing for event time or
            given for processing time, an option given without ``ttl``, or an unknown ``ttl_on`` column.
        TypeError: a ``ttl`` of the wrong type, or a ``ttl_on`` column that cannot hold event time.
    """
    if ttl is None:
        if ttl_on is not None or side_output:
            raise ValueError(f"{where}: ttl_on and expired_side_output need a ttl")
        return None
    if ttl_time not in _TIMES:
        raise ValueError(f"{where}: ttl_time must be one of {_TIMES}, got {ttl_time!r}")
    shown = f"{where}: ttl={show_duration(ttl)}"
    if ttl_time == "processing":
        if ttl_on is not None:
            raise ValueError(f"{where}: ttl_on={ttl_on!r} names an event-time column, but ttl_time is "
                             "'processing' (pass ttl_time='event')")
        if not isinstance(ttl, datetime.timedelta):
            raise TypeError(f"{shown}: a processing-time TTL is a timedelta, got {type(ttl).__name__}")
        if ttl <= datetime.timedelta(0):
            raise ValueError(f"{shown} must be positive")
    else:
        if ttl_on is None:
            raise ValueError(f"{where}: an event-time TTL needs ttl_on, the event-time column of the records")
        check_time_field(schema, ttl_on, where)
        column_type = schema.field(ttl_on).type if schema is not None else None
        if column_type is not None or not isinstance(ttl, datetime.timedelta):
            if not ticks(ttl, column_type, shown, ttl_on):
                raise ValueError(f"{shown} must be positive")
        elif ttl <= datetime.timedelta(0):
            raise ValueError(f"{shown} must be positive")
    return StateTTL(ttl, ttl_time, ttl_on, bool(side_output), clock)


class Expiry:
    """One instance's TTL: the touches of a batch's keys, when the state is due a scan, and the count of
    keys expired (``expired_keys``). Only the owning logic touches it.

    Touches are int64: nanoseconds since the epoch (processing time) or ticks of the event-time column.
    """

    def __init__(self, spec: StateTTL, where: str) -> None:
        self.spec = spec
        self.where = where
        self.expired_keys = 0
        self._ttl: int | None = None  # in touch units, once known
        self._due: int | None = None  # no key expires before this touch time; None: none known
        self._installs = -1  # the state's installs when last scanned: bins that arrived since are unknown
        self._watermark = _NO_WATERMARK
        if spec.time == "processing":
            self._ttl = int(spec.ttl // datetime.timedelta(microseconds=1)) * 1000  # type: ignore[operator]
        elif not isinstance(spec.ttl, datetime.timedelta):
            self._ttl = int(spec.ttl)  # ticks of an integer column (a timedelta waits for the column's unit)

    def touches(self, batch: pa.RecordBatch, codes: np.ndarray, n: int) -> np.ndarray:
        """Each of the ``n`` keys of ``batch`` (row ``i`` is key ``codes[i]``): its touch now."""
        if self.spec.time == "processing":
            out = np.full(n, self._now(), dtype=np.int64)
        else:
            column = self.spec.on
            assert column is not None
            if self._ttl is None:
                check_time_field(batch.schema, column, self.where)
                self._ttl = ticks(self.spec.ttl, batch.schema.field(column).type,
                                  f"{self.where}: ttl={show_duration(self.spec.ttl)}", column)
            out = np.full(n, _NO_WATERMARK, dtype=np.int64)
            np.maximum.at(out, codes, time_values(batch, column, self.where))
        if n and self._ttl is not None:
            soonest = int(out.min()) + self._ttl
            self._due = soonest if self._due is None else min(self._due, soonest)
        return out

    def watermark(self, watermark: int) -> None:
        """Event time reached ``watermark``."""
        self._watermark = max(self._watermark, int(watermark))

    def due(self, installs: int) -> tuple[int, int] | None:
        """``(cutoff, now)`` if the state should be scanned now (keys touched at or before ``cutoff``
        expire; keys of unknown touch take ``now``), else ``None``. ``installs``: the state's count of
        installs (bins that arrived since the last scan hold touches not seen here)."""
        if self._ttl is None:
            return None
        now = self._now()
        if now == _NO_WATERMARK:
            return None
        if installs == self._installs and (self._due is None or now < self._due):
            return None
        self._installs = installs
        return now - self._ttl, now

    def expired(self, count: int, oldest: int | None) -> None:
        """A scan expired ``count`` keys; the oldest touch left is ``oldest`` (``None``: no key left)."""
        self.expired_keys += count
        self._due = None if oldest is None or self._ttl is None else oldest + self._ttl

    def _now(self) -> int:
        if self.spec.time == "processing":
            return int(self.spec.clock() * 1e9)
        return self._watermark
