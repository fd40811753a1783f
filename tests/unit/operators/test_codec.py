"""Tests for operators.codec: every supported type round trips with its type, nothing else encodes, and
nothing but this format decodes (a pickle least of all: it is refused unread)."""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import json
import math
import pickle
import sys
import zoneinfo
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators import codec
from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState

PARIS = zoneinfo.ZoneInfo("Europe/Paris")


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (nan equals nan; batches and tables with their schema
    metadata and chunking)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (pa.RecordBatch, pa.Table)):
        chunks = (lambda t: [c.num_rows for c in t.to_batches()]) if isinstance(a, pa.Table) else len
        return a.equals(b) and a.schema.equals(b.schema, check_metadata=True) and chunks(a) == chunks(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a) and all(
            same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and (a == b or (a != a and b != b))
    if isinstance(a, datetime.datetime):
        return a == b and a.fold == b.fold and a.tzinfo == b.tzinfo
    return a == b


def round_trip(value: Any) -> Any:
    return codec.decode(codec.encode(value))


SCALARS = {
    "none": None, "true": True, "false": False, "int": -7, "int64 max": (1 << 63) - 1, "big int": 1 << 200,
    "negative big int": -(3 ** 150), "float": 0.1, "negative zero": -0.0, "nan": math.nan, "inf": math.inf,
    "-inf": -math.inf, "str": "héllo \u2603 \ud800", "empty str": "", "bytes": b"\x00\x80\xff",
    "empty bytes": b"",
    "large bytes": bytes(range(256)) * 1024,
    "int8": np.int8(-3), "uint64": np.uint64(2**64 - 1), "float16": np.float16(0.1),
    "float32": np.float32(1.5),
    "float64": np.float64(2.5), "float64 nan": np.float64("nan"), "bool_": np.bool_(True),
    "complex64": np.complex64(1 + 2j), "str_": np.str_("k"), "datetime64": np.datetime64(5, "ns"),
    "datetime64 NaT": np.datetime64("NaT", "ms"), "timedelta64": np.timedelta64(-7, "ms"),
    "date": datetime.date(2024, 2, 29), "time": datetime.time(1, 2, 3, 4),
    "time with offset": datetime.time(1, 2, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
    "naive datetime": datetime.datetime(2021, 1, 1, 1, 2, 3, 4),
    "utc datetime": datetime.datetime(2021, 1, 1, tzinfo=datetime.timezone.utc),
    "offset datetime": datetime.datetime(
        2021, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=5, microseconds=3))),
    "zoned datetime, second of two": datetime.datetime(2020, 10, 25, 2, 30, fold=1, tzinfo=PARIS),
    "arrow zoned datetime": pa.array([10**15], pa.timestamp("us", "Asia/Tokyo")).to_pylist()[0],
    "timedelta": datetime.timedelta(days=-1, seconds=5, microseconds=3),
    "decimal": decimal.Decimal("-1.2300"),
    "pandas timestamp ns": pa.array([1_000_000_001], pa.timestamp("ns")).to_pylist()[0],
    "pandas zoned timestamp": pd.Timestamp(1_000_000_001, tz="Europe/Paris"),
    "pandas timedelta": pa.array([5], pa.duration("ns")).to_pylist()[0],
    "month day nano": pa.array([(1, 2, 3)], pa.month_day_nano_interval()).to_pylist()[0],
}


@pytest.mark.parametrize("name", SCALARS)
def test_every_supported_scalar_round_trips_with_its_type(name: str) -> None:
    value = SCALARS[name]
    back = round_trip(value)
    assert same(back, value), (back, value)
    if not (isinstance(value, float) and math.isnan(value)) and value == value:
        assert hash(back) == hash(value)


def test_containers_nest_and_keep_their_types_and_order() -> None:
    batch = pa.record_batch({"x": [1, 2, 3]})
    value = {
        ("a", 1): [1, (2, 3), {4: [5.0, None]}, set(), frozenset({"x", 7})],
        frozenset({1, 2}): {"s": {1, 2, 3}, "empty": {}, "t": (), "l": []},
        np.int32(5): [batch, (batch.slice(1), [pa.Table.from_batches([batch, batch])])],
        None: [[[[[1]]]]], 1.5: b"x", True: "bool key", datetime.date(2020, 1, 1): decimal.Decimal(1),
    }
    back = round_trip(value)
    assert same(back, value)
    assert list(back) == list(value)  # insertion order kept


def test_numpy_keys_keep_their_dtype_so_lookups_and_hashes_match() -> None:
    keys = [np.int32(-4), np.uint8(200), np.float32(0.5), np.datetime64(3, "s"), np.bool_(False)]
    back = round_trip({k: i for i, k in enumerate(keys)})
    for i, k in enumerate(keys):
        assert back[k] == i
    assert [(type(k), k.dtype) for k in back] == [(type(k), k.dtype) for k in keys]


