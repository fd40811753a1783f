"""The job controller's injections (actors/runtime/injector.py), without Ray or an event loop: a fake loop on
the suite's fake clock runs what the injector schedules, and each call it makes is recorded, so the calls to
each host, what they carry, in which order and when, are checked exactly."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import pytest

from chiray.actors.runtime.injector import Injector, ops_running
from chiray.actors.runtime.messages import Parcel
from chiray.control.coordination import OpCoordinator
from chiray.control.message import Configs, ControlMessage, InstanceId
from chiray.control.oprun import OpState
from chiray.control.trees import Relay, build_tree

from tests.clock import FakeClock

BATCH_S = 0.05


@dataclasses.dataclass
class Call:
    """One call the injector made: to which host handle, carrying what, and when."""

    handle: str
    parcel: Parcel
    at: float
    returned: Callable[[], None]


class Loop:
    """A fake event loop: ``schedule`` queues a callback at a fake-clock time; ``run`` runs them in order."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def schedule(self, delay: float, callback: Callable[[], None]) -> None:
        self._due.append((self.clock.now + delay, next(self._order), callback))

    def run(self, until: float | None = None) -> None:
        """Run every callback due by ``until`` (default: now), moving the clock to each one's time."""
        until = self.clock.now if until is None else until
        while True:
            ready = sorted(entry for entry in self._due if entry[0] <= until)
            if not ready:
                break
            at, _, callback = entry = ready[0]
            self._due.remove(entry)
            self.clock.now = max(self.clock.now, at)
            callback()
        self.clock.now = until

    @property
    def pending(self) -> list[float]:
        return sorted(at for at, _, _ in self._due)


class Harness:
    """An injector over ``hosts`` (host id -> handle name), with ``running`` ops of its controller."""

    def __init__(self, leaves: list[InstanceId], host_of: dict[InstanceId, int], fanout: int | None = None,
                 running: int = 0) -> None:
        self.loop = Loop()
        self.calls: list[Call] = []
        self.handles = {host: f"host{host}" for host in set(host_of.values())}
        self.running = running
        tree = build_tree(leaves, fanout, host_of.__getitem__)
        self.injector: Injector[str] = Injector(
            tree, host_of, self.handles.__getitem__, self._send, self.loop.schedule, self.loop.clock,
            lambda: self.running, BATCH_S)

    def _send(self, handle: str, parcel: Parcel, returned: Callable[[], None]) -> None:
        self.calls.append(Call(handle, parcel, self.loop.clock.now, returned))

    def inject(self, *op_ids: str) -> list[int]:
        return [self.injector.inject(_message(op_id)).seq for op_id in op_ids]


def _message(op_id: str) -> ControlMessage:
    return ControlMessage(op_id, "NoOp", False, -1, "controller", None, Configs())


def _injected(parcel: Parcel) -> list[tuple[str, int, list[InstanceId]]]:
    """A parcel's injections as (op id, seq, source instances)."""
    return [(message.op_id, message.seq, sources) for message, sources in parcel.injections]


SOURCES = [("src", 0), ("src", 1), ("src", 2)]
TWO_HOSTS = {("src", 0): 0, ("src", 1): 1, ("src", 2): 0}


def test_an_op_goes_at_the_next_turn_one_call_per_host_with_all_its_sources():
    h = Harness(SOURCES, TWO_HOSTS)
    assert h.inject("a") == [0]
    assert h.calls == [] and h.loop.pending == [1000.0]  # nothing sent before the loop turns
    h.loop.run()
    assert [(c.handle, _injected(c.parcel), c.at) for c in h.calls] == [
        ("host0", [("a", 0, [("src", 0), ("src", 2)])], 1000.0),
        ("host1", [("a", 0, [("src", 1)])], 1000.0)]
    assert all(not c.parcel.relays for c in h.calls)


def test_ops_of_one_turn_share_each_hosts_call_in_the_global_order():
    h = Harness(SOURCES, TWO_HOSTS)
    assert h.inject("a", "b", "c") == [0, 1, 2]
    assert h.loop.pending == [1000.0]  # one send scheduled for all three
    h.loop.run()
    assert [(c.handle, [op for op, _, _ in _injected(c.parcel)]) for c in h.calls] == [
        ("host0", ["a", "b", "c"]), ("host1", ["a", "b", "c"])]


def test_one_call_in_flight_per_host_what_comes_meanwhile_goes_together_once_it_returns():
    h = Harness(SOURCES, TWO_HOSTS)
    h.inject("a")
    h.loop.run()
    h.inject("b")
    h.inject("c")
    h.loop.run()
    assert len(h.calls) == 2  # both hosts still have a call in flight: b and c wait
    assert not h.injector.idle
    h.calls[1].returned()  # host 1's call returned
    h.loop.run()
    assert [(c.handle, [op for op, _, _ in _injected(c.parcel)]) for c in h.calls[2:]] == [("host1", ["b", "c"])]
    h.calls[0].returned()
    h.loop.run()
    assert [(c.handle, [op for op, _, _ in _injected(c.parcel)]) for c in h.calls[3:]] == [("host0", ["b", "c"])]
    assert h.injector.idle
    h.calls[3].returned()  # nothing waits: no call follows
    h.loop.run()
    assert len(h.calls) == 4 and h.loop.pending == []


