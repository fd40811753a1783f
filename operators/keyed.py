"""keyed.py: keyed operator logics: built-in aggregations, keyed reduce and keyed process.

Every logic here keeps its state per key *bin*, the bin being
``hashing.bins_of(key, num_bins)``, the function the router uses too, so an
instance only ever sees keys of the bins routed to it and its state can move
bin by bin (``logic.state``).

* :class:`AggregateLogic`: count / sum / min / max / mean per key, vectorised
  over whole batches into a :class:`~operators.columnarstate.ColumnarAggState` (the
  fast path: a few million rows/s per instance, see ``benchmarks.keyed_count``); what each
  aggregate function computes lives in :mod:`operators.aggregates`.
* :class:`ReduceLogic`: ``fn(acc, row) -> acc`` per record (slow path).
* :class:`ProcessLogic`: ``fn(key, rows, state)`` per key and batch, with a
  per-key :class:`ValueState` (slow-ish path: one Python call per key and batch).

Null semantics are SQL's: a null key is a key of its own; sum, min, max and
mean skip null values and give null for a key with no non-null value;
``count`` is never null. NaN is a value (it propagates), not a null.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from .aggregates import (AGG_FUNCS, AggSpec, Recipe, aggregate_output_schema, batch_partials, result_column,
                         state_columns)
from .batch import to_batches
from .callbacks import KeyedState
from .hashing import check_num_bins
from .keygroups import KeyGroups, group_by_key
from .keyindex import encode_keys
from .logic import InstanceInfo, OperatorLogic, SideOutput
from .accumulators import Accumulator
from .columnarstate import ColumnarAggState
from .dictstate import DictState
from .ttl import EXPIRED, Expiry, StateTTL
from .valuettl import ExpiringValues, ValueExpiry, untouched

__all__ = [
    "AGG_FUNCS",
    "AggSpec",
    "aggregate_output_schema",
    "AggregateLogic",
    "ReduceLogic",
    "ProcessLogic",
    "ValueState",
]

_EMITS = ("final", "updates")
_MAX_OUTPUT_ROWS = 1 << 16  # rows per output batch of finish()


class _KeyedLogic(OperatorLogic):
    """What every keyed logic shares: the key column and the number of bins."""

    def __init__(self, key: str, num_bins: int) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a column name, got {key!r}")
        self.key = key
        self.num_bins = check_num_bins(num_bins)

    def open(self, info: InstanceInfo) -> None:
        if info.num_bins and info.num_bins != self.num_bins:
            raise ValueError(
                f"bug in planning: {info} was built with {self.num_bins} bins but opened with {info.num_bins}"
            )
        super().open(info)

    def _key_column(self, batch: pa.RecordBatch) -> pa.Array:
        index = batch.schema.get_field_index(self.key)
        if index < 0:
            raise ValueError(f"key column {self.key!r} is not in the input columns {batch.schema.names}")
        return batch.column(index)


def _check_emit(emit: str) -> str:
    if emit not in _EMITS:
        raise ValueError(f"emit must be one of {_EMITS}, got {emit!r}")
    return emit


def _check_fn(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} needs a callable, got {type(fn).__name__}")


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class AggregateLogic(_KeyedLogic):
    """Built-in aggregations per key, vectorised over whole batches (the fast path).

    Per batch: group the key column (:func:`~operators.keyindex.encode_keys`),
    compute per-key partials with NumPy (``bincount``, ``ufunc.at``), and
    combine them into the :class:`~operators.columnarstate.ColumnarAggState` by slot.

    ``emit="final"``: ``process`` returns nothing and ``finish`` returns every
    key's result. ``emit="updates"``: each ``process`` returns the new result
    of every key the batch touched (an upsert changelog by key); ``finish``
    returns nothing.

    ``ttl``: keys not written for that long are dropped (:mod:`operators.ttl`),
    counted in ``expired_keys``, their last results sent to the side output
    ``"expired"`` if asked.

    Example:
        >>> logic = AggregateLogic("k", [AggSpec("n", "count"), AggSpec("s", "sum", "v")], 16)
        >>> _ = logic.process(pa.record_batch({"k": ["a", "b", "a"], "v": [1, None, 3]}), 0)
        >>> logic.finish()[0].to_pylist()
        [{'k': 'a', 'n': 2, 's': 4}, {'k': 'b', 'n': 1, 's': None}]
    """

    def __init__(self, key: str, aggs: Sequence[AggSpec], num_bins: int, emit: str = "final",
                 ttl: StateTTL | None = None) -> None:
        """Create the logic (no state is built before the first batch or install).

        Raises:
            ValueError: no aggregates, an invalid ``emit`` or ``num_bins``.
            TypeError: an aggregate that is not an :class:`AggSpec`.
        """
        super().__init__(key, num_bins)
        self.aggs = tuple(aggs)
        if not self.aggs:
            raise ValueError("an aggregation needs at least one AggSpec")
        for agg in self.aggs:
            if not isinstance(agg, AggSpec):
                raise TypeError(f"aggregates must be AggSpec, got {type(agg).__name__}: {agg!r}")
        self.emit = _check_emit(emit)
        self.ttl = ttl
        self._expiry = Expiry(ttl, self.where("agg")) if ttl is not None else None
        self._state = ColumnarAggState(self.num_bins, touched=ttl is not None)
        self._input_schema: pa.Schema | None = None
        self._output_schema: pa.Schema | None = None
        self._recipes: list[tuple[Accumulator, Recipe]] = []

    @property
    def state(self) -> ColumnarAggState:
        """The keyed state (bins can be snapshotted, extracted and installed)."""
        return self._state

    @property
    def output_schema(self) -> pa.Schema | None:
        """The output schema, once known (from a batch or from installed bins)."""
        if self._output_schema is None and self._state.configured:
            self._output_schema = pa.ipc.read_schema(pa.py_buffer(self._state.layout[2]))
        return self._output_schema

    @property
    def expired_keys(self) -> int:
        """Keys dropped by the TTL so far (0 without one)."""
        return self._expiry.expired_keys if self._expiry is not None else 0

    def open(self, info: InstanceInfo) -> None:
        super().open(info)
        if self._expiry is not None:
            self._expiry.where = self.where("agg")

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[Any]:
        self._prepare(batch.schema)
        out = self._expire()
        if batch.num_rows == 0:
            return out
        uniques, codes = encode_keys(self._key_column(batch))
        touched = self._expiry.touches(batch, codes, len(uniques)) if self._expiry is not None else None
        slots = self._state.update(uniques, batch_partials(batch, codes, len(uniques), self._recipes), touched)
        if self.emit == "updates":
            out.append(self._result(uniques, self._state.values(slots)))
        return out

    def on_watermark(self, watermark: int) -> list[Any]:
        if self._expiry is None:
            return []
        self._expiry.watermark(watermark)
        return self._expire()

    def _expire(self) -> list[Any]:
        """Drop the keys the TTL says are due; their last results on the side output if asked."""
        due = self._expiry.due(self._state.installs) if self._expiry is not None else None
        if due is None or not self._state.configured:
            return []
        assert self._expiry is not None
        keys, values, oldest = self._state.expire(*due)
        self._expiry.expired(len(keys), oldest)
        if len(keys) and self._expiry.spec.side_output and self.output_schema is not None:
            return [SideOutput(EXPIRED, self._result(keys, values))]
        return []

    def finish(self) -> list[pa.RecordBatch]:
        if self.emit != "final" or self.output_schema is None:
            return []
        slots = self._state.slots()
        parts = [slots[i:i + _MAX_OUTPUT_ROWS] for i in range(0, len(slots), _MAX_OUTPUT_ROWS)]
        return [self._result(self._state.keys_at(part), self._state.values(part)) for part in parts]

    def _prepare(self, schema: pa.Schema) -> None:
        """Check a batch's schema; on the first one, configure the state."""
        if self._input_schema is not None and (schema is self._input_schema or schema.equals(self._input_schema)):
            return
        out = aggregate_output_schema(schema, self.key, self.aggs)
        if self.output_schema is not None and not out.equals(self._output_schema):
            raise ValueError(
                f"input schema changed: the aggregation's output would be {out}, "
                f"but its state holds output {self._output_schema}"
            )
        accs = state_columns(schema, self.aggs)
        self._state.configure(schema.field(self.key).type, [acc for acc, _ in accs.values()],
                              out.serialize().to_pybytes())
        self._input_schema, self._output_schema, self._recipes = schema, out, list(accs.values())

    def _result(self, keys: pa.Array, values: dict[str, np.ndarray]) -> pa.RecordBatch:
        schema = self.output_schema
        assert schema is not None
        key_type = schema.field(0).type
        arrays = [keys if keys.type == key_type else keys.cast(key_type)]
        arrays += [result_column(agg, field, values) for agg, field in zip(self.aggs, list(schema)[1:])]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


