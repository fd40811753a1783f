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
