"""harness.py: runs every ``HostCore`` of a job in one process, without Ray, for deterministic tests.

Cross-host envelopes, grants and control traffic are delivered by the
harness in parcels, as the transport sends them, optionally shuffled and
duplicated (as Ray may do), so channel ordering, credits, the mailbox loop
and the control plane are exercised exactly as in the actors. A built-in controller runs control ops.

Topology changes too: ``LocalRun.rescale`` runs a rescale's steps
(``rescaler.Rescaler``, the runner a job on Ray uses) between steps of the
loop: new hosts join, every host prepares each change, retired hosts leave
once drained. With a counting clock (``clock=counting_clock()``) a seeded run
is the same every time.

Example:
    >>> from chiray.operators import Dataflow, from_items
    >>> flow = Dataflow("t"); flow.source(from_items([{"x": 1}])).collect(name="out")  # doctest: +SKIP
    >>> LocalRun(flow).run()["out"].to_pylist()                                        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from chiray.control.coordination import JobState, OpCoordinator
from chiray.control.message import InstanceId
from chiray.control.op import ControlOp
from chiray.control.oprun import JobView, OpRun, OpState, job_view
from chiray.control.trees import Relay
from chiray.operators.branch import branch_nodes, branch_of, branch_root
from chiray.operators.dataflow import Dataflow
from chiray.operators.hashing import DEFAULT_NUM_BINS
from chiray.operators.graph import OperatorKind, PhysicalPlan, physical_plan

from ..config import JobConfig
from ..runtime.build import control_trees
from .jobvalues import RescaleProgress, RescaleState
from ..runtime.mailbox import HostCore
from ..runtime.outbox import Outbox
from ..runtime.messages import Parcel
from .placement import place
from .rescaler import HostChange, RescaleError, Rescaler, StartedOp, Tally, check_request, place_change
from ..runtime.topology import ChangePrepared
from .brancher import BranchCut, add_branch, remove_branch
from .jobvalues import UpgradeRecord
from .upgrader import run_upgrade

if TYPE_CHECKING:
    from chiray.operators.dataflow import Stream

    from ..runtime.instance import OperatorInstance

__all__ = ["LocalRun", "counting_clock"]

MAX_ROUNDS = 1_000_000
"""Rounds of the loop a wait may take before it gives up (a bug, not a slow run)."""
PAUSE_ROUNDS = 20
"""A rescale's pause between steps (``gap_s``) in-process: this many rounds of the loop."""


def counting_clock(step_s: float = 0.001) -> Callable[[], float]:
    """A clock that moves ``step_s`` on at each reading: the loop's timers (credit owed) fire after a
    fixed number of readings, so a seeded run is the same every time."""
    ticks = itertools.count()
    return lambda: next(ticks) * step_s


