"""A window that fires when its bin is installed (a non-disruptive step of a window join) goes downstream with the
step's op: a checkpoint cut right after the step, and a recovery from it, lose none of its rows.

The interleaving that lost rows (a NEXMark q8 run, 3 of 202): the old owner takes the op before the last
watermark ahead of a pause in the input and defers it, the new owner takes that watermark first (firing its own
bins' window), then installs the moved bin, whose window it fires at once. Those rows used to wait in the
state's pending output until the next batch or watermark; the checkpoint held neither them nor the window.
The oracle is a plain Python join of the two inputs by key and window.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.actors.runtime.mailbox import HostCore
from chiray.actors.runtime.restore import RestoreInfo
from chiray.actors.runtime.storage import CheckpointStorage
from chiray.control.message import ControlMessage
from chiray.control.ops.checkpoint import Checkpoint
from chiray.control.ops.migrate import MigrateBins
from chiray.control.oprun import job_view
from chiray.operators import Dataflow, bounded_out_of_orderness, tumbling
from chiray.operators.graph import rescaled_plan
from chiray.operators.hashing import bins_of
from chiray.operators.logic import Source, SourceSplit, SplitReader

NB = 16
P_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("t", pa.int64())])
S_SCHEMA = pa.schema([("seller", pa.int64()), ("t", pa.int64())])
RELEASED: dict[str, int] = {}  # split id -> batches it may read so far (the test's gate)
SEEN: list[tuple[int, int]] = []  # (id, window start) of the rows past the join


class _Reader(SplitReader):
    def __init__(self, batches: list[pa.RecordBatch], split_id: str, position: int) -> None:
        self.batches, self.split_id, self.position = batches, split_id, position

    def ready_at(self) -> float | None:
        done = self.position >= len(self.batches)
        return None if done or self.position < RELEASED.get(self.split_id, 0) else 1e18  # held

    def read(self) -> pa.RecordBatch | None:
        if self.position >= len(self.batches):
            return None
        self.position += 1
        return self.batches[self.position - 1]

    def offset(self) -> int:
        return self.position


@dataclasses.dataclass(frozen=True)
class _Held(Source):
    name: str
    schema_: Any
    per_split: tuple

    def schema(self) -> pa.Schema:
        return self.schema_

    def splits(self) -> list[SourceSplit]:
        return [SourceSplit(f"{self.name}-{i}", i) for i in range(len(self.per_split))]

    def open_split(self, split: SourceSplit, offset: object = None) -> SplitReader:
        return _Reader(self.per_split[split.payload], split.split_id, 0 if offset is None else int(offset))

    def bounded(self) -> bool:
        return True


def _key_in(bins: set[int], exclude: tuple[int, ...] = ()) -> int:
    return next(k for k in range(10_000)
                if k not in exclude and int(bins_of(pa.array([k], pa.int64()), NB)[0]) in bins)


MOVE = _key_in({0})  # bin 0 moves from instance 0 (bins 0-7) to instance 1 (bins 8-15)
OLD, OLD2 = _key_in(set(range(1, 8))), _key_in(set(range(1, 8)), (_key_in(set(range(1, 8))),))
NEW, NEW2 = _key_in(set(range(8, 16))), _key_in(set(range(8, 16)), (_key_in(set(range(8, 16))),))


def _persons(rows: list[tuple[int, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"id": k, "name": f"p{k}", "t": t} for k, t in rows], schema=P_SCHEMA)


def _sellers(rows: list[tuple[int, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"seller": k, "t": t} for k, t in rows], schema=S_SCHEMA)


# Split 0 drives the join's watermark: its first batch is window [0, 10), its second (t = 14) brings the
# watermark to 9 (the end of [0, 10)), its third comes after the recovery. Split 1 is far ahead.
PERSONS = _Held("persons", P_SCHEMA, (
    [_persons([(MOVE, 3), (NEW, 2), (OLD, 1)]), _persons([(OLD2, 14), (NEW, 14)]), _persons([(NEW2, 21)])],
    [_persons([(NEW2, 35)]), _persons([(OLD, 44)])]))
SELLERS = _Held("sellers", S_SCHEMA, (
    [_sellers([(MOVE, 5), (NEW, 6), (OLD, 7)]), _sellers([(OLD2, 14), (NEW, 14)]), _sellers([(NEW2, 22)])],
    [_sellers([(NEW2, 36)]), _sellers([(OLD, 45)])]))


def _record(batch: pa.RecordBatch) -> pa.RecordBatch:
    SEEN.extend(zip(batch.column("id").to_pylist(), batch.column("window_start").to_pylist()))
    return batch


def _flow() -> Dataflow:
    flow = Dataflow("q8-mini", num_bins=NB)
    marks = bounded_out_of_orderness("t", 4)
    p = flow.source(PERSONS, parallelism=2, name="person", watermarks=marks)
    s = flow.source(SELLERS, parallelism=2, name="auction", watermarks=marks)
    p.connect(s).key_by("id", "seller").window_join(tumbling(10), on="t", name="join", parallelism=2) \
        .map(_record, name="record").collect(name="out")
    return flow


def _oracle() -> list[tuple[int, int]]:
    people = [r for split in PERSONS.per_split for b in split for r in b.to_pylist()]
    sellers = [r for split in SELLERS.per_split for b in split for r in b.to_pylist()]
    return sorted({(a["id"], a["t"] // 10 * 10) for a in people for c in sellers
                   if a["id"] == c["seller"] and a["t"] // 10 == c["t"] // 10})


def _spin(local: LocalRun, until: Any) -> None:
    for _ in range(20_000):
        if until():
            return
        local.step_all()
    raise AssertionError("the in-process job did not get there")


def _settle(local: LocalRun) -> None:
    for _ in range(20_000):
        if not local.step_all() and not local._in_flight:
            return


def _reached(inst: Any, op_id: str) -> bool:
    """The op is queued on one of ``inst``'s inputs, or under way there."""
    return any(isinstance(env.message, ControlMessage) and env.message.op_id == op_id
               for ch in inst.inputs for env in ch.queue) or any(r.message.op_id == op_id for r in inst.control.runs)


