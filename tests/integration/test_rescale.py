"""Live rescale on real Ray actors: every strategy, scale 2 -> 3 -> 1 -> 2 under a continuous stream.

Oracles: the generator's own batches read directly (counts per key, and each
key's sequence of records in arrival order), so any record lost, counted
twice or applied out of order shows.
"""

from __future__ import annotations

import collections
import os
import time

import pyarrow as pa
import pytest
import ray

from chiray.actors.rescale import RescaleError
from chiray.operators import Dataflow, Source, SplitReader, generate
from tests.oracles import assert_counts_equal, key_counts
from tests.waiting import wait_for

pytestmark = pytest.mark.usefixtures("ray_session")

BINS = 16


class UntilStopped(Source):
    """Unbounded paced generator splits that end, each at a batch boundary, once the file ``stop`` exists.

    So a test's input lasts exactly as long as its rescales. A split that ends
    writes how many batches it emitted to ``<stop>.<name>.<split id>``.
    """

    def __init__(self, inner: Source, stop: str, name: str) -> None:
        self.inner, self.stop, self.name = inner, stop, name

    def schema(self):
        return self.inner.schema()

    def splits(self):
        return self.inner.splits()

    def open_split(self, split, offset=None):
        report = f"{self.stop}.{self.name}.{split.split_id}"
        return _UntilStoppedReader(self.inner.open_split(split, offset), report, self.stop)

    def emitted(self) -> dict[str, int]:
        """Batches each split emitted (after the job ended)."""
        out = {}
        for split in self.splits():
            with open(f"{self.stop}.{self.name}.{split.split_id}") as f:
                out[split.split_id] = int(f.read())
        return out


class _UntilStoppedReader(SplitReader):
    def __init__(self, inner: SplitReader, report: str, stop: str) -> None:
        self.inner, self.report, self.stop = inner, report, stop

    def read(self):
        if os.path.exists(self.stop):
            with open(self.report, "w") as f:
                f.write(str(self.inner.offset()))
            return None
        return self.inner.read()

    def offset(self):
        return self.inner.offset()

    def ready_at(self):
        return self.inner.ready_at()


def read_all(src) -> list[pa.RecordBatch]:
    out = []
    counts = src.emitted() if isinstance(src, UntilStopped) else {}
    inner = src.inner if isinstance(src, UntilStopped) else src
    for split in inner.splits():
        reader = inner.open_split(split)
        while (split.split_id not in counts or reader.offset() < counts[split.split_id]) \
                and (batch := reader.read()) is not None:
            out.append(batch)
    return out


def track(key, rows, state):
    """Per key, the list of record sequence numbers in arrival order; emits each record's position."""
    seqs = state.value or []
    start = len(seqs)
    new = rows.column("seq").to_pylist()
    seqs.extend(new)
    state.value = seqs
    return pa.record_batch({"key": [key] * len(new), "seq": new, "pos": list(range(start, start + len(new)))})


def build(name: str, counted, ordered) -> Dataflow:
    flow = Dataflow(name)
    flow.source(counted, parallelism=2, name="src").key_by("key", num_bins=BINS).count(
        parallelism=2, name="count").collect(name="counts")
    flow.source(ordered, parallelism=1, name="src1").key_by("key", num_bins=BINS).process(
        track, parallelism=2, name="seqs").collect(name="positions")
    return flow


def check_exact(job, counted_src, ordered) -> None:
    assert_counts_equal(job.result("counts"), key_counts(read_all(counted_src)))
    arrival: dict[str, list[int]] = collections.defaultdict(list)  # one upstream: arrival order is seq order
    for batch in read_all(ordered):
        for k, s in zip(batch.column("key").to_pylist(), batch.column("seq").to_pylist()):
            arrival[k].append(s)
    seen: dict[str, dict[int, int]] = collections.defaultdict(dict)
    for row in job.result("positions").to_pylist():
        assert row["pos"] not in seen[row["key"]], f"key {row['key']}: position {row['pos']} twice"
        seen[row["key"]][row["pos"]] = row["seq"]
    assert set(seen) == set(arrival)
    for key, by_pos in seen.items():
        assert [by_pos[i] for i in range(len(by_pos))] == arrival[key], f"key {key}: state lost or reordered"


def sources_until_stopped(tmp_path):
    """Paced generators (40,000 and 2,000 records/s) until the test creates the returned stop file."""
    stop = str(tmp_path / "stop")
    counted = generate(None, rate=40_000, batch_size=1000, num_keys=200, num_splits=2, seed=3)
    ordered = generate(None, rate=2_000, batch_size=250, num_keys=50, num_splits=1, seed=4)
    return UntilStopped(counted, stop, "counted"), UntilStopped(ordered, stop, "ordered"), stop


def emitted(job, operator: str, n: int):
    """The condition that ``operator`` has emitted at least ``n`` records (for :func:`wait_for`)."""
    return lambda: job.statistics().records_out(operator) >= n


