"""sparkside.py: the Spark side of a job-owned source: an actor holding the SparkSession, the DataFrame and the query.

A source built from a function (``from_spark_stream(build, spark=...)``,
``from_spark(build, spark=...)``) starts, from its ``splits()``, one
:class:`SparkSideActor` in the process that runs the job's ``submit`` (a
detached job's manager, which so owns it: Ray ends an actor with its owner).
The actor makes the SparkSession from the :class:`~sparkconfig.SparkConfig`,
builds the DataFrame with the user's function, and runs there what a
driver-owned source runs in the driver: the coordinator (which it owns, so it
dies with it), the job launcher, and, for a stream, the streaming query,
which starts once every lane registered, from the query's checkpoint rolled
back to the first epoch the restored dataflow needs (``querylog.py``).

:class:`SparkSide` is the job owner's handle on it (an
``operators.SourceSide``): ``failure()`` is answered by a call that returns
only when the actor closes or dies, polled without waiting; ``status()``
reads the query's progress and the coordinator's counters.

Lifecycle of the actor: ``NEW --start()--> RUNNING --close()--> CLOSED``; any
death is final (``max_restarts=0``): the owner starts a new job run, which
starts a new side.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import ray

from chiray.operators import SideState, SourceSide, SourceSideStatus, SourceSplit

from .sparkconfig import SparkConfig

__all__ = ["SideKind", "SideSpec", "SparkSide", "SparkSideActor", "side_name", "start_side"]


class SideKind(enum.Enum):
    """What the Spark side runs: a streaming query, a pushed batch DataFrame, or staging one to files."""

    STREAM = "spark streaming query"
    BATCH = "spark batch push"
    STAGE = "spark staging"


@dataclasses.dataclass(frozen=True)
class SideSpec:
    """What a Spark side builds (pickled to its actor).

    Attributes:
        kind: what it runs.
        name: the source's name (its split ids derive from it: stable across restarts).
        coordinator: the coordinator actor's name for this run of the side (fresh each run).
        build: the user's function, SparkSession -> DataFrame.
        spark: how to make the session.
        options: the factory's keyword arguments (``from_spark_stream``'s or ``from_spark``'s).
        starter: ``(spec, DataFrame) -> (driver-side source, schema)``: starts the source's driver half
            over the DataFrame (defined beside each source, so this module imports none of them).
    """

    kind: SideKind
    name: str
    coordinator: str
    build: Callable[[Any], Any]
    spark: SparkConfig
    options: tuple[tuple[str, Any], ...]
    starter: Callable[[SideSpec, Any], tuple[Any, pa.Schema]]

    def option(self, key: str) -> Any:
        return dict(self.options)[key]


def _dataframe(spec: SideSpec, spark: Any) -> Any:
    """The user's DataFrame, checked: a streaming one for a stream, a batch one otherwise."""
    from pyspark.sql import DataFrame

    df = spec.build(spark)
    streaming = spec.kind is SideKind.STREAM
    what = "from_spark_stream" if streaming else "from_spark"
    if not isinstance(df, DataFrame) or df.isStreaming != streaming:
        got = type(df).__name__ + (f" (streaming={df.isStreaming})" if isinstance(df, DataFrame) else "")
        raise TypeError(f"{what}: the build function {getattr(spec.build, '__qualname__', spec.build)!r} must "
                        f"return a {'streaming' if streaming else 'batch'} DataFrame, got {got}")
    return df


class _SparkSideShell:
    """The actor: one job-owned source's Spark driver side (see the module docstring)."""

    def __init__(self, spec: SideSpec) -> None:
        self._spec = spec
        self._source: Any = None
        self._spark: Any = None
        self._closed = threading.Event()

    def start(self) -> tuple[pa.Schema, list[SourceSplit]]:
        """Make the session, build the DataFrame, start the source's driver half; its schema and splits."""
        self._spark = self._spec.spark.session()
        df = _dataframe(self._spec, self._spark)
        self._source, schema = self._spec.starter(self._spec, df)
        return schema, list(self._source.splits())

    def pid(self) -> int:
        """This process's id (fault tests and benchmarks kill it)."""
        return os.getpid()

    def watch(self) -> None:
        """Returns when the side closed (a call that fails instead says the actor died)."""
        self._closed.wait()

    def status(self) -> SourceSideStatus:
        spec, source = self._spec, self._source
        base = SourceSideStatus(spec.name, spec.kind.value, SideState.STARTING, spec.spark.describe())
        if source is None:
            return base
        if spec.kind is SideKind.STAGE:
            return dataclasses.replace(base, state=SideState.STOPPED, detail=f"staged at {spec.option('path')}")
        stats = source.statistics()
        if spec.kind is SideKind.BATCH:
            return dataclasses.replace(base, state=SideState.RUNNING, rows_waiting=stats.buffered_rows,
                                       batches_committed=stats.committed_units)
        return _stream_status(base, source.query(), stats)

    def close(self) -> None:
        """Stop the query, kill the coordinator, stop the session. Idempotent."""
        source, self._source = self._source, None
        try:
            if source is not None and hasattr(source, "close"):
                source.close()
            if self._spark is not None:
                self._spark.stop()
        finally:
            self._closed.set()


