"""LocalRun end to end without Ray: random pipelines under shuffled, duplicated deliveries, against oracles.

Every pipeline is built from a seeded ``random.Random``; the same seed shuffles
and duplicates the cross-host deliveries of ``LocalRun``. The expected output
is computed with a plain Python loop (or pandas) over the same input rows.
Float values are multiples of 1/4, so sums are exact in any order.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import time
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.actors.runtime.instance import OperatorFailure
from chiray.actors.runtime.router import KeyColumnError
from chiray.operators import Dataflow, Sink, SinkWriter, Stream, collect, from_arrow, from_items
from chiray.operators.logic import InstanceInfo

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("f", pa.float64())])
SEEDS = range(10)
Row = dict[str, Any]


def _input(rng: random.Random, n: int | None = None, keys: int = 7) -> list[Row]:
    n = rng.choice([0, 1, 5, 20, 60, 60]) if n is None else n
    return [{"k": f"k{rng.randrange(keys)}", "v": rng.randint(-20, 50), "f": rng.randint(-8, 8) / 4}
            for _ in range(n)]


def _config(rng: random.Random) -> JobConfig:
    return JobConfig(
        channel_capacity=rng.choice([1, 1, 2, 8]),
        channel_capacity_bytes=rng.choice([64 << 20, 200]),  # 200 bytes: most batches go alone
        num_hosts=rng.choice([None, None, 1, 2, 5]),
    )


def _source(flow: Dataflow, rng: random.Random, rows: list[Row], name: str,
            parallelism: int | None = None, num_splits: int | None = None, max_batch: int = 9) -> Stream:
    """A from_items or from_arrow source over ``rows``, randomly batched and split."""
    parallelism = rng.randint(1, 3) if parallelism is None else parallelism
    if rng.random() < 0.5:
        splits = rng.randint(1, 4) if num_splits is None else num_splits
        source = from_items(rows, schema=SCHEMA, batch_size=rng.randint(1, max_batch), num_splits=splits)
    else:
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        batches = table.to_batches(max_chunksize=rng.randint(1, max_batch))
        splits = rng.choice([None, 1, 2, 5]) if num_splits is None else num_splits
        source = from_arrow(batches or table, num_splits=splits, batch_size=rng.choice([None, 3]))
    return flow.source(source, parallelism=parallelism, name=name)


# --------------------------------------------------------------------------- stateless stages


def _double_minus_one(batch: pa.RecordBatch) -> pa.RecordBatch:
    v = pc.subtract(pc.multiply(batch.column("v"), 2), 1)
    return batch.set_column(batch.schema.get_field_index("v"), "v", v)


def _not_multiple_of_three(batch: pa.RecordBatch) -> np.ndarray:
    return np.asarray(batch.column("v")) % 3 != 0


def _even_rows_twice(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    return [batch, batch.filter(np.asarray(batch.column("v")) % 2 == 0)]


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stateless step: how to add it to a stream, and what it does to a list of rows."""

    name: str
    build: Callable[[Stream, str, int], Stream]
    oracle: Callable[[list[Row]], list[Row]]


STAGES = [
    Stage("map", lambda s, n, p: s.map(_double_minus_one, name=n, parallelism=p, schema=SCHEMA),
          lambda rows: [{**r, "v": 2 * r["v"] - 1} for r in rows]),
    Stage("map-unknown-schema", lambda s, n, p: s.map(_double_minus_one, name=n, parallelism=p),
          lambda rows: [{**r, "v": 2 * r["v"] - 1} for r in rows]),
    Stage("filter", lambda s, n, p: s.filter(_not_multiple_of_three, name=n, parallelism=p),
          lambda rows: [r for r in rows if r["v"] % 3 != 0]),
    Stage("flat_map", lambda s, n, p: s.flat_map(_even_rows_twice, name=n, parallelism=p, schema=SCHEMA),
          lambda rows: [x for r in rows for x in ([r, r] if r["v"] % 2 == 0 else [r])]),
    Stage("map_records", lambda s, n, p: s.map_records(lambda r: {**r, "v": r["v"] + 1}, name=n,
                                                      parallelism=p, schema=SCHEMA),
          lambda rows: [{**r, "v": r["v"] + 1} for r in rows]),
    Stage("filter_records", lambda s, n, p: s.filter_records(lambda r: r["k"] != "k0", name=n, parallelism=p),
          lambda rows: [r for r in rows if r["k"] != "k0"]),
    Stage("flat_map_records", lambda s, n, p: s.flat_map_records(
        lambda r: [r] * (r["v"] % 3), name=n, parallelism=p, schema=SCHEMA),
        lambda rows: [r for r in rows for _ in range(r["v"] % 3)]),
]


