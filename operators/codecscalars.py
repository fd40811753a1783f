"""codecscalars.py: the scalar types of :mod:`operators.codec` beyond JSON's, each as a tagged node and back.

A value of one of these types is written as a JSON object of one tag (``{"dt":
[wall clock, zone, fold]}`` a ``datetime``, ``{"n": [dtype, item]}`` a NumPy
scalar...) and read back from it by the decoder of that tag. A decoder gets
only JSON values, checks what it builds on (a NumPy dtype of the kinds listed
here, a zone by name), and raises ``ValueError``, ``TypeError`` or
``KeyError`` on anything else; the codec reports those as a damaged payload.

Example:
    >>> node = ENCODERS[datetime.date](None, datetime.date(2024, 2, 29))
    >>> node, DECODERS["da"](None, node["da"])
    ({'da': '2024-02-29'}, datetime.date(2024, 2, 29))
"""

from __future__ import annotations

import datetime
import decimal
import zoneinfo
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from .errors import ChirayError

__all__ = ["ENCODERS", "DECODERS", "fallback", "Unsupported"]

JSON_INT = (1 << 63) - 1  # past Python's digits limit for int <-> str, ints beyond this travel as hex
NUMPY_KINDS = "biufcUMm"


class Unsupported(ChirayError):
    """A value outside the codec's types; ``path`` is filled innermost first as the walk unwinds."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.value = value
        self.path: list[str] = []


def fallback(value: Any) -> Callable[[Any, Any], Any]:
    """The encoder of a type outside the exact-type table (NumPy scalars, pandas times), or raise."""
    if isinstance(value, np.generic) and value.dtype.kind in NUMPY_KINDS:
        return _encode_numpy
    kind = type(value)
    if (kind.__module__ or "").startswith("pandas") and kind.__name__ in ("Timestamp", "Timedelta"):
        return _encode_pandas
    raise Unsupported(value)


def _encode_numpy(_: Any, value: np.generic) -> dict[str, Any]:
    kind = value.dtype.kind
    if kind in "Mm":
        item: Any = int(value.view(np.int64))
    elif kind == "c":
        item = [float(value.real), float(value.imag)]  # type: ignore[attr-defined]
    else:
        item = value.item()
    return {"n": [value.dtype.str, item]}


def _encode_pandas(_: Any, value: Any) -> dict[str, Any]:
    if type(value).__name__ == "Timedelta":
        return {"ptd": [int(value.value), value.unit]}
    return {"pt": [int(value.value), value.unit, _zone_name(value)]}


def _zone_name(value: Any) -> str | int | None:
    """How an aware value's zone travels: an IANA name, or a fixed offset in microseconds; None if naive."""
    tz = value.tzinfo
    if tz is None:
        return None
    if isinstance(tz, zoneinfo.ZoneInfo) and tz.key:
        return tz.key
    if isinstance(tz, datetime.timezone):
        return tz.utcoffset(None) // datetime.timedelta(microseconds=1)
    raise Unsupported(value)


def _encode_datetime(_: Any, value: datetime.datetime) -> dict[str, Any]:
    """The wall-clock fields, the zone and the fold: exactly the value, whatever the zone's rules."""
    return {"dt": [value.replace(tzinfo=None).isoformat(), _zone_name(value), value.fold]}


def _encode_time(_: Any, value: datetime.time) -> dict[str, Any]:
    if value.tzinfo is not None and type(value.tzinfo) is not datetime.timezone:
        raise Unsupported(value)  # a zone's offset is unknown without a date
    return {"tm": value.isoformat()}


def _encode_int(_: Any, value: int) -> Any:
    return value if -JSON_INT <= value <= JSON_INT else {"i": format(value, "x")}


ENCODERS: dict[type, Callable[[Any, Any], Any]] = {
    int: _encode_int,
    datetime.datetime: _encode_datetime,
    datetime.date: lambda _, v: {"da": v.isoformat()},
    datetime.time: _encode_time,
    datetime.timedelta: lambda _, v: {"td": [v.days, v.seconds, v.microseconds]},
    decimal.Decimal: lambda _, v: {"dec": str(v)},
    pa.MonthDayNano: lambda _, v: {"mdn": [v.months, v.days, v.nanoseconds]},
}
"""Encoders by exact type: ``encoder(codec_encoder, value) -> node`` (the first argument unused here)."""


def _decode_numpy(_: Any, arg: list[Any]) -> np.generic:
    dtype_text, item = arg
    dtype = np.dtype(dtype_text)
    if dtype.kind not in NUMPY_KINDS:
        raise ValueError(f"a NumPy scalar of dtype {dtype_text!r}")
    if dtype.kind in "Mm":
        scalar = np.array(item, dtype=np.int64).view(dtype)[()]
    else:
        scalar = np.array(complex(*item) if dtype.kind == "c" else item, dtype=dtype)[()]
    return scalar  # type: ignore[no-any-return]


def _zone(name: str | int | None) -> datetime.tzinfo | None:
    if name is None:
        return None
    if isinstance(name, int):
        return datetime.timezone(datetime.timedelta(microseconds=name))
    return zoneinfo.ZoneInfo(name)


def _decode_datetime(_: Any, arg: list[Any]) -> datetime.datetime:
    text, zone, fold = arg
    return datetime.datetime.fromisoformat(text).replace(tzinfo=_zone(zone), fold=fold)


def _decode_pandas_timestamp(_: Any, arg: list[Any]) -> Any:
    import pandas as pd  # only payloads that hold pandas values need pandas

    ticks, unit, zone = arg
    return pd.Timestamp(ticks, tz=_zone(zone)).as_unit(unit)


def _decode_pandas_timedelta(_: Any, arg: list[Any]) -> Any:
    import pandas as pd

    ticks, unit = arg
    return pd.Timedelta(ticks).as_unit(unit)


def _decode_big_int(_: Any, text: str) -> int:
    if not isinstance(text, str):
        raise ValueError("a big int that is not hex text")
    return int(text, 16)


DECODERS: dict[str, Callable[[Any, Any], Any]] = {
    "i": _decode_big_int,
    "n": _decode_numpy,
    "dt": _decode_datetime,
    "da": lambda _, text: datetime.date.fromisoformat(text),
    "tm": lambda _, text: datetime.time.fromisoformat(text),
    "td": lambda _, arg: datetime.timedelta(days=arg[0], seconds=arg[1], microseconds=arg[2]),
    "dec": lambda _, text: decimal.Decimal(text),
    "mdn": lambda _, arg: pa.MonthDayNano(arg),
    "pt": _decode_pandas_timestamp,
    "ptd": _decode_pandas_timedelta,
}
"""Decoders by tag: ``decoder(context, argument) -> value`` (the context unused here)."""
