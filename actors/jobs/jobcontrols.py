"""jobcontrols.py: where the driver's control ops go: the job controller and the side controllers of a ``Job``.

``OpRouter`` keeps one batching ``OpSender`` per controller actor (a recovery gives the job a new controller,
and so a new sender) and the job's side controllers (``Job.add_controller``), which run ops concurrently with
the job controller. ``Job.run_control`` starts each op through it.
"""

from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING

import ray

from chiray.control.op import ControlOp
from chiray.control.oprun import JobView

from ..runtime.controlops import SideController
from .ophandle import OpHandle, OpSender

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = ["OpRouter", "JOB_CONTROLLER"]

JOB_CONTROLLER = "controller"
"""The name ops of the job controller go under (side controllers have names of their own)."""


class OpRouter:
    """The controllers of one job's control ops, as the driver reaches them.

    ``start`` may be called from any thread (the autoscaler's, a rescale's): ``_senders`` is read and written
    under ``_lock`` only. ``_sides`` changes in ``add_side`` (the job's own thread). Lifecycle:
    ``OPEN -> CLOSED`` (``close()``, when the job ends: queued ops are still sent, then the senders stop).
    """

    def __init__(self, job: str):
        self._job = job
        self._sides: dict[str, ActorHandle] = {}
        self._senders: dict[object, OpSender] = {}  # controller actor id -> its batching sender
        self._lock = threading.RLock()

    @property
    def sides(self) -> dict[str, ActorHandle]:
        """Side controller name -> its actor."""
        return dict(self._sides)

    def side(self, name: str) -> ActorHandle:
        """The side controller ``name``.

        Raises:
            ValueError: the job has no side controller of that name.
        """
        if name not in self._sides:
            raise ValueError(f"job {self._job!r} has no controller {name!r}; add it with add_controller()")
        return self._sides[name]

    def start(self, op: ControlOp, controller: ActorHandle, name: str | None = None,
              op_id: str | None = None) -> OpHandle:
        """Send ``op`` to ``controller`` (the job's, or side controller ``name``'s) under ``op_id`` (default:
        a fresh unique id); no round trip: the handle's ``result()`` waits for it."""
        op_id = op_id or f"{name or JOB_CONTROLLER}:{uuid.uuid4().hex[:12]}:{type(op).__name__}"
        with self._lock:
            sender = self._senders.get(controller._actor_id)
            if sender is None:
                sender = self._senders[controller._actor_id] = OpSender(controller, name or JOB_CONTROLLER)
        sender.submit(op, op_id)
        return OpHandle(op_id, controller, getattr(op, "timeout_s", None))

    def calls(self) -> int:
        """How many Ray calls the senders made (each carries one or more ops)."""
        with self._lock:
            return sum(sender.calls for sender in self._senders.values())

    def add_side(self, name: str, view: JobView, controller: ActorHandle) -> str:
        """Start side controller ``name`` (an actor of its own) for the job ``view`` shows; ``controller``, the
        job's, learns of it. Returns ``name``."""
        side = SideController.options(name=None).remote(name, view, controller)  # type: ignore[attr-defined]
        ray.get(controller.register_controller.remote(name, side))
        self._sides[name] = side
        return name

    def set_view(self, view: JobView) -> None:
        """The job's topology changed (a rescale step): every side controller sees ``view``."""
        for side in self._sides.values():
            side.set_view.remote(view)

    def close(self) -> None:
        """Stop the senders once what they hold is sent (the job ended). Idempotent."""
        with self._lock:
            senders, self._senders = list(self._senders.values()), {}
        for sender in senders:
            sender.close()
