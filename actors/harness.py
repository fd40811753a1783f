"""harness.py: runs every ``HostCore`` of a job in one process, without Ray, for deterministic tests.

Cross-host envelopes and grants are delivered by the harness, optionally
shuffled and duplicated (as Ray may do), so channel ordering, credits and the
mailbox loop are exercised exactly as in the actors.

Example:
    >>> from operators import Dataflow, from_items
    >>> flow = Dataflow("t"); flow.source(from_items([{"x": 1}])).collect(name="out")  # doctest: +SKIP
    >>> LocalRun(flow).run()["out"].to_pylist()                                        # doctest: +SKIP
"""

from __future__ import annotations

import random
from typing import Any

from operators.dataflow import Dataflow
from operators.graph import OperatorKind, physical_plan

from .config import JobConfig
from .mailbox import HostCore, Outbox
from .placement import place

__all__ = ["LocalRun"]


class LocalRun:
    """A job's hosts as plain objects in this process.

    Args:
        flow: the dataflow (validated here).
        config: runtime options (``num_hosts`` picks the host count).
        seed: if given, deliveries between hosts are shuffled and some duplicated.
    """

    def __init__(self, flow: Dataflow, config: JobConfig | None = None, seed: int | None = None):
        flow.validate()
        self.config = config or JobConfig()
        self.plan = physical_plan(flow.graph)
        n, self.placement = place(self.plan, self.config.num_hosts, self.config.placement)
        self.hosts = [HostCore(i, self.plan, self.placement, self.config) for i in range(n)]
        self.rng = random.Random(seed) if seed is not None else None
        self._in_flight: list[tuple[int, str, list]] = []

    def _collect(self) -> None:
        for host in self.hosts:
            out: Outbox = host.take_outbox()
            for dst, envs in out.envelopes.items():
                self._in_flight.append((dst, "deliver", list(envs)))
            for dst, grants in out.grants.items():
                self._in_flight.append((dst, "grant", list(grants)))

    def _deliver_some(self) -> bool:
        if not self._in_flight:
            return False
        if self.rng is None:
            batch, self._in_flight = self._in_flight, []
        else:
            self.rng.shuffle(self._in_flight)
            k = self.rng.randint(1, len(self._in_flight))
            batch, self._in_flight = self._in_flight[:k], self._in_flight[k:]
        for dst, kind, items in batch:
            if self.rng is not None:
                self.rng.shuffle(items)
            if kind == "deliver":
                if self.rng is not None and self.rng.random() < 0.2:
                    items = items + items[: self.rng.randint(0, len(items))]  # a re-run Ray call
                self.hosts[dst].deliver(items)
            else:
                self.hosts[dst].grant(items)
        return True

    def step_all(self) -> bool:
        """One step of every host that can run, then some deliveries; False when quiescent."""
        progressed = False
        for host in self.hosts:
            progressed |= host.run_step()
        self._collect()
        progressed |= self._deliver_some()
        return progressed

    def run(self, max_rounds: int = 1_000_000) -> dict[str, Any]:
        """Run to completion; return each sink's combined result by sink name."""
        for _ in range(max_rounds):
            if not self.step_all() and all(h.done for h in self.hosts) and not self._in_flight:
                break
        else:
            raise RuntimeError("LocalRun did not finish within max_rounds")
        results: dict[tuple[str, int], Any] = {}
        for host in self.hosts:
            results.update(host.sink_results())
        out = {}
        for node in self.plan.graph.nodes.values():
            if node.kind is OperatorKind.SINK:
                assert node.sink is not None
                out[node.name] = node.sink.combine(results[(node.name, i)] for i in range(node.parallelism))
        return out
