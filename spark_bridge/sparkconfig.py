"""sparkconfig.py: ``SparkConfig``: how a source the job owns makes its SparkSession (local, a master, Spark Connect).

A DataFrame cannot move between processes, so a source that lives with its
job (``from_spark_stream(build, spark=SparkConfig(...))``) is given a
function that builds the DataFrame from a session, and this value says how
to make that session in the process that runs the job's Spark side (an
actor the job's owner starts; see ``sparkside.py``).

Example:
    >>> cfg = SparkConfig(master="local[2]", conf={"spark.driver.memory": "512m"})
    >>> cfg.describe()
    'local[2]'
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["SparkConfig"]


@dataclasses.dataclass(frozen=True)
class SparkConfig:
    """How the Spark side of a job-owned source makes its SparkSession.

    Attributes:
        master: a Spark master URL (``"local[2]"``, ``"spark://host:7077"``, ``"k8s://..."``); the
            default is ``local[cores]``.
        remote: a Spark Connect URL (``"sc://host:15002"``) instead of a master: the session is a client,
            the Spark driver runs on the Connect server.
        conf: Spark settings (``spark.driver.memory``, ``spark.sql.shuffle.partitions``, packages, ...).
        cores: task slots of the default ``local[cores]`` master.
        app_name: the Spark application's name.
        num_cpus: Ray CPUs the Spark side's actor reserves (its JVM runs the local master's tasks).
        start_timeout_s: how long starting the session and building the DataFrame may take.
    """

    master: str | None = None
    remote: str | None = None
    conf: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cores: int = 2
    app_name: str = "chiray"
    num_cpus: float = 0.0
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.master is not None and self.remote is not None:
            raise ValueError(f"SparkConfig: give master or remote, not both (got {self.master!r} and {self.remote!r})")
        if self.remote is not None and not self.remote.startswith("sc://"):
            raise ValueError(f"SparkConfig: remote must be a Spark Connect URL (sc://host:port), got {self.remote!r}")
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise ValueError(f"SparkConfig: cores must be a positive integer, got {self.cores!r}")
        if not isinstance(self.conf, Mapping) or not all(isinstance(k, str) for k in self.conf):
            raise TypeError(f"SparkConfig: conf must map setting names to values, got {self.conf!r}")
        if self.num_cpus < 0 or self.start_timeout_s <= 0:
            raise ValueError(f"SparkConfig: num_cpus must be >= 0 and start_timeout_s > 0, got "
                             f"{self.num_cpus!r} and {self.start_timeout_s!r}")
        object.__setattr__(self, "conf", {k: str(v) for k, v in self.conf.items()})

    def describe(self) -> str:
        """The master or Connect URL in words."""
        return self.remote or self.master or f"local[{self.cores}]"

    def session(self) -> Any:
        """Make the session (in the process that runs the Spark side; Ray is running there)."""
        from .env import prepare_environment, require_pyspark, spark_session

        require_pyspark()
        if self.remote is None and (self.master is None or self.master.startswith("local")):
            return spark_session(self.cores, app_name=self.app_name, conf=dict(self.conf), master=self.master)
        prepare_environment(local=False)
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName(self.app_name)
        builder = builder.remote(self.remote) if self.remote is not None else builder.master(str(self.master))
        settings = {"spark.sql.session.timeZone": "UTC", **({} if self.remote else {"spark.pyspark.python": sys.executable}),
                    **self.conf}
        for key, value in settings.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
