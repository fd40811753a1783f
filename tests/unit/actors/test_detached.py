"""Detached jobs without a cluster: what submit refuses, the job record, the metric names."""

from __future__ import annotations

import dataclasses
import os

import pytest

import chiray
from chiray.actors.jobs.jobstore import JobRecord
from chiray.actors.jobs.jobvalues import EventKind
from chiray.control.coordination import JobState
from chiray.actors.jobs.detached import refuse_driver_bound
from chiray.actors.jobs.manager import VERBS, JobManagerCore
from chiray.operators.emission import FinalOnlyWarning
from chiray.spark_bridge.source import SparkSource
from chiray.spark_bridge.streaming import SparkStreamSource


def _flow_with(source) -> chiray.Dataflow:
    flow = chiray.Dataflow("pushed")
    flow.source(source, name="spark").key_by("x").count(name="count").sink(chiray.collect(), name="out")
    return flow


class _Pushed(SparkSource):
    """A push-mode Spark source without a SparkSession: only its driver_bound() matters here."""

    def __init__(self):
        self._name = "spark"

    def describe(self):
        return "spark"

    def schema(self):
        import pyarrow as pa

        return pa.schema([("x", pa.int64())])


class _Streamed(SparkStreamSource):
    def __init__(self):
        self._name = "spark"

    def describe(self):
        return "spark"

    def schema(self):
        import pyarrow as pa

        return pa.schema([("x", pa.int64())])


@pytest.mark.parametrize("source", [_Pushed(), _Streamed()], ids=["from_spark", "from_spark_stream"])
def test_detached_refuses_push_mode_spark_sources_before_touching_ray(source):
    import ray

    started = ray.is_initialized()  # the whole suite may have started its Ray already
    with pytest.raises(ValueError) as err:
        chiray.submit(_flow_with(source), name="pushed", detached=True)
    text = str(err.value)
    assert "source 'spark' of job 'pushed' cannot run detached" in text
    assert "staged=True" in text and "without detached=True" in text
    assert ray.is_initialized() == started  # refused before Ray was touched


def test_submit_warnings_name_the_line_that_called_submit():
    with pytest.warns(FinalOnlyWarning) as caught, pytest.raises(ValueError, match="cannot run detached"):
        chiray.submit(_flow_with(_Streamed()), name="pushed", detached=True)
    assert {w.filename for w in caught if issubclass(w.category, FinalOnlyWarning)} == {__file__}


def test_replayable_sources_are_not_driver_bound():
    refuse_driver_bound(_flow_with(chiray.from_items([{"x": 1}])))  # no error
    assert chiray.from_items([{"x": 1}]).driver_bound() is None


def test_config_name_must_be_a_non_empty_string():
    with pytest.raises(ValueError, match="JobConfig: job name must be a non-empty string"):
        chiray.JobConfig(name=" ")
    with pytest.raises(ValueError, match="JobConfig: job name 'team/wc' holds '/'"):
        chiray.JobConfig(name="team/wc")
    assert chiray.JobConfig(detached=True, name="wc").detached


def test_record_events_accumulate_and_terminal_states():
    record = JobRecord("wc", b"", chiray.JobConfig(), "/tmp/x", None)
    later = record.with_event(EventKind.SUBMITTED).with_event(EventKind.CHECKPOINT, id=1, duration_s=0.5)
    assert [str(e).split(" ", 1)[1] for e in later.events] == ["submitted", "checkpoint 1 (0.50 s)"]
    assert record.events == ()  # a value: the original is unchanged
    assert not later.terminal
    assert all(dataclasses.replace(record, state=s).terminal
               for s in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED))


def test_every_client_verb_is_a_manager_method_and_an_actor_method():
    from chiray.actors.jobs.detached import JobManager

    shell = JobManager.__ray_metadata__.modified_class
    for verb in VERBS:
        assert callable(getattr(JobManagerCore, verb)), verb
        assert callable(getattr(shell, verb)), verb
    assert not hasattr(shell, "call")  # no verb dispatched by its name


@pytest.mark.parametrize("field, bad, why", [("liveness_timeout_s", 0, "must be positive"),
                                             ("restore_checkpoint_s", -1, "must be >= 0 or None"),
                                             ("run_id", "run-1", "run id must be 'r' and 8 hex digits")])
def test_config_checks_the_recovery_options(field, bad, why):
    with pytest.raises(ValueError, match=why):
        chiray.JobConfig(**{field: bad})
    config = chiray.JobConfig(liveness_timeout_s=2.5, restore_checkpoint_s=None, run_id="r0123abcd")
    assert (config.liveness_timeout_s, config.restore_checkpoint_s, config.run_id) == (2.5, None, "r0123abcd")


@pytest.mark.parametrize("given", [False, True], ids=["temporary", "given checkpoint_dir"])
def test_forgetting_an_ended_job_removes_the_temporary_directory_made_for_it(monkeypatch, tmp_path, given):
    from chiray.actors.jobs import jobstore

    stored: dict[str, JobRecord] = {}
    monkeypatch.setattr(jobstore, "save", lambda record: stored.__setitem__(record.name, record))
    monkeypatch.setattr(jobstore, "delete", lambda name: stored.pop(name))
    config = chiray.JobConfig(checkpoint_dir=str(tmp_path / "chk") if given else None)
    core = JobManagerCore("wc", b"", config, None, reconstructed=False)
    root = core.record.checkpoint_dir
    os.makedirs(os.path.join(root, "chk-1"), exist_ok=True)  # what the job left there
    assert given or os.path.basename(root).startswith("chiray-wc-")
    with pytest.raises(chiray.ChirayError, match="stop or cancel it first"):
        core.forget()  # a running job keeps everything
    if not given:  # a savepoint would go under the temporary directory, and go with it
        core._job = object()  # type: ignore[assignment]  # running
        with pytest.raises(ValueError, match="temporary directory, removed when it is forgotten: give savepoint a "
                                             "directory"):
            core.savepoint_info(None)
        core._job = None
    core.record = dataclasses.replace(core.record, state=JobState.FINISHED)
    core.forget()
    assert "wc" not in stored
    assert os.path.exists(root) == given  # a directory the user gave is theirs
