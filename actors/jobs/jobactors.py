"""jobactors.py: the types of the actor handles that deploy, supervise and pool a job's processes.

A job's hosts are ``OperatorHost`` actors; its controller runs in an actor of
its own (``JobController``) or in a host's process, reached through a
``HostedController`` that answers ``handle.method.remote(...)`` as an actor
handle does. The warm pool keeps bare actors by a ``PoolKey``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias, Union

from ray.actor import ActorHandle

if TYPE_CHECKING:
    from ..runtime.controller import HostedController

__all__ = ["HostActor", "ControllerHandle", "PoolKey"]

HostActor: TypeAlias = ActorHandle
"""The handle of an ``OperatorHost`` actor (a job's host, or a bare warm one)."""

ControllerHandle: TypeAlias = Union[ActorHandle, "HostedController"]
"""The job controller: its own ``JobController`` actor, or the one that runs in a host's process."""

PoolKey: TypeAlias = tuple[str, Union[tuple[float, tuple[tuple[str, float], ...]], None]]
"""A warm pool's key: ``("host", (host_num_cpus, sorted host_resources))`` or ``("controller", None)``."""
