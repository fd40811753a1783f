"""placement.py: which host actor runs which operator instance.

By default, stateful (keyed) instance ``i`` of every keyed operator goes to
host ``i``, so no stateful instance shares its process and core with a
source, a sink or a stateless operator; stateless instance ``i`` goes to host
``K + i``, where K is the largest keyed parallelism, so forward edges between
equal-parallelism stateless operators stay inside one host. That makes at
most twice the largest parallelism hosts.

With ``num_hosts`` given, keyed instance ``i`` goes to host ``i mod n`` and
other instance ``i`` to host ``n - 1 - i mod n``. Pins override both.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from chiray.operators.graph import OperatorKind, PhysicalPlan

__all__ = ["place"]


def place(plan: PhysicalPlan, num_hosts: int | None = None,
          pins: Mapping[str, Sequence[int]] | None = None) -> tuple[int, dict[tuple[str, int], int]]:
    """Return (number of hosts, (operator, index) -> host id).

    The default host count is the largest keyed parallelism plus the largest
    other parallelism (see the module docstring).

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
        if (len(hosts) != nodes[op].parallelism
                or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in hosts)):
            raise ValueError(
                f"placement: operator {op!r} needs {nodes[op].parallelism} host ids >= 0, got {list(hosts)}")
    needed = max((h + 1 for hosts in pins.values() for h in hosts), default=1)
    keyed = max((n.parallelism for n in nodes.values() if n.kind is OperatorKind.KEYED), default=0)
    free = max((n.parallelism for n in nodes.values() if n.kind is not OperatorKind.KEYED), default=0)
    n = num_hosts or max(needed, keyed + free)
    if needed > n:
        raise ValueError(f"placement: pins name host {needed - 1} but num_hosts is {n}")
    placement: dict[tuple[str, int], int] = {}
    for op, index in plan.instances:
        if op in pins:
            placement[(op, index)] = pins[op][index]
        elif num_hosts is None:
            placement[(op, index)] = index if nodes[op].kind is OperatorKind.KEYED else keyed + index
        elif nodes[op].kind is OperatorKind.KEYED:
            placement[(op, index)] = index % n
        else:
            placement[(op, index)] = (n - 1 - index) % n
    return n, placement
