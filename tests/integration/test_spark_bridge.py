"""The Spark bridge on real Spark (local[2]) and real Ray actors, checked against Spark SQL.

Every test builds a small DataFrame, feeds it through ``from_spark`` into a
keyed count, and compares the dataflow's result with the same aggregation
computed by Spark SQL over the same DataFrame.
"""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from pyspark.sql import functions as F

from chiray.operators import Dataflow
from chiray.spark_bridge import from_spark, from_spark_stream, from_staged
from tests.gate import Gate, Gated
from tests.oracles import output_counts
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.usefixtures("ray_session"),
    # Part of the suite (about a minute with Spark's start); CHIRAY_SPARK_TESTS=0 skips them where there is no Java.
    pytest.mark.skipif(os.environ.get("CHIRAY_SPARK_TESTS") == "0",
                       reason="Spark bridge tests skipped (CHIRAY_SPARK_TESTS=0)"),
]


def events(spark, rows: int = 60_000, partitions: int = 6):
    """A preprocessed DataFrame: string key, int value, timestamp; a filter and a projection in Spark."""
    return (
        spark.range(rows, numPartitions=partitions)
        .selectExpr(
            "concat('k', cast(id % 97 AS string)) AS key",
            "cast(id % 13 AS int) AS v",
            "timestamp_seconds(id) AS ts",
        )
        .where("v <> 3")
    )


def spark_counts(df) -> dict[str, int]:
    """The oracle: Spark SQL's own count per key over the same DataFrame."""
    df.createOrReplaceTempView("bridge_oracle")
    rows = df.sparkSession.sql("SELECT key, count(*) AS n FROM bridge_oracle GROUP BY key").collect()
    return {r["key"]: r["n"] for r in rows}


def keyed_count(name: str, src, parallelism: int = 2) -> Dataflow:
    flow = Dataflow(name)
    flow.source(src, parallelism=parallelism, name="src").key_by("key").count(
        parallelism=2, name="count"
    ).collect(name="out")
    return flow


def run_to_end(flow: Dataflow, timeout: float = 180):
    """Submit ``flow`` and wait for its end; its actors are stopped either way."""
    job = flow.submit()
    try:
        job.wait(timeout=timeout)
    finally:
        job.cancel()
    return job


def dataflow_counts(job) -> dict[str, int]:
    return output_counts(job.result("out"))


def test_keyed_count_equals_spark_sql_on_both_push_paths_and_a_warm_coordinator_serves_the_next_source(
        spark, monkeypatch):
    """Spark's executors push each partition's Arrow batches (Spark's own executor-side Arrow RDD) straight
    to the source hosts, never through the coordinator, and both instances read their units; the
    coordinator, kept warm, then serves the next source, whose tasks push from ``mapInArrow`` (the path
    where Spark has no executor-side Arrow RDD: Spark Connect). Each count equals Spark SQL's."""
    from chiray.spark_bridge import release_warm_coordinators, source
    from chiray.spark_bridge.coordinator import _warm

    df = events(spark, rows=30_000, partitions=6)
    expected = spark_counts(df)
    try:
        with from_spark(df, max_units=2, keep_warm=True) as src:
            assert source._spark_arrow_rdd(df, src._driver.target) is not None  # the default path
            job = run_to_end(keyed_count("spark-sql", src, parallelism=2))
            # A reader tells the coordinator it took a unit in a call of its own: the last notice may
            # land just after the job's end.
            wait_for(lambda: src.statistics().delivered_rows >= sum(expected.values()), 30,
                     "the coordinator to hear of every delivered row", detail=src.statistics)
            stats = src.statistics()
        assert dataflow_counts(job) == expected
        from chiray.actors.jobs.pool import warm_pool  # Spark's tasks hold the hosts' handles: never reused

        pooled = {a._actor_id for v in warm_pool()._idle.values() for a in v}
        assert not pooled & {h._actor_id for h in job.topology.hosts()}, "a Spark-fed job's hosts were reused"
        src_rows = [i.records_out for i in job.statistics().instances if i.operator == "src"]
        assert len(src_rows) == 2 and all(src_rows) and sum(src_rows) == sum(expected.values())  # both read
        assert stats.committed_units == 6 and stats.discarded_attempts == 0, stats
        assert stats.delivered_rows == sum(expected.values()) and stats.delivered_bytes > 0, stats
        assert stats.row_bytes_received == 0, stats  # the coordinator saw where data went, never the data
        assert len(_warm) == 1, "close() with keep_warm=True left no warm coordinator"
        warm_name = _warm[0][1]
        fallbacks = []  # the DataFrames that found no Arrow RDD
        monkeypatch.setattr(source, "_spark_arrow_rdd", lambda df, target: fallbacks.append(df))  # None
        again = events(spark, rows=12_000, partitions=3)
        with from_spark(again) as src:  # takes the warm coordinator; does not keep one itself
            assert src._coordinator == warm_name and not _warm
            assert len(fallbacks) == 1  # so its tasks push from mapInArrow
            job = run_to_end(keyed_count("spark-fallback-warm", src))
        assert dataflow_counts(job) == spark_counts(again)
    finally:
        release_warm_coordinators()
    assert not _warm


