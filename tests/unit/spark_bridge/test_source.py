"""How a push-mode reader reports readiness to the host loop (no Ray: ``ray.wait`` is stubbed)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from spark_bridge import source  # noqa: E402  (after the importorskip)


def test_ready_poll_answer_changes_only_at_the_wake_up_time_it_gave(monkeypatch):
    clock = [100.0]
    returned = [False]
    monkeypatch.setattr(source.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(ray, "wait", lambda refs, timeout: (refs if returned[0] else [], []))
    poll = source.ReadyPoll()
    poll.watch("ref")
    due = poll.ready_at()
    assert due == 100.0 + source.POLL_S  # not yet: look again then
    returned[0] = True  # the call returns between "is it due?" and "when to wake?"
    assert poll.ready_at() == due  # still a wake-up time, so the host sets a timer
    clock[0] = due
    assert poll.ready_at() is None and poll.ready_at() is None  # due, and stays due