# the stages whose oracle also gives the order of the rows (flat_map appends a batch's copies after it)
ROW_ORDER_STAGES = [s for s in STAGES if s.name != "flat_map"]


@dataclasses.dataclass
class Pipe:
    """A stream under construction and the rows it will carry (a multiset)."""

    stream: Stream
    rows: list[Row]


def _stages(pipe: Pipe, rng: random.Random, prefix: str, count: int | None = None,
            parallelism: int | None = None, stages: list[Stage] = STAGES) -> Pipe:
    for i in range(rng.randint(0, 3) if count is None else count):
        stage = rng.choice(stages)
        p = rng.randint(1, 3) if parallelism is None else parallelism
        pipe = Pipe(stage.build(pipe.stream, f"{prefix}-{i}-{stage.name}", p), stage.oracle(pipe.rows))
    return pipe


# --------------------------------------------------------------------------- terminals and oracles


Check = Callable[[pa.Table], None]


def _groups(rows: list[Row]) -> dict[Any, list[Row]]:
    out: dict[Any, list[Row]] = collections.defaultdict(list)
    for r in rows:
        out[r["k"]].append(r)
    return dict(out)


def _stats(rows: list[Row]) -> Row:
    """The oracle of AGGS for one key."""
    return {"n": len(rows), "s": sum(r["v"] for r in rows), "lo": min(r["v"] for r in rows),
            "hi": max(r["f"] for r in rows), "avg": sum(r["f"] for r in rows) / len(rows)}


AGGS = {"n": (None, "count"), "s": ("v", "sum"), "lo": ("v", "min"), "hi": ("f", "max"), "avg": ("f", "mean")}


def _by_key(table: pa.Table) -> dict[Any, Row]:
    rows = table.to_pylist()
    out = {r["k"]: {c: x for c, x in r.items() if c != "k"} for r in rows}
    assert len(out) == len(rows), "a key appears twice in final output"
    return out


def _sink_final(stream: Stream, rng: random.Random, name: str) -> None:
    if rng.random() < 0.5:
        stream.collect(name=name)
    else:
        stream.sink(collect(), name=name, parallelism=rng.randint(1, 3))


def _terminal_rows(pipe: Pipe, rng: random.Random, name: str) -> Check:
    pipe.stream.sink(collect(), name=name, parallelism=rng.randint(1, 3))
    expected = sorted((r["k"], r["v"], r["f"]) for r in pipe.rows)

    def check(table: pa.Table) -> None:
        assert sorted((r["k"], r["v"], r["f"]) for r in table.to_pylist()) == expected

    return check


def _keyed(pipe: Pipe, rng: random.Random) -> tuple[Any, int]:
    p = rng.randint(1, 3)
    return pipe.stream.key_by("k", num_bins=rng.choice([1, 4, 64, None])), p


def _terminal_count(pipe: Pipe, rng: random.Random, name: str) -> Check:
    keyed, p = _keyed(pipe, rng)
    _sink_final(keyed.count(parallelism=p), rng, name)
    expected = {k: {"count": len(v)} for k, v in _groups(pipe.rows).items()}
    return lambda table: _assert_equal(_by_key(table), expected)


def _terminal_sum(pipe: Pipe, rng: random.Random, name: str) -> Check:
    keyed, p = _keyed(pipe, rng)
    _sink_final(keyed.sum("v", parallelism=p), rng, name)
    expected = {k: {"sum": sum(r["v"] for r in v)} for k, v in _groups(pipe.rows).items()}
    return lambda table: _assert_equal(_by_key(table), expected)


