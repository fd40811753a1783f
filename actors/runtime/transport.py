"""transport.py: the one place that sends between hosts with ``.remote()``: one call per peer at a time
(one more for control traffic).

Everything a host has for one peer (envelopes, credit grants, control
traffic) goes in one ``receive`` call carrying a :class:`~.messages.Parcel`;
the sink returns for one controller go in one ``op_returned`` call. A Ray
call costs far more CPU than the messages it carries (about a millisecond
across the two processes on a small machine), so at most one call to each
peer is in flight (but for control traffic, below): what is produced for a
peer while its call is on the way waits, and leaves in one call as soon as
that call returns. An idle peer gets its parcel at once; a busy one gets
fewer, fuller calls (Nagle's rule), which is what keeps many small control
messages from crowding out the data.
Nothing depends on the order of calls (channels reorder by sequence number;
control inboxes by global injection order), so holding a parcel back only
delays it.

Control traffic does not wait behind a call in flight: a parcel that carries
some (``Parcel.carries_control``) leaves at once in one more call to that
peer (``CONTROL_CALLS``), with whatever data waited with it. In a trace of a
keyed count at 8M keys and 65 % of its capacity, checkpoint barriers waited
11-36 ms for the last call to return (the call itself then took 15-26 ms),
while the instance they were headed for held back its other input. With 100
blocking ops a second (``benchmarks.control_overhead``), their completion
p50 went from 182-324 ms to 108-219 ms.

A call that fails (a dead host) is reported through ``on_error`` when it
returns. Only the owning host's event loop touches a transport.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Callable, TypeVar

from chiray.control.message import ControlReturn
from chiray.operators.inflight import CallWindow, concat

from .outbox import Outbox
from .messages import Parcel

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

__all__ = ["Transport", "when_returned", "CONTROL_CALLS"]

CONTROL_CALLS = 1
"""Calls to a peer beyond the one in flight that a parcel carrying control traffic may start (bounded, so
that a stream of control ops still shares calls)."""

K = TypeVar("K")


def when_returned(ref: ObjectRef, callback: Callable[[asyncio.Future], None]) -> None:
    """Call ``callback(future)`` on this event loop once the Ray call ``ref`` has returned or failed.

    The call's failure counts as seen even if ``callback`` ignores it (a closed transport, a host that was
    forgotten): otherwise asyncio logs every such failure, e.g. each call to a peer that a cancel killed,
    as an exception never retrieved."""

    def done(future: asyncio.Future) -> None:
        if not future.cancelled():
            future.exception()
        callback(future)

    asyncio.wrap_future(ref.future()).add_done_callback(done)


def _fold(queued: Parcel, parcel: Parcel) -> Parcel:
    """A parcel still waiting to go takes the one that follows it."""
    queued.add(parcel)
    return queued


class Transport:
    """Sends a host's outbox to its peers and controllers, one call in flight per receiver (a peer: one
    more for control traffic).

    Args:
        peers: host id -> host actor handle (shared: a rescale adds hosts to it).
        on_error: called with (host id, exception) when a call to that host fails.
        controllers: controller name -> actor handle, for sink returns.

    Lifecycle: ``OPEN -> CLOSED`` (``close()``, idempotent: nothing more is sent).
    """

    def __init__(self, peers: dict[int, ActorHandle], on_error: Callable[[int, BaseException], None],
                 controllers: dict[str, ActorHandle] | None = None, run: str | None = None):
        self.peers = peers
        self.run = run  # the job life: a peer that serves another one drops the parcel
        self.on_error = on_error
        self.controllers = controllers if controllers is not None else {}
        self._parcels: CallWindow[int, Parcel] = CallWindow(_fold)  # per peer host
        self._returns: CallWindow[str, list[ControlReturn]] = CallWindow(concat)  # per controller
        self.calls = 0
        self.forgotten: set[int] = set()
        self.closed = False

    @property
    def idle(self) -> bool:
        """Nothing waits to be sent."""
        return self._parcels.idle and self._returns.idle

    def forget(self, host_ids: list[int]) -> None:
        """Retired hosts: nothing is sent to them any more (only credit and notices could be)."""
        self.forgotten.update(host_ids)
        for host in host_ids:
            self.peers.pop(host, None)
            self._parcels.forget(host)

    def send(self, outbox: Outbox) -> None:
        """Send ``outbox`` now, or with the next call to each receiver still busy with the last one."""
        if self.closed:
            return
        hosts = []
        for host, parcel in outbox.parcels().items():
            if host not in self.forgotten:
                self._parcels.put(host, parcel)
                hosts.append(host)
        for ret in outbox.control.returns:
            self._returns.put(ret.origin, [ret])
        for host in dict.fromkeys([*self._parcels.ready(), *hosts]):  # (a host with nothing left: no call)
            self._post(host)
        for origin in self._returns.ready():
            self._post_returns(origin)

    def _post(self, host: int) -> None:
        """Send what waits for ``host`` if it has room for a call: one call in flight, or one more for
        control traffic (``CONTROL_CALLS``)."""
        waiting = self._parcels.waiting(host)
        if waiting is None:
            return
        parcel = self._parcels.take(host, CONTROL_CALLS if waiting.carries_control else 0)
        if parcel is not None:
            self._track(self._peer_returned, host, self.peers[host].receive.remote(parcel, self.run))

    def _post_returns(self, origin: str) -> None:
        handle = self.controllers.get(origin)
        if handle is None:  # a controller that is gone has no op to return to
            self._returns.forget(origin)
            return
        returns = self._returns.take(origin)
        if returns is not None:
            self._track(self._controller_returned, origin, handle.op_returned.remote(returns))

    def _track(self, returned: Callable[[K, asyncio.Future], None], key: K, ref: ObjectRef) -> None:
        self.calls += 1
        when_returned(ref, functools.partial(returned, key))

    def _peer_returned(self, host: int, future: asyncio.Future) -> None:
        """A call to a peer came back: report its failure, or send what waited for it."""
        if not self._parcels.returned(host) or self.closed:
            return  # forgotten meanwhile, or closed
        error = None if future.cancelled() else future.exception()
        if error is not None:  # a dead or failing peer: the controller decides
            self.on_error(host, error)
            return
        self._post(host)

    def _controller_returned(self, origin: str, future: asyncio.Future) -> None:
        """A call to a controller came back: send the returns that waited for it."""
        if self._returns.returned(origin) and not self.closed:
            self._post_returns(origin)

    def close(self) -> None:
        """Send nothing more (the host stopped). Idempotent."""
        self.closed = True
        self._parcels.clear()
        self._returns.clear()
