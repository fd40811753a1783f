"""spark_bridge: Spark DataFrames (batch and Structured Streaming) as replayable dataflow sources.

Spark's executors push Arrow batches straight to the host processes of the
dataflow's source instances (``from_spark``, ``from_spark_stream``; a small
coordinator actor only says where each partition goes and commits), or
stage them as Arrow IPC files that sources read with exact offsets
(``from_spark(df, staged=True, path=...)``, ``from_staged``).
A DataFrame built by a function (``from_spark_stream(build, spark=SparkConfig(...))``)
makes a source that lives with its job: its Spark side runs in an actor the
job's owner starts, watches and restarts (``owned.py``, ``sparkside.py``).
pyspark is imported lazily.
"""

from .env import spark_session
from .schema import UnsupportedSparkType, to_arrow_schema
from .querylog import QueryLogError
from .source import SparkSource, from_spark, release_warm_coordinators
from .sparkconfig import SparkConfig
from .staged import StagedSource, from_staged
from .streaming import SparkStreamSource, from_spark_stream
from .units import BufferStatistics, SparkUnitFailed

__all__ = [
    "BufferStatistics",
    "QueryLogError",
    "SparkConfig",
    "SparkSource",
    "SparkStreamSource",
    "SparkUnitFailed",
    "StagedSource",
    "UnsupportedSparkType",
    "from_spark",
    "from_spark_stream",
    "from_staged",
    "release_warm_coordinators",
    "spark_session",
    "to_arrow_schema",
]
