"""A sink holds back no input while a checkpoint's barrier is on its way: what comes after the barrier on one
channel is taken in at once, kept apart, and written as the next epoch's output.

Runs under ``LocalRun`` (no Ray). The source's host 1 is stalled (it takes no step), so the barrier reaches the
sink from host 0 only. The oracle is each checkpoint's manifest: every epoch's output must hold exactly the rows
that each split emitted between the offsets of the checkpoints around it, no row twice.
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.control.oprun import OpState
from chiray.control.ops.checkpoint import Checkpoint, decode_offsets
from chiray.operators import Dataflow, Sink, SinkWriter
from chiray.operators.logic import InstanceInfo
from tests.unit.control.support import SeqSource, run_until

ROWS = 3_000
BATCH = 10


class EpochWriter(SinkWriter):
    """Keeps (split, seq) of every row, per epoch."""

    def __init__(self) -> None:
        self.current: list[tuple[int, int]] = []
        self.epochs: dict[int, list[tuple[int, int]]] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        self.current.extend(zip(batch.column("split").to_pylist(), batch.column("seq").to_pylist()))

    def prepare_commit(self, epoch: int) -> list[int]:
        self.epochs[epoch], self.current = self.current, []
        return [epoch]

    def finish(self) -> Any:
        return {"epochs": self.epochs, "final": self.current}


class AheadWriter(EpochWriter):
    """An ``EpochWriter`` that takes batches of later epochs at once (``write_ahead``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ahead: list[list[tuple[int, int]]] = []

    def write_ahead(self, batch: pa.RecordBatch, epochs: int) -> bool:
        while len(self.ahead) < epochs:
            self.ahead.append([])
        self.ahead[epochs - 1].extend(zip(batch.column("split").to_pylist(), batch.column("seq").to_pylist()))
        return True

    def prepare_commit(self, epoch: int) -> list[int]:
        staged = super().prepare_commit(epoch)
        if self.ahead:
            self.current = self.ahead.pop(0) + self.current
        return staged


class EpochSink(Sink):
    def __init__(self, ahead: bool = False) -> None:
        self.ahead = ahead

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return AheadWriter() if self.ahead else EpochWriter()


class Manifests:
    """Checkpoint storage for a stateless job: the manifests, in memory."""

    root_uri = "memory://"

    def __init__(self) -> None:
        self.manifests: dict[int, dict] = {}

    def commit(self, checkpoint_id: int, manifest: dict) -> None:
        self.manifests[checkpoint_id] = manifest

    def retain(self, keep: int, taking: Any = ()) -> None:
        pass

    def offsets(self, checkpoint_id: int) -> dict[int, int]:
        """Split number -> rows it had emitted at the checkpoint's cut."""
        merged: dict[str, Any] = {}
        for text in self.manifests[checkpoint_id]["sources"].values():
            merged.update(decode_offsets(text) or {})
        return {int(split.rsplit("-", 1)[1]): int(offset) for split, offset in merged.items()}


def _job(seed: int | None = None, rows: int = ROWS, ahead: bool = False) -> LocalRun:
    flow = Dataflow("apart")
    (flow.source(SeqSource([rows, rows], batch_size=BATCH), parallelism=2, name="src")
         .map(lambda b: b, name="m", parallelism=2)
         .sink(EpochSink(ahead), name="out", parallelism=1))
    config = JobConfig(num_hosts=2, channel_capacity=2,
                       placement={"src": [0, 1], "m": [0, 1], "out": [0]})
    return LocalRun(flow, config, seed=seed)


def _steps(run: LocalRun, n: int) -> None:
    for _ in range(n):
        run.step_all()


def _check_epochs(out: dict, storage: Manifests, checkpoints: list[int], rows: int = ROWS) -> None:
    """Epoch n holds exactly the rows between the cuts of checkpoints n-1 and n; the rest comes at the end."""
    before = {0: 0, 1: 0}
    for checkpoint_id in checkpoints:
        cut = storage.offsets(checkpoint_id)
        expected = sorted((s, q) for s in (0, 1) for q in range(before[s], cut[s]))
        assert sorted(out["epochs"].get(checkpoint_id, [])) == expected, f"epoch {checkpoint_id}"
        before = cut
    assert sorted(out["final"]) == sorted((s, q) for s in (0, 1) for q in range(before[s], rows))


def _checkpoint_with_host_1_stalled(limit: int | None = None, ahead: bool = False,
                                    ) -> tuple[LocalRun, Any, Manifests, Any]:
    """A job whose sink got checkpoint 1's barrier from host 0 only, 5,000 steps ago: (run, sink, storage, op)."""
    run = _job(ahead=ahead)
    sink = run.instance(("out", 0))
    if limit is not None:
        sink._kept.limit = limit
    run_until(run, lambda: sink.records_in >= 200)
    run.stalled.add(1)
    storage = Manifests()
    op = run.run_control(Checkpoint(1, storage))
    _steps(run, 5_000)
    return run, sink, storage, op


@pytest.mark.parametrize("ahead", [False, True], ids=["kept", "written ahead"])
def test_a_sink_takes_in_what_follows_the_barrier_while_it_waits_for_the_barrier_on_its_other_input(ahead):
    """Kept in memory, or written at once by a writer that can write later epochs (nothing kept then)."""
    run, sink, storage, op = _checkpoint_with_host_1_stalled(ahead=ahead)
    # The barrier came from host 0 only; yet the sink took in everything host 0 had, so its map ran to the end.
    assert op.state is OpState.RUNNING
    assert run.instance(("m", 0)).records_out == ROWS
    assert not any(ch.blocked for ch in sink.inputs._channels)
    kept = sink.statistics().kept_apart_records
    assert bool(sink._kept) != ahead and (sink._kept.bytes == 0) == ahead  # in memory only where not written
    in_memory = sink._kept.records if not ahead else 0
    assert sink.records_in + in_memory == ROWS + run.instance(("m", 1)).records_out  # all of host 0's rows
    run.stalled.clear()
    run.wait_op(op)
    assert sink.statistics().kept_apart_records == 0  # written once the epoch was staged
    out = run.run()["out"][0]
    _check_epochs(out, storage, [1])
    assert len(out["final"]) > ROWS - 200  # split 0's rows after the barrier went to the next epoch
    assert kept == ROWS - storage.offsets(1)[0]  # the statistics counted exactly those, while it kept them


def test_above_its_bound_a_sink_holds_back_the_channels_it_keeps_data_of():
    run, sink, storage, op = _checkpoint_with_host_1_stalled(limit=0)  # the first batch kept apart fills it
    assert op.state is OpState.RUNNING
    assert run.instance(("m", 0)).records_out < ROWS / 2  # held back by credit, as an aligned barrier does
    assert any(ch.blocked for ch in sink.inputs._channels)
    run.stalled.clear()
    run.wait_op(op)
    out = run.run()["out"][0]
    assert not any(ch.blocked for ch in sink.inputs._channels)
    _check_epochs(out, storage, [1])


@pytest.mark.parametrize("ahead", [False, True], ids=["kept", "written ahead"])
@pytest.mark.parametrize("seed", range(6))
def test_overlapping_checkpoints_split_the_output_at_each_cut(seed, ahead):
    """Two or three checkpoints pending at once (data kept apart, or written ahead, at depth 2 and 3),
    deliveries shuffled and duplicated: every epoch is exact, nothing lost or written twice."""
    rng, rows = random.Random(seed), 5 * ROWS
    run = _job(seed, rows, ahead)
    sink = run.instance(("out", 0))
    storage = Manifests()
    checkpoints: list[int] = []
    for round_ in range(3):
        run_until(run, lambda: sink.records_in >= 300 * (round_ + 1))
        assert not any(run.instance(("src", i)).finished for i in (0, 1))  # so every checkpoint completes
        stalled = rng.randrange(2)
        run.stalled.add(stalled)
        ops = []
        for _ in range(rng.randint(2, 3)):
            checkpoints.append(len(checkpoints) + 1)
            ops.append(run.run_control(Checkpoint(checkpoints[-1], storage)))
            _steps(run, rng.randint(5, 300))
        run.stalled.clear()
        for op in ops:
            run.wait_op(op)
    out = run.run()["out"][0]
    _check_epochs(out, storage, checkpoints, rows)
