"""Detached jobs on the session's Ray: the job manager dies while a rescale or a checkpoint runs.

Either the verb completes or it fails with a clear error; the job is never
left half-changed, and its result equals the oracle exactly.
"""

from __future__ import annotations

import threading

import pytest

import chiray
from chiray.actors.client import ManagerRestartedError
from tests.oracles import assert_counts_equal, key_counts
from tests.waiting import wait_for

pytestmark = pytest.mark.ray

RECORDS = 120_000
KEYS = 300


def _source() -> chiray.Source:
    return chiray.generate(RECORDS, rate=12_000, batch_size=2_000, num_keys=KEYS, seed=11, num_splits=2)


def _submit(name: str, tmp_path) -> chiray.AttachedJob:
    flow = chiray.Dataflow("detached")
    (flow.source(_source(), parallelism=2, name="events")
         .key_by("key").count(parallelism=2, name="count").sink(chiray.collect(), name="out"))
    return chiray.submit(flow, name=name, detached=True, checkpoint_dir=str(tmp_path / name))


def _kill_manager(name: str) -> None:
    import ray

    ray.kill(ray.get_actor(name, namespace="chiray"), no_restart=False)


def _wait_restarted(job: chiray.AttachedJob, restarts: int = 1) -> None:
    def back() -> bool:
        info = job.info()
        return info["restarts"] >= restarts and info["state"] == "RUNNING"

    wait_for(back, 60, f"job {job.name!r} to come back running after {restarts} restart(s)", interval=0.2,
             detail=job.info)


def _check_exact(job: chiray.AttachedJob) -> None:
    assert_counts_equal(job.result(), key_counts(_source()))  # nothing lost, nothing counted twice
    job.forget()


def test_manager_dies_during_a_rescale(ray_session, tmp_path):
    job = _submit("rescale-kill", tmp_path)
    job.checkpoint()
    handle = job.rescale("count", 3, strategy="fluid", gap_s=0.05)  # 1024 one-bin steps: still running below
    wait_for(lambda: handle.progress().get("steps_done", 0) >= 2, 30, "the rescale's first two steps",
             detail=handle.progress)
    _kill_manager(job.name)
    _wait_restarted(job)
    progress = handle.progress()
    assert progress["done"] and progress["state"] == "interrupted", progress
    with pytest.raises(chiray.ChirayError, match="manager restarted during the rescale"):
        handle.result(0)
    assert any("rolled back to checkpoint" in e for e in job.status().events)
    assert job.info()["operators"]["count"] == 2  # the interrupted rescale left the old parallelism
    assert job.rescales()[-1]["state"] == "interrupted"
    _check_exact(job)


def test_manager_dies_during_a_checkpoint(ray_session, tmp_path):
    job = _submit("checkpoint-kill", tmp_path)
    outcome: list[object] = []

    def take() -> None:
        try:
            outcome.append(job.checkpoint())
        except ManagerRestartedError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=take)
    thread.start()
    _kill_manager(job.name)
    thread.join(timeout=120)
    assert len(outcome) == 1
    assert isinstance(outcome[0], (int, ManagerRestartedError)), outcome
    if isinstance(outcome[0], ManagerRestartedError):
        assert "run checkpoint again" in str(outcome[0])
    _wait_restarted(job)
    assert job.checkpoint() >= 1  # the job takes checkpoints again
    _check_exact(job)
