"""The frozen values of the job interface: text without enum reprs, JSON forms, pickling, the record's schema."""

from __future__ import annotations

import dataclasses
import json
import pickle

import cloudpickle
import pytest

import chiray
from chiray.actors.jobs import jobstore
from chiray.actors.jobs.jobstore import RECORD_SCHEMA, JobRecord, JobRecordError
from chiray.actors.jobs.jobvalues import (CheckpointInfo, EventKind, JobEvent, JobInfo, RescaleOutcome, RescaleProgress,
                                     RescaleRecord, RescaleState)
from chiray.control.coordination import JobState


def test_a_rescale_event_reads_done_not_the_enum_repr():
    event = JobEvent.of(EventKind.RESCALE_ENDED, 0.0, operator="count", **{"from": 2}, to=3,
                        outcome=RescaleOutcome.DONE)
    assert event.text == "rescale count 2 -> 3 done"
    assert str(event).endswith(" rescale count 2 -> 3 done") and "RescaleOutcome" not in str(event)
    failed = JobEvent.of(EventKind.RESCALE_ENDED, 0.0, operator="count", **{"from": 2}, to=3,
                         outcome=RescaleOutcome.FAILED, error="a host died")
    assert failed.text == "rescale count 2 -> 3 failed: a host died"
    assert json.loads(json.dumps(event.to_json()))["fields"]["outcome"] == "done"


@pytest.mark.parametrize("kind", list(EventKind))
def test_every_event_kind_renders_without_enum_reprs(kind):
    event = JobEvent.of(kind, 0.0, state=JobState.FINISHED, outcome=RescaleOutcome.DONE, id=1, duration_s=0.1,
                        text="t", enabled=True, options={}, restart=1, where="the start")
    assert "<" not in str(event) and "Outcome." not in str(event) and "JobState." not in str(event)
    assert event.kind is kind and pickle.loads(pickle.dumps(event)) == event


def test_a_run_event_has_no_time_and_keeps_its_text():
    event = JobEvent.of(EventKind.RUN, run=0, text="recovered from checkpoint 3")
    assert event.at is None and str(event) == "run 0: recovered from checkpoint 3"


def test_values_keep_the_dict_forms_and_round_trip_through_json_and_pickle():
    taken = CheckpointInfo(3, "/c/chk-000003", 0.25)
    assert taken.to_json() == {"id": 3, "path": "/c/chk-000003", "duration_s": 0.25}
    assert CheckpointInfo(3, "/c").to_json() == {"id": 3, "path": "/c"}
    entry = RescaleRecord("r1", 1.0, "count", 2, 3, "fluid", RescaleOutcome.DONE, duration_s=1.5, bytes_moved=10,
                          bins_moved=4)
    data = json.loads(json.dumps(entry.to_json()))
    assert data["from"] == 2 and data["to"] == 3 and data["state"] == "done" and "progress" not in data
    assert entry["state"] == "done" and entry.get("by") is None and "from" in entry  # read like the dict
    progress = RescaleProgress("count", "fluid", RescaleState.DONE, parallelism=3, bins=4, bins_moved=4)
    assert progress["state"] == "DONE" and progress.get("steps_done") == 0 and "first_step_ns" in progress
    info = JobInfo("wc", JobState.RUNNING, 1.0, None, 2.0, (("count", 2),), 1, None, "/c", CheckpointInfo(3, "/c/3"))
    assert info.to_json()["operators"] == {"count": 2} and info.to_json()["last_checkpoint"] == {"id": 3,
                                                                                                 "path": "/c/3"}
    assert JobInfo("wc", JobState.RUNNING, restarting=True)["state"] == "RESTARTING"
    for value in (taken, entry, progress, info):
        assert pickle.loads(cloudpickle.dumps(value)) == value
        assert dataclasses.is_dataclass(value) and not hasattr(value, "__dict__")  # frozen and slotted
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, dataclasses.fields(value)[0].name, "x")


def test_a_record_of_another_schema_is_refused_clearly():
    record = JobRecord("wc", b"", chiray.JobConfig(), "/tmp/x", None)
    assert record.schema == RECORD_SCHEMA and record.state is JobState.RUNNING
    assert jobstore.decode("wc", cloudpickle.dumps(record)) == record
    older = dataclasses.replace(record, schema=RECORD_SCHEMA - 1)
    with pytest.raises(JobRecordError, match=rf"job 'wc': its stored record has schema {RECORD_SCHEMA - 1}, this "
                                             rf"chiray reads schema {RECORD_SCHEMA}"):
        jobstore.decode("wc", cloudpickle.dumps(older))
    with pytest.raises(JobRecordError, match="cannot be read"):
        jobstore.decode("wc", b"not a pickle")
    assert issubclass(JobRecordError, chiray.ChirayError)
