"""Submit the detached Spark-fed job of ``test_spark_detached.py`` to the Ray at RAY_ADDRESS, then exit.

Usage: python spark_detached_flow.py NAME ROOT WINDOW_PARALLELISM [RESTORE_FROM]

A Structured Streaming JSON file source over ROOT/in, preprocessed in Spark
(only clicks, joined with the static users table ROOT/users, amount as a
decimal), fed to a keyed event-time window (count and sum per user and 2,500
ticks of ``t``), written with to_parquet to ROOT/out. The Spark side lives
with the job (a build function and a SparkConfig). With RESTORE_FROM the job
starts from that savepoint and its query runs with an ``availableNow``
trigger: it reads what is there and ends, and so does the job.
"""

from __future__ import annotations

import os
import sys

import ray

import chiray
from chiray.operators import bounded_out_of_orderness, to_parquet, tumbling
from chiray.spark_bridge import SparkConfig, from_spark_stream

SCHEMA = "id long, user long, kind string, amount string, t long"
WINDOW = 2_500
SPARK = SparkConfig(master="local[2]", conf={"spark.driver.memory": "512m", "spark.sql.shuffle.partitions": "2",
                                             "spark.ui.enabled": "false"})


def main(name: str, root: str, parallelism: int, restore_from: str | None) -> None:
    def build(spark):  # runs in the job's Spark side, wherever that is
        users = spark.read.json(f"{root}/users")
        return (spark.readStream.schema(SCHEMA).json(f"{root}/in")
                .where("kind = 'click'").join(users, "user")
                .selectExpr("user", "CAST(amount AS DECIMAL(10,2)) AS amount", "t"))

    source = from_spark_stream(build, checkpoint_location=f"{root}/query", name="events", spark=SPARK,
                               trigger={"availableNow": True} if restore_from else None)
    flow = chiray.Dataflow(name)
    (flow.source(source, name="events", watermarks=bounded_out_of_orderness("t", 2_000))
         .key_by("user").window(tumbling(WINDOW), on="t")
         .agg(n=(None, "count"), total=("amount", "sum"), name="win", parallelism=parallelism)
         .sink(to_parquet(f"{root}/out"), name="out"))
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    chiray.submit(flow, detached=True, checkpoint_dir=f"{root}/chk-{name}", restore_from=restore_from)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
