"""actors: the Ray runtime: host actors, channels and credits, routing, the controller, submit() and Job."""

from .client import AttachedJob, JobNotFoundError, ManagerRestartedError, attach, jobs
from .config import JobConfig
from .errors import ChirayError, JobCancelledError, JobFailedError, OperatorError
from .handle import JobEndedError, JobHandle
from .job import Job, JobStatistics, JobStatus
from .jobvalues import CheckpointInfo, EventKind, JobEvent, JobInfo, RescaleProgress, RescaleRecord
from .joblogs import JobLogs, LogLine
from .savepoints import SavepointError, SavepointInfo
from .submit import submit
from .detached import submit_detached  # registers the job manager for submit(detached=True)
from .pool import release_warm_actors, wait_warm_actors

__all__ = [
    "submit",
    "JobHandle",
    "Job",
    "JobInfo",
    "JobEvent",
    "EventKind",
    "RescaleProgress",
    "RescaleRecord",
    "CheckpointInfo",
    "SavepointInfo",
    "JobLogs",
    "LogLine",
    "SavepointError",
    "JobEndedError",
    "JobConfig",
    "JobStatus",
    "JobStatistics",
    "ChirayError",
    "OperatorError",
    "JobFailedError",
    "JobCancelledError",
    "attach",
    "jobs",
    "AttachedJob",
    "JobNotFoundError",
    "ManagerRestartedError",
    "submit_detached",
    "release_warm_actors",
    "wait_warm_actors",
]
