"""Incremental checkpoints against a full-copy oracle: every retained checkpoint restores to the state it cut.

Several instances of one keyed logic (built-in aggregation, ``reduce``, ``process``, join) take random
batches routed by a bin table; between checkpoints bins move between instances (some out and back before
the next one). Each checkpoint runs the real ``Checkpoint`` op at every instance (its cut, then its
background write, sometimes only after the next checkpoint's cut) and commits its manifest into a real
``CheckpointStorage``, whose retention then runs. Now and then a state file's write fails (that checkpoint
fails, and those that build on it), or the checkpoint is full (a savepoint's). The oracle is a plain dict
of every key's state, kept by a Python loop over the same records and copied at each cut. After each
commit, every retained checkpoint is restored into fresh instances, at another parallelism too, and must
equal the oracle's copy at its cut; and no file that no retained checkpoint needs survives retention.
"""

from __future__ import annotations

import copy
import datetime
import os
import random
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest

from chiray.actors.runtime.restore import RestoreInfo, restore_keyed
from chiray.actors.runtime.storage import CheckpointError, CheckpointStorage
from chiray.control.ops.chains import BinChains, ChainBound, ChainWriteError, manifest_chains
from chiray.control.ops.checkpoint import Checkpoint
from chiray.operators.hashing import bins_of
from chiray.operators.joins import JoinLogic
from chiray.operators.keyed import AggregateLogic, AggSpec, ProcessLogic, ReduceLogic
from chiray.operators.logic import InstanceInfo
from chiray.operators.processbatch import KeyedBatch, ProcessBatchLogic
from chiray.operators.columnarstate import ColumnarAggState
from chiray.operators.ttl import StateTTL

BINS = 16
OP = "op"
TTL_S = 6
RECOVER = 0.2  # the chance of a recovery after a committed checkpoint
CLOCK = [0.0]  # the fake wall clock of the aggregation with a TTL (seconds)


class FlakyStorage(CheckpointStorage):
    """A checkpoint storage whose write of one instance's state file fails at chosen checkpoints."""

    fail: set[tuple[int, int]] = set()

    def write_state(self, checkpoint_id, operator, index, bins, changes=None):  # type: ignore[override]
        if (checkpoint_id, index) in self.fail:
            raise OSError(f"injected: writing the state of {operator}/{index} at checkpoint {checkpoint_id}")
        return super().write_state(checkpoint_id, operator, index, bins, changes)


class Ctx:
    """The little of an ``InstanceContext`` a keyed instance offers the checkpoint op."""

    kind = "keyed"

    def __init__(self, index: int, logic: Any, parallelism: int):
        self.instance = (OP, index)
        self.info = InstanceInfo(OP, index, parallelism)
        self.logic = logic
        self.checkpoint_chains = BinChains()
        self.work: Callable[[], Any] | None = None

    @property
    def state(self) -> Any:
        return self.logic.state

    def ack_in_background(self, work: Callable[[], Any]) -> None:
        self.work = work


# -- the keyed kinds, each with its oracle ---------------------------------------------------------------

def _aggregate() -> Any:
    return AggregateLogic("k", [AggSpec("n", "count"), AggSpec("s", "sum", "v")], BINS)


def _aggregate_ttl() -> Any:
    """Keys expire 6 s (of the fake clock) after their last write: incremental changes delete them."""
    ttl = StateTTL(datetime.timedelta(seconds=TTL_S), clock=lambda: CLOCK[0])
    return AggregateLogic("k", [AggSpec("n", "count"), AggSpec("s", "sum", "v")], BINS, "final", ttl)


def _reduce() -> Any:
    return ReduceLogic("k", lambda acc, row: {"k": row["k"], "v": acc["v"] + row["v"]}, BINS)


def _keep(key: Any, rows: pa.RecordBatch, state: Any) -> None:
    """Per key a list of its values, changed in place; a negative value clears the key."""
    for v in rows.column("v").to_pylist():
        if v < 0:
            state.clear()
        elif state.value is None:
            state.value = [v]
        else:
            state.value.append(v)  # in place, never put back: the state must notice all the same


def _process() -> Any:
    return ProcessLogic("k", _keep, BINS)


