"""windowed.py: ``WindowedStream``, the user API of event-time windows over a keyed stream.

Example:
    >>> from chiray.operators import Dataflow, from_items, collect, tumbling, bounded_out_of_orderness
    >>> flow = Dataflow("w")
    >>> (flow.source(from_items([{"k": "a", "t": 1}]), watermarks=bounded_out_of_orderness("t", 5))
    ...      .key_by("k").window(tumbling(10), on="t").count(name="counts")
    ...      .sink(collect()))  # doctest: +ELLIPSIS
    <operators.dataflow.Stream object at ...>
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Sequence

import numpy as np
import pyarrow as pa

from .aggregates import Aggregate, aggregate_output_schema
from .columns import ColumnType, check_time_column
from .eventtime import Duration, show_duration, ticks
from .graph import describe_callable
from .handles import KeyedStreamLike, S
from .logic import InstanceInfo, OperatorLogic, SideOutput
from .windows import LATE, FixedWindowLogic, WindowSpec, window_output_schema

__all__ = ["WindowedStream", "KeylessLogic", "ALL_ROWS", "with_all_rows_key"]

ALL_ROWS = "__all_rows__"
"""The constant key column a window over the whole stream runs on (added upstream, dropped on output)."""


def with_all_rows_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with the constant key column of a window without a key."""
    return batch.append_column(ALL_ROWS, pa.array(np.zeros(batch.num_rows, dtype=np.int8)))


def _drop_all_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    index = batch.schema.get_field_index(ALL_ROWS)
    return batch if index < 0 else batch.drop_columns([ALL_ROWS])


class KeylessLogic(OperatorLogic):
    """A keyed window logic over the whole stream: its rows share the key :data:`ALL_ROWS`, which
    every output (results and side outputs) drops."""

    def __init__(self, inner: OperatorLogic) -> None:
        self.inner = inner

    def open(self, info: InstanceInfo) -> None:
        super().open(info)
        self.inner.open(info)

    def process(self, batch: pa.RecordBatch, input_index: int) -> list[Any]:
        return self._strip(self.inner.process(batch, input_index))

    def on_watermark(self, watermark: int) -> list[Any]:
        return self._strip(self.inner.on_watermark(watermark))

    def finish(self) -> list[Any]:
        return self._strip(self.inner.finish())

    def close(self) -> None:
        self.inner.close()

    @property
    def state(self) -> Any | None:
        return self.inner.state

    @property
    def late_records(self) -> int:
        return int(getattr(self.inner, "late_records", 0))

    @staticmethod
    def _strip(out: Sequence[Any]) -> list[Any]:
        return [SideOutput(o.port, _drop_all_rows(o.batch)) if isinstance(o, SideOutput) else _drop_all_rows(o)
                for o in out]


