"""dataflow.py: the user API: ``Dataflow``, ``Stream`` and ``KeyedStream``, with build-time validation.

Example:
    >>> from chiray.operators import Dataflow, from_items, collect
    >>> flow = Dataflow("demo")
    >>> (flow.source(from_items([{"w": "a"}, {"w": "b"}, {"w": "a"}]))
    ...      .key_by("w").count(name="count")
    ...      .sink(collect()))
    >>> job = flow.submit()          # doctest: +SKIP
    >>> job.wait(); job.result()     # doctest: +SKIP

Misuse is caught when the graph is built (unknown column, non-positive
parallelism, duplicate names) or at ``submit()`` (a stream nobody consumes),
with a message that names the operator.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence, overload

import pyarrow as pa

from . import keyed, stateless
from .aggregates import Aggregate, AggregateFunction
from .callbacks import OnTimerFunction, ProcessFunction, TimerProcessFunction
from .graph import (
    InputEdge,
    LogicalGraph,
    OperatorKind,
    OperatorNode,
    Partition,
    describe_callable,
)
from .hashing import DEFAULT_NUM_BINS, check_num_bins
from .logic import Sink, Source
from .columns import check_time_column
from .connected import ConnectedStreams
from .emission import check_final_only
from .eventtime import Duration, show_duration, ticks
from .handles import JobLike
from .timers import TimerProcessLogic
from .ttl import EXPIRED, TTLTime, state_ttl
from .watermarks import WatermarkedSource, WatermarkStrategy
from .validation import check_name
from .keyedtop import KeyedTopLogic, keyed_top_schema
from .ordering import check_order, check_orderable
from .processbatch import KeyedBatch, ProcessBatchLogic
from .rolling import RollingLogic, rolling_output_schema
from .topn import TopLogic, top_output_schema
from .windowed import ALL_ROWS, WindowedStream, with_all_rows_key
from .windows import WINDOW_COLUMNS

__all__ = ["Dataflow", "Stream", "KeyedStream"]


def _check_parallelism(name: str, parallelism: Any) -> int:
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise ValueError(
            f"operator {name!r}: parallelism must be a positive integer, got {parallelism!r}"
        )
    return parallelism


def _check_params(verb: str, params: Any) -> dict[str, Any] | None:
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"{verb}(): params must be a dict, got {type(params).__name__}")
    return params


def _check_callable(verb: str, fn: Any, name: str | None = None, after: str | None = None) -> None:
    if not callable(fn):
        where = f"operator {name!r}: " if name else ""
        also = f" (after operator {after!r})" if after else ""
        raise TypeError(f"{where}{verb}(): expected a function, got {type(fn).__name__}{also}")


class Dataflow:
    """A dataflow under construction: sources, operators and sinks.

    Args:
        name: the job's name.
        num_bins: default number of key bins per keyed operator (a power of two).
    """

    def __init__(self, name: str, *, num_bins: int = DEFAULT_NUM_BINS):
        self.name = check_name("Dataflow: job", name)
        self.num_bins = check_num_bins(num_bins)
        self.graph = LogicalGraph(name)
        self._counter = itertools.count(1)

    def _name(self, verb: str, name: str | None) -> str:
        if name is not None:
            return check_name(f"{verb}(): operator", name)
        while True:
            candidate = f"{verb}-{next(self._counter)}"
            if candidate not in self.graph.nodes:
                return candidate

    def _add(self, node: OperatorNode) -> "Stream":
        _check_parallelism(node.name, node.parallelism)
        self.graph.add(node)
        return Stream(self, node)

    def source(self, source: Source, *, parallelism: int = 1, name: str | None = None,
               watermarks: WatermarkStrategy | None = None) -> "Stream":
        """Add a source. Its splits are spread over ``parallelism`` instances.

        ``watermarks`` (``bounded_out_of_orderness(column, delay)`` or
        ``watermarks_from(fn)``) makes it emit event-time watermarks in-band.
        """
        if not isinstance(source, Source):
            raise TypeError(
                f"Dataflow.source(): expected a Source (from_items, from_arrow, from_parquet, "
                f"generate, from_spark...), got {type(source).__name__}"
            )
        op_name = self._name("source", name)
        for_parallelism = getattr(source, "for_parallelism", None)  # duck-typed sources may lack it
        if for_parallelism is not None:
            _check_parallelism(op_name, parallelism)
            source = for_parallelism(parallelism)
        if watermarks is not None:
            if not isinstance(watermarks, WatermarkStrategy):
                raise TypeError(f"operator {op_name!r}: watermarks must be a WatermarkStrategy "
                                f"(bounded_out_of_orderness(...), watermarks_from(...)), "
                                f"got {type(watermarks).__name__}")
            watermarks.check(source.schema(), f"operator {op_name!r}")
            source = WatermarkedSource(source, watermarks)
        node = OperatorNode(
            op_name, OperatorKind.SOURCE, parallelism,
            source=source, schema=source.schema(), origin=source.describe(),
        )
        return self._add(node)

    def validate(self) -> None:
        """Check the whole graph; called by ``submit()``.

        Raises:
            ValueError: no source, no sink, or an operator whose output nobody consumes.
            FinalOnUnboundedError: an aggregation left at ``emit="final"`` is fed by a source that never
                ends (one that cannot tell: a ``FinalOnlyWarning``).
        """
        nodes = self.graph.nodes.values()
        if not any(n.kind is OperatorKind.SOURCE for n in nodes):
            raise ValueError(f"dataflow {self.name!r} has no source; add one with flow.source(...)")
        if not any(n.kind is OperatorKind.SINK for n in nodes):
            raise ValueError(f"dataflow {self.name!r} has no sink; end a stream with .sink(...) or .collect()")
        self._check_watermarks()
        check_final_only(self.graph)
        seen: dict[str, str] = {}
        for node in nodes:
            if node.state_id in seen:
                raise ValueError(f"dataflow {self.name!r}: operators {seen[node.state_id]!r} and {node.name!r} "
                                 f"share the identity {node.state_id!r} (a uid or a name); give one another uid")
            seen[node.state_id] = node.name
        for node in nodes:
            if node.kind is not OperatorKind.SINK and not self.graph.consumers(node.name):
                raise ValueError(
                    f"dataflow {self.name!r}: the output of {node.describe()} is not consumed by "
                    "any operator or sink; add a .sink(...) or remove it"
                )

    def _check_watermarks(self) -> None:
        """Every source upstream of an event-time operator (window, window join, timers) makes watermarks."""
        nodes = self.graph.nodes
        for node in nodes.values():
            if not node.event_time:
                continue
            pending, seen = [e.upstream for e in node.inputs], set()
            while pending:
                name = pending.pop()
                if name in seen:
                    continue
                seen.add(name)
                up = nodes[name]
                pending.extend(e.upstream for e in up.inputs)
                if up.kind is OperatorKind.SOURCE and not isinstance(up.source, WatermarkedSource):
                    raise ValueError(
                        f"dataflow {self.name!r}: {node.describe()} acts on event time, but source {name!r} "
                        "makes no watermarks, so it would never fire on unbounded input; add them where the "
                        f"source is added: flow.source(..., name={name!r}, "
                        "watermarks=bounded_out_of_orderness('<time column>', <max delay>))")

    def submit(self, *, config: Any = None, restore_from: str | None = None,
               allow_non_restored_state: bool = False, **options: Any) -> JobLike:
        """Deploy on Ray and start running; the same as ``chiray.submit(flow, ...)``, which documents the options.

        Args:
            config: a ``chiray.JobConfig``; or pass its fields as keywords (``checkpoint_dir=``,
                ``checkpoint_interval_s=``, ``detached=``...).
            restore_from: start from a checkpoint or savepoint (a ``chk-N`` directory or a root: its newest).
            allow_non_restored_state: drop checkpoint state that no operator takes (refused otherwise).
            **options: ``JobConfig`` fields.

        Returns:
            The running job's handle, a ``Job`` (an ``AttachedJob`` with ``detached=True``).

        Raises:
            RuntimeError: no runtime is registered (``operators`` was loaded without the ``chiray`` package).
        """
        if _RUNTIME is None:
            raise RuntimeError("no runtime registered: use chiray.submit(flow, ...) (import chiray first)")
        return _RUNTIME(self, config=config, restore_from=restore_from,
                        allow_non_restored_state=allow_non_restored_state, **options)


_RUNTIME: Callable[..., Any] | None = None


def register_runtime(submit: Callable[..., Any]) -> None:
    """Register the function that ``Dataflow.submit`` calls; the ``chiray`` facade registers the Ray runtime's.

    ``operators`` stays a pure description: it never imports the runtime, the runtime is handed to it from above.
    """
    global _RUNTIME
    _RUNTIME = submit


class Stream:
    """The output of an operator; each method adds a downstream operator."""

    def __init__(self, flow: Dataflow, node: OperatorNode, port: str | None = None,
                 schema: pa.Schema | None = None):
        self.flow = flow
        self.node = node
        self.port = port
        self._schema = schema

    def _edge(self, partition: Partition = Partition.FORWARD, key: str | None = None, num_bins: int = 0) -> InputEdge:
        return InputEdge(self.node.name, partition, key, num_bins, self.port)

    def connect(self, other: "Stream") -> ConnectedStreams[Stream]:
        """Connect with ``other`` for a keyed two-input operator: ``a.connect(b).key_by("k").join()``."""
        return ConnectedStreams(self, other)

    def side_output(self, port: str, schema: pa.Schema | None = None) -> "Stream":
        """The records this operator sends to its side output ``port`` (a window's ``"late"`` records).

        Raises:
            ValueError: the operator has no side output of that name.
        """
        ports = self.node.side_outputs
        if port not in ports:
            raise ValueError(f"operator {self.name!r} has no side output {port!r}; it has {sorted(ports) or 'none'}"
                             + (" (pass late_side_output=True to window())" if port == "late" else "")
                             + (" (pass expired_side_output=True with a ttl)" if port == "expired" else ""))
        return Stream(self.flow, self.node, port, ports[port])

    @property
    def name(self) -> str:
        return self.node.name

    def uid(self, uid: str) -> "Stream":
        """Fix this operator's identity in checkpoints, so a restore finds its state after a rename.

        A checkpoint files each operator's state (keyed state, source offsets) under its uid, which is
        its name unless set here. ``restore_from=`` matches state to operators by uid and refuses a
        checkpoint whose state has no operator to go to.

        Example::

            flow.source(src).key_by("k").count(name="count_v2").uid("count")  # was named "count"

        Raises:
            ValueError: ``uid`` is empty or another operator of the dataflow has it.
        """
        check_name(f"operator {self.name!r}: uid", uid)
        taken = [n.name for n in self.flow.graph.nodes.values() if n is not self.node and n.state_id == uid]
        if taken:
            raise ValueError(f"operator {self.name!r}: uid {uid!r} is already the identity of operator "
                             f"{taken[0]!r}; uids must be unique in a dataflow")
        self.node.uid = uid
        return self

    @property
    def schema(self) -> pa.Schema | None:
        """The schema of this stream's batches, if known at build time."""
        return self.node.schema if self.port is None else self._schema

    def _transform(self, verb: str, fn: Any, make: Callable[[], Any], *, name: str | None,
                   parallelism: int | None, schema: pa.Schema | None) -> "Stream":
        _check_callable(verb, fn, name, self.name)
        node = OperatorNode(
            self.flow._name(verb, name), OperatorKind.TRANSFORM,
            self.node.parallelism if parallelism is None else parallelism,
            inputs=[self._edge()],
            make_logic=make, schema=schema, origin=describe_callable(fn),
        )
        return self.flow._add(node)

    def map(self, fn: Callable[..., Any], *, name: str | None = None, parallelism: int | None = None,
            schema: pa.Schema | None = None, params: dict[str, Any] | None = None) -> "Stream":
        """``fn(batch) -> RecordBatch | Table``, vectorised (the fast path).

        With ``params`` (a dict) it is called as ``fn(batch, params)``, and a
        ``Reconfigure`` control op can change them while the job runs.
        """
        params = _check_params("map", params)
        return self._transform("map", fn, lambda: stateless.MapLogic(fn, schema, params),
                               name=name, parallelism=parallelism, schema=schema)

    def filter(self, fn: Callable[..., Any], *, name: str | None = None,
               parallelism: int | None = None, params: dict[str, Any] | None = None) -> "Stream":
        """``fn(batch) -> boolean mask``; keeps the rows where it is true (``params`` as for ``map``)."""
        params = _check_params("filter", params)
        return self._transform("filter", fn, lambda: stateless.FilterLogic(fn, params),
                               name=name, parallelism=parallelism, schema=self.schema)

    def flat_map(self, fn: Callable[..., Any], *, name: str | None = None, parallelism: int | None = None,
                 schema: pa.Schema | None = None, params: dict[str, Any] | None = None) -> "Stream":
        """``fn(batch) -> iterable of RecordBatch / Table`` (or one, or None; ``params`` as for ``map``)."""
        params = _check_params("flat_map", params)
        return self._transform("flat_map", fn, lambda: stateless.FlatMapLogic(fn, schema, params),
                               name=name, parallelism=parallelism, schema=schema)

    def map_records(self, fn: Callable[[dict], dict], *, name: str | None = None,
                    parallelism: int | None = None, schema: pa.Schema | None = None) -> "Stream":
        """Slow path: ``fn(row: dict) -> dict`` per record."""
        return self._transform("map_records", fn, lambda: stateless.MapRecordsLogic(fn, schema),
                               name=name, parallelism=parallelism, schema=schema)

    def filter_records(self, fn: Callable[[dict], bool], *, name: str | None = None,
                       parallelism: int | None = None) -> "Stream":
        """Slow path: ``fn(row: dict) -> bool`` per record."""
        return self._transform("filter_records", fn, lambda: stateless.FilterRecordsLogic(fn),
                               name=name, parallelism=parallelism, schema=self.schema)

    def flat_map_records(self, fn: Callable[[dict], Any], *, name: str | None = None,
                         parallelism: int | None = None, schema: pa.Schema | None = None) -> "Stream":
        """Slow path: ``fn(row: dict) -> iterable of dicts`` per record."""
        return self._transform("flat_map_records", fn,
                               lambda: stateless.FlatMapRecordsLogic(fn, schema),
                               name=name, parallelism=parallelism, schema=schema)

    def key_by(self, column: str, *, num_bins: int | None = None) -> "KeyedStream":
        """Partition by the stable hash of ``column``; the next operator is keyed."""
        if not isinstance(column, str) or not column:
            raise ValueError(f"key_by() after operator {self.name!r}: expected a column name, got {column!r}")
        _require_column(self, column, "key column")
        bins = self.flow.num_bins if num_bins is None else check_num_bins(num_bins)
        return KeyedStream(self, column, bins)

    def window(self, spec: Any, *, on: str, allowed_lateness: Any = 0,
               late_side_output: bool = False) -> WindowedStream[Stream]:
        """Event-time windows over the whole stream, without a key:
        ``window(tumbling(timedelta(minutes=1)), on="ts").agg(...)``.

        As ``key_by(k).window(...)`` with one key for every row: ``agg`` emits
        ``window_start, window_end`` and the aggregates, ``apply`` calls
        ``fn(window_start, window_end, rows)``. All rows meet in one instance
        (the window operator's parallelism is 1 unless given); a small map
        before it gives every row the same key.
        """
        if ALL_ROWS in (self.schema.names if self.schema is not None else ()):
            raise ValueError(f"window() after operator {self.name!r}: the column name {ALL_ROWS!r} is reserved")
        schema = None if self.schema is None else self.schema.append(pa.field(ALL_ROWS, pa.int8()))
        keyed = self.map(with_all_rows_key, name=self.flow._name("all_rows", None), schema=schema).key_by(ALL_ROWS)
        return WindowedStream(keyed, spec, on, allowed_lateness, late_side_output, keyless=True)

    def top(self, n: int, by: str, *, descending: bool = True, name: str | None = None,
            parallelism: int | None = None) -> "Stream":
        """The ``n`` best rows of each window by ``by`` (the greatest first, or the least with
        ``descending=False``), after a window's ``agg`` or ``apply``.

        Example: the top 3 products by revenue per minute::

            minute = timedelta(minutes=1)  # "ts" is a timestamp column; on an integer column: ticks
            revenue = bids.key_by("product").window(tumbling(minute), on="ts").agg(revenue=("price", "sum"))
            top3 = revenue.top(3, by="revenue")

        Output: the input's columns, then ``rank`` (1 for the best). A window's rows are emitted
        when the watermark passes its end (when the window fired upstream); ties keep arrival
        order and nulls rank last. Keyed by ``window_end``: windows spread over the instances.
        """
        op_name = self.flow._name("top", name)
        where = f"operator {op_name!r}"
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{where}: top() needs n >= 1 rows per window, got {n!r}")
        if not isinstance(by, str) or not by:
            raise ValueError(f"{where}: top() needs a column name to rank by, got {by!r}")
        schema = None if self.schema is None else top_output_schema(self.schema, by, where)
        bins = self.flow.num_bins
        stream = KeyedStream(self, WINDOW_COLUMNS[1], bins)._keyed(
            "top", lambda: TopLogic(n, by, bins, descending=descending), name=op_name,
            parallelism=parallelism, schema=schema)
        stream.node.event_time = True
        return stream

    def union(self, *others: "Stream", name: str | None = None,
              parallelism: int | None = None) -> "Stream":
        """Merge this stream with ``others`` (same schema) into one stream."""
        streams = (self, *others)
        for s in others:
            if not isinstance(s, Stream) or s.flow is not self.flow:
                got = f"a stream of dataflow {s.flow.name!r}" if isinstance(s, Stream) else type(s).__name__
                raise TypeError(f"union(): expected streams of the same Dataflow, got {got} "
                                f"(after operator {self.name!r})")
        first_known = next((s for s in streams if s.schema is not None), None)
        for s in streams:
            if first_known is not None and s.schema is not None and not s.schema.equals(first_known.schema):
                raise ValueError(
                    f"union(): stream {s.name!r} has schema {s.schema} but {first_known.name!r} "
                    f"has {first_known.schema}; union needs one schema"
                )
        node = OperatorNode(
            self.flow._name("union", name), OperatorKind.TRANSFORM,
            max(s.node.parallelism for s in streams) if parallelism is None else parallelism,
            inputs=[s._edge() for s in streams],
            make_logic=stateless.IdentityLogic, schema=first_known.schema if first_known else None,
        )
        return self.flow._add(node)

    def sink(self, sink: Sink, *, name: str | None = None, parallelism: int | None = None) -> "Stream":
        """End this stream in ``sink`` (``collect()``, ``to_parquet(dir)``...)."""
        if not isinstance(sink, Sink):
            where = f"operator {name!r}: " if name else ""
            raise TypeError(f"{where}sink() after operator {self.name!r}: expected a Sink "
                            f"(collect(), to_parquet(...)), got {type(sink).__name__}")
        sink = sink.bind_schema(self.schema)
        node = OperatorNode(
            self.flow._name("sink", name), OperatorKind.SINK,
            self.node.parallelism if parallelism is None else parallelism,
            inputs=[self._edge()],
            sink=sink, schema=self.schema,
            origin=sink.describe(),
        )
        return self.flow._add(node)

    def print(self, *, name: str | None = None, max_rows: int = 20) -> "Stream":
        """Print each batch as it arrives: a table of up to ``max_rows`` rows headed by the sink's name.

        At-least-once (after a recovery the batches since the last checkpoint print again), in one
        instance; it prints in that host's process, whose output Ray forwards to the driver's terminal
        (a detached job's goes to the host's log). ``job.tail()`` reads the newest rows instead.

        Example::

            flow.source(src).key_by("word").count(emit="updates").print()
        """
        from .callsinks import PrintSink

        return self.sink(PrintSink(max_rows), name=self.flow._name("print", name), parallelism=1)

    def collect(self, *, name: str | None = None) -> "Stream":
        """Sugar for ``sink(collect())``: the job's ``result()`` returns the records."""
        from .sinks import collect

        return self.sink(collect(), name=None if name is None else check_name("collect(): operator", name),
                         parallelism=1)


def _check_emit(op_name: str, emit: Any) -> tuple[str, bool]:
    """``(emit, whether it was left at its default)``; ``None`` is the default, ``"final"``."""
    if emit is None:
        return "final", True
    if emit not in ("final", "updates"):
        raise ValueError(f"operator {op_name!r}: emit must be 'final' or 'updates', got {emit!r}")
    return emit, False


def _check_count(where: str, verb: str, n: Any, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{where}: {verb}() needs n >= 1 {what}, got {n!r}")


def _require_column(stream: Stream, column: str, what: str, operator: str | None = None) -> None:
    schema = stream.schema
    if schema is not None and column not in schema.names:
        where = f"operator {operator!r}" if operator else f"key_by() after operator {stream.name!r}"
        raise ValueError(
            f"{where}: unknown {what} {column!r}; the input has columns {schema.names}"
        )


class KeyedStream:
    """A stream partitioned by a key column; its methods add keyed, stateful operators."""

    def __init__(self, stream: Stream, key: str, num_bins: int):
        self.stream = stream
        self.key = key
        self.num_bins = num_bins

    def _keyed(self, verb: str, make: Callable[[], Any], *, name: str | None,
               parallelism: int | None, schema: pa.Schema | None, origin: str = "") -> Stream:
        flow = self.stream.flow
        node = OperatorNode(
            flow._name(verb, name), OperatorKind.KEYED,
            self.stream.node.parallelism if parallelism is None else parallelism,
            inputs=[self.stream._edge(Partition.HASH, self.key, self.num_bins)],
            make_logic=make, schema=schema, key=self.key, num_bins=self.num_bins, origin=origin,
        )
        return flow._add(node)

    def agg(self, *, name: str | None = None, parallelism: int | None = None,
            emit: str | None = None, ttl: Duration | None = None, ttl_time: TTLTime = "processing",
            ttl_on: str | None = None, expired_side_output: bool = False, **aggregates: Aggregate) -> Stream:
        """Several aggregations at once: ``agg(n=(None, "count"), total=("v", "sum"))``.

        Each aggregate is a ``chiray.Aggregate``: ``(column, function)`` or ``(column, "arg_max", give)``.
        Functions (null values are skipped, as in SQL): ``count`` (rows, or a
        column's non-null values), ``sum``, ``min``, ``max``, ``mean``,
        ``first`` / ``last`` (the key's first / latest non-null value in
        arrival order), ``count_distinct``, and ``arg_min`` / ``arg_max``:
        ``("price", "arg_max", "bidder")`` gives ``bidder`` from the row with
        the greatest ``price`` (the earliest such row on ties), and
        ``("price", "arg_max")`` gives that whole row as a struct.

        Output columns: the key, then one per aggregate, in the order given.
        ``emit="final"`` (the default) emits at end of input; ``"updates"``
        emits the new values of the keys each input batch touched. On a
        source that never ends, ``"final"`` would emit nothing: ``submit``
        refuses the default there (pass ``emit`` to choose).

        ``ttl``: drop a key's state once it has not been written for that long
        (:mod:`~operators.ttl`): ``ttl_time="processing"`` (wall clock, the
        default) or ``"event"`` (its records' largest time on column
        ``ttl_on`` plus ``ttl`` reached by the watermark). Expired keys are
        counted (``expired_keys`` in ``job.statistics()``); with
        ``expired_side_output=True`` their last results also go to
        ``result.side_output("expired")``. A key that comes back starts afresh.

        Example::

            counts = stream.key_by("user").agg(n=(None, "count"), emit="updates",
                                               ttl=timedelta(hours=1), expired_side_output=True)
            gone = counts.side_output("expired")  # each expired user's last count
        """
        op_name = self.stream.flow._name("agg", name)
        emit, by_default = _check_emit(op_name, emit)
        specs = self._agg_specs(op_name, aggregates)
        expiry = state_ttl(f"operator {op_name!r}", ttl, ttl_time, ttl_on, expired_side_output, self.stream.schema)
        schema = None
        if self.stream.schema is not None:
            try:
                schema = keyed.aggregate_output_schema(self.stream.schema, self.key, specs)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"operator {op_name!r}: {exc}") from None
        key, bins = self.key, self.num_bins
        stream = self._keyed("agg", lambda: keyed.AggregateLogic(key, specs, bins, emit, expiry),
                             name=op_name, parallelism=parallelism, schema=schema)
        stream.node.final_by_default = by_default
        if expiry is not None and expiry.side_output:
            stream.node.side_outputs[EXPIRED] = schema
        return stream

    def _agg_specs(self, op_name: str, aggregates: dict[str, Any]) -> list[keyed.AggSpec]:
        if not aggregates:
            raise ValueError(f"operator {op_name!r}: agg() needs at least one aggregate")
        specs = []
        for out_name, spec in aggregates.items():
            if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
                raise TypeError(
                    f"operator {op_name!r}: aggregate {out_name!r} must be (column, func) or, for arg_min "
                    f"and arg_max, (column, func, column_to_give), got {spec!r}"
                )
            column, func, of = spec if len(spec) == 3 else (*spec, None)
            for name in (column, of):
                if name is not None:
                    _require_column(self.stream, name, "column", op_name)
            try:
                specs.append(keyed.AggSpec(out_name, func, column, of))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"operator {op_name!r}: {exc}") from None
        return specs

    def window(self, spec: Any, *, on: str, allowed_lateness: Any = 0,
               late_side_output: bool = False) -> WindowedStream[Stream]:
        """Event-time windows: ``window(tumbling(timedelta(seconds=10)), on="ts")``, ``sliding(size, slide)``,
        ``session(gap)``.

        Durations are ``timedelta``s on a timestamp column and ints (ticks) on an integer column; a bare
        number on a timestamp column is refused, naming what it would have meant. Results are emitted
        when the watermark passes a window's end (sources make watermarks:
        ``flow.source(..., watermarks=bounded_out_of_orderness("ts", timedelta(seconds=5)))``).
        Late records are counted; with ``late_side_output=True`` they also go
        to ``result.side_output("late")``.
        """
        return WindowedStream(self, spec, on, allowed_lateness, late_side_output)

    def count(self, *, name: str | None = None, parallelism: int | None = None,
              emit: str | None = None, ttl: Duration | None = None, ttl_time: TTLTime = "processing",
              ttl_on: str | None = None, expired_side_output: bool = False) -> Stream:
        """Records per key: columns (key, ``count``). ``ttl``, ``ttl_time``, ``ttl_on`` and
        ``expired_side_output`` as for :meth:`agg`."""
        return self.agg(name=name or self.stream.flow._name("count", None), parallelism=parallelism, emit=emit,
                        ttl=ttl, ttl_time=ttl_time, ttl_on=ttl_on, expired_side_output=expired_side_output,
                        count=(None, "count"))

    def sum(self, column: str, **kwargs: Any) -> Stream:
        """Sum of ``column`` per key: columns (key, ``sum``)."""
        return self._one("sum", column, **kwargs)

    def min(self, column: str, **kwargs: Any) -> Stream:
        """Minimum of ``column`` per key: columns (key, ``min``)."""
        return self._one("min", column, **kwargs)

    def max(self, column: str, **kwargs: Any) -> Stream:
        """Maximum of ``column`` per key: columns (key, ``max``)."""
        return self._one("max", column, **kwargs)

    def mean(self, column: str, **kwargs: Any) -> Stream:
        """Mean of ``column`` per key: columns (key, ``mean``)."""
        return self._one("mean", column, **kwargs)

    def _one(self, func: AggregateFunction, column: str, *, name: str | None = None,
             parallelism: int | None = None, emit: str | None = None, ttl: Duration | None = None,
             ttl_time: TTLTime = "processing", ttl_on: str | None = None,
             expired_side_output: bool = False) -> Stream:
        return self.agg(name=name or self.stream.flow._name(func, None), parallelism=parallelism, emit=emit,
                        ttl=ttl, ttl_time=ttl_time, ttl_on=ttl_on, expired_side_output=expired_side_output,
                        **{func: (column, func)})

    def reduce(self, fn: Callable[[dict, dict], dict], *, name: str | None = None,
               parallelism: int | None = None, emit: str | None = None, ttl: Duration | None = None,
               ttl_time: TTLTime = "processing", ttl_on: str | None = None,
               expired_side_output: bool = False) -> Stream:
        """General keyed reduce (slow path): ``fn(acc: dict, row: dict) -> dict`` per record.

        ``emit`` as for :meth:`agg` (``"final"`` by default); ``ttl``, ``ttl_time``, ``ttl_on`` and
        ``expired_side_output`` too (the side output gets the expired keys' last accumulators).
        """
        _check_callable("reduce", fn)
        op_name = self.stream.flow._name("reduce", name)
        emit, by_default = _check_emit(op_name, emit)
        expiry = state_ttl(f"operator {op_name!r}", ttl, ttl_time, ttl_on, expired_side_output, self.stream.schema)
        key, bins = self.key, self.num_bins
        stream = self._keyed("reduce", lambda: keyed.ReduceLogic(key, fn, bins, emit, expiry), name=op_name,
                             parallelism=parallelism, schema=self.stream.schema,
                             origin=describe_callable(fn))
        stream.node.final_by_default = by_default
        if expiry is not None and expiry.side_output:
            stream.node.side_outputs[EXPIRED] = self.stream.schema
        return stream

    def top(self, n: int, by: str | Sequence[str], *, descending: bool | Sequence[bool] = True,
            idle: Any = None, on: str | None = None, name: str | None = None,
            parallelism: int | None = None) -> Stream:
        """The ``n`` best rows of each key over the whole stream, emitted once per key, never retracted.

        Example: each auction's 10 highest bids, the earliest first on equal prices::

            bids.key_by("auction").top(10, by=["price", "date_time"], descending=[True, False])

        ``by``: a column or a list (the first decides first); ``descending``: one flag, or one per
        column. Ties keep arrival order; nulls rank last. Output: the input's columns, then ``rank``
        (1 for the best). A key's rows are emitted at end of input, or, with ``idle`` (a duration:
        a ``timedelta`` on a timestamp column, ticks on an integer one) and ``on`` (an event-time
        column), once the watermark passes the key's latest ``on`` by ``idle``; the key is then let
        go, and a later row of it starts it anew. At most ``n`` rows are kept per key; a row worse
        than a full key's ``n``-th is dropped on arrival.
        """
        op_name = self.stream.flow._name("top", name)
        where = f"operator {op_name!r}"
        _check_count(where, "top", n, "rows per key")
        by, descending = check_order(by, descending, where, "top")
        self._check_timer(where, "top", idle, on)
        schema = None if self.stream.schema is None else keyed_top_schema(self.stream.schema, by, where)
        key, bins = self.key, self.num_bins
        stream = self._keyed("top", lambda: KeyedTopLogic(key, n, by, descending, bins, idle, on),
                             name=op_name, parallelism=parallelism, schema=schema)
        stream.node.event_time = on is not None
        if idle is None:  # a key's rows go out at end of input only: refused where the input never ends
            stream.node.final_by_default = True
            stream.node.final_fix = (f"pass idle= and on= to {op_name!r} (a duration and an event-time column) "
                                     "to emit each key's rows once it has been idle that long")
        return stream

    def _check_timer(self, where: str, verb: str, idle: Any, on: str | None) -> None:
        if (idle is None) != (on is None):
            raise ValueError(f"{where}: {verb}() takes idle= and on= together (a duration and the event-time "
                             f"column it counts on), got idle={idle!r}, on={on!r}")
        if on is not None:
            found = check_time_column(self.stream.flow.graph, self.stream.node.name, self.stream.port, on, where)
            ticks(idle, found.type, f"{where}: idle={show_duration(idle)}", on)

    def rolling(self, n: int, /, *, on: str, tiebreak: str | Sequence[str] = (), name: str | None = None,
                parallelism: int | None = None, **aggregates: tuple[str | None, str]) -> Stream:
        """Per row, aggregates over its key's last ``n`` rows in event-time order (the row's own included).

        Example: each seller's average price over their last 11 closed auctions, at each close::

            closed.key_by("seller").rolling(11, on="expires", tiebreak="id", avg_price=("price", "mean"))

        SQL's ``agg(column) OVER (PARTITION BY key ORDER BY on, tiebreak ROWS n - 1 PRECEDING)``.
        Aggregates are ``(column, function)``: ``count`` (``None`` as the column counts rows), ``sum``,
        ``mean``, ``min``, ``max`` (integer or float columns; nulls skipped). Output: each input row,
        then one column per aggregate. Rows wait until the watermark passes their ``on`` (equal times
        in ``tiebreak`` order, then arrival), or the end of input; a row at or behind the watermark is
        taken at once and counted late. Per key the last ``n - 1`` rows' aggregated columns are kept.
        """
        op_name = self.stream.flow._name("rolling", name)
        where = f"operator {op_name!r}"
        _check_count(where, "rolling", n, "rows")
        if not aggregates:
            raise ValueError(f"{where}: rolling() needs at least one aggregate, e.g. avg=('price', 'mean')")
        specs = []
        for out, spec in aggregates.items():
            if not (isinstance(spec, tuple) and len(spec) == 2):
                raise TypeError(f"{where}: rolling() aggregate {out!r} must be (column, function), got {spec!r}")
            specs.append((out, spec[1], spec[0]))
        tiebreak = check_order(tiebreak, False, where, "rolling")[0] if tiebreak else ()
        check_time_column(self.stream.flow.graph, self.stream.node.name, self.stream.port, on, where)
        schema = None
        if self.stream.schema is not None:
            check_orderable(self.stream.schema, tiebreak, where, "rolling")
            schema = rolling_output_schema(self.stream.schema, specs, where)
        key, bins = self.key, self.num_bins
        stream = self._keyed("rolling", lambda: RollingLogic(key, n, on, tiebreak, specs, bins), name=op_name,
                             parallelism=parallelism, schema=schema)
        stream.node.event_time = True
        return stream

    @overload
    def process(self, fn: ProcessFunction, *, name: str | None = None, parallelism: int | None = None,
                schema: pa.Schema | None = None, on_timer: None = None, ttl: Duration | None = None,
                ttl_time: TTLTime = "processing", ttl_on: str | None = None,
                expired_side_output: bool = False) -> Stream: ...

    @overload
    def process(self, fn: TimerProcessFunction, *, name: str | None = None, parallelism: int | None = None,
                schema: pa.Schema | None = None, on_timer: OnTimerFunction, ttl: None = None,
                ttl_time: TTLTime = "processing", ttl_on: str | None = None,
                expired_side_output: bool = False) -> Stream: ...

    def process(self, fn: ProcessFunction | TimerProcessFunction, *, name: str | None = None,
                parallelism: int | None = None, schema: pa.Schema | None = None,
                on_timer: OnTimerFunction | None = None, ttl: Duration | None = None,
                ttl_time: TTLTime = "processing", ttl_on: str | None = None,
                expired_side_output: bool = False) -> Stream:
        """Keyed process with per-key state: ``fn(key, rows: RecordBatch, state) -> output``.

        ``state.value`` is the key's state (``None`` at first); assign to update it (``state`` is a
        ``chiray.KeyedState``). With ``on_timer``, ``state`` (a ``chiray.KeyedTimerState``) can also
        ``register(time)`` event-time timers for the key; ``on_timer(key, time, state) -> output`` runs
        once per (key, time) when the watermark reaches ``time``, in time order.

        ``ttl``, ``ttl_time``, ``ttl_on`` and ``expired_side_output`` as for :meth:`agg`: a key whose function
        was not called for that long loses its state (the side output gets the expired keys); not with
        ``on_timer`` (a timer can clear its key's state itself).
        """
        _check_callable("process", fn)
        key, bins = self.key, self.num_bins
        op_name = self.stream.flow._name("process", name)
        if ttl is not None and on_timer is not None:
            raise ValueError(f"operator {op_name!r}: process() with on_timer takes no ttl (a timer can clear its "
                             "key's state: state.clear())")
        expiry = state_ttl(f"operator {op_name!r}", ttl, ttl_time, ttl_on, expired_side_output, self.stream.schema)
        name = op_name
        if on_timer is not None:
            _check_callable("process(on_timer=...)", on_timer, name)
            stream = self._keyed("process", lambda: TimerProcessLogic(key, fn, on_timer, bins, schema), name=name,
                                 parallelism=parallelism, schema=schema, origin=describe_callable(fn))
            stream.node.event_time = True  # timers fire on watermarks
            return stream
        stream = self._keyed("process", lambda: keyed.ProcessLogic(key, fn, bins, schema, expiry), name=name,
                             parallelism=parallelism, schema=schema, origin=describe_callable(fn))
        if expiry is not None and expiry.side_output:
            key_field = self.stream.schema.field(key) if self.stream.schema is not None else None
            stream.node.side_outputs[EXPIRED] = pa.schema([key_field]) if key_field is not None else None
        return stream

    def process_batch(self, fn: Callable[[KeyedBatch], Any], *, name: str | None = None,
                      parallelism: int | None = None, schema: pa.Schema | None = None) -> Stream:
        """Keyed process over whole batches: ``fn(batch: chiray.KeyedBatch) -> output`` once per input batch.

        ``batch`` holds every key of the batch (``keys``), their rows grouped key by key (``rows``, key ``i``'s
        at ``offsets[i]:offsets[i + 1]``) and their states (``states``, ``None`` where none; what it holds when
        ``fn`` returns is stored), so ``fn`` can vectorise across keys; the state is ``process``'s. See
        :mod:`~operators.processbatch` for an example.
        """
        _check_callable("process_batch", fn)
        key, bins = self.key, self.num_bins
        return self._keyed("process", lambda: ProcessBatchLogic(key, fn, bins, schema), name=name,
                           parallelism=parallelism, schema=schema, origin=describe_callable(fn))
