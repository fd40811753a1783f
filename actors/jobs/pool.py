"""pool.py: warm actor processes that this driver keeps for its next submit.

Starting an actor costs a process start and the runtime's imports, about a
second of CPU each; a job's hosts and controller starting together take
several seconds on a small node, which is most of a short job's life. With
``JobConfig.warm_hosts = n`` the driver keeps up to ``n`` bare host actors
(created with the job's host resources, not set up) and one bare job
controller. ``submit``, a recovery and a scale-out take them before starting
new ones; a taken actor is set up with its job like a freshly started one.

The pool is refilled when a job ends (its hosts' resources are free again),
never while a job deploys, so warm-up work does not compete with a running
job. Idle warm hosts hold their ``host_num_cpus``; they die with the driver
(Ray kills the actors a driver owns) or at :func:`release_warm_actors`.

Hosts with custom ``host_options`` (scheduling strategies, placement groups)
are never pooled: a warm host's placement could not honour them.

The pool is per Ray session: a driver that reconnects to another cluster
never gets a handle from the old one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable

import ray
from ray.actor import ActorHandle

from .jobactors import PoolKey

__all__ = ["WarmPool", "kill", "release_warm_actors", "wait_warm_actors", "warm_pool"]

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 10.0
"""How long a taken warm actor may take to answer before it is dropped (a dead node's actors never answer)."""

Key = PoolKey


class WarmPool:
    """Idle bare actors, by kind and resources, for one Ray session (driver-side, thread-safe)."""

    def __init__(self, session: str) -> None:
        self.session = session
        self._idle: dict[Key, list[ActorHandle]] = {}
        self._lock = threading.Lock()

    def take(self, key: Key, n: int) -> list[ActorHandle]:
        """Up to ``n`` live idle actors of ``key`` (fewer, possibly none, when the pool has fewer)."""
        with self._lock:
            idle = self._idle.get(key, [])
            taken, self._idle[key] = idle[:n], idle[n:]
        return _alive(taken)

    def put(self, key: Key, actors: list[ActorHandle]) -> None:
        with self._lock:
            self._idle.setdefault(key, []).extend(actors)

    def fill(self, key: Key, n: int, start: Callable[[], Any]) -> int:
        """Start actors with ``start()`` (in the background) until ``key`` has ``n`` idle; how many started."""
        with self._lock:
            missing = n - len(self._idle.get(key, []))
        started = [start() for _ in range(max(missing, 0))]
        self.put(key, started)
        return len(started)

    def size(self, key: Key | None = None) -> int:
        with self._lock:
            if key is not None:
                return len(self._idle.get(key, []))
            return sum(len(v) for v in self._idle.values())

    def held_cpus(self) -> float:
        """The CPUs the idle actors hold (a host's key names its ``host_num_cpus``; controllers hold none)."""
        with self._lock:
            return sum(len(actors) * key[1][0] for key, actors in self._idle.items()
                       if key[0] == "host" and key[1] is not None)

    def check(self, timeout: float | None) -> int:
        """Wait until every idle actor has started; drop the dead ones; how many are up."""
        with self._lock:
            idle, self._idle = self._idle, {}
        up = {key: _alive(actors, timeout) for key, actors in idle.items()}
        for key, actors in up.items():
            self.put(key, actors)
        return sum(len(a) for a in up.values())

    def release(self, other_hosts_than: Key | None = None) -> int:
        """Kill every idle actor, or with ``other_hosts_than`` only the idle hosts of other keys (they hold
        CPUs; idle controllers hold none); how many."""
        with self._lock:
            gone = [k for k in self._idle if other_hosts_than is None
                    or (k[0] == "host" and k != other_hosts_than)]
            idle = [a for k in gone for a in self._idle.pop(k)]
        kill(idle)
        return len(idle)


def _alive(actors: list[ActorHandle], timeout: float | None = PING_TIMEOUT_S) -> list[ActorHandle]:
    """The actors that answer a ping within ``timeout`` (those still starting are waited for); the others are killed."""
    if not actors:
        return []
    pings = [a.ping.remote() for a in actors]
    ray.wait(pings, num_returns=len(pings), timeout=timeout)
    alive = []
    for actor, ping in zip(actors, pings):
        try:
            ray.get(ping, timeout=0)
            alive.append(actor)
        except Exception:
            log.info("a warm actor did not answer; starting a new one instead")
            kill([actor])
    return alive


def kill(actors: Iterable[ActorHandle]) -> None:
    """Kill these actors; those already gone are skipped."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass


_pool: WarmPool | None = None
_pool_lock = threading.Lock()


def warm_pool() -> WarmPool:
    """This driver's pool for the Ray session it is connected to."""
    global _pool
    session = ray.get_runtime_context().get_job_id()
    with _pool_lock:
        if _pool is None or _pool.session != session:
            _pool = WarmPool(session)  # a new session: the old handles are meaningless
        return _pool


def release_warm_actors() -> int:
    """Kill the warm actors this driver keeps (``JobConfig.warm_hosts``); returns how many.

    Example:
        >>> from chiray.actors import release_warm_actors
        >>> release_warm_actors() >= 0                      # doctest: +SKIP
        True
    """
    if _pool is None or not ray.is_initialized():
        return 0
    return warm_pool().release()


def wait_warm_actors(timeout: float | None = None) -> int:
    """Wait until every warm actor this driver keeps has started (to measure a submit without process starts).

    Returns:
        How many are up; one that died is dropped from the pool (the next submit starts a new one).
    """
    if _pool is None or not ray.is_initialized():
        return 0
    return warm_pool().check(timeout)
