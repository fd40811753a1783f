"""transport.py: the one place that sends data between hosts with ``.remote()``.

Every envelope list bound for one host goes in one ``deliver`` call; credit
grants in one ``grant`` call. Calls are not awaited on the hot path: the host
loop calls :meth:`Transport.check` now and then, which finds failed calls (a
dead host) with one non-blocking ``ray.wait`` over the calls in flight and
reports them through ``on_error``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import ray

from .mailbox import Outbox

__all__ = ["Transport"]


class Transport:
    """Sends a host's outbox to its peers.

    Args:
        peers: host id -> host actor handle.
        on_error: called with (host id, exception) when a call to that host fails.
    """

    def __init__(self, peers: dict[int, Any], on_error: Callable[[int, BaseException], None],
                 controllers: dict[str, Any] | None = None):
        self.peers = peers
        self.on_error = on_error
        self.controllers = controllers if controllers is not None else {}
        self._in_flight: list[tuple[int, Any]] = []
        self._last_check = time.monotonic()
        self.calls = 0
        self.forgotten: set[int] = set()

    def forget(self, host_ids: list[int]) -> None:
        """Retired hosts: nothing is sent to them any more (only credit and notices could be)."""
        self.forgotten.update(host_ids)
        for host in host_ids:
            self.peers.pop(host, None)
        self._in_flight = [(h, ref) for h, ref in self._in_flight if h not in self.forgotten]

    def send(self, outbox: Outbox) -> None:
        for host, envelopes in self._live(outbox.envelopes):
            self._track(host, self.peers[host].deliver.remote(envelopes))
        for host, grants in self._live(outbox.grants):
            self._track(host, self.peers[host].grant.remote(grants))
        for host, extra in self._live(outbox.extra):
            self._track(host, self.peers[host].deliver_extra.remote(extra))
        for host, names in self._live(outbox.ended):
            self._track(host, self.peers[host].peer_ended.remote(names))
        control = outbox.control
        for host, relays in self._live(control.relays):
            self._track(host, self.peers[host].relay.remote(relays))
        for host, injections in self._live(control.injections):
            self._track(host, self.peers[host].inject.remote(injections))
        for host, collects in self._live(control.collects):
            self._track(host, self.peers[host].collect.remote(collects))
        by_origin: dict[str, list] = {}
        for ret in control.returns:
            by_origin.setdefault(ret.origin, []).append(ret)
        for origin, rets in by_origin.items():
            handle = self.controllers.get(origin)
            if handle is not None:  # a controller that is gone has no op to return to
                handle.op_returned.remote(rets)

    def _live(self, table: dict[int, Any]) -> list[tuple[int, Any]]:
        return [(h, items) for h, items in table.items() if h not in self.forgotten]

    def _track(self, host: int, ref: Any) -> None:
        self.calls += 1
        self._in_flight.append((host, ref))

    async def check(self, every_s: float = 0.1) -> None:
        """Report failed calls among those that finished (at most once per ``every_s``)."""
        now = time.monotonic()
        if not self._in_flight or now - self._last_check < every_s:
            return
        self._last_check = now
        refs = [ref for _, ref in self._in_flight]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        if not done:
            return
        finished = set(done)
        still = []
        for host, ref in self._in_flight:
            if ref not in finished:
                still.append((host, ref))
                continue
            try:
                await ref  # finished already: no wait
            except Exception as exc:  # a dead or failing peer: the controller decides
                self.on_error(host, exc)
        self._in_flight = still

    def close(self) -> None:
        self._in_flight.clear()
