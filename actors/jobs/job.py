"""job.py: ``Job``, the driver's handle on a running job (``submit.py`` deploys one): a ``JobHandle``.

``Job`` carries out the verbs of ``JobHandle``; the machinery they share (lifecycle, controller link, the
hosts' start and release) is ``jobcore.JobCore``'s, which it extends. What the verbs need beyond that lives
beside them: ``jobcontrols.OpRouter`` (where control ops go), ``jobchanges.ChangeLog`` (the rescale and
upgrade history), ``jobstatus`` (``JobStatus``, ``JobStatistics`` and what ``info()`` derives), ``jobrelease``
(what the job's end gives back).

Example:
    >>> import ray
    >>> from chiray.operators import Dataflow, from_items
    >>> from chiray.actors import submit
    >>> flow = Dataflow("tiny")
    >>> flow.source(from_items([{"x": 1}, {"x": 2}])).collect()    # doctest: +SKIP
    >>> job = submit(flow); job.wait(timeout=60)                    # doctest: +SKIP
    >>> job.result().to_pylist()                                    # doctest: +SKIP
    [{'x': 1}, {'x': 2}]
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import ray

from chiray.control.coordination import JobState
from chiray.control.op import ControlOp
from chiray.control.ops.monitor import MonitorResult
from chiray.control.oprun import OpFailedError
from chiray.operators.branch import branch_nodes, branch_of, branch_root
from chiray.operators.hashing import DEFAULT_NUM_BINS

from .autoscaler import Autoscaler, start_autoscale
from ..errors import ChirayError, JobFailedError
from .handle import check_timeout
from .brancher import BranchCut
from .jobbranches import add_branch_on_ray, remove_branch_on_ray
from .jobcore import JobCore
from .jobfiles import copy_savepoint
from .jobstatus import JobStatistics, JobStatus, collect_statistics, newest_checkpoint, source_rate
from .jobvalues import CheckpointInfo, EventKind, JobEvent, JobInfo, RescaleRecord, UpgradeRecord
from ..runtime.storage import child_uri
from .tail import sink_node, tail_rows
from .ophandle import OpHandle
from .rescale import RescaleHandle, start_rescale
from .joblogs import JobLogs, job_log_actors, job_logs
from .savepoints import SavepointInfo, delete_savepoint, find_savepoints, life_dir, running_restores, savepoint_root

if TYPE_CHECKING:
    from chiray.operators.dataflow import Stream

__all__ = ["Job", "JobStatus", "JobStatistics"]


class Job(JobCore):
    """A running (or finished) job: the driver's ``JobHandle``.

    Use one Job handle from one thread; its supervisor thread may swap the
    actors underneath (recovery) in ``topology`` (a ``JobTopology``, which
    says who changes what). ``plan`` and ``view`` change with rescale steps
    (``apply_rescale_step``). Lifecycle:
    ``RUNNING (<-> RECOVERING) -> FINISHED | FAILED | CANCELLED``; once
    terminal, its actors are gone. What the verbs share (the lifecycle, the
    controller link, the hosts' start and release) is ``jobcore.JobCore``'s.
    """

    # -- waiting ---------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> None:
        """Block until the job finishes.

        Args:
            timeout: seconds; ``None`` waits forever, ``0`` polls.

        Raises:
            TimeoutError: still running after ``timeout``.
            OperatorError: a user function raised (its exception is the cause).
            JobFailedError: the job failed otherwise (a host died).
            JobCancelledError: the job was cancelled.
            JobNotFoundError: the job was forgotten.
        """
        check_timeout(timeout)
        self._known()
        if self._final is None:
            snap = self._call(lambda c: c.wait.remote(timeout))
            if not snap.state.terminal:
                raise TimeoutError(f"job {self.name!r} still running after {timeout} s")
            self._finalize(snap)
        self._raise_if_failed()

    def result(self, sink: str | None = None) -> Any:
        """The combined output of a sink (``collect()``: a ``pyarrow.Table``).

        Args:
            sink: the sink operator's name; may be omitted when there is one sink.

        Raises:
            ValueError: no such sink, or several and none named.
            JobNotFoundError: the job was forgotten.
        """
        self._known()
        if sink is not None and sink in self._removed_results:  # its branch was removed: it has ended
            return self._removed_results[sink]
        if self._final is None:
            self.wait()
        self._raise_if_failed()
        return self._results[sink_node(self.name, self.plan.graph, sink).name]

    def tail(self, sink: str | None = None, n: int = 10) -> pa.Table:
        """The newest ``n`` rows that reached ``sink`` of the running job, oldest first: as ``JobHandle.tail``."""
        self._running("tail")
        return tail_rows(self.name, self.plan.graph, self.topology.hosts(), sink, n)

    # -- control ---------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop the job and remove its actors; unfinished sink output is discarded. An ended job is left as
        it is (idempotent)."""
        if self._final is not None:
            return
        snap = self._halt()
        if snap.state is JobState.FINISHED:
            self._finalize(snap)
            return
        self._end(snap, remove_dir=True)  # nothing to restore from after a cancel

    def stop(self, savepoint: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """Stop gracefully: a final checkpoint (a savepoint into ``savepoint`` if given), its sink output
        committed, later output discarded, the hosts stopped; the job ends as finished.

        The final checkpoint is the job's last cut: first the autoscaler stops, running rescales and a
        running checkpoint end, and no periodic checkpoint, rescale or autoscale decision starts after
        it; so the committed output is exactly what the checkpoint (the savepoint) holds, and a job
        restored from it repeats none of it. If the final checkpoint fails, the job runs on as before.

        Args:
            savepoint: a directory to keep the final checkpoint in (as :meth:`savepoint`).
            timeout: seconds for the checkpoint.

        Returns:
            The final checkpoint (a savepoint's path if one was asked for).

        Raises:
            JobEndedError: the job has ended.
            OpFailedError / OpTimeoutError: the checkpoint failed; the job runs on.
        """
        self._running("stop")
        taken = self._final_checkpoint(savepoint, timeout)
        self._keep_statistics()
        snap = self._halt()
        if snap.state is JobState.FINISHED:  # it reached the end of its input meanwhile: all output is final
            self._finalize(snap)
        else:
            self._end_stopped(snap, taken, bool(savepoint))
        return taken

    def _final_checkpoint(self, savepoint: str | None, timeout: float | None) -> CheckpointInfo:
        """Stop's last cut (no other change starts meanwhile); if it fails, the job runs on as before."""
        scaler, self._stopping = self.autoscaler, True
        try:
            self._quiesce(timeout)
            return self.savepoint_info(savepoint, timeout) if savepoint else self.checkpoint_info(timeout)
        except BaseException:
            self._stopping = False
            if self._final is None:
                self._resume_after_stop(scaler)
            raise

    def _resume_after_stop(self, scaler: Autoscaler | None) -> None:
        """A stop's final checkpoint failed: checkpoints may start again, and so may the autoscaler it stopped."""
        try:
            self._call(lambda c: c.cancel_stop.remote(), timeout=30)
        except ray.exceptions.RayError:
            pass
        if scaler is not None and self.autoscaler is None:
            start_autoscale(self, True, **scaler.options)

    def note_event(self, text: str) -> None:
        """Add ``text`` to the job's events (``status().events``), as the autoscaler does when it pauses."""
        self._call(lambda c: c.note.remote(text), timeout=30)

    def _quiesce(self, timeout: float | None) -> None:
        """Before a stop's final checkpoint: stop the autoscaler, let running rescales end, and tell the
        controller that no other checkpoint may start (a running one ends first)."""
        if self.autoscaler is not None:
            scaler = self.autoscaler
            start_autoscale(self, False)
            scaler.join(timeout)
        for handle in self._changes.running_rescales():
            try:
                handle.result(timeout)
            except Exception:  # its outcome is in rescales(); the stop goes on
                pass
        self._call(lambda c: c.begin_stop.remote(timeout or 120.0), timeout=None if timeout is None else timeout + 30)

    def forget(self) -> None:
        """Drop an ended job's results and statistics; later verbs raise ``JobNotFoundError``.

        The driver's job keeps no record elsewhere: forgetting releases what this handle holds.

        Raises:
            ChirayError: the job still runs (stop or cancel it first).
        """
        if self._final is None:
            raise ChirayError(f"job {self.name!r} is {self.status().state.value.lower()}: stop or cancel it "
                              f"first")
        self._results, self._last_stats, self._forgotten = {}, None, True
        self._changes.forget_rescales()

    # -- control operations ----------------------------------------------------------

    def run_control(self, op: ControlOp, controller: str | None = None, op_id: str | None = None) -> OpHandle:
        """Start a control op on the running job.

        Args:
            op: a ``control.ControlOp``.
            controller: the name of a side controller (``add_controller``) to run it; default the job's.
            op_id: the op's id (default: a fresh unique one).

        Returns:
            A handle: ``result(timeout)`` waits for the op's result.

        Raises:
            JobEndedError: the job has ended.
        """
        self._running("run a control op on")
        handle = self.topology.controller if controller is None else self._ops.side(controller)
        return self._ops.start(op, handle, controller, op_id)

    def add_controller(self, name: str) -> str:
        """Start a side controller (its own actor) that can run ops concurrently; returns its name."""
        return self._ops.add_side(name, self.view, self.topology.controller)

    def rescale(self, operator: str, parallelism: int, strategy: str = "all_at_once", planner: str = "ssm",
                **knobs: object) -> RescaleHandle:
        """Change an operator's parallelism while the job runs: as ``JobHandle.rescale`` (strategies, planners,
        knobs, errors); a rescale of this handle runs in a thread of the driver."""
        self._not_stopping("rescale")
        before = self.plan.graph.nodes[operator].parallelism if operator in self.plan.graph.nodes else None
        handle = start_rescale(self, operator, parallelism, strategy, planner, None, knobs)
        return self._changes.note_rescale(handle, before, parallelism, strategy)

    def migrate(self, operator: str, assignment: list[int], strategy: str = "all_at_once",
                **knobs: object) -> RescaleHandle:
        """Move bins among the existing instances of a keyed operator (load balancing).

        Args:
            operator: a keyed operator.
            assignment: the new bin -> instance table (one entry per bin).
            strategy: as for :meth:`rescale`.
            **knobs: as for :meth:`rescale`.
        """
        self._not_stopping("rescale")
        node = self.plan.graph.nodes.get(operator)
        parallelism = node.parallelism if node is not None else None
        handle = start_rescale(self, operator, parallelism, strategy, "ssm", list(assignment), knobs)
        return self._changes.note_rescale(handle, parallelism, parallelism, strategy)

    def rescales(self) -> tuple[RescaleRecord, ...]:
        """The rescales and migrations started through this handle, oldest first, with their outcomes."""
        self._known()
        return self._changes.rescales()

    def upgrade(self, operator: str, fn: Any, *, on_timer: Any = None, schema: Any = None,
                migrate_state: Any = None, canary: int = 0, rate_bound: float = 0.5,
                timeout: float | None = 60.0) -> UpgradeRecord:
        """Replace ``operator``'s code while the job runs: as ``JobHandle.upgrade`` (the checks, the canary, the
        cut, errors); the history entry is also kept for ``upgrades()`` and noted in the job's events."""
        self._not_stopping("upgrade")
        record = self._changes.upgrade(self._run_op, self.plan, operator, fn, on_timer, schema, migrate_state,
                                       canary, rate_bound, timeout)
        self._adopt_code(operator)
        self.note_event(f"upgrade {operator} {record.old_code} -> {record.new_code} (pause "
                        f"{record.pause_ms or 0:.1f} ms)")
        return record

    def _run_op(self, op: ControlOp, timeout: float | None) -> object:
        """Run ``op`` on the job controller; its result (waiting up to ``timeout`` seconds)."""
        return self.run_control(op).result(timeout)

    def upgrades(self) -> tuple[UpgradeRecord, ...]:
        """The upgrades made through this handle, oldest first, with their outcomes."""
        self._known()
        return self._changes.upgrades()

    def add_branch(self, from_operator: str, build: Callable[[Stream], object],
                   timeout: float | None = 60.0) -> BranchCut:
        """As ``JobHandle.add_branch``: each instance of the branch starts on a host of its own, the job's plan
        (its results, checkpoints, recoveries and scale-outs) has the branch from the cut on; a recovery to a
        checkpoint taken before it starts the branch at that checkpoint's cut.

        Raises:
            BranchError: a branch refused (``operators.branch.branch_nodes`` says why), the op failed, or the
                job's input ended before it could pass.
            OutputInUseError: a sink's output is written by another running job.
        """
        self._not_stopping("add_branch")
        nodes = branch_nodes(self.plan.graph, from_operator, build, DEFAULT_NUM_BINS)
        self._running("add a branch to")
        cut = add_branch_on_ray(self, from_operator, nodes, timeout)
        self.note_event(f"add_branch from {from_operator}: {', '.join(cut.added)}")
        return cut

    def remove_branch(self, sink: str, timeout: float | None = 60.0) -> BranchCut:
        """As ``JobHandle.remove_branch``: the branch drains, its sinks' output is committed, its hosts go and
        the job's plan loses it; ``result(sink)`` answers at once.

        Raises:
            BranchError: no such sink, the job's only one, a branch that reads two running operators, the op
                failed, or the job's input ended before it could pass.
        """
        self._not_stopping("remove_branch")
        removed = branch_of(self.plan.graph, sink)
        operator = branch_root(self.plan.graph, removed)
        self._running("remove a branch of")
        cut, results = remove_branch_on_ray(self, operator, removed, timeout)
        self._removed_results.update(results)
        self.note_event(f"remove_branch {sink}: {', '.join(removed)}")
        return cut

    def refill_spare_hosts(self, timeout: float | None = None) -> None:
        """Start spare hosts for those scale-outs took (``JobConfig.spare_hosts``) and wait until they are up.

        Starting a process costs a second or more of CPU; call this when the job can
        spare it (between rescales), so that the next scale-out finds its hosts ready.

        Args:
            timeout: seconds; ``None`` waits forever, ``0`` starts them without waiting.

        Raises:
            TimeoutError: not all up after ``timeout``.
        """
        check_timeout(timeout)
        if self._deployment is not None and self._final is None:
            self._start_spares(self._deployment, timeout)

    def checkpoint(self, timeout: float | None = 120.0, full: bool = False) -> int:
        """Take an aligned, durable checkpoint now; returns its id once committed.

        A checkpoint is incremental (per key bin, what changed since the bin's previous checkpoint;
        ``JobConfig.checkpoint_max_deltas``); ``full=True`` writes every bin whole (a savepoint does).

        If the job controller dies while the checkpoint runs, the answer comes from storage: a complete
        checkpoint newer than any before the call is returned (it became durable), else it failed.

        Raises:
            JobEndedError: the job has ended (an ``OpFailedError`` too).
            OpFailedError / OpTimeoutError: the checkpoint failed (a host died, the input ended).
        """
        self._running("checkpoint")
        final = self._stopping  # the final checkpoint of stop(), the only one while it runs
        storage = self._deployment.storage if self._deployment is not None else None
        before = max(storage.committed(), default=0) if storage is not None else 0
        op_id = self._call(lambda c: c.checkpoint.remote(final, full))
        try:
            return OpHandle(op_id, self.topology.controller, timeout).result(timeout)
        except OpFailedError as exc:
            if storage is None or not isinstance(exc.__cause__, ray.exceptions.RayActorError):
                raise
            return self._durable_since(storage, before, exc)

    def checkpoint_info(self, timeout: float | None = 120.0, full: bool = False) -> CheckpointInfo:
        """As :meth:`checkpoint`; returns the checkpoint's id, path and how long it took."""
        started = time.monotonic()
        checkpoint_id = self.checkpoint(timeout, full)
        assert self._deployment is not None
        return CheckpointInfo(checkpoint_id, self._deployment.storage.chk_dir(checkpoint_id),
                              time.monotonic() - started)

    def savepoint(self, dir: str | None = None, timeout: float | None = 120.0) -> str:
        """A checkpoint now, copied to ``dir`` (default ``<checkpoint_dir>/savepoints``), kept until deleted.

        Each job life (run) has a directory of its own there, ``{dir}/{job}-{run}/chk-{id}``, so the
        savepoints of two jobs (or two lives of one) never replace each other.

        Returns:
            The savepoint's path: ``submit(flow, restore_from=<path>)`` starts a job from it (``dir``
            itself does too while it holds one job life's savepoints: the newest).

        Raises:
            ValueError: no ``dir`` for a job whose checkpoints go to a temporary directory (removed at its end).
            JobEndedError: the job has ended.
            OpFailedError / OpTimeoutError / CheckpointError: the checkpoint or its copy failed.
        """
        return self.savepoint_info(dir, timeout).path

    def savepoint_info(self, dir: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """As :meth:`savepoint`; returns the savepoint's id, path, duration and root directory."""
        self._running("savepoint")
        if dir is None and self._own_dir is not None:
            raise ValueError(f"job {self.name!r} keeps its checkpoints in a temporary directory, removed when it "
                             f"ends: give savepoint a directory (or submit with checkpoint_dir=...)")
        assert self._deployment is not None
        storage = self._deployment.storage
        life = life_dir(savepoint_root(storage.root_uri, dir), self.name, self._deployment.config.run_id)
        # full: every bin whole in the checkpoint's own directory, which the copy takes; never over another job's
        taken = copy_savepoint(storage, self.checkpoint_info(timeout, full=True), life)
        self._savepoints_taken.append(taken.path)
        return taken

    def savepoints(self) -> tuple[SavepointInfo, ...]:
        """The job's savepoints, oldest first: those under ``<checkpoint_dir>/savepoints`` and those this handle
        took into other directories (see ``chiray.actors.jobs.savepoints``)."""
        self._known()
        roots = [savepoint_root(self.checkpoint_dir)] if self.checkpoint_dir is not None else []
        return find_savepoints(self.name, roots, self._savepoints_taken)

    def delete_savepoint(self, path: str) -> SavepointInfo:
        """Delete savepoint ``path`` (its ``chk-N`` directory) of this job; returns it.

        Raises:
            SavepointError: not a savepoint of this job, or a running job was restored from it.
        """
        restores = running_restores()
        fallback = self._deployment.fallback if self._deployment is not None and self._final is None else None
        if fallback is not None:  # this job started from it: its recovery may still need it
            restores[self.name] = child_uri(fallback.storage.root_uri, f"chk-{fallback.checkpoint_id:06d}")
        return delete_savepoint(self.name, path, self.savepoints(), restores)

    def logs(self, lines: int = 100, since: JobLogs | tuple | None = None) -> JobLogs:
        """The log lines Ray keeps of the job's hosts and controller (see ``chiray.actors.jobs.joblogs``)."""
        self._known()
        return job_logs(job_log_actors(self), lines, since)

    def metrics(self, timeout: float | None = 60.0) -> MonitorResult:
        """Run a non-blocking ``Monitor`` op in-band and return its result.

        Raises:
            JobEndedError: the job has ended.
        """
        from chiray.control.ops.monitor import Monitor

        self._running("read metrics of")
        return self.run_control(Monitor()).result(timeout)

    def autoscale(self, enabled: bool = True, **options: Any) -> Autoscaler | None:
        """Switch the DS2 autoscaler on (``latency_budget_ms=``, ``min_parallelism=``, ...) or off.

        See ``chiray.actors.jobs.autoscaler.start_autoscale`` for the options; decisions are in
        ``job.autoscaler.events``.

        Returns:
            The running ``Autoscaler`` (``None`` when switched off).

        Raises:
            JobEndedError: the job has ended.
        """
        self._not_stopping("autoscale")
        return start_autoscale(self, enabled, **options)

    # -- observing -------------------------------------------------------------------

    def status(self) -> JobStatus:
        """The job's state and events (``JobNotFoundError`` once forgotten)."""
        self._known()
        try:
            snap = self._final or self._answer(lambda c: c.snapshot.remote(), "status")
        except JobFailedError:  # the supervisor gave up on the controller meanwhile
            assert self._final is not None
            snap = self._final
        history = tuple(JobEvent.of(EventKind.RUN, text=e) for e in snap.events)
        return JobStatus(self.name, snap.state, snap.finished_instances, snap.events, snap.error, history)

    def info(self) -> JobInfo:
        """A summary: state, uptime, operators and parallelism, last checkpoint, records/s."""
        state = self.status().state
        storage = self._deployment.storage if self._deployment is not None else None
        last = newest_checkpoint(None if self._own_dir and self._final else storage)
        error = self._final.error if self._final is not None else None
        rate = None
        if self._final is None:
            try:
                rate = source_rate(self.plan, self.statistics(), self.started_at)
            except ray.exceptions.RayError:
                pass
        return JobInfo(self.name, state, self.started_at, self.ended_at,
                       (self.ended_at or time.time()) - self.started_at,
                       tuple((n.name, n.parallelism) for n in self.plan.graph.nodes.values()), 0,
                       None if error is None else f"{type(error).__name__}: {error}", self.checkpoint_dir, last,
                       rate)

    def statistics(self) -> JobStatistics:
        """Per-instance counters, queue depths and back-pressured time (last snapshot once ended).

        Raises:
            ChirayError: the job ended without statistics (its hosts were gone).
        """
        self._known()
        if self._final is not None:
            if self._last_stats is None:
                raise ChirayError(f"job {self.name!r} ended without statistics")
            return self._last_stats
        self._last_stats = collect_statistics(self.topology.hosts())
        return self._last_stats
