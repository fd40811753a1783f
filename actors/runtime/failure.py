"""failure.py: ``OperatorFailure``, an operator's own code raised, and ``guarded``, the one place that says so.

Every call into user code (operator logic, control handlers, routers) goes
through :func:`guarded`, so the error that reaches ``Job.wait()`` names the
operator and instance with the user's exception as its cause.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from chiray.operators.errors import ChirayError
from chiray.operators.logic import InstanceInfo

__all__ = ["OperatorFailure", "guarded"]

R = TypeVar("R")


class OperatorFailure(ChirayError):
    """Raised by :meth:`OperatorInstance.step` when the operator's code raised."""

    def __init__(self, info: InstanceInfo, cause: BaseException):
        super().__init__(f"{info}: {type(cause).__name__}: {cause}")
        self.info = info
        self.cause = cause


def guarded(info: InstanceInfo, fn: Callable[..., R], *args: object) -> R:
    """``fn(*args)``, its exception raised as the ``OperatorFailure`` of instance ``info``."""
    try:
        return fn(*args)
    except Exception as exc:  # the user's code: report it, with its operator
        raise OperatorFailure(info, exc) from exc
