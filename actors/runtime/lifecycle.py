"""lifecycle.py: the small state machines of the data plane: an instance's, a source's reading, a host's loop.

Each is an ``Enum`` whose members own their transitions (as Flink's barrier
handler states return the next state): a method returns the state that
follows and raises :class:`IllegalTransition` where the move is not allowed,
so a broken invariant ("bug in ...") surfaces where it happens instead of as a
flag silently set twice. The holder keeps the current member in one field and
replaces it with what the method returns::

    >>> state = InstanceLifecycle.RUNNING
    >>> state = state.input_ended().finish()
    >>> state.finished
    True

Only the owner of the field (an instance, or a host's loop) moves it.
"""

from __future__ import annotations

import enum

from chiray.operators.errors import ChirayError

__all__ = ["HostLifecycle", "IllegalTransition", "InstanceLifecycle", "SourceGate", "SourceLifecycle"]


class IllegalTransition(ChirayError, RuntimeError):
    """A lifecycle was asked for a move its current state does not allow (a bug in the runtime)."""

    def __init__(self, state: enum.Enum, move: str):
        super().__init__(f"bug in the runtime: {type(state).__name__}.{state.name} cannot {move}")
        self.state = state
        self.move = move


class InstanceLifecycle(enum.Enum):
    """An operator instance: ``RUNNING -> FINISHING -> FINISHED``.

    ``FINISHING``: its input ended (every input channel's ``End``; a source: its last batch read), but an
    op under way here still needs it (a prepared topology change, records held for bins on their way);
    the op's completion finishes it. A change that gives it new input channels takes it back to
    ``RUNNING``. ``FINISHED``: final output and ``End`` queued on every output.
    """

    RUNNING = "running"
    FINISHING = "finishing"
    FINISHED = "finished"

    @property
    def finished(self) -> bool:
        return self is InstanceLifecycle.FINISHED

    @property
    def input_done(self) -> bool:
        """Its input ended (it finishes once no op under way needs it)."""
        return self is not InstanceLifecycle.RUNNING

    def input_ended(self) -> InstanceLifecycle:
        """Its input ended (again, while it waits): ``RUNNING | FINISHING -> FINISHING``."""
        if self is InstanceLifecycle.FINISHED:
            raise IllegalTransition(self, "end its input (it finished)")
        return InstanceLifecycle.FINISHING

    def reopen(self) -> InstanceLifecycle:
        """A topology change gave it new input channels: ``FINISHING | RUNNING -> RUNNING``."""
        if self is InstanceLifecycle.FINISHED:
            raise IllegalTransition(self, "take new inputs (it finished)")
        return InstanceLifecycle.RUNNING

    def finish(self) -> InstanceLifecycle:
        """Final output and ``End`` went out: ``FINISHING -> FINISHED``."""
        if self is not InstanceLifecycle.FINISHING:
            raise IllegalTransition(self, "finish (only an instance whose input ended finishes, once)")
        return InstanceLifecycle.FINISHED


class SourceLifecycle(enum.Enum):
    """What a source reads: ``READING -> EXHAUSTED`` (its last batch was read)."""

    READING = "reading"
    EXHAUSTED = "exhausted"

    @property
    def exhausted(self) -> bool:
        return self is SourceLifecycle.EXHAUSTED

    def exhaust(self) -> SourceLifecycle:
        """Its logic returned no batch: ``READING -> EXHAUSTED``."""
        if self is SourceLifecycle.EXHAUSTED:
            raise IllegalTransition(self, "be exhausted twice (it reads nothing once exhausted)")
        return SourceLifecycle.EXHAUSTED


class SourceGate(enum.Enum):
    """Whether a source may read: ``OPEN <-> HALTED``.

    A stop's final checkpoint halts a source at its cut (it reads nothing after it, but still takes control
    ops); if that checkpoint fails and the job runs on, the source is opened again. Both moves are
    idempotent (a resume reaches every source, halted or not). Independent of :class:`SourceLifecycle`: a
    source held open for a rescale's op after its last batch may be halted too.
    """

    OPEN = "open"
    HALTED = "halted"

    @property
    def halted(self) -> bool:
        return self is SourceGate.HALTED

    def halt(self) -> SourceGate:
        """``OPEN | HALTED -> HALTED``."""
        return SourceGate.HALTED

    def open(self) -> SourceGate:
        """``OPEN | HALTED -> OPEN``."""
        return SourceGate.OPEN


class HostLifecycle(enum.Enum):
    """A host actor's run loop: ``RUNNING -> STOPPED`` (aborted, or an operator or the host failed).

    Stopping is idempotent (an abort after a failure); a stopped loop never runs again (a recycled host
    starts with a new lifecycle).
    """

    RUNNING = "running"
    STOPPED = "stopped"

    @property
    def stopped(self) -> bool:
        return self is HostLifecycle.STOPPED

    def stop(self) -> HostLifecycle:
        """``RUNNING | STOPPED -> STOPPED``."""
        return HostLifecycle.STOPPED
