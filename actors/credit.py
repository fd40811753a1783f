"""credit.py: the credit a host owes senders on other hosts, and when it goes back.

Back-pressure is credit (see ``channel.py``): a receiver returns a channel's
credit as it consumes the channel's messages. To a sender on the same host
the host hands it over at once; to a sender elsewhere a call that carried
one credit alone was up to half of all calls between hosts, so the credit is
held here and goes back:

* at once, when half the channel's bound (batches or bytes) is owed;
* with the next parcel to the sender's host, whatever else it carries;
* when the oldest credit owed is ``delay_s`` old (the deadline).

Holding credit back cannot stall a sender: one without credit has its whole
bound outstanding, so once it is consumed half of it is owed and goes at
once; a batch larger than the byte credit left waits at most ``delay_s``.

Only the owning host touches a ledger. It reads no clock: every call gets
``now``, so it is exercised with a fake clock in tests.
"""

from __future__ import annotations

from typing import Collection

from .messages import Grant

__all__ = ["CREDIT_DELAY_S", "CreditLedger"]

CREDIT_DELAY_S = 0.05
"""Credit owed to a sender on another host waits at most this long."""


class CreditLedger:
    """Credit consumed on this host and not yet returned to senders on other hosts.

    Args:
        capacity_batches: a channel's bound in batches (its initial credit).
        capacity_bytes: a channel's bound in bytes.
        delay_s: the longest any credit is held.
    """

    def __init__(self, capacity_batches: int, capacity_bytes: int, delay_s: float = CREDIT_DELAY_S):
        self._half_batches = capacity_batches
        self._half_bytes = capacity_bytes
        self.delay_s = delay_s
        self._owed: dict[int, tuple[int, list[int]]] = {}  # channel -> (sender's host, [batches, bytes])
        self._since: float | None = None  # when the oldest credit owed was consumed

    def __bool__(self) -> bool:
        return bool(self._owed)

    @property
    def deadline(self) -> float | None:
        """When the credit owed must go at the latest (None: nothing is owed)."""
        return None if self._since is None else self._since + self.delay_s

    def owe(self, grant: Grant, host: int, now: float) -> Grant | None:
        """``grant`` was consumed from a sender on ``host``; returns the channel's credit if it goes now."""
        entry = self._owed.get(grant.channel)
        if entry is None:
            entry = self._owed[grant.channel] = (host, [0, 0])
            if self._since is None:
                self._since = now
        owed = entry[1]
        owed[0] += grant.batches
        owed[1] += grant.nbytes
        if 2 * owed[0] >= self._half_batches or 2 * owed[1] >= self._half_bytes:
            del self._owed[grant.channel]
            if not self._owed:
                self._since = None
            return Grant(grant.channel, owed[0], owed[1])
        return None

    def settle(self, now: float, going: Collection[int]) -> list[tuple[int, Grant]]:
        """The credit to send now, as (host, grant): all of it once the deadline passed, else the credit
        owed to the hosts in ``going`` (they get a parcel anyway)."""
        overdue = self._since is not None and now >= self._since + self.delay_s
        out = []
        for channel in list(self._owed):
            host, (batches, nbytes) = self._owed[channel]
            if overdue or host in going:
                del self._owed[channel]
                out.append((host, Grant(channel, batches, nbytes)))
        if not self._owed:
            self._since = None
        return out
