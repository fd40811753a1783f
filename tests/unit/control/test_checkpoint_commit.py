"""A checkpoint commits every sink output staged since the last durable checkpoint, not only its own epoch.

The oracle is the set of files a real ``to_parquet`` writer staged: whatever
the sequence of failed and durable checkpoints, the union of what the
durable checkpoints commit is every staged file, and each checkpoint's
manifest (what a recovery from it commits) holds every file staged since
the previous durable one.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from chiray.actors.runtime.restore import RestoreInfo
from chiray.control.ops.checkpoint import Checkpoint
from chiray.operators import to_parquet
from chiray.operators.endpoints import SinkLogic
from chiray.operators.logic import InstanceInfo


class Storage:
    """Manifests in memory; ``fail`` lists checkpoint ids whose manifest cannot be written."""

    def __init__(self, fail: set[int]) -> None:
        self.fail, self.manifests = fail, {}

    def commit(self, checkpoint_id, manifest):
        if checkpoint_id in self.fail:
            raise OSError(f"cannot write checkpoint {checkpoint_id}")
        self.manifests[checkpoint_id] = {**manifest, "checkpoint_id": checkpoint_id}

    def retain(self, keep, taking=()):
        pass


def sink_logic(directory: str, index: int) -> SinkLogic:
    logic = SinkLogic(to_parquet(directory).bind_output(directory, "out", "r0123abcd"))
    logic.open(InstanceInfo("out", index, 2))
    return logic


@pytest.mark.parametrize("failing", [set(), {2}, {2, 3}, {1, 4}])
def test_durable_checkpoints_commit_every_staged_file(tmp_path, failing):
    directory = str(tmp_path)
    logics = [sink_logic(directory, i) for i in range(2)]
    storage, durable = Storage(failing), 0
    for checkpoint_id in range(1, 6):
        for i, logic in enumerate(logics):
            logic.process(pa.record_batch({"x": [checkpoint_id, i]}), 0)
        op = Checkpoint(checkpoint_id, storage, commit_sinks=lambda sink, staged: logics[0].sink.commit(staged),
                        durable=durable)
        op.acks = {("out", i): {"staged": logic.stage(checkpoint_id, durable)} for i, logic in enumerate(logics)}
        since = {f for f in os.listdir(directory) if f.endswith(".staged")}  # staged since the last durable one
        try:
            op.on_complete(None)
        except OSError:
            assert checkpoint_id in failing
            continue
        # A recovery from this checkpoint commits what its manifest lists: every file staged since the last
        # durable checkpoint, of both instances.
        listed = {os.path.basename(p) for paths in
                  RestoreInfo(storage, storage.manifests[checkpoint_id]).sink_staged("out") for p in paths}
        assert listed == since
        for epoch in range(durable + 1, checkpoint_id + 1):
            assert {i for i in range(2) if any(f"-{i}-e{epoch:06d}-" in p for p in listed)} == {0, 1}
        assert not [f for f in os.listdir(directory) if f.endswith(".staged")]  # the commit made all visible
        durable = checkpoint_id
    committed_epochs = {int(f.split("-e")[1][:6]) for f in os.listdir(directory) if f.startswith("part-")}
    assert committed_epochs == set(range(1, durable + 1)), sorted(os.listdir(directory))


def test_a_checkpoint_of_an_earlier_version_lists_one_value_per_instance():
    old = {"checkpoint_id": 4, "sinks": {"out/0": ["a"], "out/1": ["b"], "other/0": ["c"]}}
    assert RestoreInfo(None, old).sink_staged("out") == [["a"], ["b"]]  # type: ignore[arg-type]
    new = {"checkpoint_id": 4, "sink_staged": {"out/0": [["a"], ["a2"]], "out/1": [["b"]], "a/b/0": [["c"]]}}
    assert RestoreInfo(None, new).sink_staged("out") == [["a"], ["a2"], ["b"]]  # type: ignore[arg-type]
    assert RestoreInfo(None, new).sink_staged("a/b") == [["c"]]  # type: ignore[arg-type]


class StateStore(Storage):
    def write_state(self, checkpoint_id, operator, index, bins):
        return f"{operator}-{index}"


def test_a_stops_final_checkpoint_halts_the_sources_at_its_cut_and_a_resume_reads_on():
    """The cut of ``Job.stop``: after its final checkpoint a source reads nothing (so the job's input ends where
    the checkpoint's offsets do), until ``ResumeSources`` (the stop failed and the job runs on)."""
    from chiray.actors.config import JobConfig
    from chiray.actors.jobs.harness import LocalRun
    from chiray.control.ops.checkpoint import ResumeSources
    from chiray.control.oprun import OpState
    from chiray.operators import Dataflow, collect, from_items
    from tests.unit.control.support import ops_done, run_until

    rows = [{"x": i} for i in range(2_000)]
    flow = Dataflow("stopping")
    flow.source(from_items(rows, batch_size=10), name="src").map(lambda b: b, name="m").sink(
        collect(), name="out")
    run = LocalRun(flow, JobConfig(num_hosts=2, channel_capacity=2))
    sources = [run.instance(("src", 0))]
    run_until(run, lambda: sum(s.records_out for s in sources) >= 200)
    final = run.run_control(Checkpoint(1, StateStore(set()), final=True))
    run_until(run, ops_done(final))
    read = [s.records_out for s in sources]
    assert 200 <= sum(read) < len(rows)
    for _ in range(2_000):
        run.step_all()
    assert [s.records_out for s in sources] == read and not any(s.finished for s in sources)
    resumed = run.run_control(ResumeSources())
    out = run.run()["out"]
    assert resumed.state is OpState.COMPLETE, resumed.error
    assert sorted(out.column("x").to_pylist()) == [r["x"] for r in rows]  # nothing lost or read twice


def test_a_checkpoint_with_a_bin_snapshotted_by_two_instances_is_not_committed():
    """A bin in two instances' snapshots (one taken on the wrong side of a migration) would restore state
    that saw records the sources replay: such a checkpoint fails and its manifest is never written, and
    its sinks' output is committed by the next one (as after any failed checkpoint)."""
    from chiray.control.ops.checkpoint import InconsistentCheckpointError, bins_held_twice

    storage, committed = Storage(set()), []
    op = Checkpoint(8, storage, commit_sinks=lambda sink, staged: committed.append(staged))
    op.acks = {("check", 0): {"chains": {"files": [], "chains": []}, "bins": [0, 1, 2]}, ("check", 1): {"chains": {"files": [], "chains": []}, "bins": [8, 9, 11]},
               ("check", 2): {"chains": {"files": [], "chains": []}, "bins": [6, 7, 8, 9]}, ("count", 0): {"chains": {"files": [], "chains": []}, "bins": [8]},
               ("out", 0): {"staged": ["x"]}}
    with pytest.raises(InconsistentCheckpointError, match=r"operator 'check': bin 8 by \[1, 2\], bin 9 by \[1, 2\]"):
        op.on_complete(None)
    assert storage.manifests == {} and committed == []
    op.acks[("check", 2)] = {"chains": {"files": [], "chains": []}, "bins": [6, 7]}  # each bin in one instance: committed
    assert op.on_complete(None) == 8 and set(storage.manifests) == {8} and committed == [["x"]]
    assert bins_held_twice({"a/0": [1], "a/1": [2], "b/0": [1]}) == {}  # the same bin of two operators is fine


def test_a_checkpoint_leaves_the_directory_of_one_still_being_taken_to_its_own_outcome(tmp_path):
    """Checkpoint 3 still writes when checkpoint 4 commits (it was called while 3 ran): 4's retention keeps
    3's directory and state file, which a retention without the controller's list would delete."""
    from chiray.actors.runtime.storage import CheckpointStorage

    for taking, survives in (({3}, True), (set(), False)):
        storage = CheckpointStorage(str(tmp_path / f"taking-{bool(taking)}"))
        for i in (1, 2):
            storage.commit(i, {"n": i})
        written = storage.write_state(3, "count", 0, {0: b"state"})
        op = Checkpoint(4, storage, keep=2, taking=lambda taking=taking: taking)
        op.acks = {}
        assert op.on_complete(None) == 4
        assert storage.committed() == [2, 4]
        assert (3 in storage.checkpoint_ids()) is survives
        assert os.path.exists(os.path.join(storage.root, written)) is survives
