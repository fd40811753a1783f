"""callbacks.py: the shapes of the user functions that keyed operators call and of the per-key state they get.

Protocols for type checkers and IDEs: a function fits one by its parameters (positional, any names) and
needs not subclass anything. ``key_by(k).process(fn)`` calls ``fn(key, rows, state)`` with a
``KeyedState``; with ``on_timer=`` both functions get a ``KeyedTimerState``, which also sets
event-time timers; ``connect(...).key_by(...).process(fn)`` calls ``fn(key, rows, state, input)``.

Example:
    >>> import chiray
    >>> def running_count(key: str, rows: "pa.RecordBatch", state: chiray.KeyedState) -> list[dict]:
    ...     state.value = (state.value or 0) + rows.num_rows
    ...     return [{"key": key, "seen": state.value}]
    >>> def remind(key: str, rows: "pa.RecordBatch", state: chiray.KeyedTimerState) -> None:
    ...     state.register(state.watermark + 60)
    >>> def on_timer(key: str, time: int, state: chiray.KeyedTimerState) -> list[dict]:
    ...     return [{"key": key, "at": time, "seen": state.value}]

What a function returns (for each type here: ``object``) becomes the operator's output: ``None``, a
``pyarrow.RecordBatch`` or ``Table``, a pandas ``DataFrame``, a list of row dicts, or an iterable of
batches / tables; anything else is a ``TypeError``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

__all__ = ["KeyedState", "KeyedTimerState", "ProcessFunction", "TimerProcessFunction", "OnTimerFunction",
           "CoProcessFunction"]


@runtime_checkable
class KeyedState(Protocol):
    """One key's state, handed to a keyed ``process`` function; valid only during that call.

    ``value`` is ``None`` until set; setting it (to anything but ``None``) stores it in the key's bin, so it
    is checkpointed and moves with the key when the operator rescales; ``clear()`` (or setting ``None``)
    forgets it. Values are pickled: any object ``fn`` stores.
    """

    @property
    def value(self) -> Any:
        """The key's state (``None`` if none)."""
        ...

    @value.setter
    def value(self, value: Any) -> None: ...

    def clear(self) -> None:
        """Forget the key's state."""
        ...


@runtime_checkable
class KeyedTimerState(KeyedState, Protocol):
    """One key's state and event-time timers: what ``process(fn, on_timer=...)`` hands both functions and
    what a keyed co-process function gets.

    Times are in the unit of the watermarks, that is of the sources' event-time column: the integer itself
    for an integer column, its integer ticks for a ``timestamp`` column (``state.register(state.watermark +
    delay)`` works for both).
    """

    @property
    def watermark(self) -> int:
        """The operator's current watermark."""
        ...

    def register(self, time: int) -> None:
        """Call ``on_timer`` for this key once the watermark reaches ``time`` (once per time)."""
        ...

    def delete(self, time: int) -> None:
        """Forget this key's timer at ``time`` if pending."""
        ...

    @property
    def timers(self) -> list[int]:
        """This key's pending timer times, ascending."""
        ...


class ProcessFunction(Protocol):
    """``fn(key, rows, state)``: a keyed process function, per key and batch (``key_by(k).process(fn)``).

    ``key`` is the key's Python value, ``rows`` its rows of the batch in arrival order (a
    ``pyarrow.RecordBatch``) and ``state`` its ``KeyedState``.
    """

    def __call__(self, key: Any, rows: pa.RecordBatch, state: KeyedState, /) -> object: ...


class TimerProcessFunction(Protocol):
    """``fn(key, rows, state)`` of a keyed process with timers (``process(fn, on_timer=...)``): ``state`` is a
    ``KeyedTimerState``, so ``fn`` can ``state.register(time)``."""

    def __call__(self, key: Any, rows: pa.RecordBatch, state: KeyedTimerState, /) -> object: ...


class OnTimerFunction(Protocol):
    """``on_timer(key, time, state)``: runs once per (key, time) when the watermark reaches a registered
    ``time``, in time order."""

    def __call__(self, key: Any, time: int, state: KeyedTimerState, /) -> object: ...


class CoProcessFunction(Protocol):
    """``fn(key, rows, state, input)`` of a keyed co-process (``a.connect(b).key_by(k).process(fn)``):
    ``input`` is 0 for rows of the first stream, 1 for the second's; ``state`` is shared by both inputs."""

    def __call__(self, key: Any, rows: pa.RecordBatch, state: KeyedTimerState, input: int, /) -> object: ...
