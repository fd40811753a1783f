"""CallWindow without Ray: calls per receiver within the window, what waits coalesced in order, sent once.

The randomised test drives a window the way its callers do (offer what is produced, on each return
take what waited) and checks it against a plain loop's account of the same script: the calls carry
every item exactly once and in order, each returns once, no receiver ever has more than ``window`` calls in
flight, and nothing waits while its receiver has room.
"""

from __future__ import annotations

import doctest
import random

import pytest

from chiray.operators import inflight
from chiray.operators.inflight import CallWindow, concat


def test_the_module_example_runs() -> None:
    assert doctest.testmod(inflight).failed == 0


def test_one_call_in_flight_and_what_comes_meanwhile_goes_in_one_call_in_order() -> None:
    calls: CallWindow[str, list[int]] = CallWindow(concat)
    assert calls.offer("a", [0]) == [0] and calls.in_flight("a") == 1
    for i in (1, 2, 3):
        assert calls.offer("a", [i]) is None
    assert calls.in_flight("a") == 1 and calls.queued("a") and not calls.idle
    assert calls.take("a") is None  # still busy: nothing goes
    assert calls.returned("a")
    assert calls.take("a") == [1, 2, 3] and calls.in_flight("a") == 1
    assert calls.take("a") is None and calls.idle  # the batch went exactly once
    assert calls.returned("a") and calls.in_flight("a") == 0
    assert not calls.returned("a")  # nothing was in flight
    assert calls.offer("a", [4]) == [4]  # an idle receiver gets its item at once


def test_receivers_are_independent_and_ready_lists_them_in_queued_order() -> None:
    calls: CallWindow[int, list[str]] = CallWindow(concat)
    assert calls.offer(1, ["x"]) == ["x"]
    calls.put(2, ["y"])
    calls.put(1, ["z"])
    calls.put(3, ["w"])
    assert calls.ready() == [2, 3]  # 1 is busy
    assert calls.take(3) == ["w"] and calls.take(2) == ["y"]
    assert calls.in_flight(1) == calls.in_flight(2) == calls.in_flight(3) == 1
    assert calls.ready() == []
    calls.returned(2)
    assert calls.ready() == [] and calls.take(2) is None  # 2 has room but nothing waits
    calls.returned(1)
    assert calls.ready() == [1] and calls.take(1) == ["z"]


def test_a_window_above_one_lets_that_many_calls_go_before_items_wait() -> None:
    calls: CallWindow[str, list[int]] = CallWindow(concat, window=3)
    assert [calls.offer("r", [i]) for i in range(5)] == [[0], [1], [2], None, None]
    assert calls.full("r") and calls.in_flight("r") == 3
    calls.returned("r")
    assert not calls.full("r") and calls.take("r") == [3, 4] and calls.full("r")
    for _ in range(3):
        assert calls.returned("r")
    assert calls.in_flight("r") == 0 and not calls.returned("r")


def test_a_take_with_spare_calls_goes_beyond_the_window_by_that_many_and_waiting_only_looks() -> None:
    calls: CallWindow[str, list[int]] = CallWindow(concat)
    assert calls.offer("r", [0]) == [0] and calls.offer("r", [1]) is None
    assert calls.waiting("r") == [1] and calls.queued("r")  # (looked at, not taken)
    assert calls.take("r") is None and calls.take("r", spare=1) == [1] and calls.in_flight("r") == 2
    calls.put("r", [2])
    assert calls.take("r", spare=1) is None  # the spare call is in flight too
    assert calls.returned("r") and calls.take("r") is None  # one still in flight: the window is full
    assert calls.take("r", spare=1) == [2] and calls.waiting("r") is None
    assert calls.returned("r") and calls.returned("r") and calls.in_flight("r") == 0


def test_forget_drops_what_waits_and_the_calls_in_flight() -> None:
    calls: CallWindow[str, list[int]] = CallWindow(concat)
    calls.offer("gone", [1])
    calls.offer("gone", [2])
    calls.offer("kept", [3])
    calls.offer("kept", [4])
    calls.forget("gone")
    assert not calls.queued("gone") and calls.in_flight("gone") == 0
    assert not calls.returned("gone")  # the late return of the forgotten call is ignored
    assert calls.returned("kept") and calls.take("kept") == [4]
    calls.clear()
    calls.clear()  # idempotent
    assert calls.idle and calls.in_flight("kept") == 0 and not calls.returned("kept")


def test_merge_folds_in_place_and_without_merge_a_second_item_is_a_bug() -> None:
    calls: CallWindow[str, set[int]] = CallWindow(lambda queued, item: queued | item)
    calls.offer("s", {1})
    calls.put("s", {2})
    calls.put("s", {2, 3})
    calls.returned("s")
    assert calls.take("s") == {2, 3}
    plain: CallWindow[str, int] = CallWindow(window=2)
    plain.put("p", 1)
    with pytest.raises(RuntimeError, match="bug"):
        plain.put("p", 2)


@pytest.mark.parametrize("window", [0, -1, 1.5, True, None])
def test_the_window_is_a_positive_int(window: object) -> None:
    with pytest.raises(ValueError, match="window"):
        CallWindow(concat, window=window)  # type: ignore[arg-type]


@pytest.mark.parametrize("window", [1, 2, 4])
@pytest.mark.parametrize("seed", range(20))
def test_a_random_script_sends_each_item_once_in_order_within_the_window(window: int, seed: int) -> None:
    rng = random.Random(seed)
    keys = ["a", "b", "c"]
    calls: CallWindow[str, list[int]] = CallWindow(concat, window=window)
    produced: dict[str, list[int]] = {k: [] for k in keys}
    sent: dict[str, list[int]] = {k: [] for k in keys}  # in the order the calls went
    delivered: dict[str, list[int]] = {k: [] for k in keys}  # in the order they returned
    flying: list[tuple[str, list[int]]] = []  # the plain loop's own account of the calls in flight
    for step in range(300):
        if flying and rng.random() < 0.45:
            key, batch = flying.pop(rng.randrange(len(flying)))
            delivered[key].extend(batch)
            assert calls.returned(key)
            batch = calls.take(key)
        else:
            key = rng.choice(keys)
            produced[key].append(step)
            batch = calls.offer(key, [step])
        if batch is not None:
            flying.append((key, batch))
            sent[key].extend(batch)
        for k in keys:
            in_flight = sum(1 for f, _ in flying if f == k)
            assert calls.in_flight(k) == in_flight <= window
            assert not calls.queued(k) or in_flight == window  # nothing waits while there is room
    while flying:
        key, batch = flying.pop(0)
        delivered[key].extend(batch)
        calls.returned(key)
        batch = calls.take(key)
        if batch is not None:
            flying.append((key, batch))
            sent[key].extend(batch)
    assert sent == produced and calls.idle  # each item once, in order
    assert {k: sorted(v) for k, v in delivered.items()} == produced
    assert all(calls.in_flight(k) == 0 for k in keys)
