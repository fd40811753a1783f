"""placement.py: which host actor runs which operator instance.

By default instances share hosts, as Flink's slots do: a job gets as many
hosts as its largest parallelism (one process per instance index, about one
per core where parallelism follows the cores), and instance ``i`` of every
operator runs on host ``i``'s rule below, so forward edges between operators
of equal parallelism stay inside one process. Every host process costs the
runtime's imports (about 175 MB), so this halves a small job's memory at no
loss of throughput (``benchmarks.keyed_count``).

The rule for ``n`` hosts (given as ``num_hosts``, or the default above): keyed
instance ``i`` goes to host ``i mod n``, other instance ``i`` to host
``n - 1 - i mod n`` (keyed and stateless work spread over opposite ends).

With ``colocate=False`` (``JobConfig.colocate``) keyed instances get hosts of
their own: keyed instance ``i`` goes to host ``i``, other instance ``i`` to host
``K + i``, where K is the largest keyed parallelism (at most twice the largest
parallelism hosts). Pins override every rule.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from chiray.operators.graph import OperatorKind, PhysicalPlan

__all__ = ["place"]


def place(plan: PhysicalPlan, num_hosts: int | None = None,
          pins: Mapping[str, Sequence[int]] | None = None,
          colocate: bool = True) -> tuple[int, dict[tuple[str, int], int]]:
    """Return (number of hosts, (operator, index) -> host id).

    Args:
        plan: the job's physical plan.
        num_hosts: how many hosts; default: the largest parallelism (or more, if pins need it), or,
            with ``colocate=False``, the largest keyed plus the largest other parallelism.
        pins: operator -> host id per instance index, overriding the default rule.
        colocate: without ``num_hosts``, share hosts between keyed and other instances (see the
            module docstring).

    Raises:
        ValueError: a pin names an unknown operator, has the wrong length, or a host out of range.
    """
    nodes = plan.graph.nodes
    pins = _checked_pins(plan, pins)
    needed = max((h + 1 for hosts in pins.values() for h in hosts), default=1)
    keyed = max((n.parallelism for n in nodes.values() if n.kind is OperatorKind.KEYED), default=0)
    free = max((n.parallelism for n in nodes.values() if n.kind is not OperatorKind.KEYED), default=0)
    apart = num_hosts is None and not colocate
    n = num_hosts or max(needed, keyed + free if apart else max(keyed, free))
    if needed > n:
        raise ValueError(f"placement: pins name host {needed - 1} but num_hosts is {n}")
    placement: dict[tuple[str, int], int] = {}
    for op, index in plan.instances:
        if op in pins:
            placement[(op, index)] = pins[op][index]
        elif apart:
            placement[(op, index)] = index if nodes[op].kind is OperatorKind.KEYED else keyed + index
        elif nodes[op].kind is OperatorKind.KEYED:
            placement[(op, index)] = index % n
        else:
            placement[(op, index)] = (n - 1 - index) % n
    return n, placement


def _checked_pins(plan: PhysicalPlan, pins: Mapping[str, Sequence[int]] | None) -> dict[str, Sequence[int]]:
    """``pins`` as a dict, each naming an operator of ``plan`` and one host id >= 0 per instance.

    Raises:
        ValueError: a pin names an unknown operator, has the wrong length, or a host id that is not an int >= 0.
    """
    nodes = plan.graph.nodes
    checked = dict(pins or {})
    for op, hosts in checked.items():
        if op not in nodes:
            raise ValueError(f"placement: unknown operator {op!r}; operators: {list(nodes)}")
        if (len(hosts) != nodes[op].parallelism
                or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in hosts)):
            raise ValueError(
                f"placement: operator {op!r} needs {nodes[op].parallelism} host ids >= 0, got {list(hosts)}")
    return checked