class ReduceLogic(ExpiringValues, _KeyedLogic):
    """General keyed reduce over records (the slow path: one Python call per record).

    The first row of a key is its accumulator; each further row ``r`` makes
    it ``fn(acc, r)``. Accumulators live in a :class:`~operators.dictstate.DictState`
    with ``pickled=True``: they are whatever ``fn`` returns, so their bins
    travel (rescale, checkpoint) as cloudpickle.
    With ``emit="final"`` ``finish`` emits one row per key (the accumulators);
    with ``emit="updates"`` each ``process`` emits the accumulators of the keys
    the batch touched. The accumulator keeps the record's columns: a function
    that returns other columns fails at that call (the output has the input's
    schema; use ``process`` with ``schema=`` to emit something else).
    ``ttl``: keys not written for that long are dropped (:mod:`operators.valuettl`), their last
    accumulators sent to the side output ``"expired"`` if asked.

    Example:
        >>> logic = ReduceLogic("k", lambda acc, row: {**acc, "v": acc["v"] + row["v"]}, 8)
        >>> _ = logic.process(pa.record_batch({"k": ["a", "b", "a"], "v": [1, 2, 3]}), 0)
        >>> sorted(logic.finish()[0].to_pylist(), key=lambda r: r["k"])
        [{'k': 'a', 'v': 4}, {'k': 'b', 'v': 2}]
    """

    def __init__(self, key: str, fn: Callable[[dict, dict], dict], num_bins: int, emit: str = "final",
                 ttl: StateTTL | None = None) -> None:
        super().__init__(key, num_bins)
        _check_fn(fn, "reduce")
        self.fn = fn
        self.emit = _check_emit(emit)
        self._state = DictState(self.num_bins, pickled=True, track_changes=True)  # the user's accumulators
        self._schema: pa.Schema | None = None
        self._ttl_verb = "reduce"
        self._ttl = ValueExpiry(ttl, self.where("reduce"), self._state) if ttl is not None else None

    @property
    def state(self) -> DictState:
        """The keyed state: ``key -> accumulator`` per bin."""
        return self._state

    def _expired_output(self, gone: list[tuple[Any, Any]]) -> list[Any]:
        return [SideOutput(EXPIRED, batch) for batch in self._rows([acc for _, acc in gone])]

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[Any]:
        column = self._key_column(batch)
        self._schema = batch.schema
        out = self._expire()
        if batch.num_rows == 0:
            return out
        groups = group_by_key(batch, column, self.num_bins)
        stored = self._state.get_many(groups.keys, groups.bins.tolist())
        accs = untouched(stored)  # None: a key not seen yet
        rows, offsets = groups.rows.to_pylist(), groups.offsets.tolist()
        fn, columns = self.fn, dict.fromkeys(batch.schema.names).keys()
        for i, acc in enumerate(accs):
            start, end = offsets[i], offsets[i + 1]
            if acc is None:
                acc, start = rows[start], start + 1
            for j in range(start, end):
                acc = fn(acc, rows[j])
                if type(acc) is not dict or acc.keys() != columns:
                    self._check_acc(acc, batch.schema.names)
            accs[i] = acc
        written = accs if self._ttl is None else self._ttl.touched(groups.rows, offsets, accs, stored)
        self._state.write_many(groups.keys, groups.bins, written)
        if self.emit == "updates":
            out.extend(self._rows(accs))
        return out

    def _check_acc(self, acc: Any, columns: Sequence[str]) -> None:
        if not isinstance(acc, dict):
            raise TypeError(f"reduce function {_fn_name(self.fn)} returned {type(acc).__name__}, expected a dict")
        if acc.keys() != set(columns):
            raise TypeError(_changed_columns(self.fn, columns, acc))

    def finish(self) -> list[pa.RecordBatch]:
        if self.emit != "final":
            return []
        return self._rows(untouched([acc for _, acc in self._state.items()]))

    def _rows(self, accs: list[dict]) -> list[pa.RecordBatch]:
        if not accs:
            return []
        schema = self._schema
        if schema is not None and all(acc.keys() == set(schema.names) for acc in accs):
            try:
                return [pa.RecordBatch.from_pylist(accs, schema=schema)]
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                pass
        names = dict.fromkeys(name for acc in accs for name in acc)  # every field any accumulator has
        return [pa.RecordBatch.from_pydict({name: [acc.get(name) for acc in accs] for name in names})]


