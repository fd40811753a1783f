"""tail.py: ``job.tail(sink, n)``: the newest rows that reached a sink of a running job, gathered from its hosts.

Each sink instance keeps the newest rows it wrote (``operators/recent.py``);
a tail asks every host of the job for those of the sink's instances there and
merges them by arrival time. It reads, it changes nothing: the rows are what
reached the sink, whether a checkpoint has committed them yet or not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import pyarrow as pa
import ray

from chiray.operators.graph import LogicalGraph, OperatorKind, OperatorNode
from chiray.operators.recent import check_tail_rows, newest_rows

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = ["sink_node", "tail_rows"]

TAIL_TIMEOUT_S = 30.0


def sink_node(job: str, graph: LogicalGraph, sink: str | None) -> OperatorNode:
    """The sink operator ``sink`` of job ``job`` (the only one when ``None``).

    Raises:
        ValueError: no such sink, or several and none named.
    """
    sinks = [n for n in graph.nodes.values() if n.kind is OperatorKind.SINK]
    if sink is None:
        if len(sinks) != 1:
            raise ValueError(f"job {job!r} has sinks {[s.name for s in sinks]}; name one")
        return sinks[0]
    matches = [s for s in sinks if s.name == sink]
    if not matches:
        raise ValueError(f"job {job!r} has no sink {sink!r}; sinks: {[s.name for s in sinks]}")
    return matches[0]


def tail_rows(job: str, graph: LogicalGraph, hosts: Sequence[ActorHandle], sink: str | None, n: int) -> pa.Table:
    """The newest ``n`` rows that reached sink ``sink`` on ``hosts``, oldest first.

    Raises:
        ValueError: no such sink, or ``n`` outside ``1..TAIL_ROWS``.
    """
    node = sink_node(job, graph, sink)
    check_tail_rows(n)
    parts = ray.get([h.tail.remote(node.name, n) for h in hosts], timeout=TAIL_TIMEOUT_S)
    return newest_rows((part for host_parts in parts for part in host_parts), n, node.schema)
