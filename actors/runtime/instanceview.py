"""instanceview.py: what the control context and topology changes see of an operator instance, as a protocol.

``OperatorInstance`` (``instance.py``) satisfies it; ``context.py`` and ``topology.py`` type against it
instead of importing ``instance.py``, which imports them, so the import graph has no cycle.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence, TypeAlias

import pyarrow as pa

from chiray.control.message import InstanceId
from chiray.operators.endpoints import SourceLogic
from chiray.operators.logic import InstanceInfo, OperatorLogic
from chiray.operators.upgrade import CanaryTrial, CodeChange

from .channel import OutputChannel
from .inputs import InstanceInputs
from .outputs import InstanceOutputs
from .replicas import BinReplicas
from .statistics import InstanceStatistics

__all__ = ["InstanceView", "Migration"]

Migration: TypeAlias = Callable[[object, object], object]
"""An upgrade's state migration: ``migrate(key, old value) -> new value``."""


class InstanceView(Protocol):
    """An operator instance as its control context and its topology changes see it."""

    info: InstanceInfo
    name: InstanceId
    logic: OperatorLogic | SourceLogic
    inputs: InstanceInputs
    outputs: InstanceOutputs
    replicas: BinReplicas
    is_source: bool

    @property
    def halted(self) -> bool: ...  # a source halted at a stop's cut

    def halt(self, halted: bool) -> None: ...

    def output_channels(self) -> list[OutputChannel]: ...

    def hold_bins(self, bins: Sequence[int], key: str | Sequence[str]) -> None: ...

    def release_bins(self, bins: Sequence[int]) -> None: ...

    def send_installed_output(self) -> None: ...

    def pause_event_time(self) -> None: ...

    def resume_event_time(self) -> None: ...

    def statistics(self) -> InstanceStatistics: ...

    def take_in_kept(self) -> None: ...  # after an op that kept a sink's input apart (``keptapart``)

    # an upgrade of the operator's code (``instance.py``, "upgrades")
    code: CodeChange | None

    def recent_input(self) -> list[tuple[pa.RecordBatch, int]]: ...

    def upgrade_code(self, change: CodeChange, migrate: Migration | None = None) -> None: ...

    def start_trial(self, trial: Callable[[], CanaryTrial]) -> None: ...
