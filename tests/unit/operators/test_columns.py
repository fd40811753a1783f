"""A column's build-time type through maps without a schema, and errors that name the operator that changed it.

End to end without Ray (``LocalRun``), against pandas over the same rows.
"""

from __future__ import annotations

import datetime
import random

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chiray.actors.jobs.harness import LocalRun
from chiray.operators import Dataflow, bounded_out_of_orderness, collect, from_arrow, session, tumbling
from chiray.operators.columns import ColumnTypeError, column_type

T0 = datetime.datetime(2024, 5, 1, 12, 0, 0)
MINUTE = datetime.timedelta(minutes=1)


def _events(n: int = 400, seed: int = 5) -> pa.Table:
    rng = random.Random(seed)
    times = [T0 + datetime.timedelta(milliseconds=i * 700 + rng.randrange(2_000)) for i in range(n)]
    return pa.table({"user": [f"u{rng.randrange(6)}" for _ in range(n)], "ts": pa.array(times, pa.timestamp("ms")),
                     "amount": pa.array([rng.randrange(1, 100) for _ in range(n)], pa.int32())})


def _source(flow: Dataflow, table: pa.Table, name: str = "src"):
    return flow.source(from_arrow(table, batch_size=37), name=name,
                       watermarks=bounded_out_of_orderness("ts", datetime.timedelta(seconds=3)))


def _as_rows(batch: pa.RecordBatch) -> list[dict]:
    """A map as a newcomer writes it: rows out as dicts (so ``timestamp[ms]`` comes back as ``[us]``)."""
    return [{**row, "big": row["amount"] > 50} for row in batch.to_pylist()]


def test_a_window_after_a_map_without_schema_takes_timedeltas_and_counts_exactly():
    table = _events()
    flow = Dataflow("c", num_bins=16)
    mapped = _source(flow, table).map(_as_rows, name="enrich")
    assert mapped.schema is None
    assert column_type(flow.graph, "enrich", "ts").type == pa.timestamp("ms")
    (mapped.key_by("user").window(tumbling(MINUTE), on="ts").agg(name="per_minute", parallelism=2,
                                                                 n=(None, "count"), total=("amount", "sum"))
     .sink(collect(), name="out"))
    got = LocalRun(flow, seed=3).run()["out"].to_pandas()
    assert str(got["window_start"].dtype) == "datetime64[ms]"
    df = table.to_pandas()
    df["window_start"] = df["ts"].dt.floor("60s")
    want = df.groupby(["user", "window_start"]).agg(n=("amount", "size"), total=("amount", "sum")).reset_index()
    got = got[["user", "window_start", "n", "total"]].sort_values(["user", "window_start"]).reset_index(drop=True)
    want = want.sort_values(["user", "window_start"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_a_map_that_changes_the_time_column_is_named_when_its_batches_arrive():
    def to_seconds(batch: pa.RecordBatch) -> pa.RecordBatch:
        seconds = pc.divide(batch.column("ts").cast(pa.int64()), 1000).cast(pa.timestamp("s"))
        return batch.set_column(1, "ts", seconds)

    flow = Dataflow("c", num_bins=8)
    (_source(flow, _events(40)).map(to_seconds, name="to_seconds")
     .key_by("user").window(session(MINUTE), on="ts").count(name="sessions").sink(collect()))
    with pytest.raises(Exception) as caught:
        LocalRun(flow).run()
    error = caught.value.__cause__ or caught.value
    assert isinstance(error, ColumnTypeError)
    assert ("operator 'sessions': event-time column 'ts' arrives as timestamp[s], but the operator was built for "
            "timestamp[ms] (its type since operator 'src', presumed unchanged through 'to_seconds', which declares "
            "no schema=); an operator above changed the column's type") in str(error)


def test_a_declared_schema_that_makes_the_time_column_a_string_is_named_at_build_time():
    schema = pa.schema([("user", pa.string()), ("ts", pa.string()), ("amount", pa.int32())])
    flow = Dataflow("c")
    formatted = _source(flow, _events(4)).map(lambda b: b.set_column(1, "ts", pc.cast(b.column("ts"), pa.string())),
                                              name="fmt", schema=schema)
    with pytest.raises(ColumnTypeError, match=r"operator 'w': event-time column 'ts' must be a timestamp or an "
                                              r"integer, got string \(its type since operator 'fmt'\)"):
        formatted.key_by("user").window(tumbling(MINUTE), on="ts").count(name="w")


def test_the_presumption_stops_at_a_keyed_operator_without_a_schema():
    flow = Dataflow("c")
    processed = _source(flow, _events(4)).key_by("user").process(lambda k, rows, state: rows, name="p")
    assert column_type(flow.graph, "p", "ts").type is None
    union = _source(flow, _events(4), "src2").map(lambda b: b, name="m").union(processed, name="u")
    found = column_type(flow.graph, union.name, "ts")
    assert (found.type, found.origin, found.through) == (pa.timestamp("ms"), "src2", ("u", "m"))