def _changed_columns(fn: Any, columns: Sequence[str], row: dict) -> str:
    added = sorted(set(row) - set(columns))
    missing = [c for c in columns if c not in row]
    what = "; ".join(part for part in (f"added {added}" if added else "",
                                      f"dropped {missing}" if missing else "") if part)
    return (f"reduce function {_fn_name(fn)} returned columns {sorted(row)}; expected the record's columns "
            f"{list(columns)} ({what}). A reduce keeps the record's schema: use process(fn, schema=...) "
            "to emit other columns")


def _only_nulls_differ(first: pa.Schema, other: pa.Schema) -> bool:
    """Same fields in the same order, and where a type differs ``other``'s is null (all values missing:
    rows inferred from ``None``s), so casting to ``first`` loses nothing."""
    return other.names == first.names and all(
        f.type == g.type or pa.types.is_null(g.type) for f, g in zip(first, other))


def _schema_difference(first: pa.Schema, other: pa.Schema) -> str:
    """How ``other`` differs from ``first``, field by field, for a person."""
    parts = []
    for field in other:
        if field.name not in first.names:
            parts.append(f"field {field.name!r} ({field.type}) that the first output did not have")
        elif first.field(field.name).type != field.type:
            parts.append(f"field {field.name!r} as {field.type} where the first output had "
                         f"{first.field(field.name).type}")
    parts += [f"no field {f.name!r} ({f.type})" for f in first if f.name not in other.names]
    return "; ".join(parts) or f"the fields in another order ({other.names}, first {first.names})"


