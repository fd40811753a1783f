"""eventtime.py: event time in columns: which types hold it, its integer ticks, and durations in those ticks.

Event time is an integer per record: the value of an integer column, or the
physical value of a ``timestamp`` column (ticks of its unit). Watermarks,
window bounds and timers are integers in the same ticks, so a duration given
as a ``datetime.timedelta`` is converted with the unit of the column it
applies to (an integer column takes integer durations only).

A watermark ``w`` promises that no record with time ``<= w`` follows.
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["Duration", "is_time_type", "check_time_field", "time_values", "ticks"]

Duration = int | datetime.timedelta
"""A length of event time: ticks of the time column, or a ``timedelta``."""

_TICKS_PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


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


def ticks(duration: Any, t: pa.DataType | None, what: str) -> int:
    """``duration`` in ticks of a column of type ``t`` (``None``: not known yet, integers only).

    Raises:
        TypeError: a ``timedelta`` for an integer column, or neither an int nor a timedelta.
        ValueError: a negative duration.
    """
    if isinstance(duration, bool) or not isinstance(duration, (int, np.integer, datetime.timedelta)):
        raise TypeError(f"{what} must be an int (ticks of the time column) or a timedelta, got {duration!r}")
    if isinstance(duration, datetime.timedelta):
        if t is None or not pa.types.is_timestamp(t):
            raise TypeError(f"{what} is a timedelta but the time column is {t or 'of unknown type'}; "
                            "use an int (ticks of the column) or a timestamp column")
        unit = t.unit  # type: ignore[attr-defined]
        value = (duration // datetime.timedelta(microseconds=1)) * _TICKS_PER_S[unit] // 1_000_000
    else:
        value = int(duration)
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {duration!r}")
    return value
