"""Integration fixtures: every test must stop every actor it started."""

from __future__ import annotations

import time

import pytest


@pytest.fixture(autouse=True)
def no_leaked_actors(request):
    """After each test, the CPUs its actors held must be free again (its hosts and controllers are gone)."""
    uses_ray = "ray_session" in request.fixturenames
    if uses_ray:
        request.getfixturevalue("ray_session")
        before = free_cpus()
    yield
    if not uses_ray:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if free_cpus() >= before - 1e-6:
            return
        time.sleep(0.1)
    pytest.fail(f"{request.node.name} left actors behind: {before - free_cpus()} CPUs still held")


def free_cpus() -> float:
    """The CPUs Ray has free, counting those the warm pool's idle hosts hold (they serve the next job)."""
    import ray

    from chiray.actors.jobs.pool import warm_pool

    return ray.available_resources().get("CPU", 0) + warm_pool().held_cpus()


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
