"""mailbox.py: the host's mailbox loop as a plain class: deliveries in, one step at a time, sends out.

:class:`HostCore` makes every decision of an ``OperatorHost`` and is driven
without Ray in tests: ``deliver()`` and ``grant()`` only enqueue;
``run_step()`` lets one runnable instance process one message; ``take_outbox()``
hands the envelopes and credit grants bound for other hosts to the shell.
Channels between two instances of the same host are handed over in memory.

Lifecycle: ``RUNNING -> DONE`` (every instance drained) or ``FAILED``.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import time
from typing import Any, Iterable

from chiray.control.message import ControlMessage, ControlReturn, InstanceId, instance_id
from chiray.control.trees import Relay
from chiray.operators.endpoints import SinkLogic
from chiray.operators.graph import PhysicalPlan

from .channel import InputChannel, OutputChannel
from .config import JobConfig
from .instance import OperatorInstance
from .statistics import InstanceStatistics
from .messages import ControlRun, Envelope, Grant, Parcel
from .relay import RelayTable
from .restore import RestoreInfo
from .topology import plan_instance_change
from .build import build_instance, control_trees
from .outbox import Outbox, RunGatherer

__all__ = ["HostCore", "RECHECK_S"]

RECHECK_S = 0.05
"""A source whose next batch is not due is looked at again after at most this long."""

CREDIT_DELAY_S = 0.05
"""Credit owed to a sender on another host waits at most this long (see ``HostCore._return_credit``)."""


class HostCore:
    """The decisions of one host actor.

    Args:
        host_id: this host's id.
        plan: the job's physical plan.
        placement: (operator, index) -> host id, for every instance of the job.
        config: channel capacities and friends.
        restore: a checkpoint to start from (recovery or restore into a new job).
    """

    def __init__(self, host_id: int, plan: PhysicalPlan, placement: dict[tuple[str, int], int],
                 config: JobConfig, restore: RestoreInfo | None = None):
        self.host_id = host_id
        self.config = config
        self.placement = placement
        self.instances: list[OperatorInstance] = [
            build_instance(plan, name, config, host_id, restore)
            for name in plan.instances if placement[name] == host_id
        ]
        self.by_name = {inst.name: inst for inst in self.instances}
        broadcast, aggregation = control_trees(plan, placement, config.control_fanout)
        self.relays = RelayTable(host_id, broadcast, aggregation, placement.__getitem__,
                                 lambda message, name: self._inject_local(message, name))
        self._flat_aggregation = aggregation.depth == 0
        self._inputs: dict[int, tuple[OperatorInstance, InputChannel]] = {}
        self._outputs: dict[int, OutputChannel] = {}
        self._owner: dict[int, OperatorInstance] = {}
        for inst in self.instances:
            for ch in inst.inputs:
                self._inputs[ch.channel] = (inst, ch)
            for och in inst.output_channels():
                self._outputs[och.channel] = och
                self._owner[och.channel] = inst
        self._dst_host = {c.channel_id: placement[c.dst] for c in plan.channels}
        self._dst = {c.channel_id: c.dst for c in plan.channels}
        self._local_runs = RunGatherer()  # control messages between instances here, within one flush
        self._src_host = {c.channel_id: placement[c.src] for c in plan.channels}
        self._dirty: dict[int, None] = dict.fromkeys(self._outputs)  # output channels to drain
        self._owed: dict[int, list[int]] = {}  # channel -> [batches, bytes] consumed, credit not yet sent
        self._owed_since: float | None = None  # when the oldest owed credit was consumed
        # Scheduling: instances that may be runnable, in turn; paced sources wait on a timer heap.
        self._candidates: collections.OrderedDict[OperatorInstance, None] = collections.OrderedDict.fromkeys(
            self.instances)  # ordered: see ``OperatorInstance._ready_inputs``
        self._timers: list[tuple[float, int, OperatorInstance]] = []
        self._timer_due: dict[OperatorInstance, float] = {}  # each instance's one live timer (others are stale)
        self._timer_seq = itertools.count()
        self._injected: dict[OperatorInstance, None] = {}  # sources given a control message (``_take_injected``)
        self.ended_peers: dict[InstanceId, frozenset] = {}  # finished instance -> ops it sent on extra edges
        for inst in self.instances:
            inst.control.ended_senders = self.ended_peers
        self.outbox = Outbox()
        self.finished_events: list[OperatorInstance] = []
        self._reported: set[int] = set()
        self.took_control = False  # the last step only took control messages (see ``run_step``)

    # -- topology changes (rescale) -------------------------------------------------

    def prepare_change(self, op_id: str, plan: PhysicalPlan, placement: dict[tuple[str, int], int]) -> None:
        """Get ready for op ``op_id`` to change the topology to ``plan`` (see ``topology.py``).

        Builds the instances ``placement`` puts here that do not exist yet, and
        registers each existing instance's channel changes with it.
        """
        fresh = {i for i in plan.instances if self.placement.get(i) != placement[i]}
        for name in fresh:  # a name retired earlier may come back (on a new host)
            self.ended_peers.pop(name, None)
        self.placement.update(placement)
        for c in plan.channels:
            self._dst_host[c.channel_id] = placement[c.dst]
            self._dst[c.channel_id] = c.dst
            self._src_host[c.channel_id] = placement[c.src]
        for inst in list(self.instances):
            if inst.finished and (inst.name not in plan.instances or placement[inst.name] != self.host_id):
                self._forget(inst)  # retired by an earlier rescale on a host that others still use
                continue
            change = plan_instance_change(inst, plan, self.config.channel_capacity,
                                          self.config.channel_capacity_bytes)
            if change is None:
                continue
            if inst.finished:
                raise RuntimeError(f"{inst.info} already finished (its input ended): its channels cannot change")
            inst.prepare_change(op_id, change)
            for ich in change.inputs:
                self._inputs[ich.channel] = (inst, ich)
            for och in change.added:
                self._outputs[och.channel] = och
                self._owner[och.channel] = inst
        for name in plan.instances:
            if placement[name] == self.host_id and name not in self.by_name:
                self._add_instance(build_instance(plan, name, self.config, self.host_id))

    def _forget(self, inst: OperatorInstance) -> None:
        """Drop a finished instance that is no longer part of the job here (its name may come back
        elsewhere). Its channels' ids are never reused, so their entries may stay."""
        self.instances.remove(inst)
        if self.by_name.get(inst.name) is inst:
            del self.by_name[inst.name]
        self._candidates.pop(inst, None)
        self._timer_due.pop(inst, None)
        self._injected.pop(inst, None)

    def _add_instance(self, inst: OperatorInstance) -> None:
        self.instances.append(inst)
        self.by_name[inst.name] = inst
        inst.control.ended_senders = self.ended_peers
        for ch in inst.inputs:
            self._inputs[ch.channel] = (inst, ch)
        for och in inst.output_channels():
            self._outputs[och.channel] = och
            self._owner[och.channel] = inst
        self._candidates[inst] = None

    # -- inputs from other hosts -----------------------------------------------------

    def deliver(self, envelopes: Iterable[Envelope]) -> None:
        """Accept envelopes from other hosts (any order, possibly duplicated)."""
        for env in envelopes:
            entry = self._inputs.get(env.channel)
            if entry is None:
                raise RuntimeError(f"bug: host {self.host_id} received channel {env.channel} it does not own")
            entry[1].offer(env)
            entry[0].refresh_input(env.channel)
            self._candidates[entry[0]] = None

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
            self._candidates[inst] = None

    def inject(self, items: Iterable[tuple[ControlMessage, list[InstanceId]]]) -> None:
        """Control messages from a controller (or a relay) for sources on this host."""
        for message, targets in items:
            for name in targets:
                self._inject_local(message, instance_id(name))

    def _inject_local(self, message: ControlMessage, name: InstanceId) -> None:
        inst = self.by_name[name]
        inst.inject(message)
        self._injected[inst] = None

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
            inst.extra_inbox.append(message)
            self._candidates[inst] = None

    def peer_ended(self, ended: Iterable[tuple[InstanceId, Iterable[str]]]) -> None:
        """Instances elsewhere finished: ops here stop expecting extra-edge messages from them,
        but for the ops each sent before it finished (those messages may still be on their way)."""
        items = [(instance_id(name), frozenset(sent)) for name, sent in ended]
        self.ended_peers.update(items)  # ops that arrive later will not expect them
        for inst in self.instances:
            if not inst.control.pending_ops:
                continue
            for name, sent in items:
                inst.sender_ended(name, sent)
            self._dirty.update((ch.channel, None) for ch in inst.output_channels())
            self._candidates[inst] = None
            if inst.control_out:
                self._gather_control(inst)
            if inst.extra_sends or inst.returns:
                self._route_control(inst)
        self._flush()

    def _announce_end(self, inst: OperatorInstance) -> None:
        for host in set(self.placement.values()):
            if host != self.host_id:
                self.outbox.ended[host].append((inst.name, sorted(inst.extra_ops_sent)))
        self.peer_ended([(inst.name, inst.extra_ops_sent)])

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

    def _route_control(self, inst: OperatorInstance) -> None:
        sends, returns = inst.take_control_output()
        for name, message in sends:
            host = self.placement[name]
            if host == self.host_id:
                self.by_name[name].extra_inbox.append(message)
                self._candidates[self.by_name[name]] = None
            else:
                self.outbox.extra[host].append((name, message))
        for ret in returns:
            self.relays.sink_returned(ret)
        if inst.finished and not inst.outputs and not self._flat_aggregation:
            self.relays.sink_returned(ControlReturn(None, (inst.name,), None, ""))
        self._take_relay_output()

    def grant(self, grants: Iterable[Grant]) -> None:
        """Credit returned by receivers on other hosts."""
        for g in grants:
            self._outputs[g.channel].grant(g.batches, g.nbytes)
            self._dirty[g.channel] = None

    # -- the loop ---------------------------------------------------------------

    def run_step(self, now: float | None = None) -> bool:
        """Let one runnable instance process one message; False if none could.

        Afterwards ``took_control`` says whether that step took only control messages.

        Raises:
            OperatorFailure: an operator's code raised.
        """
        now = time.monotonic() if now is None else now
        self._flush()
        if self._injected and self._take_injected():
            return True
        while self._timers and self._timers[0][0] <= now:
            due, _, inst = heapq.heappop(self._timers)
            if self._timer_due.get(inst) == due:
                del self._timer_due[inst]
                self._candidates[inst] = None
        while self._candidates:
            inst = self._candidates.popitem(last=False)[0]
            if not inst.runnable(now):
                wake = inst.wake_time()
                if wake is not None and wake > now:
                    # Re-check a paused source at least every RECHECK_S: what it waits for may change.
                    self._set_timer(inst, min(wake, now + RECHECK_S))
                elif inst.is_source and not inst.finished and not inst._outputs_blocked():
                    # It became due between our two questions (a reader waiting on another process):
                    # look again at the next step rather than never.
                    self._set_timer(inst, now)
                continue
            self._candidates[inst] = None  # it may have more: back of the line
            self._after_step(inst, inst.step())
            self.took_control = inst.took_control
            self._flush()
            return True
        return False

    def _take_injected(self) -> bool:
        """Let every source with a control message injected take it (and what follows it in its
        inbox), in one step: the same as a step of each, without a trip through the scheduler for
        hundreds of sources that each only forward the op. False if none could."""
        injected, self._injected = self._injected, {}
        took = False
        for inst in injected:
            while inst.control_ready():
                if inst._outputs_blocked():  # it takes the op once credit frees its outputs
                    self._candidates[inst] = None
                    break
                self._after_step(inst, inst.step())
                took = True
        if took:
            self.took_control = True
            self._flush()
        return took

    def _after_step(self, inst: OperatorInstance, grants: list[Grant]) -> None:
        """What an instance's step produced: credit to return, outputs to flush, control to route."""
        self._return_credit(grants)
        if inst.control_out:
            self._gather_control(inst)
        for chs in inst.outputs:
            for ch in chs:
                self._dirty[ch.channel] = None
        if inst.closed_outputs:
            self._dirty.update((ch.channel, None) for ch in inst.closed_outputs)
            inst.closed_outputs.clear()
        newly_finished = inst.finished and id(inst) not in self._reported
        if newly_finished:
            self._reported.add(id(inst))
            self.finished_events.append(inst)
            self._announce_end(inst)
        if inst.extra_sends or inst.returns or (newly_finished and not inst.outputs):
            self._route_control(inst)
        if inst.acks:
            self.outbox.acks.extend((origin, op_id, inst.name, payload, background)
                                    for op_id, origin, payload, background in inst.acks)
            inst.acks.clear()

    def _set_timer(self, inst: OperatorInstance, due: float) -> None:
        """Look at ``inst`` again at ``due``, unless it has a timer due no later: one live timer per
        instance, however often it is found waiting (each op makes every source a candidate once)."""
        current = self._timer_due.get(inst)
        if current is not None and current <= due:
            return
        self._timer_due[inst] = due  # an entry due later, if any, is now stale
        heapq.heappush(self._timers, (due, next(self._timer_seq), inst))

    def _gather_control(self, inst: OperatorInstance) -> None:
        """Control messages ``inst`` sent at once: into runs for instances here (handed over at the
        end of the next flush) or elsewhere (in the outbox)."""
        for channel, seq, message, payload in inst.control_out:
            dst = self._dst_host[channel]
            if dst == self.host_id:
                runs = self._local_runs
            else:
                runs = self.outbox.runs.get(dst)  # type: ignore[assignment]
                if runs is None:
                    runs = self.outbox.runs[dst] = RunGatherer()
            runs.add(self._dst[channel], message, payload, channel, seq, inst.name)
        inst.control_out.clear()

    def _return_credit(self, grants: list[Grant]) -> None:
        """Credit for consumed messages: at once to a sender here; to a sender elsewhere once half
        its channel's bound is owed, or with the next parcel to its host, or after ``CREDIT_DELAY_S``.

        A call that carried one credit alone was up to half of all calls between hosts. Holding
        credit back cannot stall a sender: one without credit has its whole bound outstanding,
        so once it is consumed half of it is owed here and goes at once (a batch larger than
        the byte credit left waits at most ``CREDIT_DELAY_S``).
        """
        for g in grants:
            src = self._src_host[g.channel]
            if src == self.host_id:
                self._outputs[g.channel].grant(g.batches, g.nbytes)
                self._dirty[g.channel] = None
                continue
            owed = self._owed.get(g.channel)
            if owed is None:
                owed = self._owed[g.channel] = [0, 0]
                if self._owed_since is None:
                    self._owed_since = time.monotonic()
            owed[0] += g.batches
            owed[1] += g.nbytes
            if 2 * owed[0] >= self.config.channel_capacity or 2 * owed[1] >= self.config.channel_capacity_bytes:
                del self._owed[g.channel]
                self.outbox.grants[src].append(Grant(g.channel, owed[0], owed[1]))

    def _settle_credit(self, now: float) -> None:
        """Owed credit into the outbox: all of it once the oldest is ``CREDIT_DELAY_S`` old, else
        the credit for hosts that get a parcel anyway."""
        overdue = self._owed_since is not None and now >= self._owed_since + CREDIT_DELAY_S
        going = None if overdue else self.outbox.hosts()
        for channel in list(self._owed):
            src = self._src_host[channel]
            if going is None or src in going:
                batches, nbytes = self._owed.pop(channel)
                self.outbox.grants[src].append(Grant(channel, batches, nbytes))
        if not self._owed:
            self._owed_since = None

    def _flush(self) -> None:
        """Move sendable envelopes of dirty output channels to their receivers or the outbox.

        Control messages go in runs (``RunGatherer``): one per receiving instance and op.
        """
        now = time.monotonic()
        local_runs = self._local_runs
        while self._dirty:
            channel = self._dirty.popitem()[0]
            envs = self._outputs[channel].drain()
            owner = self._owner[channel]
            if owner.note_outputs(now):  # credit let its held-back output go: it may run again
                self._candidates[owner] = None
            if not envs:
                continue
            dst = self._dst_host[channel]
            if dst == self.host_id:
                inst, ich = self._inputs[channel]
                for env in envs:
                    if type(env.message) is ControlMessage:
                        local_runs.add_envelope(inst.name, env)
                    else:
                        ich.offer(env)
                inst.refresh_input(channel)
                self._candidates[inst] = None
            else:
                for env in envs:
                    if type(env.message) is ControlMessage:
                        runs = self.outbox.runs.get(dst)
                        if runs is None:
                            runs = self.outbox.runs[dst] = RunGatherer()
                        runs.add_envelope(self._dst[channel], env)
                    else:
                        self.outbox.envelopes[dst].append(env)
        if local_runs:
            for run in local_runs.take():
                inst = self.by_name[run.target]
                inst.offer_run(run)
                self._candidates[inst] = None

    def take_outbox(self, now: float | None = None) -> Outbox:
        """What to send to other hosts now; the core forgets it."""
        if self._owed:
            self._settle_credit(time.monotonic() if now is None else now)
        out, self.outbox = self.outbox, Outbox()
        return out

    def take_finished(self) -> list[OperatorInstance]:
        """Instances that finished since the last call (to report to the controller)."""
        out, self.finished_events = self.finished_events, []
        return out

    def next_wakeup(self) -> float | None:
        """The earliest time a paced source becomes runnable or owed credit must go, if any."""
        wake = self._timers[0][0] if self._timers else None
        if self._owed_since is not None:
            due = self._owed_since + CREDIT_DELAY_S
            wake = due if wake is None else min(wake, due)
        return wake

    @property
    def done(self) -> bool:
        """Every instance finished and its output left this host."""
        return all(i.drained for i in self.instances) and not self.outbox

    def statistics(self) -> list[InstanceStatistics]:
        return [i.statistics() for i in self.instances]

    def sink_results(self) -> dict[tuple[str, int], Any]:
        return {(i.info.operator, i.info.index): i.sink_result()
                for i in self.instances if isinstance(i.logic, SinkLogic)}

    def close(self) -> None:
        """Close every instance (aborts unfinished sinks). Idempotent."""
        for inst in self.instances:
            inst.close()
