"""checkpoints.py: the job controller's checkpoints: their numbers, the fenced storage they commit through,
and the sinks' and sources' commits once one is durable.

A plain class without Ray (the controller starts the op and waits for it): it builds each ``Checkpoint``
op with the callbacks the op calls at the controller. Its commits are fenced (``control.fencing``): each
deployment takes a token from the job's storage, and a deployment whose token a newer one passed commits
nothing and retires (``on_stale``).
"""

from __future__ import annotations

import functools
import time
from typing import Callable, Collection

from chiray.control.coordination import JobLifecycle
from chiray.control.fencing import Fence, FencedStorage, StaleIncarnationError
from chiray.control.ops.chains import ChainBound
from chiray.control.ops.checkpoint import Checkpoint, CheckpointStore
from chiray.operators.logic import Sink, Source

from ..config import JobConfig
from ..errors import JobFailedError
from .storage import CheckpointStorage

__all__ = ["CheckpointBook"]


class CheckpointBook:
    """The checkpoints one controller starts, and what their commits do at the controller.

    Args:
        job_name: the job, for messages.
        config: its configuration (retention, the bound on change chains).
        storage: where its checkpoints go (None: it takes none).
        sinks, sources: the job's sink and source objects by operator name (their commits).
        next_id: the number the next checkpoint takes.
        lifecycle: the job's lifecycle: a sink commit that keeps failing loses the job, a stale commit
            fails it, a source's failed ``checkpoint_complete`` is an event.
        notify: called after the lifecycle changed (the controller tells its waiters and hosts).
        taking: the ids of the checkpoints still being taken (retention leaves their directories).

    Only the controller's event loop touches it, but for the sink and source commits, which the
    checkpoint op calls on its own thread.
    """

    SINK_COMMIT_TRIES = (0.05, 0.25)  # seconds before the second and third try of a sink commit

    def __init__(self, job_name: str, config: JobConfig, storage: CheckpointStorage | None,
                 sinks: dict[str, Sink], sources: dict[str, Source], next_id: int, lifecycle: JobLifecycle,
                 notify: Callable[[], None], taking: Callable[[], Collection[int]] = frozenset) -> None:
        self.job_name = job_name
        self.config = config
        self.storage = storage
        self.sinks = sinks
        self.sources = sources
        self.next_id = next_id
        self.durable = 0  # the newest checkpoint known durable (0: none yet, or not known since a restart)
        self.fence_token = 0  # this deployment's (see control.fencing); 0 until a deployment takes one
        self._fence = Fence.of(storage) if hasattr(storage, "fs") else None
        self._lifecycle = lifecycle
        self._notify = notify
        self._taking = taking

    def deployed(self, fence_token: int | None) -> None:
        """A deployment starts: under ``fence_token`` (None: take the next one from the storage's fence)."""
        if fence_token is not None:
            self.fence_token = fence_token
        elif self._fence is not None:
            self.fence_token = self._fence.advance(self.fence_token)

    def restarted_from(self, checkpoint_id: int) -> None:
        """The job restarted from its own checkpoint ``checkpoint_id``: that one is durable."""
        self.durable = max(self.durable, checkpoint_id)

    def commit_storage(self) -> CheckpointStore:
        """The storage a checkpoint commits through: fenced by this deployment's token (see ``_retire``)."""
        assert self.storage is not None, f"bug: job {self.job_name!r} has no checkpoint storage"
        if self._fence is None:
            return self.storage
        return FencedStorage(self.storage, self._fence, self.fence_token, self._retire)

    def next_op(self, operators: dict[str, dict[str, object]], final: bool, full: bool) -> Checkpoint:
        """The next checkpoint's op (it takes the next number); the job has checkpoint storage."""
        checkpoint_id = self.next_id
        self.next_id += 1
        config = self.config
        return Checkpoint(checkpoint_id, self.commit_storage(), config.checkpoints_to_keep,
                          functools.partial(self._commit_sinks, checkpoint_id=checkpoint_id),
                          {"name": self.job_name, "operators": operators},
                          commit_sources=self._commit_sources, durable=self.durable, on_durable=self._durable,
                          final=final, full=full,
                          bound=ChainBound(config.checkpoint_max_deltas, config.checkpoint_max_delta_ratio),
                          taking=self._taking)

    def _commit_sinks(self, sink: str, staged: list[object], checkpoint_id: int) -> None:
        """Make what checkpoint ``checkpoint_id`` (durable now) lists for ``sink`` visible. Tried three
        times; if it still fails, the job recovers from that checkpoint, whose recovery commits it (a
        failed commit is never skipped: the next checkpoint would not list this output again)."""
        for delay in (*self.SINK_COMMIT_TRIES, None):
            try:
                self.sinks[sink].commit(staged)
                return
            except Exception as exc:
                if delay is not None:
                    time.sleep(delay)
                    continue
                reason = f"sink {sink!r} could not commit checkpoint {checkpoint_id}: {exc!r}"
                self._lifecycle.lost(JobFailedError(f"job {self.job_name!r}: {reason}"), reason)
                self._notify()

    def _retire(self, error: StaleIncarnationError) -> None:
        """A newer deployment replaced this one (this side was cut off): fail here and abort the hosts;
        nothing of this deployment is committed from now on (the job itself runs on elsewhere)."""
        if not self._lifecycle.state.terminal:
            self._lifecycle.fail(error, str(error))
            self._notify()

    def _durable(self, checkpoint_id: int) -> None:
        self.durable = max(self.durable, checkpoint_id)

    def _commit_sources(self, source: str, checkpoint_id: int, offsets: dict[str, object]) -> None:
        try:
            self.sources[source].checkpoint_complete(checkpoint_id, offsets)
        except Exception as exc:  # the checkpoint stands; the source only keeps data longer
            self._lifecycle.events.append(
                f"source {source!r}: checkpoint_complete({checkpoint_id}) failed: {exc!r}")
