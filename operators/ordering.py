"""ordering.py: how the row-keeping operators order rows: ``by`` columns with a direction each, checked at build time.

``top`` per key, ``lifetime_join`` and ``rolling`` rank or order rows by columns
the user names; these checks give their errors one form (naming the operator
and the column) and :func:`sort_keys` gives Arrow's sort keys for them.

Example:
    >>> check_order(["price", "date_time"], [True, False], "operator 'top'", "top")
    (('price', 'date_time'), (True, False))
    >>> sort_keys(["p", "t"], [True, False])
    [('p', 'descending'), ('t', 'ascending')]
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

__all__ = ["check_order", "check_orderable", "sort_keys"]


def check_order(by: Any, descending: Any, where: str, verb: str) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    """``by`` (a column or a list of them) and ``descending`` (one bool, or one per column), checked.

    Raises:
        ValueError: no columns, an empty name, or a list of ``descending`` of another length.
        TypeError: a name or a ``descending`` of the wrong type.
    """
    names = (by,) if isinstance(by, str) else tuple(by) if isinstance(by, (list, tuple)) else None
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{where}: {verb}() needs by= a column name or a list of them, got {by!r}")
    if isinstance(descending, bool):
        return names, (descending,) * len(names)
    if not (isinstance(descending, (list, tuple)) and all(isinstance(d, bool) for d in descending)):
        raise TypeError(f"{where}: {verb}() needs descending= a bool or a list of bools, got {descending!r}")
    if len(descending) != len(names):
        raise ValueError(f"{where}: {verb}() got {len(descending)} descending flags for {len(names)} "
                         f"by columns {list(names)}")
    return names, tuple(descending)


def check_orderable(schema: pa.Schema, columns: Sequence[str], where: str, verb: str) -> None:
    """Each of ``columns`` is in ``schema`` with a type Arrow can sort.

    Raises:
        ValueError: a column is missing.
        TypeError: a column is nested (a list, struct or map).
    """
    for column in columns:
        if column not in schema.names:
            raise ValueError(f"{where}: {verb}() ranks by column {column!r}, which the input lacks "
                             f"(it has columns {schema.names})")
        if pa.types.is_nested(schema.field(column).type):
            raise TypeError(f"{where}: {verb}() needs orderable values to rank by; column {column!r} "
                            f"has type {schema.field(column).type}")


def sort_keys(columns: Sequence[str], descending: Sequence[bool]) -> list[tuple[str, str]]:
    """Arrow sort keys for ``columns`` in these directions (nulls rank last, Arrow's default)."""
    return [(c, "descending" if d else "ascending") for c, d in zip(columns, descending)]