@pytest.mark.parametrize("interleaved", [False, True], ids=["in-order", "op-between-watermarks"])
def test_a_window_fired_by_an_install_survives_a_checkpoint_cut_right_after_the_step(tmp_path, interleaved):
    SEEN.clear()
    RELEASED.clear()
    RELEASED.update({"persons-0": 1, "sellers-0": 1, "persons-1": 1, "sellers-1": 1})
    config = JobConfig(colocate=False)
    local = LocalRun(_flow(), config)
    old, new = local.instance(("join", 0)), local.instance(("join", 1))
    old_host = local.placement[("join", 0)]
    _settle(local)
    if interleaved:  # the old owner's host takes no step while split 0's last batch and watermark go out
        local.stalled.add(old_host)
    RELEASED.update({"persons-0": 2, "sellers-0": 2})
    _spin(local, lambda: new.logic.state.watermark >= 9)
    move = int(bins_of(pa.array([MOVE], pa.int64()), NB)[0])
    table = [1 if b == move else b * 2 // NB for b in range(NB)]
    run = local.run_control(MigrateBins("join", table, {move: (0, 1)}, blocking=False, key=("id", "seller")))
    if interleaved:  # the op reaches the old owner's queues; it then takes the op before the watermark
        _spin(local, lambda: _reached(old, run.op_id))
        local.stalled.discard(old_host)
    _spin(local, lambda: run.state.name != "RUNNING")
    assert run.state.name == "COMPLETE", run.error
    local.plan = rescaled_plan(local.plan, "join", 2, table)
    local.ops.view = job_view("q8-mini", local.plan)
    _settle(local)
    storage = CheckpointStorage(str(tmp_path / "chk"))
    taken = local.run_control(Checkpoint(1, storage, job={}))
    _spin(local, lambda: taken.state.name != "RUNNING")
    assert taken.state.name == "COMPLETE", taken.error
    before = list(SEEN)
    SEEN.clear()
    restore = RestoreInfo(storage, storage.load(1))  # every host rebuilt from checkpoint 1, as a recovery does
    local.hosts = [HostCore(h.host_id, local.plan, local.placement, config, restore, clock=local.clock)
                   for h in local.hosts]
    local._by_id = {h.host_id: h for h in local.hosts}
    local._in_flight = []
    RELEASED.update({s: 99 for s in RELEASED})
    local.run()
    assert sorted(set(before + SEEN)) == _oracle()
    assert len(before + SEEN) == len(_oracle())  # and none twice
