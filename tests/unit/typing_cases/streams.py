"""Typical user code against ``chiray``'s public API: it must pass ``mypy --strict`` (tests/unit/test_typing.py).

Never run: a type checker reads it. ``assert_type`` pins what a verb returns, so a verb typed too loosely
(``Any``, or a protocol without ``map``/``sink``) fails the check, not only one typed wrongly.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc
from typing_extensions import assert_type

import chiray


def tokenize(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"word": pc.list_flatten(pc.split_pattern(batch.column("line"), " "))})


def word_count(lines: list[str]) -> chiray.Dataflow:
    flow = chiray.Dataflow("wordcount")
    counts = (flow.source(chiray.from_items([{"line": line} for line in lines]), name="lines")
              .flat_map(tokenize)
              .key_by("word")
              .count(emit="final"))
    assert_type(counts, chiray.Stream)
    counts.sink(chiray.collect(), name="out")
    return flow


def windows(flow: chiray.Dataflow) -> None:
    bids = flow.source(chiray.from_items([{"auction": 1, "bidder": "a", "price": 3.0, "ts": 0}]),
                       watermarks=chiray.bounded_out_of_orderness("ts", 5))
    windowed = bids.key_by("auction").window(chiray.tumbling(10), on="ts")
    assert_type(windowed, chiray.WindowedStream[chiray.Stream])
    best = windowed.agg(n=(None, "count"), total=("price", "sum"), winner=("price", "arg_max", "bidder"),
                        top_row=("price", "arg_max"), cheapest=("price", "arg_min", None))
    assert_type(best, chiray.Stream)
    best.map(lambda batch: batch, name="identity").top(3, by="total").key_by("auction").count(emit="updates").print()
    best.side_output("late").collect()
    assert_type(windowed.count(), chiray.Stream)
    assert_type(windowed.sum("price"), chiray.Stream)
    minute = bids.window(chiray.sliding(timedelta(minutes=1), timedelta(seconds=10)), on="ts")
    minute.agg(revenue=("price", "sum")).sink(chiray.collect())
    sessions = bids.key_by("bidder").window(chiray.session(30), on="ts", late_side_output=True)
    applied = sessions.apply(lambda key, start, end, rows: rows)
    applied.filter(lambda batch: pc.greater(batch.column("price"), 1)).collect()
    assert_type(applied, chiray.Stream)


def aggregates(stream: chiray.Stream) -> chiray.Stream:
    keyed = stream.key_by("k")
    assert_type(keyed, chiray.KeyedStream)
    spec: chiray.Aggregate = ("price", "arg_max", "bidder")
    function: chiray.AggregateFunction = "mean"
    return keyed.agg(emit="updates", winner=spec, avg=("price", function), n=(None, "count"),
                     distinct=("bidder", "count_distinct"))


def joins(flow: chiray.Dataflow) -> None:
    orders = flow.source(chiray.from_items([{"user": "a", "amount": 3, "ts": 1}]), name="orders",
                         watermarks=chiray.bounded_out_of_orderness("ts", 0))
    users = flow.source(chiray.from_items([{"id": "a", "city": "Oslo", "ts": 1}]), name="users",
                        watermarks=chiray.bounded_out_of_orderness("ts", 0))
    keyed = orders.connect(users).key_by("user", "id")
    joined = keyed.window_join(chiray.tumbling(10), on="ts", late_side_output=True)
    assert_type(joined, chiray.Stream)
    joined.map(lambda batch: batch).key_by("user").sum("amount").sink(chiray.collect())
    joined.side_output("late_left").print()
    keyed.join(name="enrich").top(1, by="amount").collect()


def running_count(key: str, rows: pa.RecordBatch, state: chiray.KeyedState) -> list[dict[str, object]]:
    state.value = (state.value or 0) + rows.num_rows
    return [{"key": key, "seen": state.value}]


def remind(key: object, rows: pa.RecordBatch, state: chiray.KeyedTimerState) -> None:
    state.value = rows.num_rows
    for time in state.timers:
        state.delete(time)
    state.register(state.watermark + 60)


def fire(key: object, time: int, state: chiray.KeyedTimerState) -> list[dict[str, object]]:
    seen = state.value
    state.clear()
    return [{"key": key, "at": time, "seen": seen}]


def both(key: object, rows: pa.RecordBatch, state: chiray.KeyedTimerState, input: int) -> None:
    state.value = input


def callbacks(stream: chiray.Stream, other: chiray.Stream) -> None:
    stream.key_by("key").process(running_count).collect()
    stream.key_by("key").process(remind, on_timer=fire).collect()
    stream.key_by("key").process(running_count, on_timer=fire).collect()  # a KeyedState function takes either
    stream.key_by("key").process(lambda key, rows, state: None).collect()
    stream.connect(other).key_by("key").process(both, on_timer=fire).collect()
    process: chiray.ProcessFunction = running_count
    timed: chiray.TimerProcessFunction = remind
    on_timer: chiray.OnTimerFunction = fire
    co: chiray.CoProcessFunction = both
    stream.key_by("key").process(timed, on_timer=on_timer).union(stream.key_by("key").process(process)).collect()
    stream.connect(other).key_by("key").process(co).collect()


def jobs(flow: chiray.Dataflow, root: str) -> None:
    job = chiray.submit(flow, checkpoint_dir=root, checkpoint_interval_s=5)
    assert_type(job, chiray.Job)
    control = job.rescale("count", 4, strategy="non_disruptive", chunks=3)
    progress: chiray.RescaleProgress = control.result(timeout=60)
    print(progress, job.checkpoint_info().id)
    job.wait(timeout=120)
    table: pa.Table = job.result("out")
    print(table.num_rows, [r.to for r in job.rescales()])
    attached = chiray.submit(flow, detached=True)
    assert_type(attached, chiray.AttachedJob)
    attached.stop(savepoint=f"{root}/savepoints")
    configured = chiray.submit(flow, config=chiray.JobConfig(checkpoint_dir=root), restore_from=root,
                               allow_non_restored_state=True)
    assert_type(configured, chiray.JobHandle)
    info: chiray.JobInfo = configured.info()
    print(info.state)
    handle: chiray.JobHandle = chiray.attach("wordcount")
    handle.cancel()


def flow_submit(flow: chiray.Dataflow, root: str) -> None:
    job = flow.submit(checkpoint_dir=root, restore_from=f"{root}/chk-3", spare_hosts=1)
    job.rescale("count", 2).result(timeout=60)
    print(job.checkpoint(timeout=30) + 1, job.savepoint(dir=root).upper(), job.name)
    job.wait(timeout=None)
    print(job.result("out"))


def spark(path: str) -> None:
    session = chiray.spark_session(cores=2)
    flow = chiray.Dataflow("spark")
    flow.source(chiray.from_spark(session.read.parquet(path))).collect()