class LocalRun:
    """A job's hosts and controller as plain objects in this process.

    Args:
        flow: the dataflow (validated here).
        config: runtime options (``num_hosts`` picks the host count).
        seed: if given, deliveries between hosts are shuffled and some data duplicated.
        clock: the hosts' clock (a fake one makes every run of the loop deterministic).
    """

    def __init__(self, flow: Dataflow, config: JobConfig | None = None, seed: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        flow.validate()
        self.config = config or JobConfig()
        self.plan = physical_plan(flow.graph)
        n, self.placement = place(self.plan, self.config.num_hosts, self.config.placement, self.config.colocate)
        self.clock = clock
        self.hosts = [HostCore(i, self.plan, self.placement, self.config, clock=clock) for i in range(n)]
        self._by_id = {host.host_id: host for host in self.hosts}  # the live hosts (ids are never reused)
        self._next_host_id = n
        self.abandoned: list[str] = []  # why rescale steps were given up (a job on Ray would roll back)
        self.removed_results: dict[str, object] = {}  # the results of sinks whose branch was removed
        self.stalled: set[int] = set()  # hosts that take no step (busy elsewhere); deliveries wait there
        self.rng = random.Random(seed) if seed is not None else None
        self._in_flight: list[tuple[int, Parcel]] = []
        self.broadcast, _ = control_trees(self.plan, self.placement, self.config.control_fanout)
        self.ops = OpCoordinator("controller", job_view(flow.name, self.plan))
        self._seq = 0
        self._finished_sinks: set = set()

    # -- control ---------------------------------------------------------------------

    def run_control(self, op: ControlOp, op_id: str | None = None,
                    views: tuple[JobView, JobView] | None = None) -> OpRun:
        """Inject ``op`` now (at the sources' next step); returns its run (see ``.state``).

        ``views``: a topology-changing op sees the first, the ops after it the second.
        """
        started = self.ops.start(op, op_id, None if views is None else views[0])
        message = dataclasses.replace(started, seq=self._seq)
        if views is not None:
            self.ops.view = views[1]
        self._seq += 1
        for node in self.broadcast.top:
            if isinstance(node, Relay):
                self._in_flight.append((self.broadcast.host[node], Parcel(relays=[(message, node)])))
            else:
                self._in_flight.append((self.placement[node], Parcel(injections=[(message, [node])])))
        return self.ops.runs[message.op_id]

    # -- delivery --------------------------------------------------------------------

    def _collect(self) -> None:
        for host in self.hosts:
            out: Outbox = host.take_outbox()
            self._in_flight.extend(out.parcels().items())
            for ret in out.control.returns:
                self.ops.on_return(ret)
            for ack in out.acks:
                payload = ack.payload
                if ack.background:
                    try:
                        payload = payload()
                    except Exception as exc:
                        payload = exc
                self.ops.on_ack(ack.op_id, ack.instance, payload)
            for inst in host.take_finished():
                if not inst.outputs:
                    self._finished_sinks.add(inst.name)
                    self.ops.sinks_finished([inst.name])

    def _deliver_some(self) -> bool:
        if not self._in_flight:
            return False
        if self.rng is None:
            batch, self._in_flight = self._in_flight, []
        else:
            self.rng.shuffle(self._in_flight)
            k = self.rng.randint(1, len(self._in_flight))
            batch, self._in_flight = self._in_flight[:k], self._in_flight[k:]
        for dst, parcel in batch:
            host = self._by_id.get(dst)
            if host is None:  # retired: what still went to it is for no one (its peers forget it)
                continue
            if self.rng is not None:
                for items in (parcel.envelopes, parcel.runs, parcel.grants, parcel.extra, parcel.ended,
                              parcel.relays, parcel.injections, parcel.collects):
                    self.rng.shuffle(items)
                if self.rng.random() < 0.2:  # a re-run Ray call: some envelopes and control runs twice
                    parcel.envelopes.extend(parcel.envelopes[: self.rng.randint(0, len(parcel.envelopes))])
                    parcel.runs.extend(dataclasses.replace(r, channels=list(r.channels), seqs=list(r.seqs),
                                                           senders=list(r.senders))
                                       for r in parcel.runs[: self.rng.randint(0, len(parcel.runs))])
            host.receive(parcel)
        return True

    def step_all(self) -> bool:
        """One step of every host that can run, then some deliveries; False when quiescent."""
        progressed = False
        for host in self.hosts:
            if host.host_id not in self.stalled:
                progressed |= host.run_step()
        self._collect()
        progressed |= self._deliver_some()
        return progressed

    def run(self, max_rounds: int = 1_000_000, until: Callable[[], bool] | None = None) -> dict[str, object]:
        """Run to completion (or until ``until()`` is true); return each sink's combined result."""
        for _ in range(max_rounds):
            if until is not None and until():
                return {}
            if not self.step_all() and all(h.done for h in self.hosts) and not self._in_flight:
                break
        else:
            raise RuntimeError("LocalRun did not finish within max_rounds")
        return self.results()

    def results(self) -> dict[str, object]:
        """Each sink's combined result (every instance finished: the last epoch is committed)."""
        results: dict[tuple[str, int], object] = {}
        for host in self.hosts:
            results.update(host.sink_results())
        out: dict[str, object] = dict(self.removed_results)
        for node in self.plan.graph.nodes.values():
            if node.kind is OperatorKind.SINK:
                assert node.sink is not None
                parts = [results[(node.name, i)] for i in range(node.parallelism)]
                node.sink.commit_final(parts)
                out[node.name] = node.sink.combine(parts)
        return out

    def instance(self, name: tuple[str, int]) -> OperatorInstance:
        """The ``OperatorInstance`` called ``name``."""
        return self._by_id[self.placement[name]].by_name[name]

    def wait_op(self, run: OpRun) -> object:
        """Step until ``run`` ends; returns its result.

        Raises:
            OpFailedError / OpTimeoutError: the op failed.
            TimeoutError: the job came to rest with the op still running.
        """
        self._until(lambda: run.state is not OpState.RUNNING, f"control op {run.op_id}")
        if run.state is OpState.FAILED:
            assert run.error is not None
            raise run.error
        return run.result

    def _until(self, condition: Callable[[], bool], what: str) -> None:
        """Step until ``condition()``; ``TimeoutError`` if the job comes to rest first (nothing in flight or
        runnable, and no timer due but a paused source's)."""
        for _ in range(MAX_ROUNDS):
            if condition():
                return
            if not self.step_all() and not self._in_flight and self._at_rest():
                raise TimeoutError(f"{what}: still waiting with the job at rest")
        raise TimeoutError(f"{what}: still waiting after {MAX_ROUNDS} rounds")

    def _at_rest(self) -> bool:
        if self.stalled:
            return False
        now = self.clock()
        wakeups = [w for w in (h.next_wakeup() for h in self.hosts) if w is not None]
        return not wakeups or min(wakeups) > now + 3600.0

    def add_branch(self, from_operator: str, build: Callable[[Stream], object]) -> BranchCut:
        """Add the operators ``build(stream)`` adds downstream of ``from_operator`` as ``Job.add_branch`` does,
        stepping the loop while its op runs; returns its ``brancher.BranchCut``."""
        nodes = branch_nodes(self.plan.graph, from_operator, build, DEFAULT_NUM_BINS)
        return add_branch(_LocalTarget(self, from_operator, None), from_operator, nodes)

    def remove_branch(self, sink: str) -> BranchCut:
        """Remove the branch that ends in ``sink`` as ``Job.remove_branch`` does, stepping the loop while its op
        runs; the sink's result (what it received before the cut) stays in ``results()``."""
        removed = branch_of(self.plan.graph, sink)
        operator = branch_root(self.plan.graph, removed)
        sinks = {name: self.plan.graph.nodes[name] for name in removed
                 if self.plan.graph.nodes[name].kind is OperatorKind.SINK}
        cut, parts = remove_branch(_LocalTarget(self, operator, None), operator, removed)
        for name, node in sinks.items():
            assert node.sink is not None
            mine = [parts[(name, i)] for i in range(node.parallelism)]
            node.sink.commit_final(mine)
            self.removed_results[name] = node.sink.combine(mine)
        return cut

    def upgrade(self, operator: str, fn: object, **options: Any) -> UpgradeRecord:
        """Upgrade ``operator``'s code as ``Job.upgrade`` does, stepping the loop while its ops run; returns its
        ``UpgradeRecord``."""
        return run_upgrade(lambda op, timeout: self.wait_op(self.run_control(op)), self.plan, operator, fn,
                           **options)

    # -- topology changes ------------------------------------------------------------------------

    def rescale(self, operator: str, parallelism: int | None = None, strategy: str = "all_at_once",
                planner: str = "ssm", assignment: Sequence[int] | None = None,
                **knobs: object) -> RescaleProgress:
        """Rescale ``operator`` as ``Job.rescale`` (or ``migrate``, with ``assignment``) does, stepping the
        loop while each step's op runs; returns the final progress.

        Raises:
            ValueError / TypeError: a bad call (as ``Job.rescale``).
            RescaleError: a step could not be carried out (``abandoned`` says why, where a job on Ray
                would roll back to its last checkpoint).
        """
        request = check_request(self.plan.graph.name, self.plan, operator, parallelism, strategy, planner,
                                assignment, knobs)
        tally = Tally(request)
        Rescaler(_LocalTarget(self, operator, tally), request, tally).run()
        tally.end(RescaleState.DONE)
        return tally.progress()

    def add_hosts(self, plan: PhysicalPlan, placement: Mapping[InstanceId, int],
                  host_ids: Sequence[int]) -> None:
        """Start hosts ``host_ids`` with their instances of ``plan``."""
        for hid in host_ids:
            host = HostCore(hid, plan, dict(placement), self.config, clock=self.clock)
            self.hosts.append(host)
            self._by_id[hid] = host

    def new_host_ids(self, count: int) -> range:
        first, self._next_host_id = self._next_host_id, self._next_host_id + count
        return range(first, first + count)

    def retire_hosts(self, host_ids: Sequence[int]) -> None:
        """Step until hosts ``host_ids`` drained (their instances finished, output sent), then remove them."""
        gone = [self._by_id[h] for h in host_ids]
        self._until(lambda: all(h.done for h in gone), f"retired hosts {list(host_ids)} to drain")
        for host in gone:
            self.hosts.remove(host)
            del self._by_id[host.host_id]


class _LocalOp:
    """An op running in a ``LocalRun``: ``result()`` steps the loop until it ends."""

    def __init__(self, local: LocalRun, run: OpRun):
        self._local, self._run = local, run

    @property
    def elapsed_s(self) -> float:
        return self._run.elapsed_s

    def result(self, timeout: float | None = None) -> Any:
        return self._local.wait_op(self._run)


class _LocalTarget:
    """A ``LocalRun`` as the rescale of ``operator`` sees it (``rescaler.RescaleTarget``; its errors count the
    steps in ``tally``)."""

    def __init__(self, local: LocalRun, operator: str, tally: Tally | None):
        self.local, self.operator, self.tally = local, operator, tally
        self.name = local.plan.graph.name

    @property
    def plan(self) -> PhysicalPlan:
        return self.local.plan

    def placement(self) -> dict[InstanceId, int]:
        return dict(self.local.placement)

    def wait_running(self, timeout_s: float) -> None:
        pass  # never recovering

    def finished(self) -> set[InstanceId]:
        return {inst.name for host in self.local.hosts for inst in host.instances if inst.finished}

    def start_op(self, op: ControlOp, op_id: str | None = None,
                 views: tuple[JobView, JobView] | None = None) -> _LocalOp:
        return _LocalOp(self.local, self.local.run_control(op, op_id, views))

    def wait_op(self, handle: StartedOp, timeout_s: float | None) -> Any:
        """The op's result; a job that ended meanwhile (its input did) raises, as on Ray."""
        try:
            return handle.result(timeout_s)
        except TimeoutError as exc:
            if not all(host.done for host in self.local.hosts):
                raise
            where = self.tally.where() if self.tally is not None else "its start"
            raise RescaleError(f"rescale of {self.operator!r} did not complete: the job ended "
                               f"({JobState.FINISHED.value}) after {where}") from exc

    def place(self, new: PhysicalPlan) -> HostChange:
        return place_change(self.local.placement, [h.host_id for h in self.local.hosts], new,
                            self.local.new_host_ids)

    def prepare(self, op_id: str, new: PhysicalPlan, change: HostChange) -> list[ChangePrepared]:
        self.local.add_hosts(new, change.placement, change.added)
        try:
            return [host.prepare_change(op_id, new, dict(change.placement))
                    for host in self.local.hosts if host.host_id not in change.added]
        except RuntimeError as exc:  # an instance finished meanwhile: as on Ray, the job would roll back
            self.abandon(f"preparing the new topology failed: {exc!r}")
            raise RescaleError(f"rescale of {self.operator!r}: could not start its new instances: "
                               f"{exc}") from exc

    def apply(self, new: PhysicalPlan, placement: Mapping[InstanceId, int]) -> None:
        self.local.plan, self.local.placement = new, dict(placement)

    def sink_results(self, instances: list[InstanceId], timeout_s: float | None) -> dict[InstanceId, object]:
        """Step until these sink instances finished; what each returned."""
        wanted = set(instances)
        self.local._until(lambda: wanted <= self.finished(), f"sink instances {sorted(wanted)} to finish")
        found: dict[InstanceId, object] = {}
        for host in self.local.hosts:
            found.update((i, r) for i, r in host.sink_results().items() if i in wanted)
        return found

    def retire(self, host_ids: Sequence[int]) -> None:
        try:
            self.local.retire_hosts(host_ids)
        except TimeoutError as exc:
            raise RescaleError(f"rescale of {self.operator!r}: retired hosts {list(host_ids)} did not "
                               "drain") from exc

    def abandon(self, reason: str) -> None:
        self.local.abandoned.append(reason)

    def pause(self, seconds: float) -> None:
        """Let queues drain a while: a few rounds of the loop."""
        for _ in range(PAUSE_ROUNDS):
            if not self.local.step_all():
                return
