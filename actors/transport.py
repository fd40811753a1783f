"""transport.py: the one place that sends data between hosts with ``.remote()``.

Every envelope list bound for one host goes in one ``deliver`` call; credit
grants in one ``grant`` call. Calls are not awaited on the hot path; a
watcher task reports a failed call (a dead host) through ``on_error``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

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
        self._watchers: set[asyncio.Task] = set()
        self.calls = 0

    def send(self, outbox: Outbox) -> None:
        for host, envelopes in outbox.envelopes.items():
            self._watch(host, self.peers[host].deliver.remote(envelopes))
        for host, grants in outbox.grants.items():
            self._watch(host, self.peers[host].grant.remote(grants))
        for host, extra in outbox.extra.items():
            self._watch(host, self.peers[host].deliver_extra.remote(extra))
        for host, names in outbox.ended.items():
            self._watch(host, self.peers[host].peer_ended.remote(names))
        control = outbox.control
        for host, relays in control.relays.items():
            self._watch(host, self.peers[host].relay.remote(relays))
        for host, injections in control.injections.items():
            self._watch(host, self.peers[host].inject.remote(injections))
        for host, collects in control.collects.items():
            self._watch(host, self.peers[host].collect.remote(collects))
        by_origin: dict[str, list] = {}
        for ret in control.returns:
            by_origin.setdefault(ret.origin, []).append(ret)
        for origin, rets in by_origin.items():
            handle = self.controllers.get(origin)
            if handle is not None:  # a controller that is gone has no op to return to
                handle.op_returned.remote(rets)

    def _watch(self, host: int, ref: Any) -> None:
        self.calls += 1
        task = asyncio.ensure_future(self._await(host, ref))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _await(self, host: int, ref: Any) -> None:
        try:
            await ref
        except Exception as exc:  # a dead or failing peer: the controller decides
            self.on_error(host, exc)

    def close(self) -> None:
        for task in list(self._watchers):
            task.cancel()
