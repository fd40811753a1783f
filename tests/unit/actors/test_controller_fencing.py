"""The job controller's fenced commits (actors/runtime/controller.py with control/fencing.py), without Ray: a controller
cut off by a network partition commits nothing once a recovery elsewhere took a newer token, and retires."""

from __future__ import annotations

import asyncio

import pytest

from chiray.actors.config import JobConfig
from chiray.actors.runtime.controller import Controller
from chiray.actors.runtime.storage import CheckpointStorage
from chiray.control.coordination import JobState
from chiray.control.fencing import StaleIncarnationError
from chiray.control.oprun import JobView, OpState


def _controller(storage: CheckpointStorage) -> Controller:
    return Controller("wc", [("out", 0)], JobConfig(poll_interval_s=60.0), storage=storage)


def test_a_cut_off_controller_commits_nothing_after_a_recovery_and_retires(tmp_path):
    """The partition, step by step: the controller of deployment 1 is cut off; a recovery elsewhere takes
    token 2 and commits checkpoint 2; the old controller's checkpoint 2 (its own cut) is refused, it fails
    (aborting its hosts), and the manifest on storage is the recovered deployment's."""
    storage = CheckpointStorage(str(tmp_path / "chk"))

    async def scenario() -> tuple[Controller, Controller]:
        cut_off = _controller(storage)
        await cut_off.start({}, 0)
        cut_off.commit_storage().commit(1, {"by": "first"})
        recovered = _controller(storage)
        await recovered.start({}, 1)  # as the supervisor's recovery deploys it
        recovered.commit_storage().commit(2, {"by": "recovered"})
        with pytest.raises(StaleIncarnationError):
            cut_off.commit_storage().commit(2, {"by": "cut off"})
        with pytest.raises(StaleIncarnationError):
            cut_off.commit_storage().retain(0)
        for controller in (cut_off, recovered):
            await controller.stop()
        return cut_off, recovered

    cut_off, recovered = asyncio.run(scenario())
    assert (cut_off.fence_token, recovered.fence_token) == (1, 2)
    assert cut_off.lifecycle.state is JobState.FAILED and isinstance(cut_off.lifecycle.error, StaleIncarnationError)
    assert recovered.lifecycle.state is JobState.RUNNING
    assert [storage.load(i)["by"] for i in storage.committed()] == ["first", "recovered"]


def test_a_resume_takes_the_token_its_recovery_took(tmp_path):
    storage = CheckpointStorage(str(tmp_path / "chk"))

    async def scenario() -> int:
        controller = _controller(storage)
        await controller.start({}, 0, fence_token=5)
        token = controller.fence_token
        await controller.stop()
        return token

    assert asyncio.run(scenario()) == 5


def test_retention_is_told_which_of_the_controllers_checkpoints_still_run(tmp_path):
    """A checkpoint's id counts as being taken while its op runs, and is forgotten once the op ended;
    the checkpoint book hands retention exactly those ids, so it leaves their files."""
    storage = CheckpointStorage(str(tmp_path / "chk"))

    async def scenario() -> tuple[set[int], set[int], set[int], list[int]]:
        controller = _controller(storage)
        await controller.start({}, 0)
        await controller.set_view(JobView("wc", {"out": {"kind": "sink", "parallelism": 1}}, [("out", 0)], [],
                                          [("out", 0)], {("out", 0): []}))
        ops = [await controller.checkpoint() for _ in range(3)]  # no hosts here: each fails at once
        runs = [controller.ops.runs[op_id] for op_id in ops]
        assert all(run.state is OpState.FAILED for run in runs)
        ids = sorted(controller._checkpoint_ops)
        runs[1].state = runs[2].state = OpState.RUNNING  # as if still on their way
        running = controller._checkpoints_taking()
        told = set(controller.checkpoints._taking())  # what each checkpoint's retention is given
        runs[1].state = OpState.COMPLETE
        left = controller._checkpoints_taking()
        await controller.stop()
        return running, told, left, ids

    running, told, left, ids = asyncio.run(scenario())
    assert len(ids) == 3
    assert running == told == {ids[1], ids[2]}
    assert left == {ids[2]}