def test_record_batches_and_tables_keep_schemas_dictionaries_and_chunks() -> None:
    plain = pa.record_batch({"k": ["a", "b"], "v": [1, 2]})
    with_meta = plain.replace_schema_metadata({"origin": "left"})
    other_meta = plain.replace_schema_metadata({"origin": "right"})
    dict_a = pa.record_batch({"c": pa.array(["x", "y"]).dictionary_encode()})
    dict_b = pa.record_batch({"c": pa.array(["z", "x"]).dictionary_encode()})
    many = [pa.record_batch({f"c{i}": [i]}) for i in range(20)] * 2  # past the schemas compared one by one
    value = {
        "batches": [plain, with_meta, other_meta, plain.slice(1, 1), plain.slice(2, 0), dict_a, dict_b],
        "many": many,
        "tables": [pa.Table.from_batches([plain, plain.slice(0, 1)]),
                   pa.table({"x": pa.array([], pa.int64())}),
                   pa.Table.from_batches([], schema=pa.schema([("y", pa.string())], metadata={"m": "1"}))],
        "nested": pa.record_batch({"s": pa.array([{"a": [1, 2]}, None])}),
    }
    back = round_trip(value)
    assert same(back, value)
    assert back["batches"][6].column(0).dictionary.to_pylist() == ["z", "x"]  # not merged with dict_a's