def _terminal_agg_final(pipe: Pipe, rng: random.Random, name: str) -> Check:
    keyed, p = _keyed(pipe, rng)
    _sink_final(keyed.agg(parallelism=p, **AGGS), rng, name)
    expected = {k: _stats(v) for k, v in _groups(pipe.rows).items()}
    return lambda table: _assert_equal(_by_key(table), expected)


def _terminal_agg_updates(pipe: Pipe, rng: random.Random, name: str) -> Check:
    """emit="updates": per key, the last update is the oracle and counts only grow."""
    keyed, p = _keyed(pipe, rng)
    stream = keyed.agg(parallelism=p, emit="updates", **AGGS)
    if rng.random() < 0.5:
        stream.collect(name=name)
    else:  # forward edges keep each key's updates in order
        stream.sink(collect(), name=name, parallelism=p)
    expected = {k: _stats(v) for k, v in _groups(pipe.rows).items()}

    def check(table: pa.Table) -> None:
        last: dict[Any, Row] = {}
        counts: dict[Any, list[int]] = collections.defaultdict(list)
        for r in table.to_pylist():
            key = r.pop("k")
            last[key] = r
            counts[key].append(r["n"])
        _assert_equal(last, expected)
        for key, ns in counts.items():
            assert ns == sorted(set(ns)), f"updates of {key!r} do not grow: {ns}"

    return check


def _reduce_acc(acc: Row, row: Row) -> Row:
    return {"k": acc["k"], "v": acc["v"] + row["v"], "f": max(acc["f"], row["f"])}


def _terminal_reduce(pipe: Pipe, rng: random.Random, name: str) -> Check:
    keyed, p = _keyed(pipe, rng)
    _sink_final(keyed.reduce(_reduce_acc, parallelism=p), rng, name)
    expected = {k: {"v": sum(r["v"] for r in v), "f": max(r["f"] for r in v)}
                for k, v in _groups(pipe.rows).items()}
    return lambda table: _assert_equal(_by_key(table), expected)


TERMINALS = [_terminal_rows, _terminal_count, _terminal_sum, _terminal_agg_final, _terminal_agg_updates,
             _terminal_reduce]


def _assert_equal(got: dict[Any, Row], expected: dict[Any, Row]) -> None:
    assert set(got) == set(expected), f"keys differ: got {sorted(got)}, expected {sorted(expected)}"
    for key, row in expected.items():
        assert got[key] == pytest.approx(row), f"key {key!r}: got {got[key]}, expected {row}"


# --------------------------------------------------------------------------- random pipelines


def _random_pipeline(rng: random.Random) -> tuple[Dataflow, dict[str, Check]]:
    """A chain, a union or a fan-out of random stages, ending in random terminals."""
    flow = Dataflow(f"random-{rng.random():.6f}", num_bins=rng.choice([8, 64]))
    rows = _input(rng)
    pipe = _stages(Pipe(_source(flow, rng, rows, "src"), rows), rng, "pre")
    shape = rng.choice(["chain", "union", "union-sources", "fan-out"])
    if shape == "union":
        evens = Pipe(pipe.stream.filter(lambda b: np.asarray(b.column("v")) % 2 == 0, name="evens",
                                        parallelism=rng.randint(1, 3)),
                     [r for r in pipe.rows if r["v"] % 2 == 0])
        odds = Pipe(pipe.stream.filter_records(lambda r: r["v"] % 2 != 0, name="odds"),
                    [r for r in pipe.rows if r["v"] % 2 != 0])
        evens, odds = _stages(evens, rng, "even"), _stages(odds, rng, "odd")
        pipe = Pipe(evens.stream.union(odds.stream, name="union", parallelism=rng.choice([None, 1, 2, 3])),
                    evens.rows + odds.rows)
    elif shape == "union-sources":
        more = _input(rng)
        other = _stages(Pipe(_source(flow, rng, more, "src2"), more), rng, "other")
        pipe = Pipe(pipe.stream.union(other.stream, name="union"), pipe.rows + other.rows)
    checks = {"out-a": rng.choice(TERMINALS)(pipe, rng, "out-a")}
    if shape == "fan-out":
        checks["out-b"] = rng.choice(TERMINALS)(_stages(pipe, rng, "fan"), rng, "out-b")
    return flow, checks