def _keep_batch(batch: KeyedBatch) -> None:
    """``_keep`` over a whole batch (``process_batch``): its lists changed in place too."""
    values = batch.rows.column("v").to_pylist()
    offsets = batch.offsets.tolist()
    for i in range(len(batch)):
        for v in values[offsets[i]:offsets[i + 1]]:
            if v < 0:
                batch.states[i] = None
            elif batch.states[i] is None:
                batch.states[i] = [v]
            else:
                batch.states[i].append(v)


def _process_batch() -> Any:
    return ProcessBatchLogic("k", _keep_batch, BINS)


def _join() -> Any:
    return JoinLogic(("k", "k"), BINS)


def _oracle_step(kind: str, oracle: dict, rows: list[dict], side: int) -> None:
    for row in rows:
        k, v = row["k"], row["v"]
        if kind in ("aggregate", "aggregate_ttl"):
            n, s = oracle.get(k, (0, 0))
            oracle[k] = (n + 1, s + v)
        elif kind == "reduce":
            oracle[k] = oracle[k] + v if k in oracle else v
        elif kind in ("process", "process_batch"):
            if v < 0:
                oracle.pop(k, None)
            else:
                oracle.setdefault(k, []).append(v)
        else:
            sides = oracle.setdefault(k, ([], []))
            sides[side].append(v)


def _dump(kind: str, logic: Any) -> dict:
    state = logic.state
    if isinstance(state, ColumnarAggState):
        return {row["k"]: (row["n"], row["s"]) for batch in logic.finish() for row in batch.to_pylist()}
    if kind == "reduce":
        return {k: acc["v"] for k, acc in state.items()}
    if kind in ("process", "process_batch"):
        return dict(state.items())
    return {k: tuple([v for batch in side for v in batch.column("v").to_pylist()] for side in sides)
            for k, sides in state.items()}


KINDS = {"aggregate": _aggregate, "aggregate_ttl": _aggregate_ttl, "reduce": _reduce, "process": _process,
         "process_batch": _process_batch, "join": _join}


# -- the run ---------------------------------------------------------------------------------------------

