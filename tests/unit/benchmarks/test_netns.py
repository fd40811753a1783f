"""The namespace cluster's names, addresses and argument checks (benchmarks/netns.py), without root or Ray."""

from __future__ import annotations

import ipaddress
import os

import pytest

from benchmarks.netns import NetnsCluster


def test_node_addresses_and_indexes_round_trip_on_the_cluster_subnet():
    cluster = NetnsCluster(nodes=4)
    cluster.subnet = ipaddress.IPv4Network("10.123.45.0/24")
    assert [cluster.node_ip(i) for i in range(4)] == ["10.123.45.1", "10.123.45.2", "10.123.45.3", "10.123.45.4"]
    assert [cluster.node_index(cluster.node_ip(i)) for i in range(4)] == [0, 1, 2, 3]


def test_names_are_the_cluster_s_own_and_fit_interface_names():
    a, b = NetnsCluster(nodes=3), NetnsCluster(nodes=3)
    assert a.tag != b.tag and a.tag.startswith("cn") and len(a.tag) == 8
    names = [a.namespace(1), a._link(2), a._bridge]
    assert all(n.startswith(a.tag) and len(n) <= 15 for n in names), names  # Linux: 15 characters at most


def test_a_cluster_not_entered_leaves_no_directory():
    cluster = NetnsCluster(nodes=2)
    assert cluster.root == "" and not os.path.exists(cluster.temp)  # LocalCluster's own head dir is removed


def test_bad_node_numbers_are_refused():
    with pytest.raises(ValueError, match="nodes must be at least 2"):
        NetnsCluster(nodes=1)
    cluster = NetnsCluster(nodes=3)
    for bad in (0, 3):  # the head, and one past the last worker
        with pytest.raises(ValueError, match=r"node must be a worker, 1\.\.2, got"):
            cluster.lose_node(bad)
