"""placement.py: which host actor runs which operator instance.

By default there are as many hosts as the largest operator parallelism.
Keyed (stateful) instance ``i`` goes to host ``i``, so each gets its own
process and core; other instances go to host ``n - 1 - i`` (mod n), so that
forward edges between equal-parallelism operators stay inside one host and
sources and sinks do not pile onto the first stateful instance's host.
"""

from __future__ import annotations

from operators.graph import OperatorKind, PhysicalPlan

__all__ = ["place"]


def place(plan: PhysicalPlan, num_hosts: int | None = None) -> tuple[int, dict[tuple[str, int], int]]:
    """Return (number of hosts, (operator, index) -> host id)."""
    nodes = plan.graph.nodes
    n = num_hosts or max(node.parallelism for node in nodes.values())
    placement: dict[tuple[str, int], int] = {}
    for op, index in plan.instances:
        if nodes[op].kind is OperatorKind.KEYED:
            placement[(op, index)] = index % n
        else:
            placement[(op, index)] = (n - 1 - index) % n
    return n, placement