def test_a_slice_carries_only_its_own_rows() -> None:
    n = 1_000_000
    big = pa.record_batch({"x": np.arange(n), "s": pa.array(np.arange(n).astype(str))})
    full = len(codec.encode([big]))
    one = codec.encode([big.slice(n // 2, 10)])
    several = codec.encode({k: [big.slice(k * 997, 3), big.slice(n - 5 - k, 2)] for k in range(100)})
    assert len(one) < full / 1000 and len(several) < full / 100
    assert codec.decode(one)[0].equals(big.slice(n // 2, 10))
    assert same(codec.decode(several),
                {k: [big.slice(k * 997, 3), big.slice(n - 5 - k, 2)] for k in range(100)})


def test_an_int_past_pythons_digit_limit_round_trips() -> None:
    huge = 7 ** (4 * sys.get_int_max_str_digits() if sys.get_int_max_str_digits() else 20_000)
    assert round_trip([huge, -huge, 3]) == [huge, -huge, 3]


class _Color(enum.IntEnum):
    RED = 1


_Point = collections.namedtuple("_Point", "x y")


@pytest.mark.parametrize("value, where, kind", [
    ({"items": [1, 2, 3, (0, object())]}, "value['items'][3][1]", "builtins.object"),
    ([np.arange(3)], "value[0]", "numpy.ndarray"),
    ({"a": {"b": _Color.RED}}, "value['a']['b']", "_Color"),
    ((1, _Point(1, 2)), "value[1]", "_Point"),
    ({"k": {frozenset({1}), _Color.RED}}, "value['k'].<member ", "_Color"),
    ([bytearray(b"x")], "value[0]", "builtins.bytearray"),
    ({(1, object()): 2}, "value.<key 0>[1]", "builtins.object"),
    ([datetime.time(1, tzinfo=PARIS)], "value[0]", "datetime.time"),
    ([1, 2.5, "x", b"y", None, lambda: 0], "value[5]", "function"),
])
def test_anything_else_is_a_type_error_naming_the_type_and_where_it_sits(value: Any, where: str,
                                                                           kind: str) -> None:
    with pytest.raises(TypeError) as info:
        codec.encode(value)
    message = str(info.value)
    assert f" at {where}" in message and kind in message, message


def test_a_value_that_refers_to_itself_is_a_type_error() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(TypeError, match="refers to itself"):
        codec.encode({"a": loop})


TRIPPED: list[str] = []


def _trip(what: str) -> None:
    TRIPPED.append(what)


class Trap:
    """Unpickling it calls :func:`_trip` (what a hostile checkpoint would do with os.system)."""

    def __reduce__(self) -> Any:
        return _trip, ("unpickled",)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _with_metadata(payload: bytes, **changes: bytes) -> bytes:
    """``payload`` with some of its metadata replaced (a payload of another version, or damaged)."""
    reader = pa.ipc.open_stream(payload)
    metadata = {**reader.schema.metadata, **{k.encode(): v for k, v in changes.items()}}
    schema = reader.schema.with_metadata(metadata)
    return _ipc(pa.Table.from_batches([b.replace_schema_metadata(metadata) for b in reader], schema=schema))


def test_decode_refuses_pickles_unread_and_anything_it_did_not_write() -> None:
    TRIPPED.clear()
    for protocol in (2, 4, 5):
        with pytest.raises(ValueError, match="is a pickle"):
            codec.decode(pickle.dumps({"format": "x", "items": Trap()}, protocol=protocol))
    with pytest.raises(ValueError):
        codec.decode(pickle.dumps(Trap(), protocol=0))  # starts otherwise: still only Arrow is read
    assert TRIPPED == []
    columnar = ColumnarAggState(4)
    columnar.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    columnar.update(pa.array(["a"]), {"n": np.array([1])})
    for foreign in (b"", b"garbage", b"\xff\xff\xff\xff", _ipc(pa.table({"x": [1]})),
                    next(iter(columnar.snapshot_bins(columnar.bins()).values()))):
        with pytest.raises(ValueError, match="not a chiray.codec payload"):
            codec.decode(foreign)


def test_decode_names_an_unknown_version_and_refuses_a_damaged_payload() -> None:
    good = codec.encode({"a": [pa.record_batch({"x": [1]}), b"y"]})
    with pytest.raises(ValueError, match="version 2 of chiray.codec cannot be read"):
        codec.decode(_with_metadata(good, version=b"2"))
    tree = json.loads(pa.ipc.open_stream(good).schema.metadata[b"value"])
    damaged = [
        {"value": b'{"zz": 1}'},  # an unknown tag
        {"value": b'{"t": [], "s": []}'},  # two tags in one node
        {"value": b'{"b": [5, 0]}'},  # a group that is not there
        {"value": b'{"y": 9}'},  # a blob that is not there
        {"value": b'{"d": [[1, 2], [3]]}'},  # keys and values that do not pair up
        {"value": b'{"s": [[1]]}'},  # an unhashable member
        {"value": b'{"n": ["|O", 1]}'},  # an object dtype
        {"value": b'{"n": ["|i1", 1000]}'},  # out of its dtype's range
        {"value": b'{"dec": "junk"}'},  # not a decimal
        {"value": b'{"dt": ["2020-01-01T00:00:00", "../../etc/passwd", 0]}'},  # not a zone
        {"value": b'{"mdn": 1}'},  # not its three fields
        {"value": b"[1, 2"},  # not JSON
        {"groups": b'[["c", [5]]]'},  # a layout that does not fit the group's rows
        {"groups": b'[{"c": 1}]'},  # a JSON object where only arrays belong
    ]
    assert tree  # (the payload really has a value to damage)
    for change in damaged:
        with pytest.raises(ValueError, match="damaged chiray.codec payload"):
            codec.decode(_with_metadata(good, **change))


def test_decode_document_says_which_bin_and_what_it_expected() -> None:
    payload = codec.encode({"format": "chiray.X/1", "n": 1})
    assert codec.decode_document(payload, "X", "chiray.X/1", 3) == {"format": "chiray.X/1", "n": 1}
    with pytest.raises(ValueError, match=r"bin 3: payload is not a Y bin \(format 'chiray.Y/1' expected\)"):
        codec.decode_document(payload, "Y", "chiray.Y/1", 3)
    with pytest.raises(ValueError, match="bin 4: the Y payload is pickled; built-in state reads only Arrow"):
        codec.decode_document(pickle.dumps({"format": "chiray.Y/1"}), "Y", "chiray.Y/1", 4)
    with pytest.raises(ValueError, match="bin 5: payload is not a Y bin"):
        codec.decode_document(b"junk", "Y", "chiray.Y/1", 5)


# -- built-in operator state: Arrow IPC only ------------------------------------------------------

NB = 8


def _rows(seed: int, n: int = 80) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(seed * 40, seed * 40 + 60, n))
    return pa.record_batch({"k": pa.array([f"k{i}" for i in rng.integers(0, 9, n)]), "t": pa.array(t),
                            "v": pa.array(rng.integers(0, 50, n)), "window_start": pa.array(t - t % 20),
                            "window_end": pa.array(t - t % 20 + 20)})


def _register(key: Any, rows: pa.RecordBatch, ctx: Any, *_: Any) -> None:
    for t in rows.column("t").to_pylist():
        ctx.register(t + 5)  # timers only: a value set by the user's function would be pickled state


def _logics() -> dict[str, tuple[Any, tuple[int, ...]]]:
    """Each built-in operator with Arrow-only state: how to make it, and its inputs."""
    from chiray.operators.aggregates import AggSpec
    from chiray.operators.joins import CoProcessLogic, JoinLogic, WindowJoinLogic
    from chiray.operators.sessions import SessionWindowLogic
    from chiray.operators.timers import TimerProcessLogic
    from chiray.operators.topn import TopLogic
    from chiray.operators.windows import FixedWindowLogic, session, sliding, tumbling

    aggs = [AggSpec("n", "count"), AggSpec("s", "sum", "v")]
    per_window = lambda key, start, end, rows: [{"n": rows.num_rows, "v": sum(rows.column("v").to_pylist())}]
    fired = lambda key, time, ctx: [{"k": key, "at": time}]
    return {
        "window aggs": (lambda: FixedWindowLogic("k", "t", tumbling(20), NB, aggs=aggs), (0,)),
        "window rows": (lambda: FixedWindowLogic("k", "t", sliding(20, 10), NB, fn=per_window), (0,)),
        "sessions aggs": (lambda: SessionWindowLogic("k", "t", session(7), NB, aggs=aggs), (0,)),
        "sessions rows": (lambda: SessionWindowLogic("k", "t", session(7), NB, fn=per_window), (0,)),
        "join": (lambda: JoinLogic(("k", "k"), NB), (0, 1)),
        "window join": (lambda: WindowJoinLogic(("k", "k"), ("t", "t"), tumbling(20), NB), (0, 1)),
        "top": (lambda: TopLogic(2, "v", NB), (0,)),
        "timers": (lambda: TimerProcessLogic("k", _register, fired, NB), (0,)),
        "co-process timers": (lambda: CoProcessLogic(("k", "k"), _register, NB, on_timer=fired), (0, 1)),
    }


LOGICS = list(_logics())


def _feed(logic: Any, inputs: tuple[int, ...], seeds: range) -> list[pa.RecordBatch]:
    out: list[pa.RecordBatch] = []
    for seed in seeds:
        for i in inputs:
            out += logic.process(_rows(seed * 2 + i), i)
        out += logic.on_watermark(seed * 40 - 30)
    return out


def _table(batches: list[pa.RecordBatch]) -> list[tuple]:
    rows = [tuple(sorted(r.items())) for b in batches for r in b.to_pylist()]
    return sorted(rows, key=repr)


@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way to unpickle raises (cloudpickle's are pickle's)."""
    import cloudpickle

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("built-in state was unpickled")

    for module in (pickle, cloudpickle):
        for name in ("loads", "load", "Unpickler"):
            monkeypatch.setattr(module, name, refuse, raising=False)


@pytest.mark.parametrize("name", LOGICS)
def test_built_in_state_restores_with_unpickling_disabled(name: str, no_unpickling: None) -> None:
    """A copy restored from the snapshot of every bin goes on exactly as the original does."""
    make, inputs = _logics()[name]
    original = make()
    _feed(original, inputs, range(3))
    bins = original.state.bins()
    assert bins, "the test should move some state"
    copy = make()
    copy.state.install_bins(original.state.snapshot_bins(bins))
    assert copy.state.bins() == bins and all(copy.state.version(b) >= original.state.version(b) for b in bins)
    rest = [_feed(logic, inputs, range(3, 6)) + list(logic.finish()) for logic in (original, copy)]
    assert rest[0] and _table(rest[1]) == _table(rest[0])


def _poisoned(value: Any, payload: bytes) -> tuple[Any, int]:
    """``value`` with every ``bytes`` in it (the payloads of inner states) replaced by ``payload``."""
    if isinstance(value, bytes):
        return payload, 1
    if isinstance(value, (list, tuple)):
        parts = [_poisoned(v, payload) for v in value]
        return type(value)(p for p, _ in parts), sum(n for _, n in parts)
    if isinstance(value, dict):
        parts = {k: _poisoned(v, payload) for k, v in value.items()}
        return {k: p for k, (p, _) in parts.items()}, sum(n for _, n in parts.values())
    return value, 0


@pytest.mark.parametrize("name", LOGICS)
def test_built_in_state_refuses_a_pickled_bin_without_unpickling_it(name: str) -> None:
    make, inputs = _logics()[name]
    logic = make()
    _feed(logic, inputs, range(2))
    b = logic.state.bins()[0]
    doc = codec.decode(logic.state.snapshot_bins([b])[b])
    TRIPPED.clear()
    crafted = pickle.dumps({**doc, "trap": Trap()})  # the right format, pickled, with a side effect
    fresh = make()
    refused = f"bin {b}: the .* payload is pickled; built-in state reads only Arrow IPC"
    with pytest.raises(ValueError, match=refused):
        fresh.state.install_bins({b: crafted})
    poisoned, count = _poisoned(doc, pickle.dumps(Trap()))  # an Arrow document whose inner states are pickles
    if count:
        with pytest.raises(ValueError, match=f"bin {b}"):
            fresh.state.install_bins({b: codec.encode(poisoned)})
    assert TRIPPED == [] and fresh.state.bins() == []
