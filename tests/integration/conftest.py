"""Integration fixtures: every test must stop every actor it started."""

from __future__ import annotations

import time

import pytest


@pytest.fixture(autouse=True)
def no_leaked_actors(request):
    """After each test, the CPUs its actors held must be free again (its hosts and controllers are gone)."""
    uses_ray = "ray_session" in request.fixturenames
    if uses_ray:
        import ray

        request.getfixturevalue("ray_session")
        before = ray.available_resources().get("CPU", 0)
    yield
    if not uses_ray:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0) >= before - 1e-6:
            return
        time.sleep(0.1)
    free = ray.available_resources().get("CPU", 0)
    pytest.fail(f"{request.node.name} left actors behind: {before - free} CPUs still held")


@pytest.fixture(scope="session")
def spark(ray_session):
    """One local SparkSession for the whole session, built after Ray (it inherits Ray's environment)."""
    pytest.importorskip("pyspark")
    from chiray.spark_bridge import spark_session

    session = spark_session(cores=2, conf={"spark.sql.shuffle.partitions": "4",
                                           "spark.sql.adaptive.enabled": "false"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
