"""A job whose checkpoints, savepoints and output live on an S3-compatible server (moto's, the session's
``s3_server``): a killed host recovers from a checkpoint on S3, the job stops with a savepoint on S3, and a
job restored from it at another parallelism writes, to S3, the sums pandas computes over the whole input."""

from __future__ import annotations

import os
import uuid

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from chiray.actors.jobs.shareddir import alive_nodes, probe, ray_runner
from chiray.actors.runtime.storage import CheckpointStorage, child_uri
from chiray.operators import Dataflow, generate, to_parquet
from tests.gate import Gate, gated
from tests.oracles import source_batches
from tests.waiting import wait_for

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.background]  # results, never timings

N, SPLITS, BATCH = 20_000, 2, 500


def _flow(name: str, src, parallelism: int, out: str) -> Dataflow:
    flow = Dataflow(name)
    keyed = flow.source(src, parallelism=SPLITS, name="src").key_by("key")
    keyed.sum("value", parallelism=parallelism, name="sum").sink(to_parquet(out), name="out")
    return flow


def test_a_job_on_s3_recovers_a_killed_host_and_restores_from_an_s3_savepoint_at_another_parallelism(
        s3_server, tmp_path):
    s3_server.make_bucket("integration")
    root = s3_server.uri("integration", uuid.uuid4().hex[:10])
    chk, savepoints = child_uri(root, "chk"), child_uri(root, "savepoints")
    data = generate(N, batch_size=BATCH, num_keys=200, num_splits=SPLITS, seed=5)
    os.makedirs(tmp_path / "gate")
    src = gated(data, Gate(tmp_path / "gate"), N / SPLITS, fast=0.3, trickle=2_000,
                position=lambda offset: offset * BATCH)  # the gate stays shut: the job is stopped mid-stream
    job = _flow("s3-job", src, 2, child_uri(root, "out-1")).submit(poll_interval_s=0.2, checkpoint_dir=chk)
    try:
        wait_for(lambda: job.statistics().records_out("src") >= 0.3 * N, 60, "30 % of the input emitted")
        first = job.checkpoint(timeout=60)
        assert CheckpointStorage(chk, create=False).committed()[-1] == first  # on S3, complete
        ray.kill(job.actors[0], no_restart=True)
        recovered = f"recovered from checkpoint {first}"
        wait_for(lambda: any(e.startswith(recovered) for e in job.status().events), 120,
                 "the job recovered from its checkpoint on S3")
        stopped = job.stop(savepoint=savepoints, timeout=120)
    finally:
        job.cancel()
    assert stopped.path.startswith(savepoints.split("?")[0])
    assert [s.path for s in job.savepoints()] == [stopped.path]

    restored = _flow("s3-restored", data, 3, child_uri(root, "out-2")).submit(restore_from=stopped.path)
    try:
        restored.wait(timeout=180)
    finally:
        restored.cancel()
    fs = s3_server.filesystem()
    got = pq.read_table(restored.result("out"), filesystem=fs).to_pandas()
    records = pa.Table.from_batches(source_batches(data)).to_pandas()
    expected = records.groupby("key", as_index=False)["value"].sum()
    pd.testing.assert_frame_equal(got.sort_values("key", ignore_index=True),
                                  expected.rename(columns={"value": "sum"}), check_dtype=False)


def test_the_shared_directory_probe_runs_as_ray_tasks_pinned_to_each_node(tmp_path):
    """The probe's Ray shell on this session's one node (a ring of one: it reads its own token); the
    decision over several nodes is unit-tested (tests/unit/actors/test_shareddir.py)."""
    nodes = alive_nodes()
    assert len(nodes) == 1
    assert probe(str(tmp_path), list(nodes), ray_runner(timeout_s=60)) == []
    assert os.listdir(tmp_path) == []


def test_spark_stages_a_dataframe_on_s3_through_pyarrow_and_a_reader_reads_it_back(spark, s3_server):
    """Staged mode writes from Spark's Python workers through ``pyarrow.fs``: an ``s3://`` URI needs no
    Hadoop S3 connector (the ``s3a://`` jars are not in pyspark's distribution)."""
    from chiray.spark_bridge import from_spark, from_staged

    s3_server.make_bucket("integration")
    path = child_uri(s3_server.uri("integration", uuid.uuid4().hex[:10]), "staged")
    df = spark.range(0, 3_000, numPartitions=3).selectExpr("id", "id % 7 AS key")
    expected = df.toPandas().sort_values("id", ignore_index=True)
    staged = from_spark(df, staged=True, path=path, batch_bytes=4 << 10)
    for source in (staged, from_staged(path)):
        batches = []
        for split in source.splits():
            reader = source.open_split(split)
            batches.extend(iter(reader.read, None))
            reader.close()
        got = pa.Table.from_batches(batches).to_pandas().sort_values("id", ignore_index=True)
        pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    assert len(staged.splits()) == 3