def stepped(handle, condition):
    """``condition(progress)`` of a running rescale, for :func:`wait_for`; fails at once if it ended first."""
    def check():
        if condition(handle.progress()):
            return True
        assert not handle.done(), handle.progress()
        return False
    return check


STRATEGIES = [
    ("all_at_once", {}),
    ("batched", {"chunk_bins": 4}),
    ("batched", {"chunk_bins": 4, "pace": True}),
    ("fluid", {}),
    ("non_disruptive", {"chunk_bins": 4}),
    ("non_disruptive", {"chunk_bins": 4, "replicate": True}),
]


def test_every_strategy_scales_2_3_1_2_exactly(tmp_path):
    """One running job, both keyed operators, every strategy in turn: 2 -> 3 -> 1 -> 2 each."""
    counted, ordered, stop = sources_until_stopped(tmp_path)
    job = build("rescale-strategies", counted, ordered).submit(spare_hosts=1)  # scale-outs take the spare
    try:
        wait_for(emitted(job, "src", 20_000), 60, "src to emit 20,000 records")
        for strategy, knobs in STRATEGIES:
            for p in (3, 1, 2):
                for op in ("count", "seqs"):
                    progress = job.rescale(op, p, strategy=strategy, **knobs).result(120)
                    assert progress["state"] == "DONE" and progress["parallelism"] == p, (strategy, progress)
                    assert progress["bins_moved"] == progress["bins"] > 0, (strategy, progress)
                    if knobs.get("pace"):  # each step waited for the backlog it left before the next
                        drains = [e for e in progress["step_log"] if e["step"] == "drain"]
                        assert len(drains) == progress["steps"] - 1, progress["step_log"]
                    if knobs.get("replicate"):  # every bin was copied ahead
                        assert progress["bytes_replicated"] > 0, progress
                        if op == "count":  # and rebuilt from its copy and the keys written since
                            assert progress["bins_reloaded"] == progress["bins"], progress
                    assert [s.index for s in job.statistics().of(op) if not s.finished] == list(range(p))
            job.refill_spare_hosts(0)  # the next strategy's first scale-out takes a spare again
        open(stop, "w").close()  # the input ends after the rescales
        job.wait(timeout=180)
    finally:
        job.cancel()
    check_exact(job, counted, ordered)


LARGE_KEYS, LARGE_BINS = 60_000, 256


def test_a_large_state_moves_exactly_with_every_strategy(tmp_path):
    """The ``--large`` migration benchmark scaled down: many keys per bin, so bins move as slices of
    big columns. A scale-out's new owner reserves room for what the rescale brings it, old owners
    find their bins' slots without a pass over the state, and one bin a step (fluid) drains a
    retiring owner to empty (told it retires, it never compacts). The counts equal a plain count of
    the records sent."""
    stop = str(tmp_path / "stop")
    counted = UntilStopped(generate(None, rate=60_000, batch_size=2000, num_keys=LARGE_KEYS, num_splits=2,
                                    seed=11), stop, "counted")
    flow = Dataflow("rescale-large-state")
    flow.source(counted, parallelism=2, name="src").key_by("key", num_bins=LARGE_BINS).count(
        parallelism=2, name="count").collect(name="counts")
    job = flow.submit(spare_hosts=1)
    try:
        # most keys are in the state before the first move
        wait_for(emitted(job, "src", 3 * LARGE_KEYS), 60, f"src to emit {3 * LARGE_KEYS} records")
        for strategy, knobs in STRATEGIES:
            for p in (3, 2):
                progress = job.rescale("count", p, strategy=strategy, **knobs).result(180)
                assert progress["state"] == "DONE" and progress["bins_moved"] == progress["bins"] > 0, progress
            job.refill_spare_hosts(0)
        open(stop, "w").close()
        job.wait(timeout=180)
    finally:
        job.cancel()
    expected = key_counts(read_all(counted))
    assert len(expected) > LARGE_KEYS // 2
    assert_counts_equal(job.result("counts"), expected)


def sleepy(batch):
    """A slow operator beside the old owner on its host: that host reaches the op late."""
    time.sleep(0.05)
    return batch


def test_an_input_end_that_overtakes_the_bin_state_waits_for_it(tmp_path):
    """Non-disruptive scale-out whose input ends right after the op passed the source: the new owner
    (on a fresh host) gets the op and every ``End`` long before the old owner (on a host kept busy)
    ships the bins' state. Finishing without that state would drop those keys' counts."""
    stop = str(tmp_path / "stop")
    counted = UntilStopped(generate(None, rate=20_000, batch_size=500, num_keys=400, num_splits=1, seed=6),
                           stop, "counted")
    busy = UntilStopped(generate(None, rate=100, batch_size=5, num_splits=1, seed=7), stop, "busy")
    flow = Dataflow("rescale-end-overtakes")
    flow.source(counted, parallelism=1, name="src").key_by("key", num_bins=BINS).count(
        parallelism=1, name="count").collect(name="counts")
    flow.source(busy, parallelism=1, name="busy_src").map(sleepy, name="sleepy").collect(name="slow")
    job = flow.submit(spare_hosts=1, placement={"count": [0], "sleepy": [0]})
    try:
        wait_for(emitted(job, "src", 5_000), 60, "src to emit 5,000 records")
        handle = job.rescale("count", 2, strategy="non_disruptive", chunk_bins=BINS)
        # injected: the input ends right behind the op
        wait_for(stepped(handle, lambda p: p["first_step_ns"] is not None), 60, "the rescale's first step",
                 interval=0.001, detail=handle.progress)
        open(stop, "w").close()
        job.wait(timeout=120)
        assert handle.result(60)["state"] == "DONE"
    finally:
        job.cancel()
    assert_counts_equal(job.result("counts"), key_counts(read_all(counted)))


