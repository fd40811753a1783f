"""control: control-plane semantics: job coordination now; control messages and ops build on it."""

from .coordination import JobLifecycle, JobState

__all__ = ["JobLifecycle", "JobState"]
