"""valuettl.py: state time-to-live for per-key values held as Python objects (``reduce``, ``process`` and the
unbounded ``join``, which keeps the touch in its own state tuple).

Where a TTL is set, each key's value is kept as a :class:`Touched`: the value and the key's last touch
(processing time: nanoseconds since the epoch of its last write; event time: the largest ``ttl_on`` of its
records), so the touch travels with the value through checkpoints, rescales and restores. :class:`ValueExpiry`
touches a batch's keys and, when :class:`~operators.ttl.Expiry` says the state is due, scans it bin by bin and
deletes the keys whose touch the cutoff passed (a write to their bin: an incremental checkpoint records a
deletion). A value stored without a touch (a bin written by a job without a TTL) takes the time of the first
scan that finds it. The scan is a Python loop over the keys (these values are Python objects), run only once
the oldest touch known is due.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from .dictstate import DictState
from .ttl import Expiry, StateTTL

__all__ = ["ExpiringValues", "Touched", "ValueExpiry", "untouched"]


class Touched:
    """A key's value and its last touch (int64, in the TTL's units)."""

    __slots__ = ("value", "touch")

    def __init__(self, value: Any, touch: int) -> None:
        self.value, self.touch = value, touch

    def __reduce__(self) -> tuple[Any, ...]:
        return Touched, (self.value, self.touch)


def untouched(values: Sequence[Any]) -> list[Any]:
    """The values as the user function sees them (a value written with a TTL loses its touch)."""
    return [v.value if type(v) is Touched else v for v in values]


def _touch_of(value: Any) -> int | None:
    return value.touch if type(value) is Touched else None


def _value_of(value: Any) -> Any:
    return value.value if type(value) is Touched else value


class ValueExpiry:
    """One instance's TTL over a :class:`DictState` of values with touches.

    Args:
        spec: the TTL.
        where: the operator, for messages.
        state: the values (``Touched`` once written here, unless the owner keeps the touch itself).
        touch_of / value_of / retouch: a stored value's touch (``None``: written without one), the value the
            owner sees, and the stored value with a touch; by default the value is wrapped in ``Touched``.
    """

    def __init__(self, spec: StateTTL, where: str, state: DictState,
                 touch_of: Callable[[Any], int | None] = _touch_of, value_of: Callable[[Any], Any] = _value_of,
                 retouch: Callable[[Any, int], Any] = Touched) -> None:
        self.expiry = Expiry(spec, where)
        self.state = state
        self._touch_of, self._value_of, self._retouch = touch_of, value_of, retouch

    @property
    def expired_keys(self) -> int:
        return self.expiry.expired_keys

    def touched(self, rows: pa.RecordBatch, offsets: Sequence[int], values: Sequence[Any],
                stored: Sequence[Any]) -> list[Any]:
        """``values`` of the keys of ``rows`` (key ``i`` has rows ``offsets[i]:offsets[i + 1]``), each with its
        touch: now, or in event time its records' largest time so far (``stored``: what the state held for
        each key before). ``None`` stays ``None``: a deletion."""
        n = len(values)
        bounds = np.asarray(offsets, dtype=np.int64)
        codes = np.repeat(np.arange(n, dtype=np.int64), bounds[1:] - bounds[:-1])
        touches = self.expiry.touches(rows, codes, n).tolist()
        return [None if v is None else Touched(v, max(t, old.touch) if type(old) is Touched else t)
                for v, t, old in zip(values, touches, stored)]

    def watermark(self, watermark: int) -> None:
        self.expiry.watermark(watermark)

    def expire(self) -> list[tuple[Any, Any]]:
        """Delete the keys the TTL says are due; their ``(key, last value)``."""
        due = self.expiry.due(self.state.installs)
        if due is None:
            return []
        cutoff, now = due
        state, gone, oldest = self.state, [], None
        touch_of, value_of = self._touch_of, self._value_of
        for b in state.bins():
            for key, value in list(state.entries(b).items()):
                touch = touch_of(value)
                if touch is None:  # written without a TTL: it starts now
                    state.put(key, b, self._retouch(value_of(value), now))
                    touch = now
                if touch <= cutoff:
                    gone.append((key, b, value_of(value)))
                elif oldest is None or touch < oldest:
                    oldest = touch
        for key, b, _ in gone:
            state.delete(key, b)
        self.expiry.expired(len(gone), oldest)
        return [(key, value) for key, _, value in gone]


class ExpiringValues:
    """What a keyed logic whose values may expire shares (``reduce``, ``process``, ``join``): ``_ttl`` (a
    :class:`ValueExpiry`, or ``None`` without a TTL) checked at each watermark and by :meth:`_expire` before
    each batch, its count as ``expired_keys``. The logic says what its side output gets
    (:meth:`_expired_output`); ``_ttl_verb`` names it in messages until it is opened."""

    _ttl: ValueExpiry | None
    _ttl_verb = "operator"

    @property
    def expired_keys(self) -> int:
        """Keys dropped by the TTL so far (0 without one)."""
        return self._ttl.expired_keys if self._ttl is not None else 0

    def open(self, info: Any) -> None:
        super().open(info)  # type: ignore[misc]
        if self._ttl is not None:
            self._ttl.expiry.where = self.where(self._ttl_verb)  # type: ignore[attr-defined]

    def on_watermark(self, watermark: int) -> list[Any]:
        if self._ttl is None:
            return []
        self._ttl.watermark(watermark)
        return self._expire()

    def _expire(self) -> list[Any]:
        """Drop the keys the TTL says are due; what the side output gets of them, if asked."""
        gone = self._ttl.expire() if self._ttl is not None else []
        if not gone or self._ttl is None or not self._ttl.expiry.spec.side_output:
            return []
        return self._expired_output(gone)

    def _expired_output(self, gone: list[tuple[Any, Any]]) -> list[Any]:
        """The side output's batches for the expired ``(key, last value)`` pairs."""
        raise NotImplementedError
