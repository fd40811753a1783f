"""validation.py: range checks of the numeric arguments that source constructors take, and the rule for names.

Example:
    >>> _require("batch_size", 0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be an int >= 1, got 0
    >>> check_name("operator", "kafka/clicks")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: operator name 'kafka/clicks' holds '/' (a path separator); names become parts of file ...
"""

from __future__ import annotations

import numbers
from typing import Any


def check_name(what: str, name: Any) -> str:
    """``name`` if it is a safe name for a job, an operator or a uid; else ``ValueError`` naming the character.

    Names become parts of file names (sink output, checkpoint state, savepoints) and of the
    keys a checkpoint manifest joins with ``/``, so a name may not hold a path separator
    (``/``, ``\\``), a control character, or start with ``.`` (the prefix of staged files).
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")
    bad = next((c for c in name if c in "/\\" or ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None or name.startswith("."):
        held = f"holds {bad!r}" + (" (a path separator)" if bad in "/\\" else " (a control character)") \
            if bad is not None else "starts with '.'"
        raise ValueError(f"{what} name {name!r} {held}; names become parts of file and checkpoint paths, so "
                         "they may hold no path separator ('/' or a backslash) and no control character, "
                         "and may not start with '.'")
    return name


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
