"""env.py: the environment Spark's Python workers need to reach Ray, and a SparkSession built after Ray.

Order matters: Ray first, then the SparkSession, because the Spark JVM and
every Python worker it forks inherit the driver's environment when the JVM
starts. :func:`spark_session` does it in that order; with a session the user
built, the bridge also passes :func:`worker_env` inside each task.

Example:
    >>> import ray; ray.init()                      # doctest: +SKIP
    >>> spark = spark_session(cores=2)              # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["gcs_address", "prepare_environment", "require_pyspark", "spark_session", "worker_env"]

MIN_PYSPARK = (3, 5)


def require_pyspark() -> Any:
    """Import pyspark, or fail saying which version the bridge needs."""
    try:
        import pyspark
    except ImportError as e:
        raise ImportError(
            f"spark_bridge needs pyspark >= {'.'.join(map(str, MIN_PYSPARK))}: pip install pyspark"
        ) from e
    version = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
    if version < MIN_PYSPARK:
        raise ImportError(
            f"spark_bridge needs pyspark >= {'.'.join(map(str, MIN_PYSPARK))}, found {pyspark.__version__}"
        )
    return pyspark


def gcs_address() -> str:
    """The running Ray cluster's GCS address.

    Raises:
        RuntimeError: Ray is not initialised in this process (start Ray first).
    """
    import ray

    if not ray.is_initialized():
        raise RuntimeError(
            "spark_bridge: start Ray first (ray.init(...)), then build the SparkSession and the source"
        )
    return str(ray.get_runtime_context().gcs_address)


def worker_env() -> dict[str, str]:
    """What a Spark Python worker must have set before it imports ray.

    Auto-connect off (a stray ``ray.*`` call must not start a private
    cluster), and the driver's auth mode and token location (Ray's token
    authentication; the token itself stays in the file or variable it came from).
    """
    env = {"RAY_ENABLE_AUTO_CONNECT": "0"}
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


def prepare_environment(local: bool = True) -> None:
    """Export what the Spark JVM and its Python workers inherit (call after ``ray.init``, before Spark).

    Args:
        local: also pin Spark to the loopback interface (``local[...]`` masters).
    """
    gcs_address()
    os.environ.update(worker_env())
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def spark_session(
    cores: int = 2,
    *,
    app_name: str = "chiray",
    task_retries: int = 3,
    conf: dict[str, str] | None = None,
    master: str | None = None,
) -> Any:
    """A local SparkSession set up for the bridge (Ray must already be running in this process).

    Args:
        cores: Spark task slots (``local[cores, ...]``).
        app_name: the Spark application's name.
        task_retries: how often a failed task is retried (local mode does not
            retry unless asked).
        conf: more Spark settings (they win over the defaults here).
        master: another master on this machine instead of ``local[...]``, e.g.
            ``"local-cluster[2,1,1024]"``: executors in JVMs of their own (each
            running this Python for its tasks), the driver's JVM apart, as on a
            cluster.

    Returns:
        ``SparkSession.builder...getOrCreate()``: an existing session is reused.
    """
    require_pyspark()
    prepare_environment(local=True)
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
        "spark.python.worker.reuse": "true",
        "spark.sql.session.timeZone": "UTC",
        **(conf or {}),
    }
    if master is not None:
        settings.setdefault("spark.pyspark.python", sys.executable)
        settings.setdefault("spark.task.maxFailures", str(task_retries + 1))
    builder = SparkSession.builder.master(master or f"local[{cores},{task_retries + 1}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