class Run:
    def __init__(self, kind: str, root: str, seed: int, parallelism: int = 3, bound: ChainBound | None = None):
        self.kind, self.rng = kind, random.Random(seed)
        self.storage = FlakyStorage(root)
        self.storage.fail = set()
        self.ctxs = [Ctx(i, KINDS[kind](), parallelism) for i in range(parallelism)]
        self.table = [b % parallelism for b in range(BINS)]
        self.oracle: dict = {}
        self.at_cut: dict[int, dict] = {}
        self.touched_at_cut: dict[int, dict] = {}
        self.clock_at_cut: dict[int, float] = {}
        self.bound = bound or ChainBound(max_deltas=3, max_delta_ratio=2.0)
        self.next_id = 1
        self.keys = [f"k{i}" for i in range(60)]
        self.touched: dict = {}  # aggregate_ttl: key -> its last write on the fake clock
        CLOCK[0] = 0.0

    def expire(self) -> None:
        """aggregate_ttl: the clock moves on; every instance checks expiry (a watermark), and so does the oracle."""
        CLOCK[0] += self.rng.choice([0, 1, 2, 5])
        for ctx in self.ctxs:
            ctx.logic.on_watermark(0)
        for k in [k for k, t in self.touched.items() if t + TTL_S <= CLOCK[0]]:
            del self.touched[k], self.oracle[k]

    def feed(self, records: int) -> None:
        if self.kind == "aggregate_ttl":
            self.expire()
        keys = self.rng.choices(self.keys[: self.rng.randint(5, len(self.keys))], k=records)
        clears = 0.1 if self.kind == "process" else 0.0  # a negative value deletes the key
        rows = [{"k": k, "v": -1 if self.rng.random() < clears else self.rng.randint(0, 9)} for k in keys]
        side = self.rng.randint(0, 1)
        _oracle_step(self.kind, self.oracle, rows, side)
        self.touched.update((k, CLOCK[0]) for k in keys)
        batch = pa.RecordBatch.from_pylist(rows)
        owners = np.array(self.table)[bins_of(batch.column("k"), BINS)]
        for i, ctx in enumerate(self.ctxs):
            part = batch.filter(pa.array(owners == i))
            if part.num_rows:
                ctx.logic.process(part, side)

    def move(self, bins: list[int], to: int) -> None:
        """Move ``bins`` to instance ``to`` (what ``MigrateBins`` does to the states)."""
        for b in bins:
            old = self.table[b]
            if old != to:
                self.ctxs[to].state.install_bins(self.ctxs[old].state.extract_bins([b]))
                self.table[b] = to

    def cut(self, full: bool = False) -> tuple[Checkpoint, list]:
        op = Checkpoint(self.next_id, self.storage, keep=3, bound=self.bound, full=full)
        self.next_id += 1
        works = []
        for ctx in self.ctxs:
            Checkpoint.Instance(op, None).on_complete(ctx)
            works.append(ctx.work)
        self.at_cut[op.checkpoint_id] = copy.deepcopy(self.oracle)
        self.touched_at_cut[op.checkpoint_id] = dict(self.touched)
        self.clock_at_cut[op.checkpoint_id] = CLOCK[0]
        return op, works

    def recover(self, checkpoint_id: int) -> None:
        """A recovery: new instances (at another parallelism at times) restore ``checkpoint_id`` as the runtime's
        do, their chains building on the files they read; what came after it is gone, from the oracle too."""
        info = RestoreInfo(self.storage, self.storage.load(checkpoint_id))
        parallelism = self.rng.choice([len(self.ctxs), 2, 4])
        self.table = [self.rng.randrange(parallelism) for _ in range(BINS)]
        self.ctxs = [Ctx(i, KINDS[self.kind](), parallelism) for i in range(parallelism)]
        for i, ctx in enumerate(self.ctxs):
            restore_keyed(ctx.state, ctx.checkpoint_chains, info, info.load_bins(OP, i, self.table))
        self.oracle = copy.deepcopy(self.at_cut[checkpoint_id])
        self.touched = dict(self.touched_at_cut[checkpoint_id])

    def finish(self, op: Checkpoint, works: list) -> bool:
        """Run the background writes and commit; whether the checkpoint completed."""
        acks, failed = {}, False
        for ctx, work in zip(self.ctxs, works):
            try:
                acks[ctx.instance] = work()
            except (OSError, ChainWriteError):
                failed = True
        if failed:
            return False
        op.acks = acks
        assert op.on_complete(None) == op.checkpoint_id
        return True

    def restore(self, checkpoint_id: int, parallelism: int) -> dict:
        """The state ``checkpoint_id`` holds, restored at ``parallelism`` (read at its cut's time: a restored
        aggregation with a TTL would expire, as it emits its rows, what expired since)."""
        now, CLOCK[0] = CLOCK[0], self.clock_at_cut[checkpoint_id]
        try:
            return self._restore(checkpoint_id, parallelism)
        finally:
            CLOCK[0] = now

    def _restore(self, checkpoint_id: int, parallelism: int) -> dict:
        info = RestoreInfo(self.storage, self.storage.load(checkpoint_id))
        table = [self.rng.randrange(parallelism) for _ in range(BINS)]
        restored: dict = {}
        for i in range(parallelism):
            logic = KINDS[self.kind]()
            stored = info.load_bins(OP, i, table)
            logic.state.restore_bins(stored.full, stored.changes)
            part = _dump(self.kind, logic)
            assert not set(part) & set(restored)
            restored.update(part)
        return restored

    def check_retained(self) -> list[int]:
        kept = self.storage.committed()
        for checkpoint_id in kept:
            for parallelism in (len(self.ctxs), self.rng.choice([1, 2, 4])):
                assert self.restore(checkpoint_id, parallelism) == self.at_cut[checkpoint_id], \
                    f"checkpoint {checkpoint_id} restored at parallelism {parallelism}"
        needed = set().union(*(self.storage.files_of(self.storage.load(i)) for i in kept))
        for name in os.listdir(self.storage.root):
            if name.startswith("chk-") and int(name[4:]) < kept[-1] and int(name[4:]) not in kept:
                for f in os.listdir(os.path.join(self.storage.root, name)):
                    assert f == "_RETIRED" or f"{name}/{f}" in needed, f"{name}/{f} survived retention"
        return kept


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("seed", [1, 2])
def test_every_retained_incremental_checkpoint_restores_to_the_state_at_its_cut(kind, seed, tmp_path):
    run = Run(kind, str(tmp_path / "chk"), seed)
    deltas_seen = recoveries = 0
    pending: tuple[Checkpoint, list] | None = None
    for _ in range(24):
        for _ in range(run.rng.randint(1, 3)):
            run.feed(run.rng.randint(1, 40))
        roll = run.rng.random()
        if roll < 0.3:  # bins move between instances
            run.move(run.rng.sample(range(BINS), run.rng.randint(1, 3)), run.rng.randrange(len(run.ctxs)))
        elif roll < 0.4:  # a bin moves out and back before the next checkpoint
            b = run.rng.randrange(BINS)
            home = run.table[b]
            run.move([b], (home + 1) % len(run.ctxs))
            if run.rng.random() < 0.5:
                run.feed(5)
            run.move([b], home)
        if run.rng.random() < 0.1:
            run.storage.fail.add((run.next_id, run.rng.randrange(len(run.ctxs))))
        op, works = run.cut(full=run.rng.random() < 0.1)
        if pending is not None:  # the previous checkpoint's writes end only after this cut
            run.finish(*pending)
            pending = None
        if run.rng.random() < 0.3:
            pending = (op, works)
            continue
        if run.finish(op, works):
            manifest = run.storage.load(op.checkpoint_id)
            chains = manifest_chains(manifest)
            deltas_seen += sum(len(files) > 1 for bins in chains.values() for files in bins.values())
            if op.full:
                assert all(f.startswith(f"chk-{op.checkpoint_id:06d}/") for f in run.storage.files_of(manifest))
            assert all(len(files) <= 1 + run.bound.max_deltas for bins in chains.values() for files in bins.values())
            kept = run.check_retained()
            if run.rng.random() < RECOVER:  # recovered from a retained checkpoint: its chains go on
                run.recover(kept[-1])
                recoveries += 1
    if pending is not None:
        run.finish(*pending)
    assert run.check_retained(), "no checkpoint completed"
    assert deltas_seen, "no checkpoint wrote changes only"
    assert recoveries, "no recovery"
    if kind == "aggregate_ttl":
        assert sum(ctx.logic.expired_keys for ctx in run.ctxs) > 0, "no key expired"


