"""columns.py: what a stream's column is known to be at build time, and which operator gave it its type.

A ``map`` (``flat_map``, ``map_records``...) without ``schema=`` has an
unknown output schema. An operator downstream that needs a column's type when
the graph is built (a window's event-time column, to turn its ``timedelta``
durations into ticks) presumes the column passes through such operators
unchanged: it takes the type the column has at the nearest operator above them
whose schema is known. The runtime holds the presumption to account: a map
without a schema gives a column it passes through unchanged its input's type
back (``stateless.keep_input_types``: a list of dicts turns ``timestamp[ms]``
into ``timestamp[us]``), and an event-time operator refuses a column whose type
differs from the one it was built for, naming the operators in between
(:class:`ColumnTypeError`).

Example:
    >>> import pyarrow as pa
    >>> from chiray.operators import Dataflow, from_arrow
    >>> flow = Dataflow("c")
    >>> src = flow.source(from_arrow(pa.table({"ts": pa.array([1], pa.timestamp("ms"))})), name="src")
    >>> mapped = src.map(lambda b: b, name="same")
    >>> found = column_type(flow.graph, mapped.node.name, "ts")
    >>> (str(found.type), found.origin, found.through)
    ('timestamp[ms]', 'src', ('same',))
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from .errors import ChirayError
from .eventtime import check_time_field, is_time_type
from .graph import LogicalGraph, OperatorKind, OperatorNode

__all__ = ["ColumnType", "ColumnTypeError", "column_type", "check_time_column", "check_arrival"]


class ColumnTypeError(ChirayError, TypeError):
    """A column's type is not the one an operator was built for, or cannot serve it; names the operator
    that gave the column its type."""


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnType:
    """The build-time type of one column of a stream.

    Attributes:
        column: the column's name.
        type: its type; ``None``: not known (no schema above, or a keyed operator without one).
        origin: the operator that gave the column this type (a source, or the first operator with a known
            schema that holds it with this type), if known.
        through: the operators without a declared schema that it is presumed to pass through unchanged,
            nearest first.
    """

    column: str
    type: pa.DataType | None
    origin: str | None = None
    through: tuple[str, ...] = ()

    def describe(self) -> str:
        """Where the type comes from, for messages: ``"its type since operator 'src', presumed unchanged
        through 'm', which declares no schema="``."""
        if self.type is None or self.origin is None:
            return "its type is not known when the graph is built"
        text = f"its type since operator {self.origin!r}"
        if self.through:
            names = ", ".join(repr(n) for n in self.through)
            text += f", presumed unchanged through {names}, which declare{'s' if len(self.through) == 1 else ''} " \
                    "no schema="
        return text


def column_type(graph: LogicalGraph, node: str, column: str, port: str | None = None) -> ColumnType:
    """The build-time type of ``column`` in the output of operator ``node`` (its side output ``port``).

    Through a transform without a schema the column is presumed unchanged; a keyed operator without one
    ends the search (its output is its function's).
    """
    through: list[str] = []
    current: OperatorNode = graph.nodes[node]
    while True:
        schema = current.schema if port is None else current.side_outputs.get(port)
        if schema is not None:
            if column not in schema.names:
                return ColumnType(column, None, None, tuple(through))
            t = schema.field(column).type
            return ColumnType(column, t, _origin(graph, current, column, t) if port is None else current.name,
                              tuple(through))
        if port is not None or current.kind is not OperatorKind.TRANSFORM or not current.inputs:
            return ColumnType(column, None, None, tuple(through))
        through.append(current.name)
        current = _known_input(graph, current, column)


def _known_input(graph: LogicalGraph, node: OperatorNode, column: str) -> OperatorNode:
    """The input of ``node`` to follow: the first whose schema holds ``column`` (a union's), else the first."""
    ups = [graph.nodes[e.upstream] for e in node.inputs if e.port is None]
    for up in ups:
        if up.schema is not None and column in up.schema.names:
            return up
    return ups[0] if ups else graph.nodes[node.inputs[0].upstream]


def _origin(graph: LogicalGraph, node: OperatorNode, column: str, t: pa.DataType) -> str:
    """The topmost operator above ``node`` (or itself) from which ``column`` has type ``t`` all the way down."""
    while node.inputs and node.kind is not OperatorKind.SOURCE:
        ups = [graph.nodes[e.upstream] for e in node.inputs if e.port is None]
        same = [u for u in ups if u.schema is not None and column in u.schema.names
                and u.schema.field(column).type == t]
        if not same:
            break
        node = same[0]
    return node.name


def check_time_column(graph: LogicalGraph, node: str, port: str | None, column: str, where: str) -> ColumnType:
    """The event-time column ``column`` of operator ``node``'s output, checked as far as it is known.

    Raises:
        ValueError: the column is not in the stream's known schema.
        ColumnTypeError: its type is neither an integer nor a timestamp (the message names the operator
            that gave it that type).
    """
    n = graph.nodes[node]
    check_time_field(None, column, where)  # a column name at all
    schema = n.schema if port is None else n.side_outputs.get(port)
    if schema is not None and column not in schema.names:
        check_time_field(schema, column, where)  # the unknown-column error
    found = column_type(graph, node, column, port)
    if found.type is not None and not is_time_type(found.type):
        raise ColumnTypeError(f"{where}: event-time column {column!r} must be a timestamp or an integer, got "
                              f"{found.type} ({found.describe()})")
    return found


def check_arrival(batch: pa.RecordBatch, column: str, expected: pa.DataType | None, note: str, where: str) -> None:
    """Raise ``ColumnTypeError`` if ``column`` of ``batch`` is not of the type the operator was built for.

    Args:
        expected: the type its durations were resolved for (``None``: not known then, nothing to check).
        note: where that type came from (``ColumnType.describe()``).
    """
    if expected is None or column not in batch.schema.names:
        return
    actual = batch.schema.field(column).type
    if actual != expected and not (pa.types.is_integer(actual) and pa.types.is_integer(expected)):
        raise ColumnTypeError(f"{where}: event-time column {column!r} arrives as {actual}, but the operator was "
                              f"built for {expected} ({note}); an operator above changed the column's type, so "
                              f"durations in ticks would be wrong: keep its type or declare the schema it has")
