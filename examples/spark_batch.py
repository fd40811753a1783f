"""Spark into chiray, batch: a DataFrame that Spark prepares feeds a keyed aggregation on Ray.

Run it with ``python examples/spark_batch.py`` (Spark needs Java 17).

Spark reads, parses, cleans and joins; the dataflow does the stateful part.
Spark's executors push Arrow batches straight to the processes of the
dataflow's source instances, computing partitions as the dataflow asks for
them, so a slow dataflow slows Spark down.
"""

from __future__ import annotations

import pandas as pd
import ray
from pyspark.sql import DataFrame, SparkSession

import chiray


def events(spark: SparkSession) -> DataFrame:
    """What Spark prepares: here, made-up events (user, v), of which it keeps every third."""
    return spark.range(6_000).selectExpr("id % 100 AS user", "id AS v").where("v % 3 = 0")


def main() -> pd.DataFrame:
    if not ray.is_initialized():
        ray.init()                                 # Ray first: the Spark session built next inherits from it
    spark = chiray.spark_session(cores=2)          # local[2, 4]; or your own session, built after ray.init()
    with chiray.from_spark(events(spark)) as source:   # executors push Arrow batches to the source's hosts
        flow = chiray.Dataflow("ingest")
        (flow.source(source, parallelism=2, name="events")
             .key_by("user")
             .agg(n=(None, "count"), total=("v", "sum"), emit="final", parallelism=2, name="per_user")
             .sink(chiray.collect(), name="out"))
        job = chiray.submit(flow, checkpoint_interval_s=5)
        job.wait(timeout=300)                      # inside the block: closing the source ends Spark's side
    result = job.result("out").to_pandas().sort_values("user", ignore_index=True)
    print(result.head().to_string(index=False))
    print(len(result), "users,", result["n"].sum(), "events")    # 100 users, 2000 events
    return result


if __name__ == "__main__":
    main()
