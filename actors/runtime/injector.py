"""injector.py: the job controller's injections: the global order of control ops and their calls to the hosts.

Every control op the job controller injects takes the next number of one global order and goes to
every source: straight to the hosts that hold sources at the broadcast tree's top (one item per host,
however many sources it holds), or to the tree's top relays. Ops started together share calls: those
of one turn of the event loop, those queued while the last call to a host was in flight (at most one
is, ``CallWindow``), and, while earlier ops still run, those started within ``batch_s`` of the last
call. Ops injected together reach every source in one call and travel the dataflow together (one
message per channel hop, one return), which is what a high rate of ops costs most; an op that finds no
other running (one after another, or after a quiet spell) goes at once.

A plain class without Ray: its owner (``controller.Controller``) hands it the way to send a parcel and
to schedule a callback on its event loop, so a test drives it on a fake clock.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from chiray.control.coordination import OpCoordinator
from chiray.control.message import ControlMessage, InstanceId
from chiray.control.oprun import OpState
from chiray.control.trees import Relay, Tree
from chiray.operators.inflight import CallWindow

from .messages import Parcel

__all__ = ["Injector", "ops_running"]

H = TypeVar("H")
"""A host's handle (an actor handle; a test's stand-in)."""


def ops_running(ops: OpCoordinator) -> int:
    """The ops of a controller still running (an op started on its own waits for no other)."""
    return sum(1 for run in ops.running.values() if run.state is OpState.RUNNING)


def _fold(queued: tuple[H, Parcel], item: tuple[H, Parcel]) -> tuple[H, Parcel]:
    """Injections queued for one host go together; a host replaced meanwhile gets only what follows.

    Handles are compared by the actor they name, not by identity: a rescale hands the controller a new
    handle object for every host it keeps (``set_hosts``), and an op queued just before would otherwise be
    dropped, its number missing at the sources, which would then wait for it for ever (with every op after).
    """
    if queued[0] != item[0]:
        return item
    queued[1].add(item[1])
    return queued


class Injector(Generic[H]):
    """Numbers the job's control ops in one global order and sends them to the sources' hosts.

    Args:
        broadcast: the broadcast tree from the controller to the sources.
        placement: source instance -> the id of the host that runs it.
        handle: host id -> that host's handle now (a rescale or a recovery replaces hosts).
        send: ``send(handle, parcel, returned)`` makes one call carrying ``parcel`` to that host and
            calls ``returned()`` once it returned or failed.
        schedule: ``schedule(delay, callback)`` runs ``callback`` on the owner's event loop ``delay``
            seconds from now (0: at its next turn).
        clock: the event loop's monotonic seconds.
        running: how many of the controller's ops still run (see ``ops_running``).
        batch_s: while other ops run, ops started within this many seconds of the last call share the next.

    Only the owner's event loop touches an injector. Lifecycle: ``inject`` queues, a scheduled send
    takes what each host with no call in flight has queued; ``reset`` (a recovery: new hosts) starts the
    order again at 0 and forgets what was queued and in flight (late returns of the old calls are ignored).
    """

    def __init__(self, broadcast: Tree | None, placement: Mapping[InstanceId, int], handle: Callable[[int], H],
                 send: Callable[[H, Parcel, Callable[[], None]], None],
                 schedule: Callable[[float, Callable[[], None]], object], clock: Callable[[], float],
                 running: Callable[[], int], batch_s: float) -> None:
        self._broadcast = broadcast
        self._placement = placement
        self._handle = handle
        self._send = send
        self._schedule = schedule
        self._clock = clock
        self._running = running
        self._batch_s = batch_s
        self._seq = 0  # the next op's number in the global order
        self._calls: CallWindow[int, tuple[H, Parcel]] = CallWindow(_fold)
        self._sent_at = float("-inf")  # clock time of the last call
        self._due = False  # a send is scheduled
        self._idle_waiters: list[Callable[[], None]] = []

    @property
    def idle(self) -> bool:
        """Nothing waits to be sent (calls may still be in flight)."""
        return self._calls.idle

    def inject(self, message: ControlMessage) -> ControlMessage:
        """Give ``message`` the next number of the global order and queue it for every source; returns it numbered."""
        message = dataclasses.replace(message, seq=self._seq)
        self._seq += 1
        tree = self._broadcast
        assert tree is not None, "bug: controller started without a broadcast tree"
        direct: dict[int, list[InstanceId]] = {}
        for node in tree.top:
            if isinstance(node, Relay):
                self._queue(tree.host[node], Parcel(relays=[(message, node)]))
            else:
                direct.setdefault(self._placement[node], []).append(node)
        for host, sources in direct.items():  # one item per host, however many sources it holds
            self._queue(host, Parcel(injections=[(message, sources)]))
        return message

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once nothing is queued (at once if nothing is)."""
        self._idle_waiters.append(callback)
        self._wake_if_idle()

    def reset(self) -> None:
        """New hosts (a recovery): the order starts again at 0; what was queued or in flight is dropped."""
        self._calls = CallWindow(_fold)  # the old hosts' ops failed; their calls are ignored
        self._wake_if_idle()
        self._seq = 0  # new hosts: control inboxes start again at 0

    def _queue(self, host: int, parcel: Parcel) -> None:
        self._calls.put(host, (self._handle(host), parcel))
        self._schedule_send()

    def _schedule_send(self) -> None:
        if self._due:
            return
        self._due = True
        wait = self._sent_at + self._batch_s - self._clock()
        self._schedule(wait if wait > 0 and self._running() > 1 else 0.0, self._send_ready)

    def _send_ready(self) -> None:
        """Send the queued injections of every host that has no call in flight."""
        self._due = False
        sent = False
        for host in self._calls.ready():
            taken = self._calls.take(host)
            assert taken is not None, "bug in Injector: a ready host has no injections"
            handle, parcel = taken
            self._send(handle, parcel, functools.partial(self._returned, self._calls, host))
            sent = True
        if sent:
            self._sent_at = self._clock()
        self._wake_if_idle()

    def _wake_if_idle(self) -> None:
        """Release the ``when_idle`` callers once nothing is queued."""
        if not self._calls.idle or not self._idle_waiters:
            return
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            waiter()

    def _returned(self, calls: CallWindow[int, tuple[H, Parcel]], host: int) -> None:
        """A call returned: what waited for it goes (calls from before a ``reset`` are ignored)."""
        if calls is self._calls and calls.returned(host) and calls.queued(host):
            self._schedule_send()