class ValueState:
    """The state of one key, handed to a :class:`ProcessLogic` function (its public type:
    :class:`~operators.callbacks.KeyedState`, ``chiray.KeyedState``).

    ``value`` is ``None`` until set; what it holds when the call returns is stored in the key's bin
    (``None``: the key's state is forgotten, as after ``clear()``). Valid only during the call it was handed
    to: the operator hands the same object, rebound, to the next key.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def clear(self) -> None:
        """Forget the key's state."""
        self.value = None


class ProcessLogic(ExpiringValues, _KeyedLogic):
    """Keyed process with per-key state: ``fn(key, rows, state)`` per key and batch.

    For each key of a batch, in order of first appearance, ``fn`` gets the
    key (a Python value), that key's rows of the batch in arrival order (a
    RecordBatch) and its :class:`ValueState`. ``fn`` returns ``None``, a
    RecordBatch or Table, or a list of row dicts; the outputs are concatenated
    in order. They must share one schema: the declared one (``schema=`` of
    ``process()``; results are cast to it), else the first output's exactly (a
    later output with other fields or types is an error, never cast).
    The values live in a :class:`~operators.dictstate.DictState` with
    ``pickled=True`` (they are any objects ``fn`` stores): their bins travel
    as cloudpickle. A checkpoint writes the values of the keys ``fn`` was
    called for since the previous one (a value changed in place is written
    too), and of those it deleted. ``ttl``: keys not written for that long are dropped
    (:mod:`operators.valuettl`); the side output ``"expired"`` gets their keys if asked.

    Example:
        >>> def running(key, rows, state):
        ...     state.value = (state.value or 0) + rows.num_rows
        ...     return [{"k": key, "seen": state.value}]
        >>> logic = ProcessLogic("k", running, 8)
        >>> logic.process(pa.record_batch({"k": ["a", "b", "a"]}), 0)[0].to_pylist()
        [{'k': 'a', 'seen': 2}, {'k': 'b', 'seen': 1}]
    """

    def __init__(self, key: str, fn: Callable[..., Any], num_bins: int,
                 output_schema: pa.Schema | None = None, ttl: StateTTL | None = None) -> None:
        super().__init__(key, num_bins)
        _check_fn(fn, "process")
        if output_schema is not None and not isinstance(output_schema, pa.Schema):
            raise TypeError(f"output_schema must be a pyarrow.Schema, got {type(output_schema).__name__}")
        self.fn = fn
        self.output_schema = output_schema
        self._schema = output_schema  # the given schema, else the first output's
        self._state = DictState(self.num_bins, pickled=True, track_changes=True)  # the user's values
        self._ttl_verb = "process"
        self._ttl = ValueExpiry(ttl, self.where("process"), self._state) if ttl is not None else None
        self._key_type: pa.DataType | None = None  # of the key column (the expired side output's)

    def _expired_output(self, gone: list[tuple[Any, Any]]) -> list[Any]:
        keys = pa.array([key for key, _ in gone], type=self._key_type)
        return [SideOutput(EXPIRED, pa.record_batch({self.key: keys}))]

    @property
    def state(self) -> DictState:
        """The keyed state: ``key -> value`` per bin."""
        return self._state

    def replace_code(self, fn: Callable[..., Any], on_timer: Any = None,
                     schema: pa.Schema | None = None) -> tuple[Any, Any, Any]:
        """An upgrade (``job.upgrade``): call ``fn`` (declaring ``schema``) from the next batch on, over the
        same state; returns the code replaced, ``(fn, on_timer, schema)``."""
        _check_fn(fn, "process")
        old = (self.fn, None, self.output_schema)
        self.fn, self.output_schema, self._schema = fn, schema, schema
        return old

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[Any]:
        column = self._key_column(batch)
        self._key_type = column.type
        out = self._expire()
        if batch.num_rows == 0:
            return out
        groups = group_by_key(batch, column, self.num_bins)
        if type(self)._key_state is ProcessLogic._key_state:
            return out + self._outputs(self._call_keys(groups))
        return out + self._outputs(self._call_with_contexts(groups))

    def _call_keys(self, groups: KeyGroups) -> list[Any]:
        """``fn`` per key, its value in one reused :class:`ValueState`; the values written back in one pass
        (none, if ``fn`` raises: a batch changes the state wholly or not at all)."""
        keys, fn, rows, offsets = groups.keys, self.fn, groups.rows, groups.offsets.tolist()
        stored = self._state.get_many(keys, groups.bins.tolist())
        values = untouched(stored)
        state = ValueState()
        results = []
        for i, key in enumerate(keys):
            state.value = values[i]
            start = offsets[i]
            result = fn(key, rows.slice(start, offsets[i + 1] - start), state)
            values[i] = state.value
            if result is not None:
                results.append(result)
        written = values if self._ttl is None else self._ttl.touched(rows, offsets, values, stored)
        self._state.write_many(keys, groups.bins, written)
        return results

    def _call_with_contexts(self, groups: KeyGroups) -> list[Any]:
        """``fn`` per key with the context a subclass hands out (:meth:`_key_state`), which writes through."""
        results = []
        for key, b, rows in groups.slices():
            result = self.fn(key, rows, self._key_state(key, b))
            self._state.touch(key, b)  # fn may have changed the value in place: checkpointed again
            if result is not None:
                results.append(result)
        return results

    def _outputs(self, results: list[Any]) -> list[pa.RecordBatch]:
        """What the calls returned, in order, as batches of the output schema: runs of row dicts one batch."""
        outputs: list[pa.RecordBatch] = []
        pending_rows: list[dict] = []  # row outputs of consecutive keys: one batch, types inferred over all
        for result in results:
            if isinstance(result, (list, tuple)) and result and isinstance(result[0], dict):
                self._check_fields(pending_rows[0] if pending_rows else result[0], result)
                pending_rows += result
                continue
            if pending_rows:
                outputs.append(self._conform(pa.RecordBatch.from_pylist(pending_rows, schema=self.output_schema)))
                pending_rows = []
            outputs.extend(self._conform(b) for b in to_batches(result, self.output_schema))
        if pending_rows:
            outputs.append(self._conform(pa.RecordBatch.from_pylist(pending_rows, schema=self.output_schema)))
        outputs = [b for b in outputs if b.num_rows]
        if len(outputs) <= 1:
            return outputs
        return pa.Table.from_batches(outputs).combine_chunks().to_batches()

    def _key_state(self, key: Any, bin: int) -> KeyedState:
        """What ``fn`` gets as the key's state where a subclass hands out richer contexts (writing through to
        the state); the plain logic hands one reused :class:`ValueState` instead."""
        return ValueState(self._state.get(key, bin))

    def _check_fields(self, first: dict, rows: Sequence[dict]) -> None:
        fields = first.keys()
        for row in rows:
            if row.keys() != fields:
                raise TypeError(
                    f"process function {_fn_name(self.fn)} returned rows with fields {sorted(row)}; "
                    f"expected {sorted(fields)} (declare the output with process(..., schema=...))")

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Give an output batch the operator's output schema.

        With a declared schema, outputs are cast to it. Without one the first output fixes it, and a later
        output that does not have exactly its fields and types is an error (never a silent cast or drop).
        """
        if self._schema is None:
            self._schema = batch.schema
        if batch.schema.equals(self._schema):
            return batch
        if self.output_schema is None and not _only_nulls_differ(self._schema, batch.schema):
            raise TypeError(
                f"process function {_fn_name(self.fn)} returned {_schema_difference(self._schema, batch.schema)}; "
                f"its first output fixed the schema ({self._schema.to_string(show_schema_metadata=False)}). "
                "Declare the output with process(..., schema=pa.schema([...])) (outputs are then cast to it)")
        try:
            return batch.select(self._schema.names).cast(self._schema)
        except (KeyError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise TypeError(
                f"process function {_fn_name(self.fn)} returned a batch with schema {batch.schema}; "
                f"it does not cast to the declared schema= {self._schema}: {exc}"
            ) from None
