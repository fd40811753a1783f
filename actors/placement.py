"""placement.py: which host actor runs which operator instance.

By default there are as many hosts as the largest operator parallelism.
Keyed (stateful) instance ``i`` goes to host ``i``, so each gets its own
process and core; other instances go to host ``n - 1 - i`` (mod n), so that
forward edges between equal-parallelism operators stay inside one host and
sources and sinks do not pile onto the first stateful instance's host.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from operators.graph import OperatorKind, PhysicalPlan

__all__ = ["place"]


def place(plan: PhysicalPlan, num_hosts: int | None = None,
          pins: Mapping[str, Sequence[int]] | None = None) -> tuple[int, dict[tuple[str, int], int]]:
    """Return (number of hosts, (operator, index) -> host id).

    Args:
        plan: the job's physical plan.
        num_hosts: how many hosts; default: the largest parallelism (or more, if pins need it).
        pins: operator -> host id per instance index, overriding the default rule.

    Raises:
        ValueError: a pin names an unknown operator, has the wrong length, or a host out of range.
    """
    nodes = plan.graph.nodes
    pins = dict(pins or {})
    for op, hosts in pins.items():
        if op not in nodes:
            raise ValueError(f"placement: unknown operator {op!r}; operators: {list(nodes)}")
        if len(hosts) != nodes[op].parallelism or any(h < 0 for h in hosts):
            raise ValueError(
                f"placement: operator {op!r} needs {nodes[op].parallelism} host ids >= 0, got {list(hosts)}")
    needed = max((h + 1 for hosts in pins.values() for h in hosts), default=1)
    n = num_hosts or max(needed, max(node.parallelism for node in nodes.values()))
    if needed > n:
        raise ValueError(f"placement: pins name host {needed - 1} but num_hosts is {n}")
    placement: dict[tuple[str, int], int] = {}
    for op, index in plan.instances:
        if op in pins:
            placement[(op, index)] = pins[op][index]
        elif nodes[op].kind is OperatorKind.KEYED:
            placement[(op, index)] = index % n
        else:
            placement[(op, index)] = (n - 1 - index) % n
    return n, placement
