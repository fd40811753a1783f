"""mailbox.py: the host's mailbox loop as a plain class: deliveries in, one step at a time, sends out.

:class:`HostCore` makes every decision of an ``OperatorHost`` and is driven
without Ray in tests: ``deliver()`` and ``grant()`` only enqueue;
``run_step()`` lets one runnable instance process one message; ``take_outbox()``
hands the envelopes and credit grants bound for other hosts to the shell.
Channels between two instances of the same host are handed over in memory.

Its pieces, one job each: the channel table (``channeltable.py``), the
scheduler (``scheduler.py``), the credit owed to other hosts
(``channel.CreditLedger``) and the outbox (``outbox.py``); an instance's step hands its
host one frozen ``StepResult``. Every time the loop reads comes from one
injectable clock, so a test that passes a fake one drives it deterministically.

Lifecycle: ``RUNNING -> DONE`` (every instance drained) or ``FAILED``.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, TypedDict

from chiray.control.message import ControlMessage, ControlReturn, InstanceId, instance_id
from chiray.control.trees import Relay
from chiray.operators.endpoints import SinkLogic
from chiray.operators.graph import PhysicalPlan

from .build import build_instance, control_trees
from .channel import CreditLedger
from .channeltable import ChannelTable
from ..config import JobConfig
from .instance import OperatorInstance
from .messages import ControlRun, Envelope, Grant, Parcel
from .outbox import Outbox, RunGatherer
from .relay import RelayTable
from .restore import RestoreInfo
from .scheduler import Scheduler
from .source import SourceInstance
from .statistics import InstanceStatistics
from .stepresult import ControlSend, StepResult
from .topology import ChangePrepared, plan_instance_change

__all__ = ["HostCore", "LongStep"]


class LongStep(TypedDict):
    """The step running now, as a host's liveness check tells it (``HostCore.long_step``)."""

    operator: str
    index: int
    function: str  # the user function's qualified name, else the operator logic's class
    seconds: float  # how long it has run
    since: float  # when it began (time.monotonic())


