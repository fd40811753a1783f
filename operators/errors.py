"""errors.py: ``ChirayError``, the base of every error chiray raises, at the bottom layer so all can use it.

``chiray.actors.errors`` and the ``chiray`` facade re-export it. An error
that callers also catch by a built-in class keeps that base as well (an
``OpTimeoutError`` is a ``TimeoutError``, a ``CheckpointError`` a
``RuntimeError``): ``class CheckpointError(ChirayError, RuntimeError)``.

Example:
    >>> from chiray.operators.errors import ChirayError
    >>> class Broken(ChirayError, RuntimeError):
    ...     '''A broken thing.'''
    >>> isinstance(Broken("x"), ChirayError) and isinstance(Broken("x"), RuntimeError)
    True
"""

from __future__ import annotations

__all__ = ["ChirayError"]


class ChirayError(Exception):
    """Base of chiray's errors: ``except chiray.ChirayError`` catches every error chiray raises itself."""
