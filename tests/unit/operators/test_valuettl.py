"""State TTL of ``reduce`` and ``process`` (the per-key values of user functions) against a plain-loop oracle:
processing time on a fake clock, event time behind the watermark, and across a checkpoint restore and a bin
migration (the touches travel with the values); the dataflow verbs take and check the options."""

from __future__ import annotations

import datetime
import random

import pyarrow as pa
import pytest

from chiray.operators import Dataflow, from_items
from chiray.operators.hashing import bins_of
from chiray.operators.keyed import ProcessLogic, ReduceLogic
from chiray.operators.logic import SideOutput
from chiray.operators.ttl import StateTTL

from .test_ttl import Clock, Oracle

BINS = 16
TTL_S = 10
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("t", pa.int64())])


def _summing(acc: dict, row: dict) -> dict:
    return {"k": acc["k"], "v": acc["v"] + row["v"], "t": max(acc["t"], row["t"]), "n": acc["n"] + 1}


def _reduce(ttl: StateTTL) -> ReduceLogic:
    return ReduceLogic("k", _summing, BINS, "final", ttl)


def _counting(key, rows, state):
    n, s = state.value or (0, 0)
    state.value = (n + rows.num_rows, s + sum(rows.column("v").to_pylist()))


def _batch(rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{**r, "n": 1} for r in rows], schema=SCHEMA.append(pa.field("n", pa.int64())))


def _reduced(batches: list) -> dict:
    return {r["k"]: (r["n"], r["v"]) for b in batches for r in b.to_pylist()}


def _expired_accs(outputs: list) -> list[tuple]:
    return sorted((r["k"], r["n"], r["v"]) for o in outputs if isinstance(o, SideOutput) for r in o.batch.to_pylist())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_reduce_with_a_processing_time_ttl_equals_a_plain_loop(seed: int) -> None:
    rng, clock = random.Random(seed), Clock()
    logic = _reduce(StateTTL(datetime.timedelta(seconds=TTL_S), side_output=True, clock=clock))
    oracle, outputs = Oracle(TTL_S * 10**9), []
    keys = [f"k{i}" for i in range(40)]
    for step in range(60):
        clock.now += rng.choice([0, 0.5, 2, 4, 9.5, 10, 15])
        some = keys[: rng.randint(3, 40)]
        rows = [{"k": rng.choice(some), "v": rng.randint(-5, 9), "t": step} for _ in range(rng.randint(0, 20))]
        oracle.check(int(clock.now * 1e9))
        oracle.apply(rows, {r["k"]: int(clock.now * 1e9) for r in rows})
        if rng.random() < 0.2:
            outputs += logic.on_watermark(0)  # a watermark checks expiry too
        outputs += logic.process(_batch(rows), 0)
    assert _reduced(logic.finish()) == oracle.results()
    assert _expired_accs(outputs) == sorted(oracle.expired) and oracle.expired
    assert logic.expired_keys == len(oracle.expired)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_process_with_an_event_time_ttl_expires_a_key_once_the_watermark_passes_its_time_plus_ttl(seed) -> None:
    rng = random.Random(seed)
    logic = ProcessLogic("k", _counting, BINS, None, StateTTL(TTL_S, time="event", on="t", side_output=True))
    oracle, outputs, watermark = Oracle(TTL_S), [], -(1 << 63)
    keys = [f"k{i}" for i in range(30)]
    for step in range(80):
        if rng.random() < 0.3:
            watermark = max(watermark, step - rng.randint(0, 8))
            oracle.check(watermark)
            outputs += logic.on_watermark(watermark)
        rows = [{"k": rng.choice(keys), "v": rng.randint(0, 9), "t": step - rng.randint(0, 12)}
                for _ in range(rng.randint(0, 6))]
        touch: dict = {}
        for r in rows:
            touch[r["k"]] = max(touch.get(r["k"], r["t"]), r["t"])
        if watermark > -(1 << 63):
            oracle.check(watermark)
        oracle.apply(rows, touch)
        outputs += logic.process(pa.RecordBatch.from_pylist(rows, schema=SCHEMA), 0)
    assert {k: v for k, v in logic.state.items()} != {}  # values kept as (count, sum) with their touches
    held = {k: (v.value if hasattr(v, "touch") else v) for k, v in logic.state.items()}
    assert held == oracle.results()
    gone = sorted(r["k"] for o in outputs if isinstance(o, SideOutput) for r in o.batch.to_pylist())
    assert gone == sorted(k for k, _, _ in oracle.expired) and gone
    assert logic.expired_keys == len(oracle.expired)


def test_touches_travel_through_a_restore_and_a_bin_migration() -> None:
    """A reduce's keys keep their expiry time in a restored instance and in the instance their bin moved to;
    values written without a TTL start theirs at the first check that finds them."""
    clock = Clock()
    spec = StateTTL(datetime.timedelta(seconds=TTL_S), side_output=True, clock=clock)
    first = _reduce(spec)
    keys = [f"k{i}" for i in range(24)]
    first.process(_batch([{"k": k, "v": 1, "t": 0} for k in keys[:12]]), 0)
    clock.now += 6
    first.process(_batch([{"k": k, "v": 2, "t": 0} for k in keys[12:]]), 0)
    restored = _reduce(spec)  # a recovery from a checkpoint of every bin
    restored.state.install_bins(first.state.snapshot_bins(first.state.bins()))
    bins = bins_of(pa.array(keys), BINS).tolist()
    moving = sorted({b for b, k in zip(bins, keys) if k in keys[:6] + keys[12:18]})
    mover = _reduce(spec)  # the new owner of some bins
    mover.state.install_bins(restored.state.extract_bins(moving))
    clock.now += 4  # keys[:12]: 10 s since their write, keys[12:]: 4 s
    gone = _expired_accs(restored.on_watermark(0) + mover.on_watermark(0))
    assert [k for k, _, _ in gone] == sorted(keys[:12])
    clock.now += 6
    gone = _expired_accs(restored.on_watermark(0) + mover.on_watermark(0))
    assert [k for k, _, _ in gone] == sorted(keys[12:]) and [v for _, _, v in gone] == [2] * 12
    plain = ReduceLogic("k", _summing, BINS)  # written without a TTL
    plain.process(_batch([{"k": "late", "v": 5, "t": 0}]), 0)
    later = _reduce(spec)
    later.state.install_bins(plain.state.snapshot_bins(plain.state.bins()))
    assert later.on_watermark(0) == []  # its TTL starts now
    clock.now += TTL_S
    assert _expired_accs(later.on_watermark(0)) == [("late", 1, 5)]


