"""rescale.py: live rescale and bin migration of a running job: a plan, then its steps one by one.

``Job.rescale(operator, parallelism, strategy=..., planner=...)`` and
``Job.migrate(operator, assignment)`` start a :class:`RescaleRun` (a thread of
the driver, like the supervisor) and return its :class:`RescaleHandle`.

A run: read per-bin load and state size in-band (``Monitor``) when the
planner or the prioritisation needs them; make the plan
(``control.rescaleplan.plan_rescale``: the new table from ``control.planning``,
the moves cut into steps by the strategy); then carry out each step in turn
(``rescaler.Rescaler``; the Ray calls are ``rescalejob.JobTarget``'s).

* ``all_at_once``: one blocking step moving every bin (Chi's Algorithm 1; a
  migration that swaps bins between two instances takes two steps, since
  old owners that wait for each other's bins would wait for ever);
* ``batched`` (``chunk_bins=k``) and ``fluid`` (k = 1): Megaphone's sequence
  of small blocking steps, each after the previous one completed, with an
  optional ``gap_s`` between them, or ``pace=True``: after each step a
  non-blocking ``NoOp`` travels the dataflow behind the records that queued up
  during it, and the next step waits for it (steps paced to the backlog, so
  their queues never pile up); a step holds only the inputs of the old
  and new owners of its bins (one of each: ``rescaleplan.pair_chunks``);
* ``non_disruptive``: Spacker's protocol, non-blocking steps (the new owner
  buffers only records of the bins it waits for); with ``replicate=True``
  each step's bins are first copied to their new owners (``ReplicateBins``,
  one op just before the step), and the step moves only what changed since:
  nothing for a bin unchanged, the keys written since for state that tracks
  them (built-in aggregations), the whole bin otherwise. The bytes copied
  ahead are reported apart (``bytes_replicated``).

Knobs: ``priority`` ("hot_first": the bins with most records first,
"arrival": bin order, "random"), ``chunk_bins`` or ``chunks``
(progressiveness), ``replicate``, ``gap_s``, ``pace``, ``theta`` (the planner's load
bound), ``seed``, ``step_timeout_s`` (``control.rescaleplan.RescaleOptions``).

The topology changes with the first step of a scale-out (new instances on new
host actors, which Ray places on any node with room) and with the last step
of a scale-in (retiring instances end like at the end of input; their hosts
are removed once drained). After each step the supervisor's deployment is
updated, so a recovery restores the current topology from the last
checkpoint (bins are re-read by the current table). A step that fails while
the job runs rolls the job back to its last checkpoint: a half-done step
cannot be left in place.

Rescales of different operators run one after the other (each plans from
the topology the previous one left); a second rescale of the same operator
while one runs is an error.

Lifecycle of a run: ``WAITING -> PLANNING -> MIGRATING -> DONE | FAILED``.
"""

from __future__ import annotations

import threading
from typing import Mapping

from .jobvalues import RescaleProgress, RescaleState
from .rescalejob import JobTarget, RunningJob
from .rescaler import STRATEGIES, RescaleError, RescaleRequest, Rescaler, Tally, check_request

__all__ = ["RescaleHandle", "RescaleError", "STRATEGIES", "start_rescale"]


class RescaleHandle:
    """A rescale or migration in progress.

    Attributes:
        operator: the operator.
        strategy: the strategy.
    """

    def __init__(self, run: "RescaleRun"):
        self._run = run
        self.operator = run.request.operator
        self.strategy = run.request.strategy

    def progress(self) -> RescaleProgress:
        """Where the rescale is: state, steps, bins and bytes moved, elapsed time."""
        return self._run.tally.progress()

    def done(self) -> bool:
        return not self._run.is_alive()

    def result(self, timeout: float | None = None) -> RescaleProgress:
        """Wait for the rescale; returns its final progress.

        Raises:
            TimeoutError: still running after ``timeout``.
            RescaleError: it failed (the message says what happened to the job).
        """
        self._run.join(timeout)
        if self._run.is_alive():
            raise TimeoutError(f"rescale of {self.operator!r} still running after {timeout} s")
        if self._run.error is not None:
            raise self._run.error
        return self.progress()


class RescaleRun(threading.Thread):
    """Runs one rescale of a job on Ray in a thread of the driver; its errors say what happened to the job."""

    def __init__(self, job: RunningJob, request: RescaleRequest):
        super().__init__(name=f"chiray-rescale-{job.name}-{request.operator}", daemon=True)
        self.job, self.request = job, request
        self.tally = Tally(request)
        self.target = JobTarget(job, request.operator, self.tally)
        self.error: RescaleError | None = None

    def run(self) -> None:
        state = RescaleState.FAILED
        try:
            with self.job.topology.rescale_turn():  # rescales of different operators take turns
                self.tally.start()
                Rescaler(self.target, self.request, self.tally).run()
            state = RescaleState.DONE
        except Exception as exc:  # report, never leave the caller waiting
            self.error = self.target.explain(exc)
        finally:
            self.tally.end(state)
            self.job.topology.release_rescale(self.request.operator)


def start_rescale(job: RunningJob, operator: str, parallelism: int | None, strategy: str, planner: str,
                  assignment: list[int] | None, knobs: Mapping[str, object]) -> RescaleHandle:
    """Check the call (errors raise here, in the caller) and start the run."""
    request = check_request(job.name, job.plan, operator, parallelism, strategy, planner, assignment, knobs)
    if job.final_snapshot is not None:
        raise RescaleError(f"job {job.name!r} has ended; nothing to rescale")
    if not job.topology.claim_rescale(operator):
        raise RescaleError(f"a rescale of {operator!r} is already running; wait for it (handle.result())")
    run = RescaleRun(job, request)
    run.start()
    return RescaleHandle(run)