class HostCore:
    """The decisions of one host actor.

    Args:
        host_id: this host's id.
        plan: the job's physical plan.
        placement: (operator, index) -> host id, for every instance of the job.
        config: channel capacities and friends.
        restore: a checkpoint to start from (recovery or restore into a new job).
        clock: every time the loop reads (seconds, monotonic).
    """

    def __init__(self, host_id: int, plan: PhysicalPlan, placement: dict[tuple[str, int], int],
                 config: JobConfig, restore: RestoreInfo | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.host_id = host_id
        self.config = config
        self.placement = placement
        self.clock = clock
        self.instances: list[OperatorInstance] = [
            build_instance(plan, name, config, host_id, restore)
            for name in plan.instances if placement[name] == host_id
        ]
        self.by_name = {inst.name: inst for inst in self.instances}
        broadcast, aggregation = control_trees(plan, placement, config.control_fanout)
        self.relays = RelayTable(host_id, broadcast, aggregation, placement.__getitem__,
                                 lambda message, name: self._inject_local(message, name))
        self._flat_aggregation = aggregation.depth == 0
        self.channels = ChannelTable(host_id)
        self.channels.route(plan, placement)
        for inst in self.instances:
            self.channels.add_instance(inst)
        self._local_runs = RunGatherer()  # control messages between instances here, within one flush
        self._dirty: dict[int, None] = dict.fromkeys(self.channels.outputs)  # output channels to drain
        self.credit = CreditLedger(config.channel_capacity, config.channel_capacity_bytes)
        self.scheduler: Scheduler[OperatorInstance] = Scheduler(self.instances)
        self.ended_peers: dict[InstanceId, frozenset] = {}  # finished instance -> ops it sent on extra edges
        for inst in self.instances:
            inst.control.share_ended_peers(self.ended_peers)
        self.outbox = Outbox()
        self.finished_events: list[OperatorInstance] = []
        self.took_control = False  # the last step only took control messages (see ``run_step``)
        self.stepping: tuple[OperatorInstance, float] | None = None  # the step running now, since (monotonic)

    # -- topology changes (rescale) -------------------------------------------------

    def prepare_change(self, op_id: str, plan: PhysicalPlan,
                       placement: dict[tuple[str, int], int]) -> ChangePrepared:
        """Get ready for op ``op_id`` to change the topology to ``plan`` (see ``topology.py``).

        Builds the instances ``placement`` puts here that do not exist yet,
        registers each existing instance's channel changes with it, and holds
        every running source here open until the op has passed it. Returns what
        it did (the rescale checks that the op can still reach every instance
        that waits for it).
        """
        changed: list[InstanceId] = []
        held: list[InstanceId] = []
        fresh = {i for i in plan.instances if self.placement.get(i) != placement[i]}
        for name in fresh:  # a name retired earlier may come back (on a new host)
            self.ended_peers.pop(name, None)
        self.placement.update(placement)
        self.channels.route(plan, placement)
        for inst in list(self.instances):
            if inst.finished and (inst.name not in plan.instances or placement[inst.name] != self.host_id):
                self._forget(inst)  # retired by an earlier rescale on a host that others still use
                continue
            change = plan_instance_change(inst, plan, self.config.channel_capacity,
                                          self.config.channel_capacity_bytes)
            if change is None:
                if isinstance(inst, SourceInstance) and not inst.finished:
                    inst.hold_for(op_id)
                    held.append(inst.name)
                continue
            if inst.finished:
                raise RuntimeError(f"{inst.info} already finished (its input ended): its channels cannot change")
            inst.prepare_change(op_id, change)  # a source is held by it too
            self.channels.add(inst, change.inputs, change.added)
            changed.append(inst.name)
            if isinstance(inst, SourceInstance):
                held.append(inst.name)
        for name in plan.instances:
            if placement[name] == self.host_id and name not in self.by_name:
                self._add_instance(build_instance(plan, name, self.config, self.host_id))
        return ChangePrepared(tuple(changed), tuple(held))

    def _forget(self, inst: OperatorInstance) -> None:
        """Drop a finished instance that is no longer part of the job here (its name may come back
        elsewhere). Its channels' ids are never reused, so their entries may stay."""
        self.instances.remove(inst)
        if self.by_name.get(inst.name) is inst:
            del self.by_name[inst.name]
        self.scheduler.forget(inst)

    def _add_instance(self, inst: OperatorInstance) -> None:
        self.instances.append(inst)
        self.by_name[inst.name] = inst
        inst.control.share_ended_peers(self.ended_peers)
        self.channels.add_instance(inst)
        self.scheduler.wake(inst)

    # -- inputs from other hosts -----------------------------------------------------

    def deliver(self, envelopes: Iterable[Envelope]) -> None:
        """Accept envelopes from other hosts (any order, possibly duplicated)."""
        for env in envelopes:
            inst, ich = self.channels.receiver(env.channel, self.host_id)
            ich.offer(env)
            inst.refresh_input(env.channel)
            self.scheduler.wake(inst)

    def receive(self, parcel: Parcel) -> None:
        """Everything another host (or a controller) sent in one call."""
        if parcel.grants:
            self.grant(parcel.grants)
        if parcel.envelopes:
            self.deliver(parcel.envelopes)
        if parcel.runs:
            self.deliver_runs(parcel.runs)
        if parcel.extra:
            self.deliver_extra(parcel.extra)
        if parcel.ended:  # after the extra-edge messages its sender sent before it ended
            self.peer_ended(parcel.ended)
        if parcel.relays:
            self.relay(parcel.relays)
        if parcel.injections:
            self.inject(parcel.injections)
        if parcel.collects:
            self.collect(parcel.collects)

    def deliver_runs(self, runs: Iterable[ControlRun]) -> None:
        """Accept control runs from other hosts (any order, possibly duplicated)."""
        for run in runs:
            inst = self.by_name.get(instance_id(run.target))
            if inst is None:
                raise RuntimeError(f"bug: host {self.host_id} received a control run for {run.target} "
                                   "it does not host")
            inst.offer_run(run)
            self.scheduler.wake(inst)

    def inject(self, items: Iterable[tuple[ControlMessage, list[InstanceId]]]) -> None:
        """Control messages from a controller (or a relay) for sources on this host."""
        for message, targets in items:
            for name in targets:
                self._inject_local(message, instance_id(name))

    def _inject_local(self, message: ControlMessage, name: InstanceId) -> None:
        inst = self.by_name[name]
        if not isinstance(inst, SourceInstance):
            raise RuntimeError(f"bug: control message injected at non-source {inst.info}")
        inst.inject(message)
        self.scheduler.injected(inst)

    def relay(self, items: Iterable[tuple[ControlMessage, Relay]]) -> None:
        """Broadcast relays hosted here forward control messages to their children."""
        for message, relay in items:
            self.relays.relay(message, relay)
        self._take_relay_output()

    def collect(self, items: Iterable[tuple[ControlReturn, Relay]]) -> None:
        """Aggregation relays hosted here collect sink returns."""
        for ret, relay in items:
            self.relays.collect(ret, relay)
        self._take_relay_output()

    def deliver_extra(self, items: Iterable[tuple[InstanceId, ControlMessage]]) -> None:
        """Control messages along an op's extra (control-only) edges."""
        for name, message in items:
            inst = self.by_name[instance_id(name)]
            inst.control.deliver_extra(message)
            self.scheduler.wake(inst)

    def peer_ended(self, ended: Iterable[tuple[InstanceId, Iterable[str]]]) -> None:
        """Instances elsewhere finished: ops here stop expecting extra-edge messages from them,
        but for the ops each sent before it finished (those messages may still be on their way)."""
        items = [(instance_id(name), frozenset(sent)) for name, sent in ended]
        self.ended_peers.update(items)  # ops that arrive later will not expect them
        results = [(inst, inst.senders_ended(items)) for inst in self.instances if inst.control.pending_ops]
        for inst, result in results:
            self.scheduler.wake(inst)
            self._after_step(inst, result)
        self._flush()

    def _announce_end(self, inst: OperatorInstance) -> None:
        for host in set(self.placement.values()):
            if host != self.host_id:
                self.outbox.ended[host].append((inst.name, sorted(inst.control.extra_ops_sent)))
        self.peer_ended([(inst.name, inst.control.extra_ops_sent)])

    def _take_relay_output(self) -> None:
        out = self.relays.take_output()
        mine = self.outbox.control
        for host, items in out.relays.items():
            mine.relays[host].extend(items)
        for host, injections in out.injections.items():
            mine.injections[host].extend(injections)
        for host, collects in out.collects.items():
            mine.collects[host].extend(collects)
        mine.returns.extend(out.returns)

    def _route_control(self, inst: OperatorInstance, result: StepResult) -> None:
        for name, message in result.extra:
            host = self.placement[name]
            if host == self.host_id:
                self.by_name[name].control.deliver_extra(message)
                self.scheduler.wake(self.by_name[name])
            else:
                self.outbox.extra[host].append((name, message))
        for ret in result.returns:
            self.relays.sink_returned(ret)
        if result.finished and not inst.outputs and not self._flat_aggregation:
            self.relays.sink_returned(ControlReturn(None, (inst.name,), None, ""))
        self._take_relay_output()

    def grant(self, grants: Iterable[Grant]) -> None:
        """Credit returned by receivers on other hosts."""
        for g in grants:
            self.channels.outputs[g.channel].grant(g.batches, g.nbytes)
            self._dirty[g.channel] = None

    # -- the loop ---------------------------------------------------------------

    def run_step(self, now: float | None = None) -> bool:
        """Let one runnable instance process one message; False if none could.

        Afterwards ``took_control`` says whether that step took only control messages.

        Raises:
            OperatorFailure: an operator's code raised.
        """
        now = self.clock() if now is None else now
        self._flush(now)
        if self._take_injected(now):
            return True
        inst = self.scheduler.next_runnable(now)
        if inst is None:
            return False
        self.stepping = (inst, time.monotonic())  # read by the host's liveness thread
        try:
            result = inst.step()
        finally:
            self.stepping = None
        self._after_step(inst, result)
        self.took_control = result.took_control
        self._flush(now)
        return True

    def long_step(self) -> LongStep | None:
        """The step running now (from another thread): its operator, instance, user function and seconds."""
        stepping = self.stepping
        if stepping is None:
            return None
        inst, since = stepping
        fn = getattr(inst.logic, "fn", None)  # the user function, where the operator has one
        function = getattr(fn, "__qualname__", None) or type(inst.logic).__name__
        return LongStep(operator=inst.info.operator, index=inst.info.index, function=function,
                        seconds=time.monotonic() - since, since=since)

    def _take_injected(self, now: float) -> bool:
        """Let every source with a control message injected take it (and what follows it in its
        inbox), in one step: the same as a step of each, without a trip through the scheduler for
        hundreds of sources that each only forward the op. False if none could."""
        took = False
        for inst in self.scheduler.take_injected():
            while inst.control_ready():  # type: ignore[attr-defined]  # sources only
                if inst.outputs_blocked():  # it takes the op once credit frees its outputs
                    self.scheduler.wake(inst)
                    break
                self._after_step(inst, inst.step())
                took = True
            else:  # an op may have changed what it waits for (a resume after a stop's cut): ask it in turn
                self.scheduler.wake(inst)
        if took:
            self.took_control = True
            self._flush(now)
        return took

    def _after_step(self, inst: OperatorInstance, result: StepResult) -> None:
        """What an instance's step produced: credit to return, outputs to flush, control to route."""
        if result.grants:
            self._return_credit(result.grants)
        if result.control:
            self._gather_control(inst.name, result.control)
        for chs in inst.outputs.edges:
            for ch in chs:
                self._dirty[ch.channel] = None
        if result.closed:
            self._dirty.update((ch.channel, None) for ch in result.closed)
        if result.finished:
            self.finished_events.append(inst)
            self._announce_end(inst)
        if result.extra or result.returns or (result.finished and not inst.outputs):
            self._route_control(inst, result)
        if result.acks:
            self.outbox.acks.extend(result.acks)

    def _gather_control(self, sender: InstanceId, sends: tuple[ControlSend, ...]) -> None:
        """Control messages an instance sent at once: into runs for instances here (handed over at the
        end of the next flush) or elsewhere (in the outbox)."""
        dst_host, dst = self.channels.dst_host, self.channels.dst
        for send in sends:
            host = dst_host[send.channel]
            if host == self.host_id:
                runs = self._local_runs
            else:
                runs = self.outbox.runs.get(host)  # type: ignore[assignment]
                if runs is None:
                    runs = self.outbox.runs[host] = RunGatherer()
            runs.add(dst[send.channel], send.message, send.payload, send.channel, send.seq, sender)

    def _return_credit(self, grants: tuple[Grant, ...]) -> None:
        """Credit for consumed messages: at once to a sender here, through the ledger to one elsewhere."""
        for g in grants:
            src = self.channels.src_host[g.channel]
            if src == self.host_id:
                self.channels.outputs[g.channel].grant(g.batches, g.nbytes)
                self._dirty[g.channel] = None
                continue
            due = self.credit.owe(g, src, self.clock())
            if due is not None:
                self.outbox.grants[src].append(due)

    def _flush(self, now: float | None = None) -> None:
        """Move sendable envelopes of dirty output channels to their receivers or the outbox.

        Control messages go in runs (``RunGatherer``): one per receiving instance and op.
        """
        now = self.clock() if now is None else now
        local_runs, table, wake = self._local_runs, self.channels, self.scheduler.wake
        while self._dirty:
            channel = self._dirty.popitem()[0]
            envs = table.outputs[channel].drain()
            owner = table.owner[channel]
            if owner.note_outputs(now):  # credit let its held-back output go: it may run again
                wake(owner)
            if not envs:
                continue
            dst = table.dst_host[channel]
            if dst == self.host_id:
                inst, ich = table.inputs[channel]
                for env in envs:
                    if type(env.message) is ControlMessage:
                        local_runs.add_envelope(inst.name, env)
                    else:
                        ich.offer(env)
                inst.refresh_input(channel)
                wake(inst)
            else:
                for env in envs:
                    if type(env.message) is ControlMessage:
                        runs = self.outbox.runs.get(dst)
                        if runs is None:
                            runs = self.outbox.runs[dst] = RunGatherer()
                        runs.add_envelope(table.dst[channel], env)
                    else:
                        self.outbox.envelopes[dst].append(env)
        if local_runs:
            for run in local_runs.take():
                inst = self.by_name[run.target]
                inst.offer_run(run)
                wake(inst)

    def take_outbox(self, now: float | None = None) -> Outbox:
        """What to send to other hosts now; the core forgets it."""
        if self.credit:
            going = self.outbox.hosts()
            for host, grant in self.credit.settle(self.clock() if now is None else now, going):
                self.outbox.grants[host].append(grant)
        out, self.outbox = self.outbox, Outbox()
        return out

    def take_finished(self) -> list[OperatorInstance]:
        """Instances that finished since the last call (to report to the controller)."""
        out, self.finished_events = self.finished_events, []
        return out

    def next_wakeup(self) -> float | None:
        """The earliest time a paced source becomes runnable or owed credit must go, if any."""
        wake, due = self.scheduler.next_timer, self.credit.deadline
        if due is not None:
            wake = due if wake is None else min(wake, due)
        return wake

    @property
    def done(self) -> bool:
        """Every instance finished and its output left this host."""
        return all(i.drained for i in self.instances) and not self.outbox

    def statistics(self) -> list[InstanceStatistics]:
        return [i.statistics() for i in self.instances]

    def sink_results(self) -> dict[InstanceId, object]:
        return {(i.info.operator, i.info.index): i.sink_result()
                for i in self.instances if isinstance(i.logic, SinkLogic)}

    def close(self) -> None:
        """Close every instance (aborts unfinished sinks). Idempotent."""
        for inst in self.instances:
            inst.close()
