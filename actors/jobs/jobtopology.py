"""jobtopology.py: the job-side topology of a deployment: host actors, host ids, placement, controller.

One ``JobTopology`` per ``Job`` (``job.topology``). It holds the actor handles
the driver talks to and the ids the hosts know each other by; it starts and
kills no actor itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

if TYPE_CHECKING:
    from .jobactors import HostActor

__all__ = ["JobTopology", "TopologySnapshot"]

Instance = tuple[str, int]  # an operator instance: (operator name, index)


@dataclasses.dataclass(frozen=True, slots=True)
class TopologySnapshot:
    """The topology at one moment; later changes do not show in it.

    Attributes:
        controller: the job controller's actor handle.
        host_ids: the live hosts' ids, in the order they joined.
        hosts: their actor handles (``hosts[k]`` has id ``host_ids[k]``).
        placement: instance -> host id (read-only).
        incarnation: the deployment's incarnation (0 at submit, one more per recovery).
    """

    controller: Any  # a JobController actor, a HostedController, or None before the job launched
    host_ids: tuple[int, ...]
    hosts: tuple[HostActor, ...]
    placement: Mapping[Instance, int]
    incarnation: int

    def peers(self) -> dict[int, HostActor]:
        """Host id -> host actor."""
        return dict(zip(self.host_ids, self.hosts))


class JobTopology:
    """The hosts, host ids, placement, incarnation and controller of one job, and its running rescales.

    Who may touch it: ``Job.launch`` installs the first deployment
    (``install``); the supervisor replaces hosts and controller at a recovery
    (``swap``, ``set_controller``); a rescale run claims its operator, allocates
    host ids, adds and retires hosts and sets the placement (through
    ``Job.apply_rescale_step``); everyone reads (``snapshot``, ``peers``,
    ``hosts``, ``controller``).

    Locking: every method holds ``lock`` (reentrant) for its whole body, so each
    is atomic and what it returns is a copy. Hold ``lock`` around several calls
    to make them one step. ``rescale_turn()`` is another lock, held for a whole
    rescale so that rescales of different operators take turns; never take it
    while holding ``lock``.

    Host ids are never reused: ``allocate_host_ids`` hands out ids above every id
    this topology has seen (hosts forget retired peers by id).

    Example:
        >>> topology = JobTopology("controller")
        >>> topology.install(["h0", "h1"], [0, 1], {("map", 0): 0, ("map", 1): 1})
        >>> topology.allocate_host_ids(1)
        (2,)
    """

    def __init__(self, controller: Any, hosts: Sequence[HostActor] = ()):
        self.lock = threading.RLock()
        self._controller = controller
        self._hosts: tuple[HostActor, ...] = tuple(hosts)
        self._host_ids: tuple[int, ...] = tuple(range(len(self._hosts)))
        self._placement: dict[Instance, int] = {}
        self._incarnation = 0
        self._replacing = False  # a recovery killed the hosts; swap() installs their replacements
        self._next_host_id = len(self._hosts)
        self._rescaling: set[str] = set()
        self._rescale_turn = threading.Lock()

    # -- reading -------------------------------------------------------------------------

    @property
    def controller(self) -> Any:
        """The job controller's actor handle (a recovery may replace it)."""
        with self.lock:
            return self._controller

    def snapshot(self) -> TopologySnapshot:
        """The whole topology, as a value."""
        with self.lock:
            return TopologySnapshot(self._controller, self._host_ids, self._hosts,
                                    MappingProxyType(dict(self._placement)), self._incarnation)

    def hosts(self) -> tuple[HostActor, ...]:
        """The live host actors."""
        with self.lock:
            return self._hosts

    def peers(self) -> dict[int, HostActor]:
        """Host id -> host actor, for the live hosts."""
        with self.lock:
            return dict(zip(self._host_ids, self._hosts))

    # -- changing ------------------------------------------------------------------------

    def install(self, hosts: Sequence[HostActor], host_ids: Iterable[int],
                placement: Mapping[Instance, int]) -> None:
        """The first deployment (at submit): these hosts, with these ids and this placement.

        Raises:
            ValueError: ``hosts`` and ``host_ids`` differ in length.
        """
        with self.lock:
            self._set_hosts(hosts, host_ids)
            self._placement = dict(placement)

    def replacing(self) -> None:
        """A recovery killed every host: until :meth:`swap`, a host added (a rescale's) would be dropped."""
        with self.lock:
            self._replacing = True

    @property
    def being_replaced(self) -> bool:
        with self.lock:
            return self._replacing

    def swap(self, hosts: Sequence[HostActor], host_ids: Iterable[int], placement: Mapping[Instance, int],
             incarnation: int) -> None:
        """A recovery deployed new hosts: they replace every host, under a new incarnation.

        Raises:
            ValueError: ``hosts`` and ``host_ids`` differ in length.
        """
        with self.lock:
            self._set_hosts(hosts, host_ids)
            self._placement = dict(placement)
            self._incarnation = incarnation
            self._replacing = False

    def set_controller(self, controller: Any) -> None:
        """A new job controller replaced a dead one."""
        with self.lock:
            self._controller = controller

    def allocate_host_ids(self, count: int) -> tuple[int, ...]:
        """``count`` fresh host ids, above every id handed out before.

        Raises:
            ValueError: ``count`` is negative.
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        with self.lock:
            first, self._next_host_id = self._next_host_id, self._next_host_id + count
            return tuple(range(first, first + count))

    def add_hosts(self, host_ids: Sequence[int], hosts: Sequence[HostActor]) -> TopologySnapshot:
        """New hosts join (a scale-out); returns the topology with them.

        Raises:
            ValueError: the lengths differ, or an id is already live.
        """
        with self.lock:
            if len(host_ids) != len(hosts) or set(host_ids) & set(self._host_ids):
                raise ValueError(f"cannot add hosts {list(host_ids)} ({len(hosts)} actors) to live hosts "
                                 f"{list(self._host_ids)}")
            self._set_hosts((*self._hosts, *hosts), (*self._host_ids, *host_ids))
            return self.snapshot()

    def retire_hosts(self, host_ids: Iterable[int]) -> dict[int, HostActor]:
        """Hosts left (a scale-in drained them); returns the remaining host id -> host actor."""
        gone = set(host_ids)
        with self.lock:
            keep = [(i, h) for i, h in zip(self._host_ids, self._hosts) if i not in gone]
            self._host_ids, self._hosts = tuple(i for i, _ in keep), tuple(h for _, h in keep)
            return dict(keep)

    def set_placement(self, placement: Mapping[Instance, int]) -> None:
        """A rescale step completed: instances now run where ``placement`` says."""
        with self.lock:
            self._placement = dict(placement)

    # -- rescales ------------------------------------------------------------------------

    def claim_rescale(self, operator: str) -> bool:
        """Mark ``operator`` as being rescaled; ``False`` if a rescale of it already runs."""
        with self.lock:
            if operator in self._rescaling:
                return False
            self._rescaling.add(operator)
            return True

    def release_rescale(self, operator: str) -> None:
        """The rescale of ``operator`` ended (idempotent)."""
        with self.lock:
            self._rescaling.discard(operator)

    @contextlib.contextmanager
    def rescale_turn(self) -> Iterator[None]:
        """Hold the turn of rescales for the ``with`` block (rescales of different operators take turns)."""
        with self._rescale_turn:
            yield

    def _set_hosts(self, hosts: Sequence[HostActor], host_ids: Iterable[int]) -> None:
        ids = tuple(host_ids)
        if len(ids) != len(hosts):
            raise ValueError(f"{len(hosts)} host actors for {len(ids)} host ids {list(ids)}")
        self._hosts, self._host_ids = tuple(hosts), ids
        self._next_host_id = max(self._next_host_id, max(ids, default=-1) + 1)
