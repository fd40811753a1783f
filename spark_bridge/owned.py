"""owned.py: Spark sources that live with their job: built from a function, their driver side in an actor.

``from_spark_stream(build, spark=SparkConfig(...), ...)`` and
``from_spark(build, spark=...)`` (push or staged) return these. The object
the user hands to ``Dataflow.source`` holds only the function, the
``SparkConfig`` and the options; it pickles with the dataflow, so a detached
job's manager can run it. Its ``splits()`` starts the Spark side
(``sparkside.py``) in the process that runs the job's ``submit`` and
``side()`` hands that over to the job's owner; everything the source
instances and the job's controller do (open lanes or units, acknowledge
checkpoints) is the driver-owned sources' code, on the coordinator of the
current side.

The names of the splits derive from the source's name only, so a job
restarted from a checkpoint (with a new side and a new coordinator) finds
its offsets again. A stream the job owns has one lane: its readers register
the epoch they need next, and the restarted query is rolled back to exactly
that epoch (``querylog.py``); several lanes could hold different epochs in
one checkpoint, which one query cannot re-run at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from chiray.operators import Source, SourceSplit, SplitReader

from .schema import to_arrow_schema
from .sparkconfig import SparkConfig
from .sparkside import SideKind, SideSpec, SparkSide, new_coordinator, start_side, take_standby
from .staged import StagedSource, from_staged, stage

__all__ = ["Owned", "OwnedStagedSource", "check_build", "push_target"]


def check_build(what: str, build: Any, spark: Any) -> SparkConfig:
    """The ``SparkConfig`` for a source built by ``build`` (a default one for ``None``); refuses what is not.

    Raises:
        TypeError: ``build`` is not callable, or ``spark`` is not a ``SparkConfig``.
    """
    if not callable(build):
        raise TypeError(f"{what}: expected a DataFrame or a function SparkSession -> DataFrame, "
                        f"got {type(build).__name__}")
    if spark is None:
        return SparkConfig()
    if not isinstance(spark, SparkConfig):
        raise TypeError(f"{what}: spark must be a SparkConfig (how to make the session), got {type(spark).__name__}")
    return spark


class Owned:
    """What the job-owned sources share: the function, the config, the side started once by ``splits()``."""

    _name: str
    _coordinator: str

    def _own(self, kind: SideKind, build: Callable[[Any], Any], spark: SparkConfig, options: Mapping[str, Any],
             starter: Callable[[SideSpec, Any], tuple[Any, pa.Schema]]) -> None:
        self._kind, self._build, self._spark, self._starter = kind, build, spark, starter
        self._options = tuple(options.items())
        self._side: SparkSide | None = None
        self._started: tuple[pa.Schema, list[SourceSplit]] | None = None

    def _start_side(self) -> tuple[pa.Schema, list[SourceSplit]]:
        """Start the Spark side (once per object: a job run unpickles its own copy), on the warm standby a
        failed side of this source left (``sparkside.take_standby``) if there is one; its schema and splits."""
        if self._started is None:
            standby = take_standby(self._name, self._spark)
            coordinator = standby.coordinator if standby is not None else new_coordinator(self._name)
            spec = SideSpec(self._kind, self._name, coordinator, self._build, self._spark, self._options,
                            self._starter)
            self._side, schema, splits = start_side(spec, standby)
            self._coordinator = coordinator
            self._started = (schema, splits)
        return self._started

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_side": None}  # the side belongs to the process that started it

    def side(self) -> SparkSide | None:
        return self._side

    def driver_bound(self) -> str | None:
        return None  # its driver side runs in an actor of whoever runs the job

    def close(self) -> None:
        """Stop the Spark side (the job's owner does it when the job ends). Idempotent."""
        side, self._side = self._side, None
        if side is not None:
            side.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OwnedStagedSource(Owned, Source):
    """``from_spark(build, staged=True, path=..., spark=...)``: staged by the job's Spark side, read without it.

    ``splits()`` reads the staged data set if ``path`` holds one already (a
    restarted job), else has a Spark side stage it and stops that side.
    """

    def __init__(self, build: Callable[[Any], Any], spark: SparkConfig, name: str, options: Mapping[str, Any]) -> None:
        self._own(SideKind.STAGE, build, spark, options, _start_staging)
        self._name, self._coordinator, self._path = name, name, str(options["path"])
        self._staged: StagedSource | None = None

    def _read(self) -> StagedSource:
        if self._staged is None:
            try:
                self._staged = from_staged(self._path)
            except FileNotFoundError:
                self._start_side()
                self.close()  # the files are written: Spark is no longer needed
                self._staged = from_staged(self._path)
        return self._staged

    def schema(self) -> pa.Schema | None:
        return self._staged.schema() if self._staged is not None else None

    def splits(self) -> list[SourceSplit]:
        return self._read().splits()

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        return self._read().open_split(split, offset)

    def bounded(self) -> bool:
        return True

    def describe(self) -> str:
        return self._name


def _start_staging(spec: SideSpec, df: Any) -> tuple[StagedSource, pa.Schema]:
    """The Spark side's work for a staged source: stage ``df`` under the path (Spark's executors write it)."""
    schema = to_arrow_schema(df.schema)
    return stage(df, schema, spec.option("path"), name=spec.name, batch_bytes=spec.option("batch_bytes")), schema


def push_target(spec: SideSpec, schema: pa.Schema, stream: bool) -> Any:
    """Where the Spark side's tasks push (its coordinator is this run's, ``spec.coordinator``)."""
    from .coordinator import NAMESPACE
    from .env import gcs_address, worker_env
    from .push import PushTarget

    return PushTarget(gcs_address(), NAMESPACE, spec.coordinator, schema, spec.option("window"),
                      spec.option("batch_bytes"), worker_env(), epoch=None if stream else 0, stream=stream)

