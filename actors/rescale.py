"""rescale.py: live rescale and bin migration of a running job, driven from the driver.

``Job.rescale(operator, parallelism, strategy=..., planner=...)`` and
``Job.migrate(operator, assignment)`` start a :class:`RescaleRun` (a thread of
the driver, like the supervisor) and return its :class:`RescaleHandle`.

A run: read per-bin load and state size in-band (``Monitor``) when the
planner or the prioritisation needs them; plan the new table
(``control.planning``); cut the moves into steps (the strategy); then, step
by step, carry each out as one ``MigrateBins`` control op and wait for it:

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
bound), ``seed``. Which bins move in which step is pure code
(``control/rescaleplan.py``); this module runs the steps.

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
import time
import uuid
from typing import Any, Mapping

import numpy as np
import ray

from chiray.control.coordination import JobState
from chiray.control.oprun import OpFailedError, OpTimeoutError, job_view
from chiray.control.ops.migrate import MigrateBins, ReplicateBins
from chiray.control.ops.monitor import Monitor
from chiray.control.ops.noop import NoOp
from chiray.control.planning import Assignment, plan as plan_assignment
from chiray.control.rescaleplan import RescaleOptions, Strategy, plan_steps, unreached
from chiray.operators.errors import ChirayError
from chiray.operators.graph import OperatorKind, PhysicalPlan, rescaled_plan

from .controller import controller_host
from .jobvalues import RescaleProgress, RescaleState
from .ophandle import OpHandle

__all__ = ["RescaleHandle", "RescaleError", "STRATEGIES", "start_rescale"]

STRATEGIES = tuple(s.value for s in Strategy)
KEYED_STRATEGIES = tuple(s.value for s in Strategy if s.moves_bins)
STEP_POLL_S = 1.0
"""While a step's op runs, whether the job ended is checked this often."""


class RescaleError(ChirayError, RuntimeError):
    """A rescale or migration could not be carried out (the reason says what happened to the job)."""


