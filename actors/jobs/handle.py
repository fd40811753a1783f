"""handle.py: ``JobHandle``, the one interface of a job, that the driver's ``Job`` and ``AttachedJob`` implement.

Every verb a job has is a method of ``JobHandle``; the job manager's remote
methods (``detached.JobManager``) and the CLI's job verbs
(``chiray/cli_jobs.py``) are derived from it (``VERBS``), never listed
again. Both handles give the same answers and raise the same errors:

* a verb that needs a running job, on an ended one: ``JobEndedError``;
* ``wait(timeout)``: ``TimeoutError`` while running, ``ValueError`` for a
  negative timeout, the job's failure (``OperatorError``, ``JobFailedError``)
  or ``JobCancelledError``;
* ``cancel()`` of an ended job does nothing (it is idempotent);
* ``forget()`` of a running job: ``ChirayError``; after it, ``status()``
  and the other verbs raise ``JobNotFoundError``.

Example:
    >>> import chiray
    >>> from chiray.actors.jobs.handle import JobHandle
    >>> flow = chiray.Dataflow("tiny")
    >>> _ = flow.source(chiray.from_items([{"x": 1}])).sink(chiray.collect())
    >>> job = chiray.submit(flow)                                   # doctest: +SKIP
    >>> isinstance(job, JobHandle)                                  # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from chiray.control.oprun import OpFailedError

from ..errors import ChirayError
from .joblogs import JobLogs
from .jobvalues import CheckpointInfo, JobInfo, RescaleProgress, RescaleRecord, UpgradeRecord
from .rescale import RescaleError
from .savepoints import SavepointInfo

if TYPE_CHECKING:
    import pyarrow as pa

    from chiray.control.ops.monitor import MonitorResult

    from .jobstatus import JobStatistics, JobStatus
    from .ophandle import OpHandle

__all__ = ["JobHandle", "RescaleControl", "VERBS", "READING_VERBS", "JobEndedError", "JobNotFoundError",
           "check_timeout", "ended_error"]


class JobEndedError(OpFailedError, RescaleError):
    """A verb that needs a running job was called on one that has ended.

    It is an ``OpFailedError`` and a ``RescaleError`` too, what ``checkpoint()`` and ``rescale()`` raised
    for an ended job before; catch it as ``ChirayError``.
    """


class JobNotFoundError(ChirayError, LookupError):
    """No job of that name (on the cluster, or a driver's job that was forgotten)."""


def ended_error(name: str, state: object, verb: str) -> JobEndedError:
    """The error for ``verb`` on job ``name`` that ended in ``state``: the same text from both handles."""
    return JobEndedError(f"job {name!r} has ended ({str(getattr(state, 'value', state)).lower()}); there is "
                         f"nothing left to {verb}")


def check_timeout(timeout: float | None) -> None:
    """The one timeout rule: ``None`` waits forever, ``0`` polls, a negative value is a ``ValueError``."""
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be None (wait forever), 0 (poll) or positive, got {timeout}")


@runtime_checkable
class RescaleControl(Protocol):
    """A rescale or migration in progress (``JobHandle.rescale`` / ``migrate``)."""

    def progress(self) -> RescaleProgress:
        """Where it is: state, steps, bins and bytes moved, elapsed time."""
        ...

    def done(self) -> bool:
        """Whether it ended."""
        ...

    def result(self, timeout: float | None = None) -> RescaleProgress:
        """Wait for it; its final progress (``TimeoutError`` while running, its error if it failed)."""
        ...


@runtime_checkable
class JobHandle(Protocol):
    """A job, running or ended: what a user can ask of it and do to it.

    Attributes:
        name: the job's name.
    """

    name: str

    def status(self) -> JobStatus:
        """The job's ``JobStatus``: state, finished instances, events (as text and as ``JobEvent``s), error."""
        ...

    def info(self) -> JobInfo:
        """A summary: state, uptime, operators and parallelism, last checkpoint, records/s."""
        ...

    def statistics(self) -> JobStatistics:
        """Per-instance ``JobStatistics`` (the last snapshot once the job ended)."""
        ...

    def metrics(self, timeout: float | None = 60.0) -> MonitorResult:
        """A ``Monitor`` op's result, run in-band now (per instance: state bytes, keys, per-bin load)."""
        ...

    def rescale(self, operator: str, parallelism: int, strategy: str = "all_at_once", planner: str = "ssm",
                **knobs: Any) -> RescaleControl:
        """Change an operator's parallelism while the job runs; no record is lost or processed twice.

        Args:
            operator: a keyed or stateless operator (not a source or sink).
            parallelism: the new number of instances (>= 1).
            strategy: "all_at_once" (one blocking step), "batched" (``chunk_bins`` per
                step), "fluid" (one bin per step) or "non_disruptive" (non-blocking steps;
                only records of moving bins wait for their state).
            planner: "ssm" (minimum bytes moved within load bound ``theta``),
                "round_robin" or "consistent_hash".
            **knobs: ``chunk_bins``, ``chunks``, ``priority`` ("hot_first", "arrival",
                "random"), ``replicate`` (non_disruptive), ``gap_s``, ``pace`` (each step
                waits for the backlog the one before left), ``theta``, ``seed``, ``step_timeout_s``.

        Returns:
            A handle: ``progress()`` and ``result(timeout)``.

        Raises:
            ValueError / TypeError: an unknown operator, strategy, planner or knob, a
                parallelism < 1, a source or sink, a keyed strategy for a stateless operator.
            RescaleError: another rescale of the operator is running.
            JobEndedError: the job has ended (a ``RescaleError`` too).
        """
        ...

    def migrate(self, operator: str, assignment: list[int], strategy: str = "all_at_once",
                **knobs: Any) -> RescaleControl:
        """Move bins among the existing instances of a keyed operator (a new bin -> instance table)."""
        ...

    def rescales(self) -> tuple[RescaleRecord, ...]:
        """The rescale history: when, operator, from -> to, strategy, duration, bytes, outcome."""
        ...

    def upgrade(self, operator: str, fn: Any, *, on_timer: Any = None, schema: Any = None,
                migrate_state: Any = None, canary: int = 0, rate_bound: float = 0.5,
                timeout: float | None = 60.0) -> UpgradeRecord:
        """Replace ``operator``'s code while the job runs: every record is processed wholly by the old or wholly
        by the new code, the operators upstream never stop, and keyed state is kept.

        The new code is first run on a sample of the operator's recent input (it must not raise, and must return
        the declared ``schema``, else the old code's output schema). Then a blocking control op that holds only the
        operator's inputs swaps it in at each instance, at a cut whose position the returned record gives. A later
        checkpoint records the new code, so a recovery or a restore runs it.

        Example::

            record = job.upgrade("enrich", enrich_v2)                  # map, filter, flat_map
            job.upgrade("sessions", count_v2, migrate_state=lambda key, old: {"n": old, "sum": 0}, canary=20)

        Args:
            operator: a ``map``, ``filter``, ``flat_map`` (batch or record level) or keyed ``process``.
            fn: the new function (its signature as the old one's).
            on_timer: a keyed process's new ``on_timer`` (None: keep it).
            schema: the output schema the new code returns (None: the old code's).
            migrate_state: ``fn(key, old_value) -> new_value`` (None deletes the key), applied to each key's
                state of a keyed process at the cut.
            canary: run the new code on instance 0 for this many batches first, its output held; if it raises,
                changes the output schema or its records out per record in depart from the old code's by more
                than ``rate_bound`` (a fraction of the larger), the old code and state come back at the cut and
                the records it saw are processed again by the old code (nothing lost, nothing emitted twice).
            rate_bound: the canary's output rate bound.
            timeout: seconds each of its control ops may take (the canary's trial included).

        Returns:
            The upgrade's ``UpgradeRecord``: old and new code identity, cut, pause, duration.

        Raises:
            UpgradeError: refused before the cut: an unknown operator or one without user code, code that does not
                pickle, raises on the sample or returns another schema.
            CanaryRolledBackError: the canary failed (an ``UpgradeError``); the old code runs on.
            JobEndedError: the job has ended.
        """
        ...

    def upgrades(self) -> tuple[UpgradeRecord, ...]:
        """The upgrade history: when, operator, old and new code, canary result, duration, pause, cut."""
        ...

    def add_branch(self, from_operator: str, build: Callable[..., object], timeout: float | None = 60.0) -> Any:
        """Add operators and sinks downstream of the running operator ``from_operator`` (``build(stream)`` adds
        them with the usual verbs) at a cut: they see every record it emits after the cut. Returns the
        ``BranchCut``; a detached job's record keeps the changed dataflow."""
        ...

    def remove_branch(self, sink: str, timeout: float | None = 60.0) -> Any:
        """Drain and remove the branch that ends in ``sink`` at a cut: it received every record emitted before
        the cut. Returns the ``BranchCut``; ``result(sink)`` then gives what the sink received."""
        ...

    def checkpoint(self, timeout: float | None = 120.0) -> int:
        """An aligned, durable checkpoint now; its id."""
        ...

    def checkpoint_info(self, timeout: float | None = 120.0) -> CheckpointInfo:
        """An aligned, durable checkpoint now: its id, path and how long it took."""
        ...

    def savepoint(self, dir: str | None = None, timeout: float | None = 120.0) -> str:
        """A checkpoint copied to ``dir`` (default ``<checkpoint_dir>/savepoints``), kept until deleted; its path."""
        ...

    def savepoints(self) -> tuple[SavepointInfo, ...]:
        """The job's savepoints, oldest first: path, checkpoint id, time, size and the run that took each (those
        under ``<checkpoint_dir>/savepoints``, and those it took into other directories)."""
        ...

    def delete_savepoint(self, path: str) -> SavepointInfo:
        """Delete one of the job's savepoints (``path``: its ``chk-N`` directory); returns it. Refused
        (``SavepointError``) for a path that is not one of its savepoints and for one that a running job was
        restored from."""
        ...

    def stop(self, savepoint: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """Stop gracefully: a final checkpoint (a savepoint into ``savepoint`` if given), the sinks commit it,
        later output is discarded, the hosts stop; the job ends ``FINISHED``. Returns that checkpoint."""
        ...

    def cancel(self) -> None:
        """Stop now; output after the last checkpoint is discarded. An ended job is left as it is."""
        ...

    def wait(self, timeout: float | None = None) -> None:
        """Block until the job ends; raise its failure or ``JobCancelledError``, ``TimeoutError`` if running."""
        ...

    def result(self, sink: str | None = None) -> Any:
        """A finished job's sink result (``collect()``: a table); waits for the end first."""
        ...

    def tail(self, sink: str | None = None, n: int = 10) -> pa.Table:
        """The newest ``n`` rows that reached ``sink`` of the running job, oldest first (a ``pyarrow.Table``).

        A look at the output as it flows, whatever the sink (``collect()``, ``to_parquet``, ``print()``...):
        the rows are counted as they reach the sink, before a checkpoint commits them. Each sink instance
        keeps its newest 1,000 rows.

        Args:
            sink: the sink operator's name; may be omitted when there is one sink.
            n: how many rows, 1 to 1,000.

        Raises:
            ValueError: no such sink (or several and none named), or ``n`` out of range.
            JobEndedError: the job has ended (its output is in ``result()``).

        Example::

            job = chiray.submit(flow)
            print(job.tail("out", 5).to_pandas())
        """
        ...

    def logs(self, lines: int = 100, since: Any = None) -> JobLogs:
        """The log lines Ray keeps of the job's actors (a detached job's manager, the hosts, the controller),
        each with its actor: the last ``lines`` of each, or only those after ``since`` (an earlier answer's
        ``cursor``). An ended job's: those of the actors it ran on last."""
        ...

    def run_control(self, op: Any, controller: str | None = None) -> OpHandle:
        """Start a control op on the running job; returns its ``OpHandle`` (``result(timeout)``)."""
        ...

    def autoscale(self, enabled: bool = True, **options: Any) -> object:
        """Switch the DS2 autoscaler on (``latency_budget_ms=``, ``min_parallelism=``, ...) or off."""
        ...

    def forget(self) -> None:
        """Drop an ended job's record, results and statistics (a running one: ``ChirayError``)."""
        ...


VERBS: tuple[str, ...] = tuple(name for name, value in vars(JobHandle).items()
                               if callable(value) and not name.startswith("_"))
"""Every verb of a job, in the protocol's order: what the job manager answers and the CLI offers."""

READING_VERBS = frozenset({"status", "info", "statistics", "rescales", "upgrades", "wait", "result", "tail", "logs",
                           "savepoints", "rescale_progress", "rescale_result"})
"""The verbs that change nothing: a client retries them while a job manager restarts."""
