"""Staging per attempt beside a reader: only the committed attempt's batches come out, in order."""

from __future__ import annotations

import pytest

from chiray.spark_bridge.staging import AttemptStage


def test_commit_returns_the_attempts_batches_in_order_and_forgets_them():
    stage = AttemptStage()
    pushed = {(1, 7): [(2, b"c", 3), (0, b"a", 1), (1, b"b", 2)], (1, 8): [(0, b"x", 9)]}
    for key, batches in pushed.items():  # pushes arrive in any order
        for seq, data, rows in batches:
            stage.push(key, seq, data, rows)
    assert (len(stage), stage.rows, stage.nbytes) == (2, 15, 4)
    expected = sorted(pushed[(1, 7)])
    assert stage.commit((1, 7), 3) == ([d for _, d, _ in expected], sum(r for _, _, r in expected))
    assert (len(stage), stage.rows) == (1, 9)
    assert stage.drop(lambda key: True) == 1
    assert (len(stage), stage.rows, stage.nbytes) == (0, 0, 0)


def test_an_attempt_that_pushed_nothing_commits_empty_and_a_missing_batch_is_a_bug():
    stage = AttemptStage()
    assert stage.commit((2, 1), 0) == ([], 0)
    stage.push((2, 2), 0, b"a", 1)
    stage.push((2, 2), 2, b"c", 1)
    with pytest.raises(ValueError, match=r"reported 3 batches, the reader holds \[0, 2\]"):
        stage.commit((2, 2), 3)
    with pytest.raises(ValueError, match="pushed twice"):
        stage.push((2, 3), 0, b"a", 1) or stage.push((2, 3), 0, b"a", 1)


def test_drop_takes_the_keys_it_is_told():
    stage = AttemptStage()
    for key in [(5, 0, 1, 10), (5, 1, 1, 11), (6, 0, 2, 12)]:
        stage.push(key, 0, b"d", 2)
    assert stage.drop(lambda key: key[0] == 5) == 2
    assert stage.has((6, 0, 2, 12)) and not stage.has((5, 0, 1, 10)) and stage.rows == 2
