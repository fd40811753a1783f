"""actors: the Ray runtime: host actors, channels and credits, routing, the controller, submit() and Job."""

from .config import JobConfig
from .errors import ChirayError, JobCancelledError, JobFailedError, OperatorError
from .job import Job, JobStatistics, JobStatus, submit
from .pool import release_warm_actors, wait_warm_actors

__all__ = [
    "submit",
    "Job",
    "JobConfig",
    "JobStatus",
    "JobStatistics",
    "ChirayError",
    "OperatorError",
    "JobFailedError",
    "JobCancelledError",
    "release_warm_actors",
    "wait_warm_actors",
]
