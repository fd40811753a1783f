"""trees.py: broadcast and aggregation trees with fan-out k between the controller and the sources / sinks.

A tree's leaves are instances (the sources for broadcast, the sinks for
aggregation); its inner nodes are *relays*, each with at most ``fanout``
children, placed on the host of their first leaf so that most hops stay
inside one host. The controller talks only to the top relays, so the cost of
an op grows with the tree's depth, log_k(#leaves), instead of with the
number of leaves. ``fanout=None`` gives the flat tree: every leaf is a child
of the controller.

Example:
    >>> t = build_tree([("src", i) for i in range(8)], fanout=4, host_of=lambda leaf: leaf[1] // 4)
    >>> len(t.top), t.depth
    (2, 1)
    >>> build_tree([("src", 0), ("src", 1)], fanout=4, host_of=lambda leaf: 0).depth  # few leaves: flat
    0
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Sequence

__all__ = ["Relay", "Tree", "build_tree"]


@dataclasses.dataclass(frozen=True, slots=True)
class Relay:
    """An inner node of a tree: ``level`` 1 holds leaves, higher levels hold relays."""

    level: int
    index: int


@dataclasses.dataclass(frozen=True, slots=True)
class Tree:
    """A broadcast or aggregation tree.

    Attributes:
        fanout: children per relay (None: flat).
        top: the controller's children (relays, or leaves when flat).
        children: relay -> its children (relays or leaves).
        parent: node -> its parent relay (absent: the controller is the parent).
        host: relay -> the host id it lives on.
        leaves_under: relay -> how many leaves are below it.
        depth: number of relay levels.
    """

    fanout: int | None
    top: tuple[Any, ...]
    children: dict[Relay, tuple[Any, ...]]
    parent: dict[Any, Relay]
    host: dict[Relay, int]
    leaves_under: dict[Relay, int]
    depth: int

    def leaves_of(self, node: Any) -> list[Any]:
        """The leaves below ``node`` (itself if it is a leaf)."""
        if not isinstance(node, Relay):
            return [node]
        out: list[Any] = []
        for child in self.children[node]:
            out.extend(self.leaves_of(child))
        return out


def build_tree(leaves: Sequence[Hashable], fanout: int | None, host_of: Callable[[Any], int]) -> Tree:
    """Group ``leaves`` (in order) under relays of ``fanout`` children, level by level.

    Args:
        leaves: the instances at the bottom.
        fanout: children per relay, >= 2; None for a flat tree.
        host_of: the host of a leaf.

    Raises:
        ValueError: fanout < 2.
    """
    if fanout is not None and fanout < 2:
        raise ValueError(f"tree fan-out must be >= 2 (or None for flat), got {fanout}")
    if fanout is None or len(leaves) <= fanout:
        return Tree(fanout, tuple(leaves), {}, {}, {}, {}, 0)
    children: dict[Relay, tuple[Any, ...]] = {}
    parent: dict[Any, Relay] = {}
    host: dict[Relay, int] = {}
    under: dict[Relay, int] = {}
    level_nodes: list[Any] = list(leaves)
    level = 0
    while len(level_nodes) > fanout:
        level += 1
        next_nodes: list[Any] = []
        for i in range(0, len(level_nodes), fanout):
            relay = Relay(level, i // fanout)
            group = tuple(level_nodes[i:i + fanout])
            children[relay] = group
            first = group[0]
            host[relay] = host[first] if isinstance(first, Relay) else host_of(first)
            under[relay] = sum(under[c] if isinstance(c, Relay) else 1 for c in group)
            for child in group:
                parent[child] = relay
            next_nodes.append(relay)
        level_nodes = next_nodes
    return Tree(fanout, tuple(level_nodes), children, parent, host, under, level)
