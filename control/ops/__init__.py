"""ops: the built-in control operations."""

from .monitor import Monitor, MonitorResult
from .noop import NoOp
from .reconfigure import Reconfigure

__all__ = ["NoOp", "Monitor", "MonitorResult", "Reconfigure"]
