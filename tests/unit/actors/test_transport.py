"""Transport without Ray: one call per peer at a time, and what waited leaves in one call.

Peers and controllers are fakes whose ``.remote()`` records the call and
returns a ref the test completes by hand, so when each call returns is
scripted exactly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
from typing import Any

import pytest

from chiray.actors.runtime.outbox import Outbox
from chiray.actors.runtime.messages import Envelope, Grant, Parcel
from chiray.actors.runtime.transport import Transport
from chiray.control.message import ControlReturn


class FakeRef:
    def __init__(self) -> None:
        self._future: concurrent.futures.Future = concurrent.futures.Future()

    def future(self) -> concurrent.futures.Future:
        return self._future

    def finish(self, error: BaseException | None = None) -> None:
        if error is None:
            self._future.set_result(None)
        else:
            self._future.set_exception(error)


class FakeMethod:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def remote(self, arg: Any, run: str | None = None) -> FakeRef:  # run: the sender's job life
        ref = FakeRef()
        self.calls.append((arg, ref))
        return ref


class FakeActor:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, FakeRef]] = []
        self.receive = FakeMethod(self.calls)
        self.op_returned = FakeMethod(self.calls)


def outbox(host: int, *seqs: int, grants: int = 0) -> Outbox:
    out = Outbox()
    out.envelopes[host].extend(Envelope(7, s, f"m{s}") for s in seqs)
    out.grants[host].extend(Grant(3, 1, 10) for _ in range(grants))
    return out


async def settle() -> None:
    """Let the done callbacks of finished refs run (they go through this event loop)."""
    for _ in range(5):
        await asyncio.sleep(0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_one_call_in_flight_per_peer_and_what_waited_goes_in_one_call() -> None:
    async def go() -> None:
        peers = {1: FakeActor(), 2: FakeActor()}
        errors: list = []
        t = Transport(peers, lambda h, e: errors.append((h, e)))
        t.send(outbox(1, 0, 1))
        t.send(outbox(2, 0))
        assert len(peers[1].calls) == 1 and len(peers[2].calls) == 1  # idle peers: at once
        t.send(outbox(1, 2, grants=1))
        t.send(outbox(1, 3))
        assert len(peers[1].calls) == 1 and not t.idle  # held back behind the call in flight
        peers[1].calls[0][1].finish()
        await settle()
        assert len(peers[1].calls) == 2
        second: Parcel = peers[1].calls[1][0]
        assert [e.seq for e in second.envelopes] == [2, 3] and len(second.grants) == 1
        assert t.idle and t.calls == 3 and not errors

    run(go())


def control(host: int, name: str) -> Outbox:
    """An outbox with control traffic for ``host`` (a message along an extra edge; the transport never
    looks inside)."""
    out = Outbox()
    out.extra[host].append((("count", 0), name))  # type: ignore[arg-type]
    return out


def test_control_traffic_leaves_at_once_in_one_more_call_and_no_more() -> None:
    async def go() -> None:
        peers = {1: FakeActor()}
        t = Transport(peers, lambda h, e: None)
        t.send(outbox(1, 0))
        t.send(outbox(1, 1))
        assert len(peers[1].calls) == 1  # data waits behind the call in flight
        t.send(control(1, "barrier-1"))
        assert len(peers[1].calls) == 2  # control does not: it goes now, with the data that waited
        second: Parcel = peers[1].calls[1][0]
        assert [e.seq for e in second.envelopes] == [1] and [m for _, m in second.extra] == ["barrier-1"]
        t.send(control(1, "barrier-2"))
        t.send(outbox(1, 2))
        assert len(peers[1].calls) == 2  # two calls in flight: even control waits now
        peers[1].calls[1][1].finish()  # the control call returns first (calls return in any order)
        await settle()
        assert len(peers[1].calls) == 3  # what waited holds control: it takes the spare call at once
        third: Parcel = peers[1].calls[2][0]
        assert [e.seq for e in third.envelopes] == [2] and [m for _, m in third.extra] == ["barrier-2"]
        t.send(outbox(1, 3))
        peers[1].calls[0][1].finish()
        await settle()
        assert len(peers[1].calls) == 3  # data only: it waits until no call but this one is in flight
        peers[1].calls[2][1].finish()
        await settle()
        assert len(peers[1].calls) == 4 and [e.seq for e in peers[1].calls[3][0].envelopes] == [3]
        peers[1].calls[3][1].finish()
        await settle()
        assert t.idle and t.calls == 4

    run(go())


def test_a_failed_call_is_reported_with_its_host() -> None:
    async def go() -> None:
        peers = {1: FakeActor()}
        errors: list = []
        t = Transport(peers, lambda h, e: errors.append((h, e)))
        t.send(outbox(1, 0))
        peers[1].calls[0][1].finish(RuntimeError("gone"))
        await settle()
        assert [(h, str(e)) for h, e in errors] == [(1, "gone")]

    run(go())


def test_returns_go_to_their_controller_one_call_at_a_time() -> None:
    async def go() -> None:
        ctl, side = FakeActor(), FakeActor()
        t = Transport({}, lambda h, e: None, {"controller": ctl, "side": side})
        first = Outbox()
        first.control.returns.extend([ControlReturn("a", (("s", 0),), {}, "controller"),
                                      ControlReturn("b", (("s", 0),), {}, "side")])
        t.send(first)
        later = Outbox()
        later.control.returns.extend([ControlReturn("c", (("s", 0),), {}, "controller"),
                                      ControlReturn("d", (("s", 0),), {}, "controller")])
        t.send(later)
        assert [[r.op_id for r in c[0]] for c in ctl.calls] == [["a"]]
        assert [[r.op_id for r in c[0]] for c in side.calls] == [["b"]]
        ctl.calls[0][1].finish()
        await settle()
        assert [[r.op_id for r in c[0]] for c in ctl.calls] == [["a"], ["c", "d"]]

    run(go())


def test_forgotten_hosts_get_nothing_and_close_stops_sending() -> None:
    async def go() -> None:
        peers = {1: FakeActor(), 2: FakeActor()}
        t = Transport(peers, lambda h, e: None)
        t.send(outbox(1, 0))
        t.send(outbox(1, 1))
        t.forget([1])
        assert t.idle
        t.send(outbox(1, 2))
        assert 1 not in peers and t.idle
        t.close()
        t.close()  # idempotent
        t.send(outbox(2, 0))
        assert not peers[2].calls

    run(go())


@pytest.mark.parametrize("kinds", [("envelopes",), ("grants", "extra"), ("relays", "injections", "collects")])
def test_outbox_parcels_carry_every_kind_for_each_host(kinds: tuple[str, ...]) -> None:
    out = Outbox()
    tables = {"envelopes": out.envelopes, "grants": out.grants, "extra": out.extra, "ended": out.ended,
              "relays": out.control.relays, "injections": out.control.injections,
              "collects": out.control.collects}
    for i, kind in enumerate(kinds):
        tables[kind][4].append(("item", i))
        tables[kind][5].append(("other", i))
    parcels = out.parcels()
    assert set(parcels) == {4, 5}
    for i, kind in enumerate(kinds):
        assert getattr(parcels[4], kind) == [("item", i)] and getattr(parcels[5], kind) == [("other", i)]
    assert all(not getattr(parcels[4], k) for k in tables if k not in kinds)


def test_a_call_that_fails_after_the_transport_closed_is_not_logged_as_never_retrieved() -> None:
    """A cancel kills every host: the calls still in flight to them fail after the sender closed its transport.
    Nobody acts on those failures, and asyncio logged each as 'Future exception was never retrieved'."""
    unseen: list[dict] = []

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unseen.append(context))
        peers = {1: FakeActor()}
        t = Transport(peers, lambda h, e: None)
        t.send(outbox(1, 0))
        (_, ref), = peers[1].calls
        t.close()
        ref.finish(RuntimeError("the peer was killed"))
        await settle()
        peers[1].calls.clear()
        del ref
        gc.collect()
        await settle()

    run(go())
    assert not [c for c in unseen if "never retrieved" in str(c.get("message", ""))]
