"""A checkpoint cut of a columnar state copies its rows after the cut, while the state goes on.

The cut only marks the rows it holds; the checkpoint's thread copies them a chunk at a time, and a write to
a row not copied yet copies it first. Whatever the state does between the cut and the copy (updates of
captured and new keys, expiry, installs, the next cut), what the checkpoint encodes is the state at the
cut: checked against a plain dict of the values at each cut, by restoring the encoded bins.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators.accumulators import Accumulator
from chiray.operators import columnarstate, rowcapture
from chiray.operators.columnarstate import ColumnarAggState
from chiray.operators.statecodec import TOUCHED

BINS = 16
ACCS = [Accumulator("n", "sum", "int64"), Accumulator("hi", "max", "int64")]


def _state(touched: bool = False) -> ColumnarAggState:
    state = ColumnarAggState(BINS, touched=touched)
    state.configure(pa.string(), ACCS)
    return state


def _write(state: ColumnarAggState, oracle: dict[str, tuple[int, int]], keys: list[str], value: int,
           touch: int | None = None) -> None:
    state.update(pa.array(keys), {"n": np.ones(len(keys), np.int64), "hi": np.full(len(keys), value, np.int64)},
                 None if touch is None else np.full(len(keys), touch, np.int64))
    for k in keys:
        n, hi = oracle.get(k, (0, np.iinfo(np.int64).min))
        oracle[k] = (n + 1, max(hi, value))


def _contents(state: ColumnarAggState) -> dict[str, tuple[int, int]]:
    slots = state.slots()
    values = state.values(slots)
    return {k: (int(n), int(hi)) for k, n, hi in zip(state.keys_at(slots).to_pylist(), values["n"], values["hi"])}


def _restored(full: dict[int, bytes], changes: list[dict[int, bytes]]) -> dict[str, tuple[int, int]]:
    fresh = ColumnarAggState(BINS)
    fresh.restore_bins(full, changes)
    return _contents(fresh)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rowcapture, "CHUNK_ROWS", 7)  # many chunks, so writes fall between them


def test_writes_between_the_cut_and_the_copy_do_not_reach_the_checkpoint() -> None:
    state, oracle = _state(), {}
    keys = [f"k{i}" for i in range(300)]
    _write(state, oracle, keys, 1)
    at_cut = dict(oracle)
    encode = state.snapshot_changes_later(state.bins(), {})
    capture = state._capture
    assert capture is not None and not capture.done  # nothing copied at the cut
    assert np.array_equal(capture.slots, np.arange(300))  # every slot (no tombstones): a range, not a gather
    capture.copy_some(state._captured_columns, state._keys_reader, 40)  # the copier is part way
    _write(state, oracle, keys[::3] + [f"new{i}" for i in range(50)], 9)  # before and after its place
    _write(state, oracle, keys[::3], 11)  # a row written twice is copied once, before the first write
    full, changes = encode()
    assert not changes
    assert _restored(full, []) == at_cut
    assert 0 < capture.rescued < 100  # the rows written before the copier reached them
    assert _contents(state) == oracle  # and the state went on


def test_incremental_cuts_hold_each_cut_with_writes_racing_the_copier() -> None:
    rng = np.random.default_rng(7)
    state, oracle = _state(), {}
    _write(state, oracle, [f"k{i}" for i in range(500)], 0)
    chain_full = state.snapshot_changes_later(state.bins(), {})()[0]
    versions = {b: state.version(b) for b in state.bins()}
    chain: list[dict[int, bytes]] = []
    for step in range(1, 12):
        _write(state, oracle, [f"k{i}" for i in rng.choice(800, 120, replace=False)], step)
        at_cut = dict(oracle)
        encode = state.snapshot_changes_later([], versions)
        versions = {b: state.version(b) for b in state.bins()}
        done = threading.Event()
        result: list = []

        def copier() -> None:
            result.append(encode())
            done.set()

        thread = threading.Thread(target=copier)
        thread.start()
        while not done.is_set():  # the processing thread writes while the copier copies
            _write(state, oracle, [f"k{i}" for i in rng.choice(800, 15, replace=False)], 100 + step)
        thread.join()
        full, changes = result[0]
        assert not full
        chain.append(changes)
        assert _restored(chain_full, chain) == at_cut, step


def test_expiry_installs_and_the_next_cut_first_finish_the_copy() -> None:
    state, oracle = _state(touched=True), {}
    _write(state, oracle, [f"old{i}" for i in range(60)], 1, touch=10)
    _write(state, oracle, [f"young{i}" for i in range(60)], 2, touch=50)
    at_cut = dict(oracle)
    encode = state.snapshot_changes_later(state.bins(), {})
    gone, _, _ = state.expire(cutoff=20, fill=0)  # buries captured rows: the capture is finished first
    assert sorted(gone.to_pylist()) == sorted(f"old{i}" for i in range(60))
    assert state._capture is None
    second = state.snapshot_changes_later(state.bins(), {})
    _write(state, oracle, ["young1"], 7, touch=60)
    assert _restored(encode()[0], []) == at_cut
    assert _restored(second()[0], []) == {k: v for k, v in at_cut.items() if k.startswith("young")}
    moved = state.extract_bins(state.bins()[:4])  # a move settles too, and takes the rows as they are now
    state.install_bins(moved)
    assert TOUCHED in state._cols


def test_a_cut_of_an_empty_or_unconfigured_state_captures_nothing() -> None:
    state = ColumnarAggState(BINS)
    assert state.snapshot_changes_later([], {})() == ({}, {})
    assert state._capture is None


class HeldTakes:
    """Holds the first take of keys of each thread role in ``hold`` ("copier": the ``copier`` thread;
    "other": any other) until the test lets it go (``go[role]``): a thread held there is outside the
    capture's lock (``RowCapture.copy_some``)."""

    def __init__(self, state: ColumnarAggState, monkeypatch: pytest.MonkeyPatch, copier: threading.Thread,
                 hold: set[str]) -> None:
        self.entered = {role: threading.Event() for role in hold}
        self.go = {role: threading.Event() for role in hold}
        real_reader = state._keys_reader

        def reader():
            read = real_reader()

            def take(slots):
                role = "copier" if threading.current_thread() is copier else "other"
                if role in self.entered and not self.entered[role].is_set():
                    self.entered[role].set()
                    assert self.go[role].wait(30), "the test never let the take go on"
                return read(slots)

            return take

        monkeypatch.setattr(state, "_keys_reader", reader)

    def release(self) -> None:
        for go in self.go.values():
            go.set()


