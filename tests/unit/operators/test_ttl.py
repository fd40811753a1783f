"""Tests for operators.ttl and the TTL of built-in aggregations: expiry in processing time (a fake clock) and
event time against a plain-loop oracle, the drops counted and sent to the side output, and the expired keys'
deletions carried by incremental changes, restores and bin moves (operators.deletedkeys)."""

from __future__ import annotations

import datetime
import random

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators import Dataflow, from_items
from chiray.operators.deletedkeys import MIN_BOUND
from chiray.operators.keyed import AggregateLogic, AggSpec
from chiray.operators.logic import SideOutput
from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState
from chiray.operators.statecodec import decode_bin_stream
from chiray.operators.ttl import EXPIRED, StateTTL, state_ttl

BINS = 16
TTL_S = 10


class Clock:
    """A fake wall clock (seconds)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _logic(ttl: StateTTL, emit: str = "final") -> AggregateLogic:
    return AggregateLogic("k", [AggSpec("n", "count"), AggSpec("s", "sum", "v")], BINS, emit, ttl)


def _results(batches: list) -> dict:
    return {r["k"]: (r["n"], r["s"]) for b in batches for r in b.to_pylist()}


def _expired(outputs: list) -> list[tuple]:
    return sorted((r["k"], r["n"], r["s"]) for o in outputs if isinstance(o, SideOutput) for r in o.batch.to_pylist())


class Oracle:
    """Per key (count, sum, last touch); a key expires at a check once ``last + ttl <= now``."""

    def __init__(self, ttl: int) -> None:
        self.ttl, self.keys, self.expired = ttl, {}, []

    def check(self, now: int) -> None:
        for k in sorted(k for k, (_, _, last) in self.keys.items() if last + self.ttl <= now):
            n, s, _ = self.keys.pop(k)
            self.expired.append((k, n, s))

    def apply(self, rows: list[dict], touch: dict) -> None:
        for row in rows:
            n, s, last = self.keys.get(row["k"], (0, 0, touch[row["k"]]))
            self.keys[row["k"]] = (n + 1, s + row["v"], max(last, touch[row["k"]]))

    def results(self) -> dict:
        return {k: (n, s) for k, (n, s, _) in self.keys.items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_processing_time_ttl_equals_a_plain_loop_with_a_fake_clock(seed: int) -> None:
    rng, clock = random.Random(seed), Clock()
    logic = _logic(StateTTL(datetime.timedelta(seconds=TTL_S), side_output=True, clock=clock))
    oracle, expired = Oracle(TTL_S * 10**9), []
    keys = [f"k{i}" for i in range(40)]
    for _ in range(60):
        clock.now += rng.choice([0, 0.5, 2, 4, 9.5, 10, 15])
        some = keys[: rng.randint(3, 40)]
        rows = [{"k": rng.choice(some), "v": rng.randint(-5, 9)} for _ in range(rng.randint(0, 20))]
        oracle.check(int(clock.now * 1e9))
        oracle.apply(rows, {r["k"]: int(clock.now * 1e9) for r in rows})
        if rng.random() < 0.2:  # a watermark checks expiry too (processing time: no batch needed)
            expired += logic.on_watermark(0)
        schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
        expired += logic.process(pa.RecordBatch.from_pylist(rows, schema=schema), 0)
    assert _results(logic.finish()) == oracle.results()
    assert _expired(expired) == sorted(oracle.expired) and oracle.expired
    assert logic.expired_keys == len(oracle.expired)


@pytest.mark.parametrize("seed", [1, 2])
def test_event_time_ttl_expires_a_key_once_the_watermark_reaches_its_last_time_plus_ttl(seed: int) -> None:
    rng = random.Random(seed)
    logic = _logic(StateTTL(TTL_S, time="event", on="t", side_output=True))
    oracle, expired, watermark = Oracle(TTL_S), [], -(1 << 63)
    keys = [f"k{i}" for i in range(30)]
    for step in range(80):
        if rng.random() < 0.3:
            watermark = max(watermark, step - rng.randint(0, 8))
            oracle.check(watermark)
            expired += logic.on_watermark(watermark)
        rows = [{"k": rng.choice(keys), "v": rng.randint(0, 9), "t": step - rng.randint(0, 12)}
                for _ in range(rng.randint(0, 6))]
        touch: dict = {}
        for r in rows:
            touch[r["k"]] = max(touch.get(r["k"], r["t"]), r["t"])  # a key's time: its records' largest
        if watermark > -(1 << 63):
            oracle.check(watermark)
        oracle.apply(rows, touch)
        expired += logic.process(pa.RecordBatch.from_pylist(rows, schema=pa.schema(
            [("k", pa.string()), ("v", pa.int64()), ("t", pa.int64())])), 0)
    assert _results(logic.finish()) == oracle.results()
    assert _expired(expired) == sorted(oracle.expired) and oracle.expired
    assert logic.expired_keys == len(oracle.expired)


def _touched_state() -> ColumnarAggState:
    s = ColumnarAggState(BINS, touched=True)
    s.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    return s


def _put(s: ColumnarAggState, keys: list[str], touch: int) -> None:
    s.update(pa.array(keys), {"n": np.ones(len(keys), dtype=np.int64)}, np.full(len(keys), touch))


def _dump(s: ColumnarAggState) -> dict:
    slots = s.slots()
    return dict(zip(s.keys_at(slots).to_pylist(), s.values(slots)["n"].tolist()))


def _fresh_with(full: dict, changes: list[dict]) -> ColumnarAggState:
    s = _touched_state()
    s.restore_bins(full, changes)
    return s


@pytest.mark.parametrize("seed", range(6))
def test_changes_carry_expired_keys_as_deletions_and_a_restore_equals_the_state(seed: int) -> None:
    """A full copy, then rounds of writes and expiries, each captured as changes since the previous capture
    (the bins a checkpoint follows): the copy plus the changes restores to the state at every round."""
    rng = random.Random(seed)
    s = _touched_state()
    keys = [f"k{i}" for i in range(200)]
    _put(s, rng.sample(keys, 80), 0)
    full = s.snapshot_changes_later(s.bins(), {})()[0]
    versions = {b: s.version(b) for b in range(BINS)}
    changes: list[dict] = []
    for now in range(1, 12):
        _put(s, rng.sample(keys, rng.randint(0, 30)), now)  # some keys deleted earlier come back
        gone, _, _ = s.expire(now - 3, now)
        since = {b: versions[b] for b in s.changes_since(versions)}
        assert set(since) == set(range(BINS)), "a bin's changes were not followed"
        changes.append(s.snapshot_changes_later([], since)()[1])
        versions = {b: s.version(b) for b in range(BINS)}
        restored = _fresh_with(full, changes)
        assert _dump(restored) == _dump(s)
        assert restored.bins() == s.bins()
    assert any(len(decode_bin_stream(part.payload, set(part.sizes), BINS).deleted) for part in changes)


def test_touches_travel_with_the_bins_and_an_untouched_bin_starts_its_ttl_at_arrival() -> None:
    clock = Clock()
    spec = StateTTL(datetime.timedelta(seconds=TTL_S), clock=clock)
    old, new, plain = _logic(spec), _logic(spec), _logic(None)  # type: ignore[arg-type]
    batch = pa.record_batch({"k": ["a", "b", "c"], "v": [1, 2, 3]})
    old.process(batch, 0)
    plain.process(batch, 0)
    clock.now += 6
    old.process(pa.record_batch({"k": ["b"], "v": [1]}), 0)
    new.state.install_bins(old.state.extract_bins(old.state.bins()))
    clock.now += 4  # a and c: 10 s since their last write; b: 4 s
    new.on_watermark(0)
    assert _results(new.finish()) == {"b": (2, 3)} and new.expired_keys == 2
    untouched = _logic(spec)  # bins of a state without TTL: their keys' touches are not known
    untouched.state.install_bins(plain.state.snapshot_bins(plain.state.bins()))
    untouched.on_watermark(0)
    clock.now += TTL_S - 1
    untouched.on_watermark(0)
    assert untouched.expired_keys == 0
    clock.now += 1
    untouched.on_watermark(0)
    assert untouched.expired_keys == 3 and untouched.finish() == []


def test_a_replica_plus_extract_changes_deletes_the_keys_expired_since() -> None:
    s = _touched_state()
    _put(s, [f"k{i}" for i in range(50)], 0)
    bins = s.bins()
    replica = _touched_state()
    replica.install_bins(s.snapshot_bins(bins))
    since = {b: s.version(b) for b in bins}
    _put(s, [f"k{i}" for i in range(0, 50, 5)], 5)
    s.expire(2, 5)
    expected = _dump(s)
    changes = s.extract_changes(since)
    assert changes is not None and s.bins() == []
    replica.apply_changes(changes)
    assert _dump(replica) == expected and len(expected) == 10


def test_a_forgotten_deletion_log_makes_the_changes_unknown_so_bins_are_written_whole() -> None:
    s = _touched_state()
    keys = [f"k{i}" for i in range(2 * MIN_BOUND + 10)]
    _put(s, keys, 0)
    versions = {b: s.version(b) for b in s.bins()}
    _put(s, keys[:MIN_BOUND], 5)
    s.expire(0, 5)  # more keys than the log keeps while the state holds fewer: it forgets them
    assert s.changes_since(versions) == set()
    assert s.extract_changes(versions) is None and len(s) == MIN_BOUND


def test_state_ttl_refuses_bad_options_naming_the_operator() -> None:
    where = "operator 'count'"
    schema = pa.schema([("k", pa.string()), ("ts", pa.timestamp("ms")), ("s", pa.string())])
    td = datetime.timedelta(minutes=1)
    with pytest.raises(ValueError, match="operator 'count': an event-time TTL needs ttl_on"):
        state_ttl(where, td, "event", None, False, schema)
    with pytest.raises(ValueError, match="ttl_time must be one of"):
        state_ttl(where, td, "wall", None, False, schema)
    with pytest.raises(ValueError, match="must be positive"):
        state_ttl(where, datetime.timedelta(0), "processing", None, False, schema)
    with pytest.raises(TypeError, match="a processing-time TTL is a timedelta"):
        state_ttl(where, 60, "processing", None, False, schema)
    with pytest.raises(ValueError, match="ttl_time is 'processing'"):
        state_ttl(where, td, "processing", "ts", False, schema)
    with pytest.raises(ValueError, match="need a ttl"):
        state_ttl(where, None, "processing", None, True, schema)
    with pytest.raises(ValueError, match="unknown event-time column 'x'"):
        state_ttl(where, td, "event", "x", False, schema)
    with pytest.raises(TypeError, match="must be a timestamp or an integer"):
        state_ttl(where, td, "event", "s", False, schema)
    with pytest.raises(TypeError, match=r"would be 60 ms"):
        state_ttl(where, 60, "event", "ts", False, schema)
    assert state_ttl(where, td, "event", "ts", True, schema) == StateTTL(td, "event", "ts", True)


def test_the_verbs_take_a_ttl_and_offer_the_expired_side_output() -> None:
    flow = Dataflow("ttl")
    stream = flow.source(from_items([{"k": "a", "v": 1}])).key_by("k")
    counted = stream.count(emit="updates", ttl=datetime.timedelta(hours=1), expired_side_output=True)
    assert counted.side_output(EXPIRED).schema == counted.schema
    with pytest.raises(ValueError, match=r"has no side output 'expired'.*expired_side_output=True"):
        stream.sum("v", emit="updates", ttl=datetime.timedelta(hours=1)).side_output(EXPIRED)
    with pytest.raises(ValueError, match="operator 'agg.*': an event-time TTL needs ttl_on"):
        stream.agg(n=(None, "count"), emit="updates", ttl=datetime.timedelta(hours=1), ttl_time="event")