def test_random_migrations_keep_the_invariant(tmp_path):
    """Seeded random bin tables, strategies and moments: every key's state stays whole and in order."""
    import random

    rng = random.Random(5)
    counted, ordered, stop = sources_until_stopped(tmp_path)
    job = build("migrate-random", counted, ordered).submit()
    try:
        for _ in range(2):
            more = job.statistics().records_out("src") + rng.randint(1_000, 20_000)
            wait_for(emitted(job, "src", more), 60, f"src to emit {more} records")
            for op in ("count", "seqs"):
                table = [rng.randrange(2) for _ in range(BINS)]
                strategy = rng.choice(["all_at_once", "batched", "non_disruptive"])
                knobs = {"chunk_bins": rng.randint(1, 8), "priority": rng.choice(["arrival", "random"])} \
                    if strategy != "all_at_once" else {}
                progress = job.migrate(op, table, strategy=strategy, **knobs).result(120)
                assert progress["state"] == "DONE"
                assert job.plan.bin_tables[op] == table
        open(stop, "w").close()
        job.wait(timeout=180)
    finally:
        job.cancel()
    check_exact(job, counted, ordered)


def test_killed_host_during_migration_recovers_exactly(tmp_path):
    counted, ordered, stop = sources_until_stopped(tmp_path)
    job = build("rescale-kill", counted, ordered).submit(
        checkpoint_interval_s=0.5, poll_interval_s=0.2, checkpoint_dir=str(tmp_path / "chk"))
    try:
        wait_for(emitted(job, "src", 20_000), 60, "src to emit 20,000 records")
        handle = job.rescale("count", 3, strategy="batched", chunk_bins=1, gap_s=0.05)
        wait_for(stepped(handle, lambda p: p["steps_done"] >= 2), 60, "the rescale's first two steps",
                 interval=0.02, detail=handle.progress)
        ray.kill(job.actors[0], no_restart=True)  # count[0] (and seqs[0]) live on host 0
        with pytest.raises(RescaleError):
            handle.result(120)
        wait_for(lambda: any(e.startswith("recovered from") for e in job.status().events), 120,
                 "the job to recover from the killed host", detail=lambda: job.status().events)
        # The job runs on, with the topology of the last completed step; a new rescale completes.
        assert job.rescale("count", 1, strategy="all_at_once").result(120)["state"] == "DONE"
        open(stop, "w").close()  # the input ends after the rescales
        job.wait(timeout=180)
    finally:
        job.cancel()
    check_exact(job, counted, ordered)


def test_bad_calls_get_clear_errors():
    counted = generate(None, rate=1_000, batch_size=100, num_keys=10, seed=1)
    flow = Dataflow("rescale-errors")
    stream = flow.source(counted, name="src")
    stream.map(lambda b: b, name="pass").key_by("key", num_bins=BINS).count(name="count").collect(name="out")
    job = flow.submit()
    try:
        with pytest.raises(ValueError, match="no operator 'nope'"):
            job.rescale("nope", 2)
        with pytest.raises(ValueError, match="parallelism must be an int >= 1, got 0"):
            job.rescale("count", 0)
        with pytest.raises(ValueError, match="'src' is a source"):
            job.rescale("src", 2)
        with pytest.raises(ValueError, match="strategy 'fluid' moves key bins, but 'pass' is not keyed"):
            job.rescale("pass", 2, strategy="fluid")
        with pytest.raises(ValueError, match="unknown strategy 'fast'"):
            job.rescale("count", 2, strategy="fast")
        with pytest.raises(TypeError, match=r"unknown options \['chunk'\]"):
            job.rescale("count", 2, strategy="batched", chunk=3)
        with pytest.raises(ValueError, match="assignment for 'count' must give each of its 16 bins"):
            job.migrate("count", [0, 1])
        first = job.rescale("count", 2, strategy="fluid")
        with pytest.raises(RescaleError, match="a rescale of 'count' is already running"):
            job.rescale("count", 3)
        first.result(120)
        # A stateless operator rescales too (all at once), and the keyed one after it.
        assert job.rescale("pass", 2).result(120)["parallelism"] == 2
        assert [s.index for s in job.statistics().of("pass") if not s.finished] == [0, 1]
    finally:
        job.cancel()
