"""errors.py: the errors a job reports to its user, picklable across Ray processes."""

from __future__ import annotations

import pickle
import traceback

import cloudpickle

from chiray.operators.errors import ChirayError

__all__ = ["ChirayError", "OperatorError", "JobFailedError", "JobCancelledError", "JobUnresponsiveError", "portable"]


class OperatorError(ChirayError):
    """A user function raised inside an operator instance.

    Attributes:
        operator: the operator's name.
        index: the instance's index.
        cause: the user's exception (also ``__cause__``).
        user_traceback: the formatted traceback from the instance.
    """

    def __init__(self, operator: str, index: int, cause: BaseException, user_traceback: str = ""):
        super().__init__(
            f"operator {operator!r} instance {index} failed: {type(cause).__name__}: {cause}"
            + (f"\n\nTraceback in the instance:\n{user_traceback}" if user_traceback else "")
        )
        self.operator = operator
        self.index = index
        self.cause = cause
        self.user_traceback = user_traceback
        self.__cause__ = cause

    def __reduce__(self):
        return (OperatorError, (self.operator, self.index, self.cause, self.user_traceback))


class JobFailedError(ChirayError):
    """The job failed for a reason other than a user function (a host died, a bug)."""


class JobCancelledError(ChirayError):
    """The job was cancelled before it finished."""


class JobUnresponsiveError(ChirayError, TimeoutError):
    """The job's controller did not answer in time (its process stopped or overloaded); the job may run on."""


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its text and traceback."""
    try:
        pickle.loads(cloudpickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RuntimeError(f"{type(exc).__name__}: {exc} (not picklable; original traceback:\n{text})")