class RescaleHandle:
    """A rescale or migration in progress.

    Attributes:
        operator: the operator.
        strategy: the strategy.
    """

    def __init__(self, run: "RescaleRun"):
        self._run = run
        self.operator = run.operator
        self.strategy = run.strategy

    def progress(self) -> RescaleProgress:
        """Where the rescale is: state, steps, bins and bytes moved, elapsed time."""
        return self._run.progress()

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
    """Plans and carries out one rescale (see the module docstring)."""

    def __init__(self, job: Any, operator: str, parallelism: int, strategy: str, planner: str,
                 assignment: list[int] | None, knobs: Mapping[str, Any]):
        super().__init__(name=f"chiray-rescale-{job.name}-{operator}", daemon=True)
        self.job = job
        self.operator = operator
        self.parallelism = parallelism
        self.strategy = strategy
        self.planner = planner
        self.assignment = assignment
        self.knobs = dict(knobs)
        self.error: RescaleError | None = None
        self.state = RescaleState.WAITING
        self.started = time.monotonic()
        self.finished: float | None = None
        self.steps_total = 0
        self.steps_done = 0
        self.bins_total = 0
        self.bins_moved = 0
        self.bytes_moved = 0
        self.reloaded = 0
        self.bytes_replicated = 0
        self.predicted_bytes = 0
        self.step_log: list[dict[str, Any]] = []
        self.first_step_ns: int | None = None  # when the first migration op was injected (after setup)
        self._lock = threading.Lock()

    def progress(self) -> RescaleProgress:
        with self._lock:
            return RescaleProgress(
                self.operator, self.strategy, self.state, parallelism=self.parallelism, steps_done=self.steps_done,
                steps=self.steps_total, bins_moved=self.bins_moved, bins=self.bins_total,
                bytes_moved=self.bytes_moved, bins_reloaded=self.reloaded, bytes_replicated=self.bytes_replicated,
                predicted_bytes=self.predicted_bytes, elapsed_s=(self.finished or time.monotonic()) - self.started,
                first_step_ns=self.first_step_ns, step_log=tuple(self.step_log))

    def run(self) -> None:
        try:
            with self.job.topology.rescale_turn():  # rescales of different operators take turns
                self.started = time.monotonic()
                self._run()
            self.state = RescaleState.DONE
        except RescaleError as exc:
            self.error, self.state = self._ended_first(exc) or exc, RescaleState.FAILED
        except Exception as exc:  # report, never leave the caller waiting
            error = (self._ended_first(exc) or self._recovering(exc)
                     or RescaleError(f"rescale of {self.operator!r} failed: {exc!r}"))
            error.__cause__ = exc
            self.error, self.state = error, RescaleState.FAILED
        finally:
            self.finished = time.monotonic()
            self.job.topology.release_rescale(self.operator)

    # -- the steps -------------------------------------------------------------------

    def _wait_running(self) -> None:
        """A job that is recovering is rescaled once it runs again (within ``step_timeout_s``)."""
        deadline = time.monotonic() + self.knobs.get("step_timeout_s", 120.0)
        while True:
            snap = ray.get(self.job.topology.controller.snapshot.remote(), timeout=30)
            if snap.state is not JobState.RECOVERING:
                return
            if time.monotonic() > deadline:
                raise RescaleError(f"cannot rescale {self.operator!r}: the job is still recovering "
                                   f"({snap.events[-1] if snap.events else 'a restart'}); rescale once it runs")
            time.sleep(0.1)

    def _recovering(self, exc: BaseException) -> RescaleError | None:
        """The clearer error when an actor died under the rescale because the job is recovering."""
        if not isinstance(exc, ray.exceptions.RayActorError):
            return None
        error = RescaleError(
            f"rescale of {self.operator!r} did not complete: an actor of the job died after {self.steps_done} "
            f"of {self.steps_total} steps, and the job rolls back to its last checkpoint (recovering); "
            "rescale again once it runs")
        error.__cause__ = exc
        return error

    def _run(self) -> None:
        job = self.job
        self._wait_running()
        self.state = RescaleState.PLANNING
        plan: PhysicalPlan = job.plan
        node = plan.graph.nodes[self.operator]
        old_p = node.parallelism
        keyed = node.kind is OperatorKind.KEYED
        live = set(plan.instances)  # retired instances may still show until their host goes
        ended = sorted((s.operator, s.index) for s in job.statistics().instances
                       if s.finished and (s.operator, s.index) in live)
        if ended:
            raise RescaleError(f"cannot rescale {self.operator!r}: {ended[:4]} already finished (the input "
                               "ended); a job is rescaled while its input flows")
        if not keyed:
            self.steps_total = 1
            self.state = RescaleState.MIGRATING
            self._step(plan, rescaled_plan(plan, self.operator, self.parallelism), None)
            return
        current = list(plan.bin_tables[self.operator])
        loads = sizes = None
        keys_per_bin: dict[int, int] = {}
        needs_metrics = self.planner == "ssm" or self.knobs.get("priority", "hot_first") == "hot_first"
        if needs_metrics and self.assignment is None:
            # the operator's states ready their bins' slots for the first step meanwhile
            metrics = job.run_control(Monitor(prepare_moves=self.operator)).result(
                self.knobs.get("step_timeout_s", 120.0))
            loads = metrics.bin_loads.get(self.operator)
            sizes = metrics.bin_bytes.get(self.operator)
            for (name, _), m in metrics.instances.items():
                for b, n in ((m.get("keys_per_bin") or {}) if name == self.operator else {}).items():
                    keys_per_bin[int(b)] = keys_per_bin.get(int(b), 0) + int(n)
            if sizes is not None and len(sizes) < len(current):
                sizes = np.concatenate([sizes, np.zeros(len(current) - len(sizes), dtype=np.int64)])
        if self.assignment is not None:
            table = list(self.assignment)
            moves = {b: (o, n) for b, (o, n) in enumerate(zip(current, table)) if o != n}
            result = Assignment(table, moves, 0, 0.0, "given")
        else:
            result = plan_assignment(self.planner, current, self.parallelism,
                                     None if loads is None else loads + 1, sizes,
                                     theta=self.knobs.get("theta", 0.2))
        self.predicted_bytes = result.bytes_moved
        chunks = plan_steps(RescaleOptions.of(self.strategy, self.knobs), result.moves, loads,
                            scale_out=self.parallelism > old_p)
        replicate = bool(self.knobs.get("replicate"))
        self.steps_total = len(chunks) + (sum(1 for c in chunks if c) if replicate else 0)
        self.bins_total = len(result.moves)
        self.state = RescaleState.MIGRATING
        table = list(current)
        replicas: dict[int, int] = {}
        blocking = self.strategy != "non_disruptive"
        incoming: dict[int, int] = {}  # new owner -> keys the rescale brings it
        for b, (_, new_owner) in result.moves.items():
            incoming[new_owner] = incoming.get(new_owner, 0) + keys_per_bin.get(b, 0)
        retiring = list(range(self.parallelism, old_p))  # a scale-in's old owners that go
        for k, chunk in enumerate(chunks):
            for b in chunk:
                table[b] = result.table[b]
            last = k == len(chunks) - 1
            if self.parallelism > old_p:
                target_p = self.parallelism  # scale-out: new instances exist from the first step
            else:
                target_p = self.parallelism if last else old_p  # scale-in: they retire with the last
            new_plan = rescaled_plan(job.plan, self.operator, target_p, list(table))
            moves = {b: result.moves[b] for b in chunk}
            if replicate and moves:  # copy this step's bins now: the step then moves what changed since
                replicas = self._replicate(moves)
            keys = [e.key or "" for e in node.inputs]  # keyed inputs are hash edges: each has its key
            key = keys[0] if len(set(keys)) == 1 else tuple(keys)  # a two-input operator: one per input
            op = MigrateBins(self.operator, list(table), moves, blocking, key, replicas,
                             timeout_s=self.knobs.get("step_timeout_s", 120.0),
                             everywhere=self.strategy == "all_at_once",
                             reserve={i: n for i, n in incoming.items() if n} if k == 0 else None,
                             retiring=retiring)
            self._step(job.plan, new_plan, op)
            if self.knobs.get("pace") and not last:
                self._drain()
            gap = self.knobs.get("gap_s", 0.0)
            if gap and not last:
                time.sleep(gap)  # let queues drain between steps (a pacing knob, not synchronisation)

    def _drain(self) -> None:
        """``pace``: wait until the records queued behind the last step have gone through. A
        non-blocking op, in-band behind them, completes once every instance has taken what came
        before it. Only a pace: if it fails (not the job), the next step goes on, and the step log
        says why."""
        timeout_s = self.knobs.get("step_timeout_s", 120.0)
        started = time.monotonic()
        entry: dict[str, Any] = {"step": "drain"}
        try:
            self._wait_step(self.job.run_control(NoOp(blocking=False, timeout_s=timeout_s)), timeout_s)
        except (OpFailedError, TimeoutError) as exc:
            entry["error"] = str(exc)
        entry["elapsed_s"] = time.monotonic() - started
        with self._lock:
            self.step_log.append(entry)

    def _replicate(self, moves: dict[int, tuple[int, int]]) -> dict[int, int]:
        handle = self.job.run_control(ReplicateBins(self.operator, moves))
        try:
            result = handle.result(self.knobs.get("step_timeout_s", 120.0))
        except (OpFailedError, TimeoutError) as exc:
            raise RescaleError(f"rescale of {self.operator!r}: replicating bins failed: {exc}") from exc
        with self._lock:
            self.steps_done += 1
            self.bytes_replicated += result["bytes"]
            self.step_log.append({"step": "replicate", "bins": len(result["versions"]), "bytes": result["bytes"],
                                  "elapsed_s": handle.elapsed_s})
        return dict(result["versions"])

    def _step(self, old: PhysicalPlan, new: PhysicalPlan, op: Any) -> None:
        """Carry out one op; change the topology with it if ``new`` has other instances."""
        job = self.job
        changes_topology = set(new.instances) != set(old.instances) or any(
            a.partition is not b.partition
            for n in new.graph.nodes for a, b in zip(new.graph.nodes[n].inputs, old.graph.nodes[n].inputs))
        if op is None:
            op = MigrateBins(self.operator, None, {}, True, None, None,
                             timeout_s=self.knobs.get("step_timeout_s", 120.0))
        op_id = f"controller:{uuid.uuid4().hex[:12]}:{op.kind}"
        started = time.monotonic()
        first = self.first_step_ns is None
        retiring: list[int] = []
        if changes_topology:
            placement, added, retiring = self._place(old, new)
            view = job_view(job.name, _union(old, new))
            next_view = job_view(job.name, new)
            self._prepare(op_id, new, placement, added)
            if first:
                self.first_step_ns = time.time_ns()
            controller = job.topology.controller
            handle = OpHandle(op_id, controller, op.timeout_s)
            controller.run_op.remote(op, op_id, view, next_view)
        else:
            placement = dict(job.topology.snapshot().placement)
            if first:
                self.first_step_ns = time.time_ns()
            handle = job.run_control(op, op_id=op_id)
        injected = time.monotonic()
        try:
            result = self._wait_step(handle, op.timeout_s)
        except (OpFailedError, TimeoutError) as exc:
            self._abandon(str(exc))
            raise RescaleError(f"rescale of {self.operator!r} failed during a step: {exc}") from exc
        waited = time.monotonic()
        job.apply_rescale_step(new, {i: placement[i] for i in new.instances})
        with self._lock:
            self.steps_done += 1
            self.bins_moved += result["bins"]
            self.bytes_moved += result["bytes"]
            self.reloaded += result["reloaded"]
            self.step_log.append({"step": self.steps_done, "bins": result["bins"], "bytes": result["bytes"],
                                  "elapsed_s": time.monotonic() - started, "prepare_s": injected - started,
                                  "op_s": handle.elapsed_s, "wait_s": waited - injected,
                                  "extract_s": result.get("extract_s", 0.0)})
        if retiring:
            self._retire(retiring)

    def _wait_step(self, handle: Any, timeout_s: float | None) -> Any:
        """The step op's result, waiting up to ``timeout_s``; a job that ended meanwhile (its input did)
        raises at once. The op of a step injected just before the input ended can reach instances that
        finish without acting on it: it would only fail at its timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = STEP_POLL_S if deadline is None else min(STEP_POLL_S, deadline - time.monotonic())
            try:
                return handle.result(max(left, 0.0))
            except TimeoutError as exc:
                if isinstance(exc, OpTimeoutError) or (deadline is not None and time.monotonic() >= deadline):
                    raise
                ended = self._ended_first(exc)
                if ended is not None:
                    raise ended from exc

    def _place(self, old: PhysicalPlan, new: PhysicalPlan) -> tuple[dict, list[int], list[int]]:
        """Placement after the change: each new instance on a new host; hosts left empty retire."""
        topology = self.job.topology
        snap = topology.snapshot()
        placement = {i: h for i, h in snap.placement.items() if i in set(new.instances)}
        missing = [inst for inst in new.instances if inst not in placement]
        added = list(topology.allocate_host_ids(len(missing)))  # never reused (peers forget retired ones)
        placement.update(zip(missing, added))
        used = set(placement.values())
        controller_at = controller_host(snap.controller)
        if controller_at is not None:  # the host the controller runs in stays, empty or not
            used.add(controller_at)
        retiring = [h for h in snap.host_ids if h not in used]
        full = dict(snap.placement)
        full.update(placement)
        return full, added, retiring

    def _prepare(self, op_id: str, new: PhysicalPlan, placement: dict, added: list[int]) -> None:
        """Start new hosts and have every host prepare the change (before the op is injected)."""
        job = self.job
        dep = job.deployment
        fresh = dep.take_hosts(added) if added else []
        before = job.topology.snapshot()
        peers = {**before.peers(), **dict(zip(added, fresh))}
        timeout = dep.config.deploy_timeout_s
        new_ref = ray.put(new)
        try:  # the new hosts alone: until they run, nothing of the job has changed
            errors = ray.get([h.setup.remote(new_ref, placement, dep.config, peers, job.topology.controller,
                                             None, before.incarnation, hid) for hid, h in zip(added, fresh)],
                             timeout=timeout)
            for error in errors:
                if error is not None:
                    raise error
            sides = job.side_controllers
            ray.get([h.add_controller.remote(name, side) for h in fresh for name, side in sides.items()],
                    timeout=timeout)
            ray.get([h.start.remote() for h in fresh], timeout=timeout)
        except Exception as exc:
            for h in fresh:
                ray.kill(h, no_restart=True)
            why = (f"no room for {len(fresh)} new host(s) of {dep.config.host_num_cpus} CPUs within "
                   f"deploy_timeout_s={timeout} s (Ray has {ray.available_resources().get('CPU', 0)} CPUs free)"
                   if isinstance(exc, ray.exceptions.GetTimeoutError) else f"its new hosts failed to start: {exc}")
            raise RescaleError(f"rescale of {self.operator!r} failed before any bin moved: {why}; the job runs "
                               f"on unchanged") from exc
        with job.topology.lock:  # a recovery swaps the hosts under this lock
            recovered = job.topology.being_replaced or job.topology.snapshot().incarnation != before.incarnation
            if not recovered and job.final_snapshot is None:
                job.topology.add_hosts(added, fresh)
        if recovered or job.final_snapshot is not None:  # the hosts it knew of are gone; these were never its
            for h in fresh:
                ray.kill(h, no_restart=True)
            why = "the job recovered" if recovered else f"the job ended ({job.final_snapshot.state.value})"
            raise RescaleError(f"rescale of {self.operator!r} did not complete: {why} while its new hosts started")
        try:
            prepared = ray.get([h.prepare_change.remote(op_id, new_ref, placement, peers)
                                for hid, h in peers.items() if hid not in added], timeout=timeout)
            ray.get(job.topology.controller.set_hosts.remote(peers), timeout=timeout)
        except Exception as exc:
            self._abandon(f"preparing the new topology failed: {exc!r}")
            raise RescaleError(f"rescale of {self.operator!r}: could not start its new instances: {exc}") from exc
        held = [i for p in prepared for i in p.held]
        missing = unreached(job.plan, held, [i for p in prepared for i in p.changed])
        if missing:  # every source before them ended before the prepare: they would wait for ever
            self._abandon(f"the input ended before a step's op could reach {sorted(missing)}")
            raise RescaleError(f"rescale of {self.operator!r}: the job's input ended before step "
                               f"{self.steps_done + 1}'s op could reach {sorted(missing)}")

    def _retire(self, host_ids: list[int]) -> None:
        """Wait until the retired hosts drained, then remove them."""
        job = self.job
        table = job.topology.peers()
        retired = [table[h] for h in host_ids if h in table]
        deadline = time.monotonic() + 120.0
        while retired and not all(ray.get([h.is_done.remote() for h in retired], timeout=60)):
            if time.monotonic() > deadline:
                raise RescaleError(f"rescale of {self.operator!r}: retired hosts {host_ids} did not drain")
            time.sleep(0.02)
        live = job.topology.retire_hosts(host_ids)
        ray.get(job.topology.controller.set_hosts.remote(live))
        ray.get([h.forget_peers.remote(host_ids) for h in live.values()])
        for h in retired:
            try:
                ray.kill(h, no_restart=True)
            except Exception:
                pass

    def _ended_first(self, exc: BaseException) -> RescaleError | None:
        """The clearer error when the job itself ended (e.g. its input did) before the rescale completed."""
        snap = self.job.final_snapshot
        if snap is None:
            try:
                snap = ray.get(self.job.topology.controller.snapshot.remote(), timeout=5)
            except Exception:
                return None
        if not snap.state.terminal:
            return None
        error = RescaleError(
            f"rescale of {self.operator!r} did not complete: the job ended ({snap.state.value}) after "
            f"{self.steps_done} of {self.steps_total} steps")
        error.__cause__ = exc
        return error

    def _abandon(self, reason: str) -> None:
        """A step failed half-way: if the job still runs, roll it back to its last checkpoint."""
        try:
            controller = self.job.topology.controller
            snap = ray.get(controller.snapshot.remote(), timeout=30)
            if snap.state is JobState.RUNNING:
                ray.get(controller.begin_recovery.remote(
                    f"rescale of {self.operator!r} failed: {reason}"), timeout=30)
        except Exception:
            pass


def _union(old: PhysicalPlan, new: PhysicalPlan) -> PhysicalPlan:
    """Instances and channels of both plans (the topology an op sees while it changes it)."""
    seen = {c.channel_id for c in new.channels}
    channels = [*new.channels, *(c for c in old.channels if c.channel_id not in seen)]
    instances = [*new.instances, *(i for i in old.instances if i not in set(new.instances))]
    return PhysicalPlan(new.graph, instances, channels, new.output_edges, new.bin_tables, new.source_splits,
                        new.next_channel_id)


def start_rescale(job: Any, operator: str, parallelism: int | None, strategy: str, planner: str,
                  assignment: list[int] | None, knobs: Mapping[str, Any]) -> RescaleHandle:
    """Validate the call (errors raise here, in the caller) and start the run."""
    nodes = job.plan.graph.nodes
    if operator not in nodes:
        raise ValueError(f"job {job.name!r} has no operator {operator!r}; operators: {list(nodes)}")
    node = nodes[operator]
    if node.kind in (OperatorKind.SOURCE, OperatorKind.SINK):
        raise ValueError(f"operator {operator!r} is a {node.kind.value}; only keyed and stateless "
                         "operators between them can be rescaled")
    if parallelism is None:
        parallelism = node.parallelism
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise ValueError(f"rescale of {operator!r}: parallelism must be an int >= 1, got {parallelism!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"rescale of {operator!r}: unknown strategy {strategy!r}; strategies: {list(STRATEGIES)}")
    keyed = node.kind is OperatorKind.KEYED
    if not keyed and strategy in KEYED_STRATEGIES:
        raise ValueError(f"rescale of {operator!r}: strategy {strategy!r} moves key bins, but {operator!r} "
                         "is not keyed (it has no state); use strategy='all_at_once'")
    if not keyed and assignment is not None:
        raise ValueError(f"migrate: operator {operator!r} is not keyed; it has no bins to move")
    if assignment is not None:
        if len(assignment) != node.num_bins or any(
                isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= a < parallelism
                for a in assignment):
            raise ValueError(f"migrate: assignment for {operator!r} must give each of its {node.num_bins} bins "
                             f"an instance in 0..{parallelism - 1}")
    RescaleOptions.of(strategy, knobs)  # raises on an unknown or bad knob
    from chiray.control.planning import PLANNERS

    if planner not in PLANNERS:
        raise ValueError(f"rescale of {operator!r}: unknown planner {planner!r}; planners: {sorted(PLANNERS)}")
    if job.final_snapshot is not None:
        raise RescaleError(f"job {job.name!r} has ended; nothing to rescale")
    if not job.topology.claim_rescale(operator):
        raise RescaleError(f"a rescale of {operator!r} is already running; wait for it (handle.result())")
    run = RescaleRun(job, operator, parallelism, strategy, planner,
                     None if assignment is None else [int(a) for a in assignment], knobs)
    run.start()
    return RescaleHandle(run)