@pytest.mark.parametrize("shape", range(12))
@pytest.mark.parametrize("seed", SEEDS)
def test_random_pipeline_matches_oracle(shape, seed):
    rng = random.Random(shape * 1000 + seed)
    flow, checks = _random_pipeline(rng)
    run = LocalRun(flow, _config(rng), seed=seed)
    results = run.run()
    assert set(results) == set(checks)
    for name, check in checks.items():
        check(results[name])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("terminal", TERMINALS, ids=lambda t: t.__name__.removeprefix("_terminal_"))
def test_every_terminal_after_a_stage_chain(terminal, seed):
    rng = random.Random(seed)
    flow = Dataflow("chain")
    rows = _input(rng, n=80)
    pipe = _stages(Pipe(_source(flow, rng, rows, "src"), rows), rng, "s", count=2)
    check = terminal(pipe, rng, "out")
    check(LocalRun(flow, JobConfig(channel_capacity=1), seed=seed).run()["out"])


@pytest.mark.parametrize("seed", SEEDS)
def test_fan_out_to_two_sinks(seed):
    rng = random.Random(seed)
    flow = Dataflow("fan-out")
    rows = _input(rng, n=50)
    src = _source(flow, rng, rows, "src")
    src.sink(collect(), name="copy", parallelism=rng.randint(1, 3))
    src.key_by("k").count(parallelism=rng.randint(1, 3)).collect(name="counts")
    out = LocalRun(flow, JobConfig(channel_capacity=1), seed=seed).run()
    df = pd.DataFrame(rows, columns=SCHEMA.names)
    got = out["copy"].to_pandas().sort_values(SCHEMA.names, ignore_index=True)
    pd.testing.assert_frame_equal(got, df.sort_values(SCHEMA.names, ignore_index=True))
    counts = out["counts"].to_pandas().set_index("k")["count"].sort_index()
    expected = df.groupby("k").size().sort_index()
    assert counts.to_dict() == expected.to_dict()


