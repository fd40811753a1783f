"""Detached jobs on the session's Ray: the job manager dies while a rescale, then while a checkpoint runs.

Either the verb completes or it fails with a clear error; the job is never
left half-changed, and its result equals the oracle exactly.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

import chiray
from chiray.actors.jobs.client import ManagerRestartedError
from tests.gate import Gate, gated
from tests.oracles import assert_counts_equal, key_counts
from tests.waiting import wait_for

pytestmark = pytest.mark.ray

RECORDS = 120_000
KEYS = 300
BATCH = 2_000


def _source() -> chiray.Source:
    return chiray.generate(RECORDS, batch_size=BATCH, num_keys=KEYS, seed=11, num_splits=2)


def _records_at(offset: int) -> int:
    return offset * BATCH  # a generator's offset counts batches


def _submit(name: str, tmp_path, gate: Gate) -> chiray.AttachedJob:
    """The keyed count over ``_source()`` held at ``gate`` (20 % of each split at once, then a trickle up to
    80 %), so the job runs until the test opens the gate, also across the manager's restarts."""
    flow = chiray.Dataflow("detached")
    held = gated(_source(), gate, RECORDS / 2, fast=0.2, trickle=2_000, position=_records_at)
    (flow.source(held, parallelism=2, name="events")
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


def _kill_a_host(name: str) -> None:
    """SIGKILL the process of one of the job's hosts, whose id its manager tells."""
    import ray

    pids = ray.get(ray.get_actor(name, namespace="chiray").host_pids.remote())
    os.kill(pids[max(pids)], signal.SIGKILL)


def _run_events(job: chiray.AttachedJob, run: int, starting: str) -> list[str]:
    return [e for e in job.status().events if e.startswith(f"run {run}: {starting}")]


def test_manager_dies_during_a_rescale_and_then_during_a_checkpoint(ray_session, tmp_path):
    gate = Gate(tmp_path)
    job = _submit("manager-kills", tmp_path, gate)
    job.checkpoint()
    # A host dies first: its recovery is an event of the job's first run, which the history keeps
    # across the manager's restarts and after the job's end.
    _kill_a_host(job.name)
    wait_for(lambda: _run_events(job, 0, "recovered from checkpoint"), 60, "the recovery from the killed host",
             detail=lambda: job.status().events)
    # A rescale: interrupted, and the job rolled back to the checkpoint at the old parallelism.
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
    # A checkpoint: it either completed or failed with a clear error, and the job takes checkpoints again.
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
    _wait_restarted(job, restarts=2)
    assert job.checkpoint() >= 1
    gate.open()
    job.wait(timeout=120)
    assert len(_run_events(job, 0, "recovered from checkpoint")) == 1, job.status().events
    _check_exact(job)