def _fail_first_attempt(batches):
    """User preprocessing that fails partition 2's first attempt after it emitted half its rows."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    doomed = ctx.partitionId() == 2 and ctx.attemptNumber() == 0
    emitted = 0
    for batch in batches:
        for start in range(0, batch.num_rows, 500):
            yield batch.slice(start, 500)
            emitted += min(500, batch.num_rows - start)
            if doomed and emitted >= 6000:
                raise RuntimeError("injected failure of the first attempt, mid-push")


def test_task_retried_mid_push_causes_no_duplicates(spark):
    base = events(spark, rows=48_000, partitions=4)
    df = base.mapInArrow(_fail_first_attempt, base.schema)
    spark.conf.set(
        "spark.sql.execution.arrow.maxRecordsPerBatch", "500"
    )  # so the attempt pushes before failing
    try:
        with from_spark(df, batch_bytes=16 << 10, max_units=4) as src:
            job = run_to_end(keyed_count("spark-retry", src))
            stats = src.statistics()
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
    expected = spark_counts(base)
    assert stats.discarded_attempts >= 1, stats  # the failed attempt did push, and its batches were dropped
    assert dataflow_counts(job) == expected
    assert stats.delivered_rows == sum(expected.values())


def _slowly(batch):
    time.sleep(0.2)  # a slow consumer, not synchronisation
    return batch


def test_slow_dataflow_holds_spark_back_within_the_bound(spark):
    partitions, max_units, parallelism = 6, 1, 1
    df = events(spark, rows=12_000, partitions=partitions)
    rows_per_partition = max(
        spark.range(12_000, numPartitions=partitions)
        .groupBy(F.spark_partition_id())
        .count()
        .agg(F.max("count"))
        .first()[0],
        1,
    )
    with from_spark(df, max_units=max_units) as src:
        flow = Dataflow("spark-backpressure")
        flow.source(src, parallelism=parallelism, name="src").map(_slowly, name="slow").key_by("key").count(
            name="count"
        ).collect(name="out")
        job = run_to_end(flow)
        stats = src.statistics()
    bound = max_units + parallelism  # units Spark may run ahead, plus the one each source instance waits for
    assert stats.peak_buffered_units <= bound, stats
    assert stats.peak_buffered_rows <= bound * rows_per_partition, stats
    assert stats.launches >= partitions // bound, stats  # Spark computed on demand, not all at once
    assert dataflow_counts(job) == spark_counts(df)


def test_killed_stateful_host_replays_from_spark_exactly(spark, tmp_path):
    df = events(spark, rows=24_000, partitions=8)
    with from_spark(df, max_units=2) as src:
        flow = Dataflow("spark-recovery")
        flow.source(src, parallelism=2, name="src").map(_slowly, name="slow").key_by("key").count(
            parallelism=2, name="count"
        ).collect(name="out")
        job = flow.submit(checkpoint_interval_s=0.3, poll_interval_s=0.2, checkpoint_dir=str(tmp_path))
        try:
            wait_for(lambda: job.statistics().records_out("src") >= 6_000, 120,
                     "src to emit 6,000 records (mid-ingest, after some checkpoints)")
            ray.kill(job.actors[0], no_restart=True)  # the host of the keyed instance count[0]
            job.wait(timeout=180)
        finally:
            job.cancel()
        stats = src.statistics()
    assert any(e.startswith("recovered from") for e in job.status().events), job.status().events
    assert stats.relaunches >= 1, stats  # Spark computed again what the restored readers needed
    assert dataflow_counts(job) == spark_counts(df)


HELD = 2  # batches each staged split emits before it holds at the gate


def _batches_read(offset: int) -> int:
    """A staged split's position at an offset: the batches read (so a restored reader holds there too)."""
    return offset


def _head_rows(source, split, batches: int) -> int:
    """Rows in the first ``batches`` batches of ``split``."""
    reader = source.open_split(split)
    try:
        return sum(reader.read().num_rows for _ in range(batches))
    finally:
        reader.close()


