"""harness.py: runs every ``HostCore`` of a job in one process, without Ray, for deterministic tests.

Cross-host envelopes, grants and control traffic are delivered by the
harness in parcels, as the transport sends them, optionally shuffled and
duplicated (as Ray may do), so channel ordering, credits, the mailbox loop
and the control plane are exercised exactly as in the actors. A built-in controller runs control ops.

Example:
    >>> from chiray.operators import Dataflow, from_items
    >>> flow = Dataflow("t"); flow.source(from_items([{"x": 1}])).collect(name="out")  # doctest: +SKIP
    >>> LocalRun(flow).run()["out"].to_pylist()                                        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, Callable

from chiray.control.coordination import OpCoordinator
from chiray.control.oprun import OpRun, job_view
from chiray.control.trees import Relay
from chiray.operators.dataflow import Dataflow
from chiray.operators.graph import OperatorKind, physical_plan

from .config import JobConfig
from .build import control_trees
from .mailbox import HostCore
from .outbox import Outbox
from .messages import Parcel
from .placement import place

__all__ = ["LocalRun"]


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
        self.hosts = [HostCore(i, self.plan, self.placement, self.config, clock=clock) for i in range(n)]
        self.rng = random.Random(seed) if seed is not None else None
        self._in_flight: list[tuple[int, Parcel]] = []
        self.broadcast, _ = control_trees(self.plan, self.placement, self.config.control_fanout)
        self.ops = OpCoordinator("controller", job_view(flow.name, self.plan))
        self._seq = 0
        self._finished_sinks: set = set()

    # -- control ---------------------------------------------------------------------

    def run_control(self, op: Any) -> OpRun:
        """Inject ``op`` now (at the sources' next step); returns its run (see ``.state``)."""
        message = dataclasses.replace(self.ops.start(op), seq=self._seq)
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
            if self.rng is not None:
                for items in (parcel.envelopes, parcel.runs, parcel.grants, parcel.extra, parcel.ended,
                              parcel.relays, parcel.injections, parcel.collects):
                    self.rng.shuffle(items)
                if self.rng.random() < 0.2:  # a re-run Ray call: some envelopes and control runs twice
                    parcel.envelopes.extend(parcel.envelopes[: self.rng.randint(0, len(parcel.envelopes))])
                    parcel.runs.extend(dataclasses.replace(r, channels=list(r.channels), seqs=list(r.seqs),
                                                           senders=list(r.senders))
                                       for r in parcel.runs[: self.rng.randint(0, len(parcel.runs))])
            self.hosts[dst].receive(parcel)
        return True

    def step_all(self) -> bool:
        """One step of every host that can run, then some deliveries; False when quiescent."""
        progressed = False
        for host in self.hosts:
            progressed |= host.run_step()
        self._collect()
        progressed |= self._deliver_some()
        return progressed

    def run(self, max_rounds: int = 1_000_000, until: Any = None) -> dict[str, Any]:
        """Run to completion (or until ``until()`` is true); return each sink's combined result."""
        for _ in range(max_rounds):
            if until is not None and until():
                return {}
            if not self.step_all() and all(h.done for h in self.hosts) and not self._in_flight:
                break
        else:
            raise RuntimeError("LocalRun did not finish within max_rounds")
        return self.results()

    def results(self) -> dict[str, Any]:
        results: dict[tuple[str, int], Any] = {}
        for host in self.hosts:
            results.update(host.sink_results())
        out = {}
        for node in self.plan.graph.nodes.values():
            if node.kind is OperatorKind.SINK:
                assert node.sink is not None
                parts = [results[(node.name, i)] for i in range(node.parallelism)]
                node.sink.commit_final(parts)
                out[node.name] = node.sink.combine(parts)
        return out

    def instance(self, name: tuple[str, int]) -> Any:
        """The ``OperatorInstance`` called ``name``."""
        return self.hosts[self.placement[name]].by_name[name]