def test_a_write_does_not_wait_for_the_copier_to_take_keys_and_what_it_took_stays_right(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The copier takes a chunk's keys after it lets the lock go (for string keys most of a chunk's time):
    while it is held inside that take, the processing thread writes captured rows, adds keys and compacts
    its slots (which finishes the capture), and the copy still holds the state at the cut. With the take
    under the lock, the first write waited for it (this test's write would time out)."""
    monkeypatch.setattr(rowcapture, "CHUNK_ROWS", 64)
    state, oracle = _state(), {}
    keys = [f"k{i}" for i in range(400)]
    _write(state, oracle, keys, 1)
    at_cut = dict(oracle)
    encode = state.snapshot_changes_later(state.bins(), {})
    result: list = []
    copier = threading.Thread(target=lambda: result.append(encode()))
    held = HeldTakes(state, monkeypatch, copier, {"copier"})
    copier.start()
    try:
        assert held.entered["copier"].wait(30), "the copier never took keys"
        wrote = threading.Event()

        def processing() -> None:
            _write(state, oracle, keys[:100] + [f"new{i}" for i in range(300)], 5)  # captured rows, new keys
            wrote.set()

        writer = threading.Thread(target=processing)
        writer.start()
        assert wrote.wait(10), "a write waited for the copier's take of keys"
        writer.join()
        monkeypatch.setattr(columnarstate, "COMPACT_LIVE", 0.9)
        slots_before = state._n
        moved = state.extract_bins(state.bins()[2:])  # most rows leave: the slots are compacted
        assert state._n < slots_before and state._capture is None
        state.install_bins(moved)
        assert _contents(state) == oracle
    finally:
        held.release()
        copier.join(30)
    full, changes = result[0]
    assert not changes
    assert _restored(full, []) == at_cut


def test_the_copier_waits_for_keys_a_finish_in_the_processing_thread_is_still_taking(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A move finishes the capture from the processing thread, which takes the rest of the keys outside the
    lock; the copier, finding every row copied, must wait for those keys before it hands the rows on."""
    monkeypatch.setattr(rowcapture, "CHUNK_ROWS", 64)
    monkeypatch.setattr(columnarstate, "COMPACT_LIVE", 0.9)
    state, oracle = _state(), {}
    _write(state, oracle, [f"k{i}" for i in range(400)], 1)
    at_cut = dict(oracle)
    encode = state.snapshot_changes_later(state.bins(), {})
    result: list = []
    copied = threading.Event()
    copier = threading.Thread(target=lambda: (result.append(encode()), copied.set()))
    held = HeldTakes(state, monkeypatch, copier, {"copier", "other"})
    copier.start()
    mover = None
    try:
        assert held.entered["copier"].wait(30), "the copier never took keys"
        moved: list = []
        mover = threading.Thread(target=lambda: moved.append(state.extract_bins(state.bins()[2:])))
        mover.start()  # the processing thread's move finishes the capture: its take of the rest is held
        assert held.entered["other"].wait(30), "the move never finished the capture"
        held.go["copier"].set()  # the copier stores its chunk's keys, finds every row copied ...
        assert not copied.wait(0.5), "the copier handed its rows on while keys were still being taken"
    finally:
        held.release()
        copier.join(30)
        if mover is not None:
            mover.join(30)
    state.install_bins(moved[0])
    full, changes = result[0]
    assert not changes
    assert _restored(full, []) == at_cut
    assert _contents(state) == oracle


def test_a_capture_copies_changes_in_slot_order_unless_its_copy_began() -> None:
    """Changes come in the order they were written: the copier puts them in the order of their slots before
    it copies, so that it reads the key store and the columns forwards (one stream holds every bin's
    changes: they need no grouping by bin); a copy that began (a ``finish``) keeps its order."""
    state, oracle = _state(), {}
    _write(state, oracle, [f"k{i}" for i in range(400)], 0)
    base = state.snapshot_changes_later(state.bins(), {})()[0]
    versions = {b: state.version(b) for b in state.bins()}
    _write(state, oracle, [f"k{i}" for i in range(399, -1, -13)], 1)
    at_cut = dict(oracle)
    encode = state.snapshot_changes_later([], versions)
    capture = state._capture
    assert capture is not None
    written = capture.slots.copy()
    assert (np.diff(written) < 0).all()  # as written (fewer than an eighth of the slots: kept as written)
    full, changes = encode()
    assert not full and sorted(capture.slots.tolist()) == sorted(written.tolist())
    assert (np.diff(capture.slots) > 0).all()  # copied in slot order
    assert _restored(base, [changes]) == at_cut
    columns = {"x": np.arange(10, dtype=np.int64)}
    fresh = rowcapture.RowCapture(np.array([5, 3, 9, 1]), 10, {"x": np.dtype(np.int64)})
    assert fresh.reorder(1, np.sort) and fresh.slots.tolist() == [5, 1, 3, 9]  # from the second row on
    begun = rowcapture.RowCapture(np.array([5, 3, 9]), 10, {"x": np.dtype(np.int64)})
    begun.copy_some(lambda: columns, None, 1)
    assert not begun.reorder(0, np.sort) and begun.slots.tolist() == [5, 3, 9]
    begun.finish(lambda: columns, None)
    assert begun.values()[1]["x"].tolist() == [5, 3, 9]
