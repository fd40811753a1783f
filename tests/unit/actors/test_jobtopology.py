"""JobTopology: host id allocation, adding, retiring and swapping hosts, placement, peers (no Ray)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from chiray.actors.jobs.jobtopology import JobTopology, TopologySnapshot

PLACEMENT = {("src", 0): 0, ("map", 0): 1, ("map", 1): 2}


def installed() -> JobTopology:
    topology = JobTopology("c0")
    topology.install(["h0", "h1", "h2"], [0, 1, 2], PLACEMENT)
    return topology


def test_a_new_topology_has_the_controller_and_no_hosts():
    topology = JobTopology("c0")
    assert topology.snapshot() == TopologySnapshot("c0", (), (), {}, 0)
    assert topology.allocate_host_ids(2) == (0, 1)


def test_install_sets_hosts_ids_and_placement():
    snap = installed().snapshot()
    assert snap.controller == "c0"
    assert snap.host_ids == (0, 1, 2)
    assert snap.hosts == ("h0", "h1", "h2")
    assert dict(snap.placement) == PLACEMENT
    assert snap.incarnation == 0
    assert snap.peers() == {0: "h0", 1: "h1", 2: "h2"}


def test_install_copies_the_placement():
    placement = dict(PLACEMENT)
    topology = JobTopology("c0")
    topology.install(["h0", "h1", "h2"], [0, 1, 2], placement)
    placement[("map", 2)] = 7
    assert ("map", 2) not in topology.snapshot().placement


def test_host_ids_are_allocated_above_every_id_seen_and_never_reused():
    topology = installed()
    assert topology.allocate_host_ids(2) == (3, 4)
    topology.add_hosts([3, 4], ["h3", "h4"])
    topology.retire_hosts([4, 0])
    assert topology.allocate_host_ids(1) == (5,)  # 4 and 0 retired: not handed out again
    assert topology.allocate_host_ids(0) == ()
    assert topology.allocate_host_ids(3) == (6, 7, 8)


def test_allocating_a_negative_count_is_an_error():
    with pytest.raises(ValueError, match="count must be >= 0"):
        installed().allocate_host_ids(-1)


def test_add_hosts_appends_and_returns_the_new_topology():
    topology = installed()
    ids = topology.allocate_host_ids(2)
    snap = topology.add_hosts(ids, ["h3", "h4"])
    assert snap.host_ids == (0, 1, 2, 3, 4)
    assert snap.peers() == {0: "h0", 1: "h1", 2: "h2", 3: "h3", 4: "h4"}
    assert topology.hosts() == ("h0", "h1", "h2", "h3", "h4")


def test_add_hosts_refuses_a_live_id_or_a_length_mismatch():
    topology = installed()
    with pytest.raises(ValueError):
        topology.add_hosts([2], ["again"])
    with pytest.raises(ValueError):
        topology.add_hosts([3, 4], ["h3"])
    assert topology.peers() == {0: "h0", 1: "h1", 2: "h2"}


def test_retire_hosts_keeps_the_order_of_the_rest_and_returns_them():
    topology = installed()
    topology.add_hosts(topology.allocate_host_ids(1), ["h3"])
    live = topology.retire_hosts([1, 99])  # an unknown id is ignored
    assert live == {0: "h0", 2: "h2", 3: "h3"}
    assert topology.snapshot().host_ids == (0, 2, 3)
    assert topology.hosts() == ("h0", "h2", "h3")


def test_swap_replaces_hosts_placement_and_incarnation_but_keeps_ids_fresh():
    topology = installed()
    topology.allocate_host_ids(2)  # 3 and 4 handed out (e.g. a scale-out that failed half-way)
    topology.swap(["n0", "n1"], [0, 2], {("src", 0): 0, ("map", 0): 2}, 1)
    snap = topology.snapshot()
    assert snap == TopologySnapshot("c0", (0, 2), ("n0", "n1"), {("src", 0): 0, ("map", 0): 2}, 1)
    assert topology.allocate_host_ids(1) == (5,)


def test_swap_raises_next_id_above_the_swapped_in_ids():
    topology = JobTopology("c0")
    topology.swap(["n7"], [7], {("src", 0): 7}, 2)
    assert topology.allocate_host_ids(1) == (8,)


def test_swap_refuses_a_length_mismatch():
    with pytest.raises(ValueError):
        installed().swap(["n0"], [0, 1], {}, 1)


def test_set_controller_replaces_the_controller_only():
    topology = installed()
    topology.set_controller("c1")
    snap = topology.snapshot()
    assert topology.controller == "c1"
    assert snap.controller == "c1" and snap.host_ids == (0, 1, 2)


def test_set_placement_replaces_the_placement():
    topology = installed()
    new = {("src", 0): 0, ("map", 0): 1, ("map", 1): 2, ("map", 2): 3}
    topology.set_placement(new)
    new[("map", 3)] = 4  # the topology keeps its own copy
    assert dict(topology.snapshot().placement) == {("src", 0): 0, ("map", 0): 1, ("map", 1): 2, ("map", 2): 3}


def test_a_snapshot_is_a_frozen_value():
    topology = installed()
    snap = topology.snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.incarnation = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        snap.placement[("map", 2)] = 3  # type: ignore[index]
    topology.add_hosts([3], ["h3"])
    topology.set_placement({})
    assert snap.host_ids == (0, 1, 2) and dict(snap.placement) == PLACEMENT


def test_peers_is_a_copy():
    topology = installed()
    peers = topology.peers()
    peers[9] = "x"
    assert topology.peers() == {0: "h0", 1: "h1", 2: "h2"}


def test_one_rescale_per_operator_at_a_time():
    topology = installed()
    assert topology.claim_rescale("map")
    assert not topology.claim_rescale("map")
    assert topology.claim_rescale("agg")
    topology.release_rescale("map")
    topology.release_rescale("map")  # idempotent
    assert topology.claim_rescale("map")


def test_rescales_take_turns():
    topology = installed()
    order: list[str] = []

    def second() -> None:
        with topology.rescale_turn():
            order.append("second in")

    with topology.rescale_turn():
        waiter = threading.Thread(target=second)
        waiter.start()
        order.append("first out")  # the second rescale cannot enter before this turn ends
    waiter.join(5)
    assert order == ["first out", "second in"]
