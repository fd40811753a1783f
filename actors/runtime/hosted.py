"""hosted.py: a handle on the job controller that runs inside a host's process (``HostedController``).

By default a job's controller runs in host 0's process, on a thread of that host's own (see
``OperatorHost.controller_call``), so a job costs no process beyond its hosts. Its handle has an
actor's call syntax, so whoever calls the controller need not know where it runs.
"""

from __future__ import annotations

from ray import ObjectRef
from ray.actor import ActorHandle

__all__ = ["HostedController", "controller_host"]


def controller_host(controller: object) -> int | None:
    """The id of the host whose process runs ``controller``; None where it has an actor of its own."""
    return controller.host_id if isinstance(controller, HostedController) else None


class HostedController:
    """A handle on the controller that runs inside a host's process: ``handle.method.remote(...)``
    as on an actor, each call one ``controller_call`` on that host. Picklable (it travels to hosts
    and side controllers like an actor handle).

    Args:
        host: the ``OperatorHost`` actor that runs the controller.
        host_id: that host's id in the job.
        run: the job life (``JobConfig.run_id``): a host that serves another one by the time a call
            arrives (a warm pool gave it to the next job) refuses the call.
    """

    def __init__(self, host: ActorHandle, host_id: int, run: str | None = None):
        self.host = host
        self.host_id = host_id
        self.run = run

    @property
    def _actor_id(self) -> object:
        return self.host._actor_id

    def __getattr__(self, name: str) -> "_HostedMethod":
        if name.startswith("_") or "host" not in self.__dict__:
            raise AttributeError(name)
        return _HostedMethod(self.host, name, self.run)

    def __repr__(self) -> str:
        return f"HostedController(host {self.host_id}: {self.host!r})"


class _HostedMethod:
    __slots__ = ("host", "name", "run")

    def __init__(self, host: ActorHandle, name: str, run: str | None):
        self.host = host
        self.name = name
        self.run = run

    def remote(self, *args: object, **kwargs: object) -> ObjectRef:
        return self.host.controller_call.remote(self.name, args, kwargs, self.run)
