"""A checkpoint cut while a migration step moves key bins holds each bin in exactly one snapshot.

Two control processors, the old and the new owner of bins 8 and 9 of a keyed operator, each fed by
one upstream channel, are driven by hand in an order the runtime can deliver: checkpoint C (earlier in
the global order) and migration step M (later) reach the old owner; it snapshots at C, processes one
more batch of bin 8, and sends the bins at M along the extra edge; that bin state reaches the new
owner before C does (its upstream channel is slow), then C and M come over the channel.

The oracle is a plain dict of the keyed state at the cut (the records before C), and the rule that
each bin belongs to one instance at any cut (``bins_held_twice``).
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from chiray.control.message import Configs, ControlMessage, InstanceId
from chiray.control.op import ControlOp
from chiray.control.ops.chains import BinChains
from chiray.control.ops.checkpoint import Checkpoint, bins_held_twice, instance_key
from chiray.control.ops.migrate import MigrateBins
from chiray.control.processor import Completion, ControlProcessor, extra_input
from chiray.operators.dictstate import DictState
from chiray.operators.logic import InstanceInfo

BINS = 16
OLD, NEW = ("check", 1), ("check", 2)
SOURCE = ("src", 0)


class Store:
    """Checkpoint storage in memory: (operator/index) -> the bins written."""

    root_uri = "memory"

    def __init__(self) -> None:
        self.files: dict[str, dict[int, bytes]] = {}

    def state_file(self, checkpoint_id: int, operator: str, index: int) -> str:
        return instance_key((operator, index))

    def write_state(self, checkpoint_id: int, operator: str, index: int, bins: dict[int, bytes],
                    changes: dict[int, bytes] | None = None) -> str:
        assert not changes, "a first checkpoint writes every bin whole"
        key = instance_key((operator, index))
        self.files[key] = bins
        return key


class Owner:
    """The little of an ``InstanceContext`` a keyed instance offers a checkpoint and a migration."""

    kind = "keyed"

    def __init__(self, name: InstanceId, items: dict[int, dict[str, int]]):
        self.instance = name
        self.info = InstanceInfo(name[0], name[1], 3)
        self.state = DictState(BINS, pickled=True)
        for b, entries in items.items():
            for key, value in entries.items():
                self.state.put(key, b, value)
        self.acks: dict[str, Any] = {}
        self.held: set[int] = set()
        self.checkpoint_chains = BinChains()

    def queue_ack(self, message: ControlMessage, payload: Any, background: bool) -> None:
        self.acks[message.op_id] = payload() if background else payload

    def set_bin_table(self, operator: str, table: list[int]) -> None:
        pass

    def hold_bins(self, bins: list[int], key: Any) -> None:
        self.held.update(bins)

    def release_bins(self, bins: list[int]) -> None:
        assert set(bins) <= self.held, f"released {bins}, held {sorted(self.held)}"
        self.held.difference_update(bins)

    def send_installed_output(self) -> None:
        pass  # a dict state fires nothing on install

    def pause_event_time(self) -> None:
        pass

    def resume_event_time(self) -> None:
        pass


def _message(op: ControlOp, seq: int, configs: dict, extra: tuple = ()) -> ControlMessage:
    return ControlMessage(f"op-{seq}", op.kind, bool(op.blocking), seq, "controller", op, Configs(configs),
                          extra, SOURCE, None)


def _forwarded(done: list[Completion], op_id: str, sender: InstanceId, target: InstanceId) -> ControlMessage:
    """The copy of op ``op_id`` that ``sender`` sends ``target`` once it completed there."""
    (completion,) = [c for c in done if c.message.op_id == op_id]
    return completion.message.hop(sender, completion.payload_for(target))


def _snapshot(store: Store, key: str) -> dict[int, dict[str, int]]:
    return {b: pickle.loads(data)["items"] for b, data in store.files[key].items()}


@pytest.mark.parametrize("c_first", [0, 1], ids=["before_the_checkpoint", "while_the_checkpoint_aligns"])
@pytest.mark.parametrize("blocking", [True, False], ids=["batched", "non_disruptive"])
def test_a_bin_moving_after_the_cut_is_in_the_old_owners_snapshot_only(blocking, c_first):
    """``c_first``: on how many of the new owner's two channels C came before the bin state."""
    at_old = {8: {"k15": 338}, 9: {"k3": 5}, 11: {"k7": 1}}
    at_new = {6: {"k1": 2}, 7: {"k2": 4}}
    old, new = Owner(OLD, at_old), Owner(NEW, at_new)
    store = Store()
    checkpoint = _message(Checkpoint(8, store), 40, {})
    moves = {8: (1, 2), 9: (1, 2)}
    table = [0] * 6 + [2] * 4 + [1] * 6
    step = MigrateBins("check", table, moves, blocking=blocking, everywhere=False)
    migrate = _message(step, 41, step.on_init(type("Ctx", (), {"operators": {"check": {}}})()),
                       extra=((OLD, NEW),))
    old_proc = ControlProcessor(OLD, ["a->1"], is_source=False)
    new_proc = ControlProcessor(NEW, ["a->2", "b->2"], is_source=False)

    # The old owner: C, one more batch of bin 8, then M (it sends bins 8 and 9 to the new owner).
    assert [c.message.op_id for c in old_proc.arrive(checkpoint, "a->1", old)] == [checkpoint.op_id]
    old.state.put("k15", 8, 339)
    done = old_proc.arrive(migrate, "a->1", old)
    bins_sent = _forwarded(done, migrate.op_id, OLD, NEW)
    assert sorted(bins_sent.payload["bins"]) == [8, 9]

    # The new owner: the bin state (extra edge) overtakes C on its slow upstream channels.
    channels = ["a->2", "b->2"]
    for channel in channels[:c_first]:
        assert new_proc.arrive(checkpoint, channel, new) == []
    new_proc.arrive(bins_sent, extra_input(OLD), new)
    for channel in channels[c_first:]:
        new_proc.arrive(checkpoint, channel, new)
    for channel in channels:
        new_proc.arrive(migrate, channel, new)
    assert new_proc.pending_ops == [] and old_proc.pending_ops == []

    held = {instance_key(name): owner.acks[checkpoint.op_id]["bins"] for name, owner in ((OLD, old), (NEW, new))}
    assert bins_held_twice(held) == {}, f"snapshots at the cut: {held}"
    at_cut = {**at_old, **at_new}  # the oracle: the state before the records after C
    snapshots = {**_snapshot(store, instance_key(OLD)), **_snapshot(store, instance_key(NEW))}
    assert {b: items for b, items in snapshots.items() if items} == at_cut
    assert new.state.get("k15", 8) == 339, "after M the new owner holds the bin as the old owner sent it"
    assert sorted(new.state.bins()) == [6, 7, 8, 9] and sorted(old.state.bins()) == [11]
    assert not new.held, "the held records of the moved bins are released"