class WindowedStream(Generic[S]):
    """A keyed stream cut into event-time windows; its methods add the windowed operator.

    ``key_by(k).window(...)`` and ``stream.window(...)`` make one; its methods return the ``Stream`` of the
    window operator's output (the type parameter ``S``, for type checkers: ``WindowedStream[Stream]``).

    Args:
        keyed: the keyed stream.
        spec: ``tumbling(size)``, ``sliding(size, slide)`` or ``session(gap)``.
        on: the event-time column (an integer or timestamp column).
        allowed_lateness: how long a window accepts records after it fired.
        late_side_output: send late records to the side output ``"late"``
            (``stream.side_output("late")``), besides counting them.
    """

    def __init__(self, keyed: KeyedStreamLike[S], spec: WindowSpec, on: str, allowed_lateness: Duration = 0,
                 late_side_output: bool = False, keyless: bool = False):
        if not isinstance(spec, WindowSpec):
            raise TypeError(f"window() after operator {keyed.stream.name!r}: expected tumbling(...), "
                            f"sliding(...) or session(...), got {type(spec).__name__}")
        self.keyed, self.spec, self.on, self.allowed_lateness = keyed, spec, on, allowed_lateness
        self.late_side_output = bool(late_side_output)
        self.keyless = keyless  # a window over the whole stream: keyed by ALL_ROWS, which outputs drop

    def _check(self, op_name: str) -> ColumnType:
        """The event-time column (its type presumed through maps without a schema), durations checked."""
        where = f"operator {op_name!r}"
        stream = self.keyed.stream
        found = check_time_column(stream.flow.graph, stream.node.name, stream.port, self.on, where)
        time_type = found.type
        self.spec.resolve(time_type, where, self.on)
        ticks(self.allowed_lateness, time_type, f"{where}: allowed_lateness={show_duration(self.allowed_lateness)}",
              self.on)
        return found

    def agg(self, *, name: str | None = None, parallelism: int | None = None,
            **aggregates: Aggregate) -> S:
        """Built-in aggregates per key and window: ``agg(n=(None, "count"), total=("v", "sum"))``.

        The aggregates are those of ``KeyedStream.agg``, ``("price", "arg_max", "bidder")`` included.
        Output columns: the key, ``window_start``, ``window_end``, then one per aggregate.
        """
        op_name = self.keyed.stream.flow._name("window", name)
        found = self._check(op_name)
        time_type = found.type
        specs = self.keyed._agg_specs(op_name, aggregates)
        schema = None
        stream_schema = self.keyed.stream.schema
        if stream_schema is not None and time_type is not None:
            try:
                values = aggregate_output_schema(stream_schema, self.keyed.key, specs)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"operator {op_name!r}: {exc}") from None
            schema = self._output(window_output_schema(time_type, values.field(0), list(values)[1:]))
        return self._add(op_name, parallelism, schema, dict(aggs=specs), found)

    def _output(self, schema: pa.Schema) -> pa.Schema:
        return schema.remove(0) if self.keyless else schema

    def apply(self, fn: Callable[..., Any], *, name: str | None = None, parallelism: int | None = None,
              schema: pa.Schema | None = None) -> S:
        """User function per key and window (slow path): ``fn(key, window_start, window_end, rows) -> rows``."""
        op_name = self.keyed.stream.flow._name("window", name)
        if not callable(fn):
            raise TypeError(f"operator {op_name!r}: apply() needs a function, got {type(fn).__name__}")
        found = self._check(op_name)
        origin = describe_callable(fn)
        if self.keyless:
            user_fn = fn

            def fn(key: Any, start: Any, end: Any, rows: pa.Table) -> Any:
                return user_fn(start, end, rows.drop_columns([ALL_ROWS]))
        return self._add(op_name, parallelism, schema, dict(fn=fn), found, origin)

    def count(self, *, name: str | None = None, parallelism: int | None = None) -> S:
        """Records per key and window: column ``count``."""
        return self.agg(name=name, parallelism=parallelism, count=(None, "count"))

    def sum(self, column: str, **kwargs: Any) -> S:
        return self.agg(**kwargs, sum=(column, "sum"))

    def min(self, column: str, **kwargs: Any) -> S:
        return self.agg(**kwargs, min=(column, "min"))

    def max(self, column: str, **kwargs: Any) -> S:
        return self.agg(**kwargs, max=(column, "max"))

    def mean(self, column: str, **kwargs: Any) -> S:
        return self.agg(**kwargs, mean=(column, "mean"))

    def _add(self, op_name: str, parallelism: int | None, schema: pa.Schema | None, what: dict[str, Any],
             found: ColumnType, origin: str = "") -> S:
        key, on, spec, bins, lateness = self.keyed.key, self.on, self.spec, self.keyed.num_bins, self.allowed_lateness
        time_type = found.type
        what = dict(what, late_side_output=self.late_side_output, time_note=found.describe())
        if spec.kind == "session":
            from .sessions import SessionWindowLogic

            def make() -> Any:
                return SessionWindowLogic(key, on, spec, bins, allowed_lateness=lateness,
                                          time_type=time_type, **what)
        else:
            def make() -> Any:
                return FixedWindowLogic(key, on, spec, bins, allowed_lateness=lateness, time_type=time_type, **what)
        if self.keyless:
            make_keyed = make

            def make() -> Any:
                return KeylessLogic(make_keyed())
            parallelism = 1 if parallelism is None else parallelism
        stream = self.keyed._keyed("window", make, name=op_name, parallelism=parallelism, schema=schema,
                                   origin=origin)
        if self.late_side_output:
            late = self.keyed.stream.schema
            stream.node.side_outputs[LATE] = late.remove(late.get_field_index(ALL_ROWS)) if (
                self.keyless and late is not None) else late
        stream.node.event_time = True
        return stream
