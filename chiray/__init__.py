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
sources). The runtime's names (``submit``, ``Job``, ``attach``, ...) and the
Spark sources are loaded on first use, so ``import chiray`` imports neither
Ray nor pyspark.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    from chiray.actors.jobs.rescale import RescaleError
    from chiray.actors.jobs.shareddir import UnsharedStorageError
    from chiray.actors.runtime.storage import CheckpointError
    from chiray.spark_bridge import from_spark, from_spark_stream, from_staged, spark_session

__version__ = "0.1.0"

_LAZY = {
    "AttachedJob": "chiray.actors",
    "CheckpointInfo": "chiray.actors",
    "ChirayError": "chiray.actors",
    "EventKind": "chiray.actors",
    "Job": "chiray.actors",
    "JobCancelledError": "chiray.actors",
    "JobConfig": "chiray.actors",
    "JobEndedError": "chiray.actors",
    "JobEvent": "chiray.actors",
    "JobFailedError": "chiray.actors",
    "JobHandle": "chiray.actors",
    "JobInfo": "chiray.actors",
    "JobLogs": "chiray.actors",
    "JobStatistics": "chiray.actors",
    "JobNotFoundError": "chiray.actors",
    "JobStatus": "chiray.actors",
    "LogLine": "chiray.actors",
    "RescaleProgress": "chiray.actors",
    "RescaleRecord": "chiray.actors",
    "ManagerRestartedError": "chiray.actors",
    "SavepointError": "chiray.actors",
    "SavepointInfo": "chiray.actors",
    "OperatorError": "chiray.actors",
    "attach": "chiray.actors",
    "jobs": "chiray.actors",
    "submit": "chiray.actors",
    "RescaleError": "chiray.actors.jobs.rescale",
    "UnsharedStorageError": "chiray.actors.jobs.shareddir",
    "CheckpointError": "chiray.actors.runtime.storage",
    "from_spark": "chiray.spark_bridge",
    "from_spark_stream": "chiray.spark_bridge",
    "from_staged": "chiray.spark_bridge",
    "spark_session": "chiray.spark_bridge",
}
"""Where each name that is loaded on first use lives: the Ray runtime and the Spark sources."""


def _submit(*args: Any, **kwargs: Any) -> Any:
    """``Dataflow.submit``'s runtime: ``chiray.actors.submit``, imported on the first submit."""
    from chiray.actors import submit

    return submit(*args, **kwargs)


register_runtime(_submit)


def __getattr__(name: str) -> Any:
    """Load the runtime and the Spark sources on first use, so ``import chiray`` and ``import
    chiray.operators`` import neither Ray nor pyspark."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chiray' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
