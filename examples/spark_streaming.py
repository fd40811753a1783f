"""Spark into chiray, streaming: a Structured Streaming query feeds a keyed count, one epoch per micro-batch.

Run it with ``python examples/spark_streaming.py`` (Spark needs Java 17).

Each micro-batch of the query is an epoch (Spark's batch id), committed
once; lane ``l`` of the source (use as many lanes as the source's
parallelism) reads the partitions ``q % lanes == l`` of every epoch. With the
``availableNow`` trigger the query reads what is there and stops, and so
does the source. With a Kafka source in Spark, this is how a dataflow reads
Kafka.
"""

from __future__ import annotations

import os
import tempfile

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import ray

import chiray

FILES, ROWS_PER_FILE, KEYS = 2, 1_000, 23


def main() -> pd.DataFrame:
    if not ray.is_initialized():
        ray.init()                                 # Ray first, then the Spark session
    spark = chiray.spark_session(cores=2)
    work = tempfile.mkdtemp()
    os.makedirs(f"{work}/in")
    for i in range(FILES):                         # two files: one micro-batch each (maxFilesPerTrigger=1)
        ids = pa.array(range(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE), pa.int64())
        pq.write_table(pa.table({"id": ids}), f"{work}/in/part{i}.parquet")

    stream = (spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).parquet(f"{work}/in")
                   .selectExpr(f"concat('k', cast(id % {KEYS} AS string)) AS key"))
    with chiray.from_spark_stream(stream, checkpoint_location=f"{work}/query-chk",
                                  trigger={"availableNow": True}, lanes=2) as source:
        flow = chiray.Dataflow("stream-ingest")
        (flow.source(source, parallelism=2, name="events")
             .key_by("key")
             .count(name="count", emit="final")    # the source ends when the query stops
             .sink(chiray.collect(), name="out"))
        job = chiray.submit(flow)
        job.wait(timeout=300)
    counts = job.result("out").to_pandas().sort_values("key", ignore_index=True)
    print(len(counts), "keys,", counts["count"].sum(), "records")    # 23 keys, 2000 records
    return counts


if __name__ == "__main__":
    main()
