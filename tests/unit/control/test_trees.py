"""Broadcast / aggregation trees (``trees.py``): shape properties against plain-loop oracles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chiray.control.trees import Relay, Tree, build_tree


def _leaves(n: int) -> list[tuple[str, int]]:
    return [("src", i) for i in range(n)]


def _expected_depth(n: int, fanout: int) -> int:
    """Relay levels needed so the controller has at most ``fanout`` children: a plain loop."""
    depth = 0
    while fanout ** (depth + 1) < n:
        depth += 1
    return depth


def _ancestors(tree: Tree, node) -> list[Relay]:
    out = []
    while node in tree.parent:
        node = tree.parent[node]
        out.append(node)
    return out


@pytest.mark.parametrize("fanout", [0, 1, -3])
def test_fanout_below_two_is_rejected(fanout):
    with pytest.raises(ValueError, match="fan-out must be >= 2"):
        build_tree(_leaves(5), fanout, lambda leaf: 0)


@pytest.mark.parametrize("n,fanout", [(0, 2), (1, 2), (2, 2), (5, 8), (8, 8), (100, None)])
def test_flat_when_few_leaves_or_no_fanout(n, fanout):
    leaves = _leaves(n)
    tree = build_tree(leaves, fanout, lambda leaf: 0)
    assert tree.top == tuple(leaves)
    assert tree.depth == 0 and tree.children == {} and tree.parent == {} and tree.host == {}


def test_docstring_example():
    tree = build_tree(_leaves(8), 4, lambda leaf: leaf[1] // 4)
    assert len(tree.top) == 2 and tree.depth == 1
    assert [tree.host[r] for r in tree.top] == [0, 1]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 200), fanout=st.integers(2, 9), hosts=st.integers(1, 6), data=st.data())
def test_tree_shape(n, fanout, hosts, data):
    leaves = _leaves(n)
    host_of_leaf = {leaf: data.draw(st.integers(0, hosts - 1)) for leaf in leaves}
    tree = build_tree(leaves, fanout, host_of_leaf.__getitem__)

    # every leaf is reached exactly once, in the given order
    reached = [leaf for top in tree.top for leaf in tree.leaves_of(top)]
    assert reached == leaves

    # fan-out bound everywhere, the controller included
    assert len(tree.top) <= fanout
    for relay, children in tree.children.items():
        assert 1 <= len(children) <= fanout

    # depth: log_k of the leaves, and every leaf has exactly `depth` relays above it
    assert tree.depth == (0 if n <= fanout else _expected_depth(n, fanout))
    for leaf in leaves:
        chain = _ancestors(tree, leaf)
        assert len(chain) == tree.depth
        assert [r.level for r in chain] == list(range(1, tree.depth + 1))
        assert not chain or chain[-1] in tree.top

    # the relay count per level is what grouping by `fanout` gives
    width = n
    for level in range(1, tree.depth + 1):
        width = -(-width // fanout)
        assert sum(1 for r in tree.children if r.level == level) == width

    # parent / children agree; relays live on the host of their first leaf; leaf counts
    for relay, children in tree.children.items():
        for child in children:
            assert tree.parent[child] == relay
        below = tree.leaves_of(relay)
        assert tree.host[relay] == host_of_leaf[below[0]]
        assert tree.leaves_under[relay] == len(below)
    assert set(tree.host) == set(tree.children) == set(tree.leaves_under)
    assert all(node not in tree.parent for node in tree.top)


def test_sixteen_sources_on_four_hosts_with_fanout_two():
    leaves = _leaves(16)
    tree = build_tree(leaves, 2, lambda leaf: leaf[1] % 4)
    assert tree.depth == 3 and len(tree.top) == 2
    level1 = sorted((r for r in tree.children if r.level == 1), key=lambda r: r.index)
    assert [tree.children[r] for r in level1] == [tuple(leaves[i:i + 2]) for i in range(0, 16, 2)]
    assert [tree.host[r] for r in level1] == [(2 * i) % 4 for i in range(8)]