def test_while_other_ops_run_an_op_waits_for_the_batch_window_after_the_last_call():
    h = Harness(SOURCES, {s: 0 for s in SOURCES}, running=2)
    h.inject("a")
    h.loop.run()  # the first call of all: nothing sent before, so at once
    h.calls[0].returned()
    h.loop.clock.advance(0.01)
    h.inject("b")
    assert h.loop.pending == [pytest.approx(1000.0 + BATCH_S)]  # 0.04 s more: the window from the call at 1000.0
    h.loop.run(until=1000.0 + BATCH_S - 0.001)
    assert len(h.calls) == 1
    h.inject("c")  # joins b: a send is already due
    assert len(h.loop.pending) == 1
    h.loop.run(until=1000.0 + BATCH_S + 1e-9)
    assert [([op for op, _, _ in _injected(c.parcel)], c.at) for c in h.calls[1:]] == [
        (["b", "c"], pytest.approx(1000.0 + BATCH_S))]


def test_an_op_on_its_own_or_after_a_quiet_spell_goes_at_once():
    alone = Harness(SOURCES, {s: 0 for s in SOURCES}, running=1)  # only the op itself runs
    alone.inject("a")
    alone.loop.run()
    alone.calls[0].returned()
    alone.loop.clock.advance(0.01)
    alone.inject("b")
    assert alone.loop.pending == [alone.loop.clock.now]
    quiet = Harness(SOURCES, {s: 0 for s in SOURCES}, running=5)
    quiet.inject("a")
    quiet.loop.run()
    quiet.calls[0].returned()
    quiet.loop.clock.advance(BATCH_S)  # the window since the last call has passed
    quiet.inject("b")
    assert quiet.loop.pending == [quiet.loop.clock.now]


def test_relays_at_the_top_of_the_tree_each_get_the_op_on_their_host():
    leaves = [("src", i) for i in range(4)]
    h = Harness(leaves, {leaf: leaf[1] // 2 for leaf in leaves}, fanout=2)
    h.inject("a")
    h.loop.run()
    assert [(c.handle, [(m.op_id, m.seq, relay) for m, relay in c.parcel.relays], c.parcel.injections)
            for c in h.calls] == [("host0", [("a", 0, Relay(1, 0))], []), ("host1", [("a", 0, Relay(1, 1))], [])]


def test_a_host_replaced_before_its_call_gets_only_what_was_queued_for_the_new_one():
    h = Harness(SOURCES, {s: 0 for s in SOURCES})
    h.inject("a")
    h.handles[0] = "host0-new"
    h.inject("b")
    h.loop.run()
    assert [(c.handle, [op for op, _, _ in _injected(c.parcel)]) for c in h.calls] == [("host0-new", ["b"])]


@dataclasses.dataclass(frozen=True)
class SameActor:
    """A handle object equal to another that names the same actor, as Ray's are (a rescale's ``set_hosts``
    gives the controller new handle objects for the hosts it keeps)."""

    name: str


def test_a_new_handle_of_the_same_host_drops_nothing_queued_before_it():
    h = Harness(SOURCES, {s: 0 for s in SOURCES}, running=2)
    h.handles[0] = SameActor("host0")  # type: ignore[assignment]
    h.inject("a")
    h.loop.run()
    h.calls[0].returned()
    h.loop.clock.advance(0.01)
    h.inject("b")  # waits for the batch window
    h.handles[0] = SameActor("host0")  # type: ignore[assignment]
    assert h.handles[0] is not h.calls[0].handle
    h.inject("c")
    h.loop.run(until=h.loop.clock.now + BATCH_S)
    assert [[(op, seq) for op, seq, _ in _injected(c.parcel)] for c in h.calls] == [
        [("a", 0)], [("b", 1), ("c", 2)]]


def test_when_idle_hears_once_everything_queued_is_sent_not_when_calls_return():
    h = Harness(SOURCES, TWO_HOSTS)
    heard: list[str] = []
    h.injector.when_idle(lambda: heard.append("at once"))
    assert heard == ["at once"]
    h.inject("a")
    h.injector.when_idle(lambda: heard.append("sent"))
    assert heard == ["at once"]
    h.loop.run()
    assert heard == ["at once", "sent"]


def test_reset_starts_the_order_again_drops_what_waits_and_ignores_the_old_calls():
    h = Harness(SOURCES, {s: 0 for s in SOURCES})
    h.inject("a")
    h.loop.run()
    assert h.inject("b") == [1]
    h.loop.run()  # b waits for a's call
    heard: list[str] = []
    h.injector.when_idle(lambda: heard.append("idle"))
    assert heard == []
    h.injector.reset()
    assert heard == ["idle"] and h.injector.idle
    h.calls[0].returned()  # the old call: ignored, b is gone
    assert h.loop.pending == []
    assert len(h.calls) == 1
    assert h.inject("c") == [0]
    h.loop.run()
    assert [_injected(c.parcel) for c in h.calls[1:]] == [[("c", 0, SOURCES)]]


def test_ops_running_counts_the_runs_still_running():
    ops = OpCoordinator("controller", None)
    states = [OpState.RUNNING, OpState.COMPLETE, OpState.RUNNING, OpState.FAILED]
    ops.running = {str(i): type("Run", (), {"state": state})() for i, state in enumerate(states)}
    assert ops_running(ops) == 2
