"""instanceview.py: what the control context and topology changes see of an operator instance, as a protocol.

``OperatorInstance`` (``instance.py``) satisfies it; ``context.py`` and ``topology.py`` type against it
instead of importing ``instance.py``, which imports them, so the import graph has no cycle.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from chiray.control.message import InstanceId
from chiray.operators.logic import InstanceInfo

from .channel import InputChannel, OutputChannel

__all__ = ["InstanceView"]


class InstanceView(Protocol):
    """An operator instance as its control context and its topology changes see it."""

    info: InstanceInfo
    name: InstanceId
    logic: Any
    inputs: list[InputChannel]
    outputs: list[list[OutputChannel]]
    routers: list[Any]
    targets: list[list[InstanceId]]
    replicas: Any
    ctx: Any
    is_source: bool
    halted: bool  # a source halted at a stop's cut

    def output_channels(self) -> list[OutputChannel]: ...

    def queue_ack(self, op_id: str, origin: str, payload: Any, background: bool) -> None: ...

    def hold_bins(self, bins: Sequence[int], key: str | Sequence[str]) -> None: ...

    def release_bins(self, bins: Sequence[int]) -> None: ...

    def pause_event_time(self) -> None: ...

    def resume_event_time(self) -> None: ...

    def statistics(self) -> Any: ...

    # an upgrade of the operator's code (``instance.py``, "upgrades")
    code: Any
    records_by_channel: dict[int, int]

    def recent_input(self) -> list[Any]: ...

    def upgrade_code(self, change: Any, migrate: Any = None) -> None: ...

    def start_trial(self, trial: Any) -> None: ...
