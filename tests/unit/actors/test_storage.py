"""Checkpoint storage without Ray: state files, atomic manifests, incomplete and corrupt checkpoints."""

from __future__ import annotations

import json
import logging
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc  # noqa: F401  (pa.ipc)
import pytest

from chiray.actors.runtime import storage as storage_module
from chiray.actors.runtime.storage import MANIFEST, CheckpointError, CheckpointStorage
from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState
from chiray.operators.hashing import bins_of
from chiray.operators.statecodec import BinStream


def test_state_round_trip_and_bin_filter(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    bins = {3: b"three", 17: b"x" * 1000, 900: b""}
    rel = storage.write_state(1, "count", 0, bins)
    assert storage.read_state(rel) == bins
    assert storage.read_state(rel, {17, 5}) == {17: bins[17]}


def test_a_checkpoint_exists_only_once_its_manifest_is_written(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    rel = storage.write_state(2, "count", 0, {1: b"a"})
    assert storage.committed() == []
    storage.commit(2, {"state_files": {"count/0": rel}})
    assert storage.committed() == [2]
    assert storage.latest()["checkpoint_id"] == 2
    assert not [n for n in os.listdir(storage.chk_dir(2)) if ".tmp-" in n]


def test_incomplete_and_corrupt_checkpoints_are_skipped_with_a_log_line(tmp_path, caplog):
    storage = CheckpointStorage(str(tmp_path))
    storage.commit(1, {})
    os.makedirs(storage.chk_dir(2))  # crashed before its manifest
    storage.commit(3, {})
    with open(os.path.join(storage.chk_dir(3), MANIFEST), "w") as f:
        f.write("{not json")
    storage.commit(4, {"state_files": {"count/0": "chk-000004/state-count-0.arrow"}})  # file missing
    with caplog.at_level(logging.WARNING, logger="chiray.actors.runtime.storage"):
        assert storage.committed() == [1]
    text = caplog.text
    assert "checkpoint 2" in text and "incomplete" in text
    assert "checkpoint 3" in text and "corrupt manifest" in text
    assert "checkpoint 4" in text and "missing" in text
    assert storage.latest()["checkpoint_id"] == 1
    for bad, what in ((2, "incomplete"), (3, "corrupt"), (4, "missing"), (9, "incomplete or missing")):
        with pytest.raises(CheckpointError, match=what):
            storage.load(bad)


def test_retention_keeps_the_newest(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    for i in range(1, 6):
        storage.commit(i, {"n": i})
    os.makedirs(storage.chk_dir(6))  # in progress: newer than every complete one, kept
    storage.retain(2)
    assert storage.committed() == [4, 5]
    assert storage.checkpoint_ids() == [4, 5, 6]
    assert json.loads(open(os.path.join(storage.chk_dir(5), MANIFEST)).read())["n"] == 5


def test_retention_leaves_a_checkpoint_still_being_taken_below_the_newest_complete_one(tmp_path):
    """Checkpoint 3 started before 4 and is still writing when 4 completes (a checkpoint called while another
    ran): its directory and what it wrote so far stay; once it has failed, the next retention drops them."""
    storage = CheckpointStorage(str(tmp_path))
    for i in (1, 2, 4):
        storage.commit(i, {"n": i})
    written = storage.write_state(3, "count", 0, {0: b"state"})
    storage.retain(2, taking={3})
    assert storage.committed() == [2, 4] and 3 in storage.checkpoint_ids()
    assert os.path.exists(os.path.join(str(tmp_path), written))
    storage.retain(2)  # it failed: nothing takes it any more
    assert storage.checkpoint_ids() == [2, 4]
    assert not os.path.exists(os.path.join(str(tmp_path), written))


def test_any_pyarrow_filesystem_uri(tmp_path):
    uri = f"file://{tmp_path}/remote"
    storage = CheckpointStorage(uri)
    rel = storage.write_state(1, "op", 2, {0: b"z"})
    storage.commit(1, {"state_files": {"op/2": rel}})
    assert CheckpointStorage(uri).latest()["state_files"] == {"op/2": rel}
    assert isinstance(storage.fs, pafs.LocalFileSystem)


def test_directories_are_private_and_a_torn_state_file_fails_verification(tmp_path):
    root = tmp_path / "chk"
    storage = CheckpointStorage(str(root))
    rel = storage.write_state(1, "count", 0, {1: b"a"})
    storage.commit(1, {"state_files": {"count/0": rel}})
    assert (os.stat(root).st_mode & 0o777) == 0o700 and (os.stat(storage.chk_dir(1)).st_mode & 0o777) == 0o700
    storage.verify(storage.load(1))  # readable
    open(os.path.join(str(root), rel), "w").close()  # emptied: it still exists, so load() takes it
    with pytest.raises(CheckpointError, match=r"checkpoint 1 .* is corrupt: its state file .* is unreadable"):
        storage.verify(storage.load(1))
    assert storage.has_manifest(1) and not storage.has_manifest(2)


def test_a_state_file_larger_than_a_batch_reads_back_every_bin_and_whether_it_holds_changes(tmp_path, monkeypatch):
    """The bins go to the file in record batches of about ``WRITE_BATCH_BYTES`` (converting them all at once held
    the interpreter lock for the whole copy); a bin larger than a batch gets one of its own."""
    monkeypatch.setattr(storage_module, "WRITE_BATCH_BYTES", 1000)
    rng = random.Random(3)
    full = {b: rng.randbytes(rng.choice([10, 300, 2500])) for b in range(0, 40, 2)}
    changes = {b: rng.randbytes(rng.choice([0, 50, 1200])) for b in range(1, 40, 4)}
    s = CheckpointStorage(str(tmp_path / "chk"))
    rel = s.write_state(1, "agg", 0, full, changes)
    with open(os.path.join(s.root, rel), "rb") as f:
        batches = pa.ipc.open_file(f).num_record_batches
    assert batches > 10  # about 30 KB in batches of about 1 KB
    assert s.read_parts(rel) == {**{b: (d, False) for b, d in full.items()}, **{b: (d, True) for b, d in changes.items()}}
    assert s.read_state(rel, {2, 4, 5}) == {2: full[2], 4: full[4], 5: changes[5]}


def test_a_state_file_whose_write_fails_part_way_leaves_no_file_behind(tmp_path, monkeypatch):
    """A state file is written batch by batch straight into a temporary file: a failure after some batches
    (a full disk, a store gone) leaves neither the state file nor the temporary one, and the next write works."""
    monkeypatch.setattr(storage_module, "WRITE_BATCH_BYTES", 1000)
    real = storage_module._bin_batches

    def failing(*args):
        batches = real(*args)
        yield next(batches)
        raise OSError("no space left on device")

    monkeypatch.setattr(storage_module, "_bin_batches", failing)
    s = CheckpointStorage(str(tmp_path / "chk"))
    full = {b: bytes([b]) * 900 for b in range(6)}
    with pytest.raises(OSError, match="no space left"):
        s.write_state(1, "agg", 0, full)
    assert os.listdir(s.chk_dir(1)) == []
    monkeypatch.setattr(storage_module, "_bin_batches", real)
    rel = s.write_state(1, "agg", 0, full)
    assert s.read_state(rel) == full and os.listdir(s.chk_dir(1)) == [os.path.basename(rel)]


def test_streams_of_several_bins_are_a_row_each_read_back_for_each_of_their_bins(tmp_path):
    """A columnar state's whole bins, and its changes to the others, are a stream each: the file holds each as
    one row, and reading gives each of their bins asked for the stream's payload (the same object for all:
    decoded once, for those bins) and whether it holds changes."""
    state = ColumnarAggState(8)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    keys = pa.array([f"k{i}" for i in range(50)])
    state.update(keys, {"n": np.ones(50, np.int64)})
    since = {b: state.version(b) for b in state.bins()}
    state.update(keys.slice(0, 20), {"n": np.ones(20, np.int64)})
    whole = sorted(since)[:3]
    full, changes = state.snapshot_changes_later(whole, {b: v for b, v in since.items() if b not in whole})()
    s = CheckpointStorage(str(tmp_path / "chk"))
    rel = s.write_state(1, "agg", 0, full, changes)
    with open(os.path.join(s.root, rel), "rb") as f:
        rows = pa.ipc.open_file(f).read_all()
    assert rows.column("bin").to_pylist() == [storage_module.SHARED_BIN] * 2
    assert rows.column("delta").to_pylist() == [False, True]
    parts = s.read_parts(rel)
    assert set(parts) == set(since)
    assert [parts[b][1] for b in sorted(since)] == [b not in whole for b in sorted(since)]
    assert len({id(parts[b][0]) for b in whole}) == 1 and len({id(parts[b][0]) for b in since if b not in whole}) == 1
    assert parts[whole[0]][0].payload == full.payload.to_pybytes()
    assert set(s.read_parts(rel, {whole[0], 42})) == {whole[0]}
    fresh = ColumnarAggState(8)
    fresh.restore_bins({b: parts[b][0] for b in whole[:2]})  # the rows of those two bins only
    key_bins = bins_of(keys, 8)
    expected = {k: (2 if i < 20 else 1) for i, k in enumerate(keys.to_pylist()) if key_bins[i] in whole[:2]}
    slots = fresh.slots()
    assert dict(zip(fresh.keys_at(slots).to_pylist(), fresh.values(slots)["n"].tolist())) == expected
    torn = s.write_state(2, "agg", 0, {}, BinStream(changes.payload[:40], changes.sizes))
    with pytest.raises(CheckpointError, match=r"state file 'chk-000002/state-agg-0.arrow' .*not a stream of "
                                              r"ColumnarAggState bins"):
        s.read_parts(torn)


def test_a_stream_of_bins_is_read_as_a_view_of_the_file_at_an_aligned_address(tmp_path):
    """A stream of several bins comes back as a view of the buffer the file was read into (a full copy of
    millions of keys is not copied again into ``bytes``), at an address that is a multiple of 8: a stream
    that a file holds after another bin's payload of 3 bytes is copied to such an address, and reads back
    whole."""
    state = ColumnarAggState(8)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    keys = pa.array([f"k{i}" for i in range(40)])
    state.update(keys, {"n": np.arange(40, dtype=np.int64)})
    full, _ = state.snapshot_changes_later(sorted(state.bins()), {})()
    s = CheckpointStorage(str(tmp_path / "chk"))
    read = s.read_parts(s.write_state(1, "agg", 0, full))
    assert all(isinstance(shared.payload, pa.Buffer) and shared.payload.address % 8 == 0
               for shared, _ in read.values())
    rel = "chk-000001/state-agg-1.arrow"  # another bin's payload of 3 bytes first, in the same record batch
    with pa.OSFile(os.path.join(s.root, rel), "wb") as out, \
            pa.ipc.new_file(out, storage_module._BINS_SCHEMA) as writer:
        for batch in storage_module._bin_batches([42, storage_module.SHARED_BIN], [b"abc", full.payload], 2):
            writer.write_batch(batch)
    parts = s.read_parts(rel)
    assert parts.pop(42) == (b"abc", False)
    assert set(parts) == set(state.bins())
    payload = next(iter(parts.values()))[0].payload
    assert payload.address % 8 == 0 and payload == full.payload.to_pybytes()
    fresh = ColumnarAggState(8)
    fresh.restore_bins({b: shared for b, (shared, _) in parts.items()})
    slots = fresh.slots()
    assert dict(zip(fresh.keys_at(slots).to_pylist(), fresh.values(slots)["n"].tolist())) == {
        f"k{i}": i for i in range(40)}
