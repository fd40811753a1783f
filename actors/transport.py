"""transport.py: the one place that sends between hosts with ``.remote()``: one call per peer at a time.

Everything a host has for one peer (envelopes, credit grants, control
traffic) goes in one ``receive`` call carrying a :class:`~.messages.Parcel`;
the sink returns for one controller go in one ``op_returned`` call. A Ray
call costs far more CPU than the messages it carries (about a millisecond
across the two processes on a small machine), so at most one call to each
peer is in flight: what is produced for a peer while its call is on the way
waits, and leaves in one call as soon as that call returns. An idle peer gets
its parcel at once; a busy one gets fewer, fuller calls (Nagle's rule), which
is what keeps many small control messages from crowding out the data.
Nothing depends on the order of calls (channels reorder by sequence number;
control inboxes by global injection order), so holding a parcel back only
delays it.

A call that fails (a dead host) is reported through ``on_error`` when it
returns. Only the owning host's event loop touches a transport.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable

from .outbox import Outbox
from .messages import Parcel

__all__ = ["Transport", "when_returned"]


def when_returned(ref: Any, callback: Callable[[asyncio.Future], None]) -> None:
    """Call ``callback(future)`` on this event loop once the Ray call ``ref`` has returned or failed."""
    asyncio.wrap_future(ref.future()).add_done_callback(callback)


class Transport:
    """Sends a host's outbox to its peers and controllers, one call in flight per receiver.

    Args:
        peers: host id -> host actor handle (shared: a rescale adds hosts to it).
        on_error: called with (host id, exception) when a call to that host fails.
        controllers: controller name -> actor handle, for sink returns.

    Lifecycle: ``OPEN -> CLOSED`` (``close()``, idempotent: nothing more is sent).
    """

    def __init__(self, peers: dict[int, Any], on_error: Callable[[int, BaseException], None],
                 controllers: dict[str, Any] | None = None):
        self.peers = peers
        self.on_error = on_error
        self.controllers = controllers if controllers is not None else {}
        self._waiting: dict[int, Parcel] = {}  # parcels held back while a call to that host is in flight
        self._returns: dict[str, list] = {}  # the same for controllers
        self._in_flight: dict[Any, Any] = {}  # host id or ("controller", name) -> the call's ref
        self.calls = 0
        self.forgotten: set[int] = set()
        self.closed = False

    @property
    def idle(self) -> bool:
        """Nothing waits to be sent."""
        return not self._waiting and not self._returns

    def forget(self, host_ids: list[int]) -> None:
        """Retired hosts: nothing is sent to them any more (only credit and notices could be)."""
        self.forgotten.update(host_ids)
        for host in host_ids:
            self.peers.pop(host, None)
            self._waiting.pop(host, None)
            self._in_flight.pop(host, None)

    def send(self, outbox: Outbox) -> None:
        """Send ``outbox`` now, or with the next call to each receiver still busy with the last one."""
        if self.closed:
            return
        for host, parcel in outbox.parcels().items():
            if host in self.forgotten:
                continue
            waiting = self._waiting.get(host)
            if waiting is None:
                self._waiting[host] = parcel
            else:
                waiting.add(parcel)
        for ret in outbox.control.returns:
            self._returns.setdefault(ret.origin, []).append(ret)
        for host in list(self._waiting):
            if host not in self._in_flight:
                self._post(host)
        for origin in list(self._returns):
            if ("controller", origin) not in self._in_flight:
                self._post_returns(origin)

    def _post(self, host: int) -> None:
        parcel = self._waiting.pop(host)
        self._track(host, self.peers[host].receive.remote(parcel))

    def _post_returns(self, origin: str) -> None:
        returns = self._returns.pop(origin)
        handle = self.controllers.get(origin)
        if handle is not None:  # a controller that is gone has no op to return to
            self._track(("controller", origin), handle.op_returned.remote(returns))

    def _track(self, key: Any, ref: Any) -> None:
        self.calls += 1
        self._in_flight[key] = ref
        when_returned(ref, functools.partial(self._returned, key, ref))

    def _returned(self, key: Any, ref: Any, future: Any) -> None:
        """A call came back: report its failure, send what waited for it."""
        if self._in_flight.get(key) is not ref:
            return  # forgotten meanwhile
        del self._in_flight[key]
        if self.closed:
            return
        error = None if future.cancelled() else future.exception()
        if isinstance(key, tuple):
            if key[1] in self._returns:
                self._post_returns(key[1])
            return
        if error is not None:  # a dead or failing peer: the controller decides
            self.on_error(key, error)
            return
        if key in self._waiting and key not in self.forgotten:
            self._post(key)

    def close(self) -> None:
        """Send nothing more (the host stopped). Idempotent."""
        self.closed = True
        self._waiting.clear()
        self._returns.clear()
        self._in_flight.clear()