def test_the_verbs_take_a_ttl_and_refuse_one_with_timers() -> None:
    flow = Dataflow("t")
    keyed = flow.source(from_items([{"k": "a", "v": 1, "t": 0}])).key_by("k")
    reduced = keyed.reduce(_summing, emit="updates", ttl=datetime.timedelta(minutes=5), expired_side_output=True)
    assert reduced.side_output("expired").schema.names == ["k", "v", "t"]
    processed = keyed.process(_counting, ttl=3, ttl_time="event", ttl_on="t", expired_side_output=True)
    assert processed.side_output("expired").schema.names == ["k"]
    with pytest.raises(ValueError, match="on_timer takes no ttl"):
        keyed.process(_counting, on_timer=lambda key, time, state: None, ttl=3, ttl_time="event", ttl_on="t")
    with pytest.raises(ValueError, match="ttl_on"):
        keyed.reduce(_summing, emit="updates", ttl=3, ttl_time="event")


def test_a_state_migration_of_an_upgrade_sees_the_values_and_keeps_their_touches() -> None:
    from chiray.operators.upgrade import migrate_values

    clock = Clock()
    logic = ProcessLogic("k", _counting, BINS, None, StateTTL(datetime.timedelta(seconds=TTL_S), clock=clock))
    logic.process(pa.RecordBatch.from_pylist([{"k": "a", "v": 2, "t": 0}, {"k": "b", "v": 3, "t": 0}],
                                             schema=SCHEMA), 0)
    seen = []
    assert migrate_values(logic.state, lambda key, old: seen.append(old) or {"n": old[0]}) == 2
    assert sorted(seen) == [(1, 2), (1, 3)]
    clock.now += TTL_S
    assert logic.on_watermark(0) == [] and logic.expired_keys == 2  # the touches stayed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_join_with_a_ttl_pairs_only_rows_of_keys_still_alive_as_a_plain_loop_does_across_a_restore(seed):
    """An unbounded join with a processing-time TTL: a key whose rows were not added to for ``ttl`` loses them,
    so a later row joins only the rows that came after; the join is restored from a checkpoint midway."""
    from chiray.operators.joins import JoinLogic

    rng, clock = random.Random(seed), Clock()
    spec = StateTTL(datetime.timedelta(seconds=TTL_S), side_output=True, clock=clock)
    logic = JoinLogic(("k", "id"), BINS, spec)
    alive: dict[str, tuple[list, list, float]] = {}  # the oracle: key -> (left ids, right ids, last add)
    want, got, gone_want, gone_got = [], [], [], []
    schemas = (pa.schema([("k", pa.string()), ("l", pa.int64())]), pa.schema([("id", pa.string()), ("r", pa.int64())]))
    for step in range(80):
        clock.now += rng.choice([0, 1, 3, 6, 10, 12])
        side = rng.randrange(2)
        rows = [(f"k{rng.randrange(12)}", step * 100 + i) for i in range(rng.randint(0, 5))]
        for k in sorted(k for k, (_, _, last) in alive.items() if last + TTL_S <= clock.now):
            del alive[k]
            gone_want.append(k)
        for k, n in rows:
            left, right, _ = alive.get(k, ([], [], clock.now))
            want += [(n, r) for r in right] if side == 0 else [(l, n) for l in left]
            alive[k] = (left + [n], right, clock.now) if side == 0 else (left, right + [n], clock.now)
        batch = pa.RecordBatch.from_pylist([dict(zip(schemas[side].names, r)) for r in rows], schema=schemas[side])
        for out in logic.process(batch, side):
            if isinstance(out, SideOutput):
                gone_got += out.batch.column("k").to_pylist()
            else:
                got += list(zip(out.column("l").to_pylist(), out.column("r").to_pylist()))
        if step == 40:  # a recovery from a checkpoint taken now
            restored = JoinLogic(("k", "id"), BINS, spec)
            restored.state.install_bins(logic.state.snapshot_bins(logic.state.bins()))
            logic = restored
    assert sorted(got) == sorted(want) and want
    assert sorted(gone_got) == sorted(gone_want) and gone_want


def test_a_join_s_event_time_ttl_column_must_be_on_both_inputs() -> None:
    flow = Dataflow("t")
    left = flow.source(from_items([{"k": "a", "t": 0}]))
    right = flow.source(from_items([{"id": "a", "u": 0}]))
    joined = left.connect(right).key_by("k", "id")
    with pytest.raises(ValueError, match="'t'"):
        joined.join(ttl=5, ttl_time="event", ttl_on="t")
    stream = left.connect(right).key_by("k", "id").join(ttl=datetime.timedelta(seconds=5), expired_side_output=True)
    assert stream.side_output("expired").schema.names == ["k"]