def test_a_checkpoint_building_on_a_failed_write_fails_and_the_next_writes_those_bins_whole(tmp_path):
    run = Run("reduce", str(tmp_path / "chk"), seed=3, parallelism=1)
    run.feed(50)
    assert run.finish(*run.cut())
    run.feed(5)
    run.storage.fail.add((2, 0))
    second = run.cut()
    run.feed(5)
    third = run.cut()  # its chains name the file of checkpoint 2, which is never written
    assert not run.finish(*second)
    with pytest.raises(ChainWriteError, match="checkpoint 3 builds on the state file of checkpoint 2"):
        third[1][0]()
    run.feed(5)
    op, works = run.cut()
    assert run.finish(op, works)
    chains = manifest_chains(run.storage.load(op.checkpoint_id))[f"{OP}/0"]
    assert not [f for files in chains.values() for f in files if f.startswith("chk-000002/")]
    assert run.restore(4, 2) == run.oracle


def test_unchanged_bins_write_nothing_and_keep_their_chain(tmp_path):
    run = Run("aggregate", str(tmp_path / "chk"), seed=4, parallelism=1)
    run.feed(200)
    assert run.finish(*run.cut())
    first = manifest_chains(run.storage.load(1))[f"{OP}/0"]
    touched = {int(b) for b in bins_of(pa.array(["k1"]), BINS)}
    run.ctxs[0].logic.process(pa.RecordBatch.from_pylist([{"k": "k1", "v": 1}]))
    _oracle_step("aggregate", run.oracle, [{"k": "k1", "v": 1}], 0)
    assert run.finish(*run.cut())
    second = manifest_chains(run.storage.load(2))[f"{OP}/0"]
    assert {b for b in second if second[b] != first[b]} == touched
    assert second[min(touched)] == first[min(touched)] + [f"chk-000002/state-{OP}-0.arrow"]
    parts = run.storage.read_parts(f"chk-000002/state-{OP}-0.arrow")
    assert set(parts) == touched and all(delta for _, delta in parts.values())
    assert run.restore(2, 3) == run.oracle


