"""The Spark bridge on real Spark (local[2]) and real Ray actors, checked against Spark SQL.

Every test builds a small DataFrame, feeds it through ``from_spark`` into a
keyed count, and compares the dataflow's result with the same aggregation
computed by Spark SQL over the same DataFrame.
"""

from __future__ import annotations

import pytest

from operators import Dataflow
from spark_bridge import from_spark

pytestmark = pytest.mark.usefixtures("ray_session")


def events(spark, rows: int = 60_000, partitions: int = 6):
    """A preprocessed DataFrame: string key, int value, timestamp; a filter and a projection in Spark."""
    return (spark.range(rows, numPartitions=partitions)
            .selectExpr("concat('k', cast(id % 97 AS string)) AS key", "cast(id % 13 AS int) AS v",
                        "timestamp_seconds(id) AS ts")
            .where("v <> 3"))


def spark_counts(df) -> dict[str, int]:
    """The oracle: Spark SQL's own count per key over the same DataFrame."""
    df.createOrReplaceTempView("bridge_oracle")
    rows = df.sparkSession.sql("SELECT key, count(*) AS n FROM bridge_oracle GROUP BY key").collect()
    return {r["key"]: r["n"] for r in rows}


def keyed_count(name: str, src, parallelism: int = 2) -> Dataflow:
    flow = Dataflow(name)
    flow.source(src, parallelism=parallelism, name="src").key_by("key").count(
        parallelism=2, name="count").collect(name="out")
    return flow


def dataflow_counts(job) -> dict[str, int]:
    return {r["key"]: r["count"] for r in job.result("out").to_pylist()}


@pytest.mark.parametrize("parallelism", [1, 2])
def test_keyed_count_equals_spark_sql(spark, parallelism):
    df = events(spark)
    with from_spark(df, max_units=2) as src:
        job = keyed_count(f"spark-sql-{parallelism}", src, parallelism).submit()
        try:
            job.wait(timeout=180)
        finally:
            job.cancel()
        stats = src.statistics()
    assert dataflow_counts(job) == spark_counts(df)
    assert stats.committed_units == 6 and stats.discarded_attempts == 0
