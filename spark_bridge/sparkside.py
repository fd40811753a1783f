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

Lifecycle of the actor: ``NEW --warm()--> WARM --start(spec)--> RUNNING
--close()--> CLOSED`` (``start`` warms first if needed); any death is final
(``max_restarts=0``): the owner starts a new job run, which starts a new side.

A warm standby: once a side serves its job (its query ran a micro-batch),
``SparkSide.keep_standby()`` starts a second actor that makes its session and
runs one tiny Python task (the JVM and Spark's Python workers up), named
``<coordinator>-standby`` after the coordinator it will run. When the side
fails, the job's owner closes it with ``hand_over()``, which leaves the
standby in this process's registry (one per source name); the restarted
run's source takes it there (``take_standby``) and only builds its DataFrame
and starts its query on it, instead of waiting for a new JVM. A standby that
died meanwhile, or was made for another ``SparkConfig``, is replaced by a new
actor.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import ray

from chiray.operators import SideState, SourceSide, SourceSideStatus, SourceSplit

from .sparkconfig import SparkConfig

__all__ = ["SideKind", "SideSpec", "SparkSide", "SparkSideActor", "Standby", "new_coordinator", "side_name",
           "start_side", "start_standby", "take_standby"]


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


def _identity(batches: Any) -> Any:
    return batches


class _SparkSideShell:
    """The actor: one job-owned source's Spark driver side (see the module docstring).

    ``warm`` and ``start`` are called by the owner only, one at a time; ``status``, ``watch``, ``serving``
    and ``close`` may come from other threads.
    """

    def __init__(self, spark: SparkConfig) -> None:
        self._config = spark
        self._spec: SideSpec | None = None
        self._source: Any = None
        self._spark: Any = None
        self._warm = threading.Lock()
        self._closed = threading.Event()

    def warm(self) -> None:
        """Make the session and run one tiny Python task (JVM, Python workers up). Idempotent."""
        with self._warm:
            if self._spark is not None:
                return
            spark = self._config.session()
            if self._config.remote is None:  # a local or cluster master: start its Python workers
                spark.range(1).mapInArrow(_identity, "id long").collect()
            self._spark = spark

    def start(self, spec: SideSpec) -> tuple[pa.Schema, list[SourceSplit]]:
        """Warm up if needed, build the DataFrame, start the source's driver half; its schema and splits."""
        self.warm()
        self._spec = spec
        df = _dataframe(spec, self._spark)
        self._source, schema = spec.starter(spec, df)
        return schema, list(self._source.splits())

    def serving(self) -> None:
        """Returns once the side serves its job: its query ran a micro-batch (other kinds: once started)."""
        while not self._closed.wait(0.5):
            source, spec = self._source, self._spec
            if source is not None and spec is not None and (
                    spec.kind is not SideKind.STREAM or (source.query() is not None and
                                                         source.query().lastProgress is not None)):
                return

    def pid(self) -> int:
        """This process's id (fault tests and benchmarks kill it)."""
        return os.getpid()

    def watch(self) -> None:
        """Returns when the side closed (a call that fails instead says the actor died)."""
        self._closed.wait()

    def status(self) -> SourceSideStatus:
        spec, source = self._spec, self._source
        if spec is None:
            return SourceSideStatus("", "spark standby", SideState.STARTING, self._config.describe())
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
"""The Spark side's actor class (``SparkSideActor.options(num_cpus=...).remote(spark_config)``)."""

CLOSE_TIMEOUT_S = 60.0


def side_name(coordinator: str) -> str:
    """The Spark side actor's name (in the bridge's namespace) for the run whose coordinator is ``coordinator``."""
    return f"{coordinator}-spark"


def new_coordinator(source: str) -> str:
    """A fresh coordinator name for a run of the side of ``source``."""
    return f"{source}-{uuid.uuid4().hex[:8]}"


def _new_actor(spark: SparkConfig, name: str) -> Any:
    from .coordinator import NAMESPACE

    return SparkSideActor.options(  # type: ignore[attr-defined]
        name=name, namespace=NAMESPACE, num_cpus=spark.num_cpus).remote(spark)


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # gone already
        pass


@dataclasses.dataclass(frozen=True)
class Standby:
    """A warm Spark side actor kept for the next run of a source's side.

    Attributes:
        source: the source's name.
        spark: the config its session was made with.
        coordinator: the coordinator name of the run it will serve (its actor is ``<coordinator>-standby``).
        actor: the actor (warming up, or warm).
    """

    source: str
    spark: SparkConfig
    coordinator: str
    actor: Any

    def close(self) -> None:
        _kill(self.actor)


_handed: dict[str, Standby] = {}  # source name -> the standby a failed side left for the next run
_handed_lock = threading.Lock()


def start_standby(source: str, spark: SparkConfig) -> Standby:
    """Start a warm standby for the side of ``source`` (returns at once; the actor warms up meanwhile)."""
    coordinator = new_coordinator(source)
    actor = _new_actor(spark, f"{coordinator}-standby")
    actor.warm.remote()
    return Standby(source, spark, coordinator, actor)


def hand_on(standby: Standby) -> None:
    """Leave ``standby`` for the next run of its source's side (one it replaces is closed)."""
    with _handed_lock:
        replaced, _handed[standby.source] = _handed.get(standby.source), standby
    if replaced is not None:
        replaced.close()


def take_standby(source: str, spark: SparkConfig) -> Standby | None:
    """The standby a failed side of ``source`` left, if it was made with ``spark`` (else it is closed)."""
    with _handed_lock:
        standby = _handed.pop(source, None)
    if standby is not None and standby.spark != spark:
        standby.close()
        return None
    return standby


class SparkSide(SourceSide):
    """The job owner's handle on a running :class:`SparkSideActor` (an ``operators.SourceSide``)."""

    def __init__(self, spec: SideSpec, actor: Any) -> None:
        self.spec = spec
        self._actor = actor
        self._watch = actor.watch.remote()
        self._serving = actor.serving.remote()
        self._standby: Standby | None = None
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

    def keep_standby(self) -> None:
        """Start a warm standby once this side serves the job (its query ran a micro-batch); at once."""
        if self._closed or self._standby is not None or self.spec.kind is SideKind.STAGE:
            return
        ready, _ = ray.wait([self._serving], timeout=0)
        if ready:
            self._standby = start_standby(self.spec.name, self.spec.spark)

    def hand_over(self) -> None:
        """Close this side; its standby (if any) is left for the restarted run's side (``take_standby``)."""
        standby, self._standby = self._standby, None
        self.close()
        if standby is not None:
            hand_on(standby)

    def close(self) -> None:
        standby, self._standby = self._standby, None
        if standby is not None:
            standby.close()
        if self._closed:
            return
        self._closed = True
        if self.failure_known():
            _kill(self._actor)
            return
        try:
            ray.get(self._actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
        except Exception:  # dead already, or stuck: killed below either way
            pass
        _kill(self._actor)

    def failure_known(self) -> bool:
        """Whether its actor is known to be gone (its watch call ended)."""
        ready, _ = ray.wait([self._watch], timeout=0)
        return bool(ready)


def start_side(spec: SideSpec, standby: Standby | None = None) -> tuple[SparkSide, pa.Schema, list[SourceSplit]]:
    """Start the Spark side of ``spec`` (owned by this process), on ``standby`` if given; its handle, schema
    and splits. A standby that died is replaced by a new actor.

    Raises:
        what building the session or the DataFrame raised (the actor is stopped first).
    """
    if standby is not None:
        try:
            return _started(spec, standby.actor)
        except ray.exceptions.RayActorError:  # it died while it waited: start from nothing
            pass
    return _started(spec, _new_actor(spec.spark, side_name(spec.coordinator)))


def _started(spec: SideSpec, actor: Any) -> tuple[SparkSide, pa.Schema, list[SourceSplit]]:
    side = SparkSide(spec, actor)
    try:
        schema, splits = ray.get(actor.start.remote(spec), timeout=spec.spark.start_timeout_s)
    except ray.exceptions.RayActorError:
        side.close()
        raise
    except ray.exceptions.RayTaskError as exc:
        side.close()
        raise (exc.cause or exc) from None
    except BaseException:
        side.close()
        raise
    return side, schema, splits