def test_staged_reader_killed_mid_split_resumes_exactly(spark, tmp_path):
    df = events(spark, rows=20_000, partitions=4)
    expected_counts = spark_counts(df)
    src = from_spark(df, staged=True, path=str(tmp_path / "staged"), batch_bytes=16 << 10)
    assert len(src.splits()) == 4 and src.num_rows == sum(expected_counts.values())
    # A reader stopped after three batches and reopened at its offset yields the rest, nothing twice.
    split = src.splits()[1]
    whole, first = src.open_split(split), src.open_split(split)
    expected = [b for b in iter(whole.read, None)]
    head = [first.read() for _ in range(3)]
    offset = first.offset()
    first.close()
    tail = list(iter(src.open_split(split, offset).read, None))
    assert offset == 3 and len(expected) > 4
    assert pa.Table.from_batches(head + tail).equals(pa.Table.from_batches(expected))
    # In a dataflow: each source instance reads its first split up to the gate (mid-split), a checkpoint
    # holds those offsets, the host of a source instance is killed, and the restored readers resume there.
    held = min(_head_rows(src, s, HELD) for s in src.splits())  # batches are about equal: 1 is fewer rows
    gate = Gate(tmp_path)
    staged = Gated(from_staged(str(tmp_path / "staged")), gate.path, hold_after=HELD, position=_batches_read)
    flow = Dataflow("spark-staged")
    flow.source(staged, parallelism=2, name="src").key_by("key").count(parallelism=2, name="count").collect(
        name="out")
    job = flow.submit(poll_interval_s=0.2, checkpoint_dir=str(tmp_path / "chk"))
    try:
        wait_for(lambda: all(i.records_out >= held for i in job.statistics().of("src")), 120,
                 f"each src instance to emit {HELD} batches of its first split")
        taken = job.checkpoint()
        host = next(i.host for i in job.statistics().instances if i.operator == "src" and i.index == 0)
        ray.kill(job.topology.peers()[host], no_restart=True)
        gate.open()
        job.wait(timeout=180)
    finally:
        job.cancel()
    assert f"recovered from checkpoint {taken}" in " ".join(job.status().events), job.status().events
    assert dataflow_counts(job) == expected_counts


def test_stream_epochs_are_seen_once_across_a_killed_host_and_a_rerun_batch(spark, tmp_path):
    """A host killed before any checkpoint: Spark pushes the kept epochs again to the restored lanes. Then
    the query's last commit is lost, as if its driver died: Spark re-runs that batch, which the coordinator
    ignores. The dataflow saw every epoch once: its count equals Spark SQL's."""
    inbound, chk = tmp_path / "in", tmp_path / "query-chk"
    inbound.mkdir()
    for i in range(3):  # three micro-batches of one file each
        pq.write_table(pa.table({"id": pa.array(range(i * 4000, (i + 1) * 4000), pa.int64())}),
                       inbound / f"part{i}.parquet")

    def preprocess(df):
        return df.selectExpr("concat('k', cast(id % 23 AS string)) AS key", "cast(id % 5 AS int) AS v").where(
            "v <> 1")

    sdf = preprocess(spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).parquet(str(inbound)))
    with from_spark_stream(sdf, checkpoint_location=str(chk), trigger={"availableNow": True}, lanes=2,
                           until_terminated=False) as src:  # the input ends at src.end(), not before
        # No checkpoint: the restored lanes start again from epoch 0.
        job = keyed_count("spark-stream", src).submit(poll_interval_s=0.2,
                                                      checkpoint_dir=str(tmp_path / "chk"))
        try:
            wait_for(lambda: job.statistics().records_out("src") >= 3_000, 120,
                     "src to emit 3,000 records (the lanes took some epochs)")
            ray.kill(job.actors[0], no_restart=True)  # the host of the keyed instance count[0]
            assert src.await_termination(timeout_s=120), "the query did not end"
            commits = sorted(int(p.name) for p in (chk / "commits").iterdir() if p.name.isdigit())
            for log in (str(commits[-1]), f".{commits[-1]}.crc"):  # as if the driver died before its commit
                (chk / "commits" / log).unlink(missing_ok=True)
            src.restart()  # Spark re-runs the last batch from its logged offsets
            assert src.await_termination(timeout_s=120), "the restarted query did not end"
            src.end()
            job.wait(timeout=180)
        finally:
            job.cancel()
        stats = src.statistics()
    assert any(e.startswith("recovered from") for e in job.status().events), job.status().events
    assert stats.replayed_epochs >= 1 and stats.repushes >= 1, stats  # Spark pushed kept epochs again
    assert stats.ignored_commits == 1 and stats.committed_epochs == len(commits), stats
    assert stats.row_bytes_received == 0 and stats.delivered_bytes > 0, stats
    assert dataflow_counts(job) == spark_counts(preprocess(spark.read.parquet(str(inbound))))
