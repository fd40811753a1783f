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