def _stream_status(base: SourceSideStatus, query: Any, stats: Any) -> SourceSideStatus:
    """The status of a streaming query (``None``: it waits for the lanes before it starts)."""
    waiting = dict(rows_waiting=stats.rows_waiting, batches_committed=stats.committed_epochs)
    if query is None:
        return dataclasses.replace(base, detail="waiting for the dataflow's readers", **waiting)
    progress = query.lastProgress or {}
    error = query.exception() if not query.isActive else None
    state = SideState.RUNNING if query.isActive else SideState.FAILED if error is not None else SideState.STOPPED
    rate = progress.get("inputRowsPerSecond")
    return dataclasses.replace(base, state=state, detail=str(query.status.get("message", "")),
                               last_batch=progress.get("batchId"),
                               input_rows_per_s=None if rate is None else float(rate),
                               error=None if error is None else str(error)[:500], **waiting)


SparkSideActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=8)(_SparkSideShell)  # type: ignore[call-overload]
"""The Spark side's actor class (``SparkSideActor.options(num_cpus=...).remote(spec)``)."""

CLOSE_TIMEOUT_S = 60.0


def side_name(coordinator: str) -> str:
    """The Spark side actor's name (in the bridge's namespace) for the run whose coordinator is ``coordinator``."""
    return f"{coordinator}-spark"


class SparkSide(SourceSide):
    """The job owner's handle on a running :class:`SparkSideActor` (an ``operators.SourceSide``)."""

    def __init__(self, spec: SideSpec, actor: Any) -> None:
        self.spec = spec
        self._actor = actor
        self._watch = actor.watch.remote()
        self._closed = False

    def failure(self) -> str | None:
        if self._closed:
            return None
        ready, _ = ray.wait([self._watch], timeout=0)
        if not ready:
            return None
        try:
            ray.get(ready[0])
        except ray.exceptions.RayError as exc:
            return f"the Spark side of source {self.spec.name!r} died: {type(exc).__name__}"
        return f"the Spark side of source {self.spec.name!r} closed"

    def status(self, timeout_s: float = 5.0) -> SourceSideStatus:
        try:
            return ray.get(self._actor.status.remote(), timeout=timeout_s)
        except Exception as exc:
            reason = self.failure() or f"no answer within {timeout_s} s ({type(exc).__name__})"
            return SourceSideStatus(self.spec.name, self.spec.kind.value, SideState.FAILED, error=reason)

    def actor(self) -> Any:
        """The actor's handle (``ray.kill`` it to simulate a lost Spark driver)."""
        return self._actor

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            ray.get(self._actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
        except Exception:  # dead already, or stuck: killed below either way
            pass
        try:
            ray.kill(self._actor, no_restart=True)
        except Exception:
            pass


def start_side(spec: SideSpec) -> tuple[SparkSide, pa.Schema, list[SourceSplit]]:
    """Start the Spark side of ``spec`` (owned by this process); its handle, schema and splits.

    Raises:
        what building the session or the DataFrame raised (the actor is stopped first).
    """
    from .coordinator import NAMESPACE

    actor = SparkSideActor.options(  # type: ignore[attr-defined]
        name=side_name(spec.coordinator), namespace=NAMESPACE, num_cpus=spec.spark.num_cpus).remote(spec)
    side = SparkSide(spec, actor)
    try:
        schema, splits = ray.get(actor.start.remote(), timeout=spec.spark.start_timeout_s)
    except ray.exceptions.RayTaskError as exc:
        side.close()
        raise (exc.cause or exc) from None
    except BaseException:
        side.close()
        raise
    return side, schema, splits
