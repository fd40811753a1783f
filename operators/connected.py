"""connected.py: two streams connected for a keyed two-input operator (co-process, joins).

Example:
    >>> from chiray.operators import Dataflow, from_items
    >>> flow = Dataflow("j")
    >>> orders = flow.source(from_items([{"user": "a", "amount": 3}]), name="orders")
    >>> users = flow.source(from_items([{"id": "a", "city": "Oslo"}]), name="users")
    >>> joined = orders.connect(users).key_by("user", "id").join(name="enrich")
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Sequence

import pyarrow as pa

from .columns import check_time_column
from .eventtime import show_duration, ticks
from .graph import OperatorKind, OperatorNode, Partition, describe_callable
from .callbacks import CoProcessFunction, OnTimerFunction
from .handles import S
from .hashing import check_num_bins
from .ordering import check_order, check_orderable
from .lifetime import LifetimeJoinLogic, lifetime_output_schema
from .joins import LATE_PORTS, CoProcessLogic, JoinLogic, WindowJoinLogic, check_key_types, join_tables
from .ttl import EXPIRED, state_ttl
from .windows import WindowSpec, window_output_schema

__all__ = ["ConnectedStreams", "KeyedConnectedStreams"]


class ConnectedStreams(Generic[S]):
    """Two streams of one dataflow, to be keyed together (``key_by``); ``a.connect(b)`` makes them (for type
    checkers a ``ConnectedStreams[Stream]``: the type parameter ``S`` is the stream type its operators return).
    """

    def __init__(self, left: S, right: S) -> None:
        if not isinstance(right, type(left)) or right.flow is not left.flow:
            raise TypeError(f"connect() after operator {left.name!r}: expected a stream of the same Dataflow, "
                            f"got {type(right).__name__}")
        self.left, self.right = left, right

    def key_by(self, left_key: str, right_key: str | None = None, *,
               num_bins: int | None = None) -> KeyedConnectedStreams[S]:
        """Partition both streams by their key columns (``right_key`` defaults to ``left_key``)."""
        right_key = left_key if right_key is None else right_key
        for stream, key in ((self.left, left_key), (self.right, right_key)):
            if not isinstance(key, str) or not key:
                raise ValueError(f"connect().key_by(): expected a column name, got {key!r}")
            if stream.schema is not None and key not in stream.schema.names:
                raise ValueError(f"connect().key_by(): unknown key column {key!r} of stream {stream.name!r}; "
                                 f"it has columns {stream.schema.names}")
        if self.left.schema is not None and self.right.schema is not None:
            check_key_types((left_key, right_key), (self.left.schema.field(left_key).type,
                                                    self.right.schema.field(right_key).type),
                            f"connect({self.left.name!r}, {self.right.name!r}).key_by(): ")
        bins = self.left.flow.num_bins if num_bins is None else check_num_bins(num_bins)
        return KeyedConnectedStreams(self.left, self.right, (left_key, right_key), bins)


class KeyedConnectedStreams(Generic[S]):
    """Two streams partitioned by the same bins: their keyed two-input operators, which return an ``S``
    (a ``Stream``)."""

    def __init__(self, left: S, right: S, keys: tuple[str, str], num_bins: int) -> None:
        self.left, self.right, self.keys, self.num_bins = left, right, keys, num_bins

    def _add(self, verb: str, make: Callable[[], Any], name: str | None, parallelism: int | None,
             schema: pa.Schema | None, origin: str = "") -> S:
        flow = self.left.flow
        node = OperatorNode(
            flow._name(verb, name), OperatorKind.KEYED,
            self.left.node.parallelism if parallelism is None else parallelism,
            inputs=[s._edge(Partition.HASH, k, self.num_bins) for s, k in zip((self.left, self.right), self.keys)],
            make_logic=make, schema=schema, key=self.keys[0], num_bins=self.num_bins, origin=origin,
        )
        return flow._add(node)

    def _join_schema(self) -> pa.Schema | None:
        if self.left.schema is None or self.right.schema is None:
            return None
        return join_tables(self.left.schema.empty_table(), self.right.schema.empty_table(), *self.keys).schema

    def join(self, *, name: str | None = None, parallelism: int | None = None, ttl: Any = None,
             ttl_time: Any = "processing", ttl_on: str | None = None, expired_side_output: bool = False) -> S:
        """Incremental inner equi-join: each pair of rows with equal keys, emitted when its second row arrives.

        State grows without bound (every row is kept) unless ``ttl`` is given: a key whose rows were not added
        to for that long loses them (``ttl_time``, ``ttl_on`` and ``expired_side_output`` as for ``agg``; an
        event-time ``ttl_on`` is a column of both inputs). ``window_join`` bounds the state by windows instead.
        """
        op_name = self.left.flow._name("join", name)
        where = f"operator {op_name!r}"
        expiry = state_ttl(where, ttl, ttl_time, ttl_on, expired_side_output, self.left.schema)
        if expiry is not None and ttl_on is not None:
            state_ttl(where, ttl, ttl_time, ttl_on, expired_side_output, self.right.schema)  # both sides have it
        keys, bins = self.keys, self.num_bins
        stream = self._add("join", lambda: JoinLogic(keys, bins, expiry), op_name, parallelism, self._join_schema())
        if expiry is not None and expiry.side_output:
            left = self.left.schema
            stream.node.side_outputs[EXPIRED] = pa.schema([left.field(keys[0])]) if left is not None else None
        return stream

    def window_join(self, spec: WindowSpec, *, on: str | tuple[str, str], name: str | None = None,
                    parallelism: int | None = None, allowed_lateness: Any = 0,
                    late_side_output: bool = False) -> S:
        """Inner equi-join of rows in the same event-time window, emitted when the watermark passes its end.

        ``on``: the event-time column (one name, or one per input). ``allowed_lateness`` (ticks or a
        timedelta): a window still joins rows for that long after it fired, each late row at once with
        the other side's rows of its key (an update). ``late_side_output=True``: rows that came after
        their every window expired also go to ``side_output("late_left")`` / ``("late_right")``, besides
        being counted.
        """
        op_name = self.left.flow._name("window_join", name)
        times = (on, on) if isinstance(on, str) else tuple(on)
        if not isinstance(spec, WindowSpec) or spec.kind == "session":
            raise TypeError(f"operator {op_name!r}: window_join() takes tumbling(...) or sliding(...), got {spec!r}")
        found = [check_time_column(stream.flow.graph, stream.node.name, stream.port, column, f"operator {op_name!r}")
                 for stream, column in zip((self.left, self.right), times)]
        known = [f for f in found if f.type is not None]
        time_type = known[-1].type if known else None
        note = known[-1].describe() if known else ""
        spec.resolve(time_type, f"operator {op_name!r}", times[0])
        schema = self._join_schema()
        if schema is not None and time_type is not None:
            schema = window_output_schema(time_type, schema.field(0), list(schema)[1:])
        ticks(allowed_lateness, time_type, f"operator {op_name!r}: allowed_lateness={show_duration(allowed_lateness)}",
              times[0])  # checked at build time
        keys, bins, late = self.keys, self.num_bins, bool(late_side_output)
        pair: tuple[str, str] = (times[0], times[1])
        stream = self._add("window_join", lambda: WindowJoinLogic(
            keys, pair, spec, bins, time_type, allowed_lateness, late, note), op_name, parallelism, schema)
        stream.node.event_time = True
        if late:
            stream.node.side_outputs[LATE_PORTS[0]] = self.left.schema
            stream.node.side_outputs[LATE_PORTS[1]] = self.right.schema
        return stream

    def lifetime_join(self, *, start: str, end: str, on: str, by: str | Sequence[str],
                      descending: bool | Sequence[bool] = True, name: str | None = None,
                      parallelism: int | None = None) -> S:
        """Each left row with the best right row of its key within its lifetime, emitted when that ends.

        Example: each auction with its highest bid while it was open, the earliest on equal prices::

            auctions.connect(bids).key_by("id", "auction").lifetime_join(
                start="date_time", end="expires", on="date_time", by="price")

        A right row matches a left row of its key when its time ``on`` is within the left row's
        ``[start, end]`` (event-time columns of one type). Of the matches the best is the one with the
        greatest ``by`` (a column or a list, the first deciding first; the least with
        ``descending=False``), the earliest by ``on`` on ties, then the first to arrive. A left row is
        emitted once the watermark reaches its ``end`` (or at end of input), joined with its best
        match; a left row with none emits nothing. Output columns as ``join``'s: the key (named as the
        left key), the left columns, then the right ones but the key (``_right`` on clashes).

        State: the open left rows with their best match so far, and the right rows after the
        watermark (a left row still to come could match them).
        """
        op_name = self.left.flow._name("lifetime_join", name)
        where = f"operator {op_name!r}"
        by, flags = check_order(by, descending, where, "lifetime_join")
        found = [check_time_column(stream.flow.graph, stream.node.name, stream.port, column, where)
                 for stream, column in ((self.left, start), (self.left, end), (self.right, on))]
        types = {f.type for f in found if f.type is not None}
        if len(types) > 1:
            raise ValueError(f"{where}: lifetime_join() compares start={start!r}, end={end!r} and on={on!r} as "
                             f"times of one type; they have types {[str(f.type) for f in found]}: cast them "
                             "to one (e.g. timestamp('ms'))")
        schema = None
        if self.right.schema is not None:
            check_orderable(self.right.schema, by, where, "lifetime_join")
            if self.left.schema is not None:
                schema = lifetime_output_schema(self.left.schema, self.right.schema, self.keys)
        keys, bins = self.keys, self.num_bins
        stream = self._add("lifetime_join", lambda: LifetimeJoinLogic(keys, start, end, on, by, flags, bins),
                           op_name, parallelism, schema)
        stream.node.event_time = True
        return stream

    def process(self, fn: CoProcessFunction, *, on_timer: OnTimerFunction | None = None,
                name: str | None = None, parallelism: int | None = None, schema: pa.Schema | None = None) -> S:
        """Keyed co-process: ``fn(key, rows, state, input)`` (``input`` 0 or 1), with optional timers.

        ``state`` (a ``KeyedTimerState``) is the key's, shared by both inputs: ``state.value``, and
        ``state.register(time)`` for ``on_timer(key, time, state)`` once the watermark reaches ``time``.
        """
        for verb, f in (("process", fn), ("on_timer", on_timer)):
            if f is not None and not callable(f):
                raise TypeError(f"connect().key_by().process(): {verb} must be a function, got {type(f).__name__}")
        keys, bins = self.keys, self.num_bins
        stream = self._add("co_process", lambda: CoProcessLogic(keys, fn, bins, on_timer, schema), name,
                           parallelism, schema, describe_callable(fn))
        stream.node.event_time = on_timer is not None  # timers fire on watermarks
        return stream


