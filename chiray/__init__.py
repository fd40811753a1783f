"""chiray: stream processing on Ray with in-band control and live rescaling of stateful operators.

The public API in one place::

    import chiray

    flow = chiray.Dataflow("wordcount")
    (flow.source(chiray.from_items([{"word": "a"}, {"word": "b"}, {"word": "a"}]))
         .key_by("word").count()
         .sink(chiray.collect()))
    job = chiray.submit(flow)
    print(job.result().to_pandas())

The layers below are ``chiray.operators`` (the dataflow description and the
operator library, no Ray), ``chiray.control`` (control-plane semantics),
``chiray.actors`` (the Ray runtime) and ``chiray.spark_bridge`` (Spark
sources). ``from_spark`` and ``from_spark_stream`` are loaded on first use,
so ``import chiray`` never imports pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chiray.actors import (
    AttachedJob,
    CheckpointInfo,
    ChirayError,
    EventKind,
    Job,
    JobCancelledError,
    JobConfig,
    JobEndedError,
    JobEvent,
    JobFailedError,
    JobHandle,
    JobInfo,
    JobLogs,
    JobStatistics,
    JobNotFoundError,
    JobStatus,
    LogLine,
    RescaleProgress,
    RescaleRecord,
    ManagerRestartedError,
    SavepointError,
    SavepointInfo,
    OperatorError,
    attach,
    jobs,
    submit,
)
from chiray.actors.rescale import RescaleError
from chiray.actors.shareddir import UnsharedStorageError
from chiray.actors.storage import CheckpointError
from chiray.control.op import ControlOp, InstanceHandler
from chiray.control.oprun import OpFailedError, OpTimeoutError
from chiray.operators import (
    Dataflow,
    KeyedStream,
    Sink,
    SinkWriter,
    Source,
    SourceSplit,
    SplitAddress,
    SplitReader,
    Stream,
    WatermarkStrategy,
    WindowedStream,
    bounded_out_of_orderness,
    collect,
    from_arrow,
    from_csv,
    from_items,
    from_json,
    from_parquet,
    generate,
    session,
    sliding,
    to_callable,
    to_delta,
    to_parquet,
    tumbling,
    watermarks_from,
)
from chiray.operators.aggregates import Aggregate, AggregateFunction
from chiray.operators.callbacks import (
    CoProcessFunction,
    KeyedState,
    KeyedTimerState,
    OnTimerFunction,
    ProcessFunction,
    TimerProcessFunction,
)
from chiray.operators.dataflow import register_runtime
from chiray.operators.processbatch import KeyedBatch

if TYPE_CHECKING:  # what type checkers and IDEs see of the names __getattr__ loads on first use
    from chiray.spark_bridge import from_spark, from_spark_stream, from_staged, spark_session

register_runtime(submit)

__version__ = "0.1.0"

_SPARK = {"from_spark", "from_spark_stream", "from_staged", "spark_session"}


def __getattr__(name: str) -> Any:
    """Load the Spark sources on first use, so ``import chiray`` does not import pyspark."""
    if name in _SPARK:
        from chiray import spark_bridge

        return getattr(spark_bridge, name)
    raise AttributeError(f"module 'chiray' has no attribute {name!r}")


__all__ = [
    "Dataflow",
    "Stream",
    "KeyedStream",
    "WindowedStream",
    "Aggregate",
    "AggregateFunction",
    "KeyedState",
    "KeyedTimerState",
    "KeyedBatch",
    "ProcessFunction",
    "TimerProcessFunction",
    "OnTimerFunction",
    "CoProcessFunction",
    "Source",
    "SourceSplit",
    "SplitReader",
    "SplitAddress",
    "Sink",
    "SinkWriter",
    "from_items",
    "from_arrow",
    "from_parquet",
    "from_csv",
    "from_json",
    "generate",
    "from_spark",
    "from_spark_stream",
    "from_staged",
    "spark_session",
    "collect",
    "to_parquet",
    "to_delta",
    "to_callable",
    "tumbling",
    "sliding",
    "session",
    "WatermarkStrategy",
    "bounded_out_of_orderness",
    "watermarks_from",
    "submit",
    "attach",
    "jobs",
    "JobHandle",
    "Job",
    "AttachedJob",
    "JobConfig",
    "JobStatus",
    "JobStatistics",
    "JobInfo",
    "JobEvent",
    "EventKind",
    "RescaleProgress",
    "RescaleRecord",
    "CheckpointInfo",
    "SavepointInfo",
    "JobLogs",
    "LogLine",
    "ControlOp",
    "InstanceHandler",
    "ChirayError",
    "OperatorError",
    "JobFailedError",
    "JobCancelledError",
    "JobEndedError",
    "JobNotFoundError",
    "ManagerRestartedError",
    "SavepointError",
    "CheckpointError",
    "UnsharedStorageError",
    "RescaleError",
    "OpFailedError",
    "OpTimeoutError",
]
