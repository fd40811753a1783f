"""eventtime.py: event time in columns: which types hold it, its integer ticks, and durations in those ticks.

Event time is an integer per record: the value of an integer column, or the
physical value of a ``timestamp`` column (ticks of its unit). Watermarks,
window bounds and timers are integers in the same ticks. A duration (a
window's size, slide or gap, an allowed lateness, an out-of-orderness) is a
``datetime.timedelta`` on a timestamp column, converted with the column's
unit, and an int on an integer column: a bare number on a timestamp column is
refused (60 on ``timestamp[ms]`` would be 60 ms, rarely what was meant), and
so is a duration too long for 64-bit ticks.

Example:
    >>> import datetime
    >>> ticks(datetime.timedelta(seconds=60), pa.timestamp("ms"), "operator 'w': tumbling(...)", "ts")
    60000
    >>> try:
    ...     ticks(60, pa.timestamp("ms"), "operator 'w': tumbling(60)", "ts")
    ... except DurationUnitError as exc:
    ...     print(exc)
    operator 'w': tumbling(60) on timestamp[ms] column 'ts' would be 60 ms; pass timedelta(seconds=60) (or timedelta(milliseconds=60) if 60 ms is meant)
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import ChirayError

__all__ = ["Duration", "DurationUnitError", "DurationRangeError", "MAX_DURATION", "is_time_type", "check_time_field",
           "time_values", "ticks", "show_duration"]

Duration = int | datetime.timedelta
"""A length of event time: ticks of the time column, or a ``timedelta``."""

_TICKS_PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}

MAX_DURATION = 1 << 62
"""The longest duration in ticks: event time is int64 ticks, and a window's end plus its allowed lateness
must still fit (about 146 years on a ``timestamp[ns]`` column)."""


class DurationUnitError(ChirayError, TypeError):
    """A duration in the wrong form for its time column: a bare number for a timestamp column (which would
    be ticks of its unit), or a ``timedelta`` for an integer column."""


class DurationRangeError(ChirayError, ValueError):
    """A duration longer than event time in 64-bit ticks leaves room for."""


def is_time_type(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` can hold event time (integers and timestamps)."""
    return pa.types.is_integer(t) or pa.types.is_timestamp(t)


def check_time_field(schema: pa.Schema | None, column: str, where: str) -> None:
    """Raise a clear error if ``column`` of ``schema`` (when known) cannot hold event time.

    Raises:
        ValueError: the column is missing.
        TypeError: its type is neither an integer nor a timestamp.
    """
    if not isinstance(column, str) or not column:
        raise ValueError(f"{where}: the event-time column must be a column name, got {column!r}")
    if schema is None:
        return
    if column not in schema.names:
        raise ValueError(f"{where}: unknown event-time column {column!r}; the input has columns {schema.names}")
    t = schema.field(column).type
    if not is_time_type(t):
        raise TypeError(f"{where}: event-time column {column!r} must be a timestamp or an integer, got {t}")


def time_values(batch: pa.RecordBatch, column: str, where: str) -> np.ndarray:
    """The event time of every row of ``batch`` as int64 ticks.

    Raises:
        ValueError: the column is missing or holds nulls.
        TypeError: the column's type cannot hold event time.
    """
    check_time_field(batch.schema, column, where)
    arr = batch.column(column)
    if arr.null_count:
        raise ValueError(f"{where}: event-time column {column!r} has {arr.null_count} null values")
    if pa.types.is_timestamp(arr.type):
        arr = arr.cast(pa.int64())
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)


def ticks(duration: Any, t: pa.DataType | None, what: str, column: str | None = None) -> int:
    """``duration`` in ticks of a column of type ``t`` (``None``: not known yet, integers only).

    A timestamp column takes a ``timedelta`` (or 0): a bare number would be ticks of its unit (60 on a
    ``timestamp[ms]`` column is 60 ms), a trap, so it is refused with the ``timedelta`` to pass.

    Args:
        duration: an int (ticks of an integer column) or a ``timedelta`` (a timestamp column).
        t: the time column's type, if known.
        what: the duration as the user wrote it, with its operator (``"operator 'w': tumbling(60)"``).
        column: the time column's name, for messages.

    Raises:
        DurationUnitError: a bare number for a timestamp column, or a ``timedelta`` for an integer one.
        DurationRangeError: longer than event time in 64-bit ticks leaves room for.
        TypeError: neither an int nor a timedelta.
        ValueError: a negative duration.
    """
    if isinstance(duration, bool) or not isinstance(duration, (int, np.integer, datetime.timedelta)):
        raise TypeError(f"{what} must be an int (ticks of an integer time column) or a timedelta (a timestamp "
                        f"column), got {duration!r}")
    on = f"{t} column {column!r}" if column else f"a {t} column"
    if isinstance(duration, datetime.timedelta):
        if t is None or not pa.types.is_timestamp(t):
            raise DurationUnitError(f"{what} is a timedelta but the time column is {t or 'of unknown type'}; "
                                    "use an int (ticks of the column) or a timestamp column")
        unit = t.unit  # type: ignore[attr-defined]
        value = (duration // datetime.timedelta(microseconds=1)) * _TICKS_PER_S[unit] // 1_000_000
    else:
        value = int(duration)
        if value and t is not None and pa.types.is_timestamp(t):  # 0 is 0 in any unit (the defaults)
            raise DurationUnitError(_bare_number(value, t, what, on))
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {duration!r}")
    if value > MAX_DURATION:
        years = MAX_DURATION / (_TICKS_PER_S.get(getattr(t, "unit", ""), 0) or 1) / 31_557_600
        room = f" (about {years:,.0f} years in {t})" if t is not None and pa.types.is_timestamp(t) else ""
        raise DurationRangeError(f"{what} on {on if t is not None else 'its time column'} is {value:.3g} ticks, "
                                 f"more than the {MAX_DURATION:.3g}{room} that event time in 64-bit ticks leaves "
                                 f"room for; pass a shorter duration")
    return value


_UNIT_NAMES = {"s": ("s", "seconds"), "ms": ("ms", "milliseconds"), "us": ("µs", "microseconds"),
               "ns": ("ns", None)}


def _bare_number(value: int, t: pa.DataType, what: str, on: str) -> str:
    """The message for a bare number given as a duration on timestamp column: what it would have meant."""
    short, keyword = _UNIT_NAMES[t.unit]  # type: ignore[attr-defined]
    also = f" (or timedelta({keyword}={value}) if {value} {short} is meant)" if keyword not in (None, "seconds") \
        else ""
    return f"{what} on {on} would be {value} {short}; pass timedelta(seconds={value}){also}"


def show_duration(duration: Any) -> str:
    """A duration as the user would write it: ``60`` or ``timedelta(seconds=60)``."""
    if isinstance(duration, datetime.timedelta) and not isinstance(duration, bool):
        parts = [f"{k}={v}" for k, v in (("days", duration.days), ("seconds", duration.seconds),
                                           ("microseconds", duration.microseconds)) if v]
        return f"timedelta({', '.join(parts) or '0'})"
    return repr(duration)
