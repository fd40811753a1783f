"""The suite's and the benchmarks' Ray is always a new local one, never the cluster another process runs.

``ray.init()`` without an address connects to the cluster named in ``/tmp/ray/ray_current_cluster`` while
one is alive (a ``ray.cluster_utils.Cluster`` writes it); ``make test`` runs two pytest processes at
once, and the second one's session Ray failed so whenever the first ran such a cluster at that moment.
"""

from __future__ import annotations

from typing import Any

import pytest
import ray

from benchmarks.common import start_ray
from tests.conftest import start_private_ray


@pytest.fixture
def init_calls(monkeypatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: calls.append({"args": args, **kwargs}))
    return calls


@pytest.mark.parametrize("start", [start_private_ray, start_ray], ids=["test session", "benchmarks"])
def test_ray_is_started_local_whatever_cluster_runs_on_the_machine(start, init_calls):
    start()
    assert len(init_calls) == 1
    assert init_calls[0]["args"] == () and init_calls[0].get("address") == "local", init_calls
