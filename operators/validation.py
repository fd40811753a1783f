"""validation.py: range checks of the numeric arguments that source constructors take.

Example:
    >>> _require("batch_size", 0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be an int >= 1, got 0
"""

from __future__ import annotations

import numbers
from typing import Any


def _require(name: str, value: Any, *, integer: bool = True, minimum: int = 1, allow_none: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is an int ``>= minimum`` (``integer``) or a number ``> 0``.

    ``None`` passes when ``allow_none``; bools never pass.
    """
    if value is None and allow_none:
        return
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok or (value < minimum if integer else not value > 0):
        what = f"an int >= {minimum}" if integer else "a number > 0"
        raise ValueError(f"{name} must be {what}{' or None' if allow_none else ''}, got {value!r}")