@pytest.mark.parametrize("seed", SEEDS)
def test_agg_matches_pandas(seed):
    rng = random.Random(seed)
    flow = Dataflow("pandas")
    rows = _input(rng, n=120, keys=11)
    stream = _source(flow, rng, rows, "src").key_by("k").agg(parallelism=rng.randint(1, 3), **AGGS)
    stream.sink(collect(), name="out", parallelism=rng.randint(1, 3))
    got = LocalRun(flow, JobConfig(channel_capacity=1), seed=seed).run()["out"].to_pandas()
    df = pd.DataFrame(rows)
    expected = df.groupby("k").agg(n=("v", "size"), s=("v", "sum"), lo=("v", "min"), hi=("f", "max"),
                                   avg=("f", "mean")).reset_index()
    got = got.sort_values("k", ignore_index=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


@pytest.mark.parametrize("shape", range(10))
def test_random_pipeline_without_shuffling_matches_oracle(shape):
    rng = random.Random(shape * 1000 + 999)
    flow, checks = _random_pipeline(rng)
    results = LocalRun(flow, _config(rng)).run()  # seed=None: deliveries in order, no duplicates
    for name, check in checks.items():
        check(results[name])


@pytest.mark.parametrize("seed", SEEDS)
def test_null_keys_are_a_key_of_their_own(seed):
    rng = random.Random(seed)
    rows = _input(rng, n=40, keys=3)
    for r in rows[::4]:
        r["k"] = None
    flow = Dataflow("nulls")
    _source(flow, rng, rows, "src").key_by("k").count(parallelism=rng.randint(1, 3)).collect(name="out")
    got = LocalRun(flow, JobConfig(channel_capacity=1), seed=seed).run()["out"].to_pylist()
    assert {r["k"]: r["count"] for r in got} == collections.Counter(r["k"] for r in rows)


# --------------------------------------------------------------------------- per-key order


LIST_SCHEMA = pa.schema([("k", pa.string()), ("vals", pa.list_(pa.int64()))])


def _remember(key: Any, rows: pa.RecordBatch, state: Any) -> list[Row]:
    state.value = (state.value or []) + rows.column("v").to_pylist()
    return [{"k": key, "vals": list(state.value)}]


@pytest.mark.parametrize("seed", SEEDS)
def test_keyed_process_sees_each_keys_values_in_source_order(seed):
    rng = random.Random(seed)
    rows = _input(rng, n=rng.randint(100, 200), keys=rng.randint(1, 9))
    flow = Dataflow("order", num_bins=rng.choice([1, 8, 64]))
    p = rng.randint(1, 3)
    src = _source(flow, rng, rows, "src", parallelism=p, num_splits=1, max_batch=3)
    # stages of the source's parallelism: forward edges keep the order of the one split
    pipe = _stages(Pipe(src, rows), rng, "s", count=rng.randint(0, 2), parallelism=p, stages=ROW_ORDER_STAGES)
    remembered = pipe.stream.key_by("k").process(_remember, schema=LIST_SCHEMA, parallelism=rng.randint(1, 3))
    remembered.collect(name="out")
    config = JobConfig(channel_capacity=rng.choice([1, 4, 8]), num_hosts=rng.choice([None, None, 2]))
    got = LocalRun(flow, config, seed=seed).run()["out"].to_pylist()
    final: dict[Any, list[int]] = {}
    for r in got:
        previous = final.get(r["k"], [])
        assert r["vals"][:len(previous)] == previous, f"state of {r['k']!r} lost or reordered values"
        final[r["k"]] = r["vals"]
    expected = {k: [r["v"] for r in v] for k, v in _groups(pipe.rows).items()}
    assert final == expected


# --------------------------------------------------------------------------- failures


def _explode(batch: pa.RecordBatch) -> pa.RecordBatch:
    raise ZeroDivisionError(f"boom on a batch of {batch.num_rows}")


def _failing_flow(where: str, seed: int) -> Dataflow:
    rng = random.Random(seed)
    flow = Dataflow("fails")
    src = _source(flow, rng, _input(rng, n=30), "src", parallelism=2)
    if where == "map":
        src.map(_explode, name="bad", parallelism=2).collect(name="out")
    elif where == "filter":
        src.filter(lambda b: [True] * (b.num_rows + 1), name="bad").collect(name="out")  # wrong mask length
    elif where == "process":
        src.key_by("k").process(lambda k, rows, st: 1 / 0, name="bad", parallelism=3).collect(name="out")
    elif where == "reduce":
        src.key_by("k").reduce(lambda acc, row: 1 / 0, name="bad").collect(name="out")
    elif where == "records":
        src.map_records(lambda r: {"v": 1 / 0}, name="bad").collect(name="out")
    return flow


CAUSES = {"map": ZeroDivisionError, "filter": ValueError, "process": ZeroDivisionError,
          "reduce": ZeroDivisionError, "records": ZeroDivisionError}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("where", sorted(CAUSES))
def test_user_function_failure_names_operator_and_carries_cause(where, seed):
    flow = _failing_flow(where, seed)
    with pytest.raises(OperatorFailure) as info:
        LocalRun(flow, JobConfig(channel_capacity=1), seed=seed).run()
    failure = info.value
    assert failure.info.operator == "bad"
    assert str(failure).startswith(f"bad[{failure.info.index}]: {CAUSES[where].__name__}")
    assert isinstance(failure.cause, CAUSES[where])
    assert failure.__cause__ is failure.cause


def test_missing_key_column_at_run_time_names_both_operators():
    flow = Dataflow("drops-key")
    src = flow.source(from_items([{"k": "a", "v": 1}]), name="src")
    dropped = src.map(lambda b: b.select(["v"]), name="drop")  # schema unknown: key_by is accepted
    dropped.key_by("k").count(name="per-key").collect(name="out")
    with pytest.raises(OperatorFailure) as info:
        LocalRun(flow, seed=0).run()
    failure = info.value
    assert failure.info.operator == "drop"
    assert isinstance(failure.cause, KeyColumnError)
    assert "'per-key'" in str(failure) and "'k'" in str(failure) and "['v']" in str(failure)


def test_wrong_column_type_at_run_time_names_the_aggregation():
    flow = Dataflow("bad-type")
    src = flow.source(from_items([{"k": "a", "v": 1}]), name="src")
    as_text = src.map(lambda b: b.set_column(1, "v", pc.cast(b.column("v"), pa.string())), name="to-text")
    as_text.key_by("k").sum("v", name="total").collect(name="out")
    with pytest.raises(OperatorFailure) as info:
        LocalRun(flow, seed=0).run()
    assert info.value.info.operator == "total"
    assert isinstance(info.value.cause, TypeError)
    assert "has type string" in str(info.value)


class _FailingWriter(SinkWriter):
    def write(self, batch: pa.RecordBatch) -> None:
        raise OSError("disk full")


class _FailingSink(Sink):
    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return _FailingWriter()


def test_failing_sink_names_the_sink():
    flow = Dataflow("sink-fails")
    flow.source(from_items([{"x": 1}]), name="src").sink(_FailingSink(), name="lake")
    with pytest.raises(OperatorFailure, match=r"^lake\[0\]: OSError: disk full") as info:
        LocalRun(flow, seed=3).run()
    assert isinstance(info.value.cause, OSError)


# --------------------------------------------------------------------------- edge cases


def test_empty_input_gives_empty_results():
    flow = Dataflow("empty")
    src = flow.source(from_items([], schema=SCHEMA), parallelism=2, name="src")
    src.key_by("k").count(parallelism=2).collect(name="counts")
    src.sink(collect(), name="rows", parallelism=2)
    out = LocalRun(flow, JobConfig(channel_capacity=1), seed=1).run()
    assert out["counts"].num_rows == 0 and out["rows"].num_rows == 0


def test_empty_result_keeps_the_known_schema():
    flow = Dataflow("empty")
    src = flow.source(from_items([], schema=SCHEMA), name="src")
    src.collect(name="rows")
    src.key_by("k").count().collect(name="counts")
    out = LocalRun(flow, seed=1).run()
    assert out["rows"].schema.equals(SCHEMA)
    assert out["counts"].schema.names == ["k", "count"]


def test_more_source_instances_than_splits():
    flow = Dataflow("idle-sources")
    rows = [{"k": f"k{i % 3}", "v": i, "f": 0.0} for i in range(10)]
    src = flow.source(from_items(rows, num_splits=1, batch_size=2), parallelism=3, name="src")
    src.key_by("k").sum("v", parallelism=2).collect(name="out")
    got = LocalRun(flow, JobConfig(channel_capacity=1), seed=5).run()["out"].to_pylist()
    assert {r["k"]: r["sum"] for r in got} == {"k0": 18, "k1": 12, "k2": 15}


def test_local_run_does_not_reuse_state_between_runs():
    flow = Dataflow("twice")
    flow.source(from_items([{"k": "a", "v": 1}] * 5), name="src").key_by("k").count().collect(name="out")
    first = LocalRun(flow, seed=1).run()["out"].to_pylist()
    second = LocalRun(flow, seed=2).run()["out"].to_pylist()
    assert first == second == [{"k": "a", "count": 5}]


class _FlipReader:
    """A reader that says "not yet" when first asked and "due" right after (a reply that lands between
    the host's two questions, as a reader waiting on another process sees)."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.waiting = True  # the next batch is "on its way" until the host asks twice

    def ready_at(self):
        if self.waiting:
            self.waiting = False
            return time.monotonic() + 3600
        return None

    def read(self):
        self.waiting = True
        return self.batches.pop(0) if self.batches else None

    def offset(self):
        return 0

    def close(self):
        pass


def test_a_source_that_becomes_due_between_two_questions_is_not_forgotten():
    from chiray.operators.logic import Source, SourceSplit

    batches = [pa.record_batch({"x": [i, i + 1]}) for i in range(0, 6, 2)]

    class FlipSource(Source):
        def schema(self):
            return batches[0].schema

        def splits(self):
            return [SourceSplit("only", 0)]

        def open_split(self, split, offset=None):
            return _FlipReader(batches)

    flow = Dataflow("flip")
    flow.source(FlipSource(), name="src").collect(name="out")
    out = LocalRun(flow).run(max_rounds=10_000)["out"]
    assert sorted(out.column("x").to_pylist()) == list(range(6))
