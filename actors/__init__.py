"""actors: the Ray runtime: host actors, channels and credits, routing, the controller, submit() and Job."""

from .jobs.client import AttachedJob, JobNotFoundError, ManagerRestartedError, attach, jobs
from .config import JobConfig
from .errors import ChirayError, JobCancelledError, JobFailedError, OperatorError
from .jobs.handle import JobEndedError, JobHandle
from .jobs.job import Job, JobStatistics, JobStatus
from .jobs.jobvalues import CheckpointInfo, EventKind, JobEvent, JobInfo, RescaleProgress, RescaleRecord
from .jobs.joblogs import JobLogs, LogLine
from .jobs.savepoints import SavepointError, SavepointInfo
from .jobs.submit import submit
from .jobs.detached import submit_detached  # registers the job manager for submit(detached=True)
from .jobs.pool import release_warm_actors, wait_warm_actors

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