def test_retention_removes_what_a_failed_checkpoint_wrote_before_keep_checkpoints_are_complete(tmp_path):
    run = Run("reduce", str(tmp_path / "chk"), seed=7, parallelism=2)
    run.feed(40)
    assert run.finish(*run.cut())
    run.feed(10)
    run.storage.fail.add((2, 0))  # instance 1 writes its file, instance 0 fails: checkpoint 2 fails
    assert not run.finish(*run.cut())
    assert os.listdir(run.storage.chk_dir(2)) == [f"state-{OP}-1.arrow"]
    run.feed(10)
    assert run.finish(*run.cut())
    assert run.storage.committed() == [1, 3]  # fewer than the three kept
    needed = run.storage.files_of(run.storage.load(3))
    left = set(os.listdir(run.storage.chk_dir(2))) if os.path.exists(run.storage.chk_dir(2)) else set()
    # once left until three were complete; now only what checkpoint 3 builds on stays, the directory retired
    assert left <= {"_RETIRED"} | {rel.split("/", 1)[1] for rel in needed if rel.startswith("chk-000002/")}
    assert "_MANIFEST.json" not in left
    run.storage.fail.update({(4, 0), (4, 1)})
    run.feed(40)
    assert not run.finish(*run.cut())
    for _ in range(3):
        run.feed(10)
        assert run.finish(*run.cut())
    run.check_retained()
    assert run.restore(7, 2) == run.oracle


@pytest.mark.parametrize("kind", ["aggregate", "process"])
def test_after_a_recovery_the_first_checkpoint_writes_only_what_changed(kind, tmp_path):
    """The restored instances' chains build on the files they read: unchanged bins write nothing, changed
    ones their changes; before, the first checkpoint after a recovery wrote every bin whole."""
    run = Run(kind, str(tmp_path / "chk"), seed=6, parallelism=2)
    run.feed(300)
    assert run.finish(*run.cut())
    run.feed(40)
    assert run.finish(*run.cut())
    run.recover(2)
    assert len(run.ctxs[0].checkpoint_chains.chains()) > 0
    op, works = run.cut()
    assert run.finish(op, works)
    own = f"chk-{op.checkpoint_id:06d}/"
    assert not [f for f in run.storage.files_of(run.storage.load(op.checkpoint_id)) if f.startswith(own)]
    rows = [{"k": "k1", "v": 1}, {"k": "k2", "v": 2}]
    touched = [int(b) for b in bins_of(pa.array([row["k"] for row in rows]), BINS)]
    for row, b in zip(rows, touched):
        run.ctxs[run.table[b]].logic.process(pa.RecordBatch.from_pylist([row]))
    _oracle_step(kind, run.oracle, rows, 0)
    op, works = run.cut()
    assert run.finish(op, works)
    written: dict[int, bool] = {}
    for rel in run.storage.files_of(run.storage.load(op.checkpoint_id)):
        if rel.startswith(f"chk-{op.checkpoint_id:06d}/"):
            written.update((b, delta) for b, (_, delta) in run.storage.read_parts(rel).items())
    assert written == {b: True for b in touched}  # the changes of the two bins written to, nothing whole
    for parallelism in (1, 2, 3):
        assert run.restore(op.checkpoint_id, parallelism) == run.oracle


def test_a_bound_of_zero_deltas_writes_every_bin_whole_every_time(tmp_path):
    run = Run("process", str(tmp_path / "chk"), seed=5, parallelism=2, bound=ChainBound(max_deltas=0))
    for _ in range(3):
        run.feed(30)
        op, works = run.cut()
        assert run.finish(op, works)
        own = f"chk-{op.checkpoint_id:06d}/"
        assert all(f.startswith(own) for f in run.storage.files_of(run.storage.load(op.checkpoint_id)))
    assert run.restore(3, 1) == run.oracle


