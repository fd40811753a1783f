"""Fencing a job's commits by deployment (control/fencing.py), without Ray: a side of the job cut off by a
network partition commits nothing once a recovery elsewhere took a newer token."""

from __future__ import annotations

import pickle

import pyarrow.fs as pafs
import pytest

from chiray.control.fencing import FENCE_FILE, Fence, FencedStorage, StaleIncarnationError, next_token


def test_the_next_token_passes_the_stored_one_and_the_one_in_use():
    assert [next_token(0), next_token(4), next_token(4, 7), next_token(9, 2)] == [1, 5, 8, 10]
    with pytest.raises(ValueError, match="never negative"):
        next_token(-1)


def test_a_fence_starts_at_zero_and_only_grows(tmp_path):
    fence = Fence(pafs.LocalFileSystem(), str(tmp_path))
    assert fence.current() == 0
    assert [fence.advance(), fence.advance(), fence.advance(at_least=10)] == [1, 2, 11]
    assert Fence(pafs.LocalFileSystem(), str(tmp_path)).current() == 11  # another process reads the same file
    assert sorted(p.name for p in tmp_path.iterdir()) == [FENCE_FILE]  # no temporary file is left


def test_a_stale_token_is_refused_and_the_newest_is_allowed(tmp_path):
    old_side = Fence(pafs.LocalFileSystem(), str(tmp_path))
    token = old_side.advance()
    recovery = Fence(pafs.LocalFileSystem(), str(tmp_path)).advance()
    with pytest.raises(StaleIncarnationError, match=r"checkpoint 3 refused.*token 1.*\(token 2\)"):
        old_side.check(token, "checkpoint 3")
    old_side.check(recovery, "checkpoint 3")  # the recovered deployment commits


class _Recorder:
    """A storage that records what reaches it."""

    def __init__(self, root: str):
        self.fs, self.root = pafs.LocalFileSystem(), root
        self.calls: list[tuple] = []

    def commit(self, checkpoint_id, manifest):
        self.calls.append(("commit", checkpoint_id))

    def retain(self, keep):
        self.calls.append(("retain", keep))

    def chk_dir(self, checkpoint_id):
        return f"{self.root}/chk-{checkpoint_id}"


def test_fenced_storage_refuses_commits_and_retention_of_a_replaced_deployment(tmp_path):
    inner = _Recorder(str(tmp_path))
    fence = Fence.of(inner)
    stale: list[StaleIncarnationError] = []
    old = FencedStorage(inner, fence, fence.advance(), stale.append)
    old.commit(1, {})
    new = FencedStorage(inner, fence, fence.advance())
    for refused in (lambda: old.commit(2, {}), lambda: old.retain(1)):
        with pytest.raises(StaleIncarnationError):
            refused()
    new.commit(2, {})
    assert inner.calls == [("commit", 1), ("commit", 2)]
    assert len(stale) == 2
    assert old.chk_dir(4) == f"{tmp_path}/chk-4"  # everything else goes to the storage


def test_fenced_storage_pickles_without_its_callback(tmp_path):
    fenced = FencedStorage(_Recorder(str(tmp_path)), Fence(pafs.LocalFileSystem(), str(tmp_path)), 3,
                           lambda error: None)
    again = pickle.loads(pickle.dumps(fenced))
    assert again.on_stale is None and again.token == 3 and again.root == str(tmp_path)