def test_a_checkpoint_written_before_incremental_checkpoints_still_restores(tmp_path):
    """Format 1: one full state file per instance (columns bin and data only), ``state_files`` in the
    manifest, no ``format_version``."""
    import pyarrow.ipc as ipc

    logic = _reduce()
    rows = [{"k": f"k{i % 7}", "v": i} for i in range(40)]
    logic.process(pa.RecordBatch.from_pylist(rows))
    oracle: dict = {}
    _oracle_step("reduce", oracle, rows, 0)
    bins = logic.state.snapshot_bins(logic.state.bins())
    storage = CheckpointStorage(str(tmp_path / "chk"))
    os.makedirs(storage.chk_dir(1))
    schema = pa.schema([("bin", pa.int32()), ("data", pa.large_binary())])
    with ipc.new_file(os.path.join(storage.chk_dir(1), f"state-{OP}-0.arrow"), schema) as writer:
        writer.write_table(pa.table({"bin": pa.array(list(bins), pa.int32()),
                                     "data": pa.array(list(bins.values()), pa.large_binary())}, schema=schema))
    rel = f"chk-000001/state-{OP}-0.arrow"
    storage.commit(1, {"job": {}, "state_files": {f"{OP}/0": rel}, "state_bins": {f"{OP}/0": sorted(bins)},
                       "sources": {}, "sink_staged": {}})
    info = RestoreInfo(storage, storage.load(1))
    restored: dict = {}
    for i in range(2):
        fresh = _reduce()
        stored = info.load_bins(OP, i, [b % 2 for b in range(BINS)])
        assert stored.changes == []
        fresh.state.restore_bins(stored.full, stored.changes)
        restored.update(_dump("reduce", fresh))
    assert restored == oracle


def test_a_checkpoint_of_format_2_with_a_payload_per_bin_still_restores(tmp_path):
    """Format 2, as the version before streams of several bins wrote it: a columnar state's full copies and
    changes each a payload per bin, in chains over two files; the restore equals the state (a dict of the
    writes) at the second checkpoint, at the parallelism it was written with and at another."""
    from chiray.operators.accumulators import Accumulator

    def state() -> ColumnarAggState:
        s = ColumnarAggState(BINS)
        s.configure(pa.string(), [Accumulator("n", "sum", "int64")])
        return s

    rng = random.Random(5)
    twin, oracle = state(), {}
    first = [f"k{i}" for i in range(120)]
    second = rng.sample(first, 40) + [f"new{i}" for i in range(15)]
    for keys in (first, second):
        twin.update(pa.array(keys), {"n": np.ones(len(keys), np.int64)})
        for k in keys:
            oracle[k] = oracle.get(k, 0) + 1
        if keys is first:
            full = twin.snapshot_bins(twin.bins())  # a payload per bin, as format 2 held them
            since = {b: twin.version(b) for b in twin.bins()}
    changes = twin.extract_changes(since)
    assert changes is not None and all(isinstance(data, bytes) for data in changes.values())
    storage = CheckpointStorage(str(tmp_path / "chk"))
    files = [storage.write_state(1, OP, 0, full), storage.write_state(2, OP, 0, {}, changes)]
    storage.commit(2, {"format_version": 2, "job": {}, "sources": {}, "sink_staged": {},
                       "state_chains": {f"{OP}/0": {"files": files,
                                                    "chains": [[b, 0, 1] if b in changes else [b, 0] for b in full]}},
                       "state_bins": {f"{OP}/0": sorted(full)}})
    info = RestoreInfo(storage, storage.load(2))
    for parallelism in (1, 2):
        restored: dict = {}
        for i in range(parallelism):
            fresh = state()
            stored = info.load_bins(OP, i, [b % parallelism for b in range(BINS)])
            fresh.restore_bins(stored.full, stored.changes)
            slots = fresh.slots()
            restored.update(zip(fresh.keys_at(slots).to_pylist(), fresh.values(slots)["n"].tolist()))
        assert restored == oracle


def test_a_manifest_of_an_unknown_format_is_refused_clearly(tmp_path):
    storage = CheckpointStorage(str(tmp_path / "chk"))
    storage.commit(1, {"format_version": 99, "state_chains": {}})
    with pytest.raises(CheckpointError, match=r"checkpoint 1 .*manifest format 99 .*formats 1 to 3.*newer"):
        storage.load(1)
    assert storage.committed() == []
