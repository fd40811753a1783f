"""context.py: the runtime's implementation of ``control.op.InstanceContext`` for one instance.

Control handlers see an instance through this object: its identity, keyed
state, routers, operator parameters, downstream instances and statistics.
Attachments are collected by the control processor around ``on_complete``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import pyarrow as pa

from chiray.control.message import ControlMessage, InstanceId
from chiray.control.ops.chains import BinChains
from chiray.operators.endpoints import SinkLogic, SourceLogic
from chiray.operators.logic import InstanceInfo
from chiray.operators.upgrade import CanaryTrial, CodeChange, TrialVerdict

from .instanceview import InstanceView, Migration
from .router import HashRouter, Router
from .statistics import InstanceStatistics
from .stepresult import Ack

__all__ = ["InstanceControlContext"]


class InstanceControlContext:
    """What control handlers may see and change of one instance (lives as long as the instance)."""

    def __init__(self, instance: InstanceView, kind: str, downstream: list[InstanceId]):
        self._instance = instance
        self._kind = kind
        self._downstream = downstream
        self._chains = BinChains()
        self._acks: list[Ack] = []  # made by the handlers of the processor call under way (``take_acks``)

    @property
    def instance(self) -> InstanceId:
        return (self._instance.info.operator, self._instance.info.index)

    @property
    def info(self) -> InstanceInfo:
        return self._instance.info

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def state(self) -> object | None:
        logic = self._instance.logic
        return None if isinstance(logic, SourceLogic) else logic.state

    @property
    def checkpoint_chains(self) -> BinChains:
        """The files this instance's bins are made of in its checkpoints (incremental checkpoints)."""
        return self._chains

    @property
    def routers(self) -> list[Router]:
        return list(self._instance.outputs.routers)

    @property
    def downstream(self) -> list[InstanceId]:
        return list(self._downstream)

    def set_downstream(self, downstream: list[InstanceId]) -> None:
        self._downstream = list(downstream)

    def set_bin_table(self, operator: str, table: list[int]) -> None:
        for router in self._instance.outputs.routers:
            if isinstance(router, HashRouter) and router.operator == operator:
                router.set_table(table, max(router.num_targets, max(table) + 1))

    def hold_bins(self, bins: list[int], key: str | Sequence[str]) -> None:
        self._instance.hold_bins(bins, key)

    def release_bins(self, bins: list[int]) -> None:
        self._instance.release_bins(bins)

    def send_installed_output(self) -> None:
        """Send on, ahead of the op, what installing bins here produced at once (see
        ``OperatorInstance.send_installed_output``)."""
        self._instance.send_installed_output()

    def pause_event_time(self) -> None:
        """Hold the instance's watermark (kept and applied on resume) while bins leave it."""
        self._instance.pause_event_time()

    def resume_event_time(self) -> None:
        self._instance.resume_event_time()

    def keep_replicas(self, operator: str, replicas: dict[int, tuple[int, bytes]]) -> None:
        self._instance.replicas.keep(operator, replicas)

    def take_replicas(self, operator: str, bins: list[int], versions: dict[int, int]) -> dict[int, bytes]:
        """Remove and return the replicas of ``bins``, which must be at ``versions``."""
        return self._instance.replicas.take(operator, bins, versions)

    def parameters(self) -> dict[str, object]:
        return dict(getattr(self._instance.logic, "params", None) or {})

    def set_parameters(self, **changes: object) -> None:
        logic = self._instance.logic
        params = getattr(logic, "params", None)
        if params is None:
            raise TypeError(f"{self._instance.info}: this operator takes no parameters "
                            "(create it with params={...} to make it reconfigurable)")
        params.update(changes)

    def input_records(self) -> dict[int, int]:
        """Records taken so far per input channel id."""
        return dict(self._instance.inputs.records_by_channel)

    def recent_input(self) -> list[tuple[pa.RecordBatch, int]]:
        """A sample of the recent input: (record batch, input index) per input."""
        return self._instance.recent_input()

    def code(self) -> CodeChange | None:
        """The code an upgrade put in place here, or None."""
        return self._instance.code

    def upgrade_code(self, change: CodeChange, migrate: Migration | None = None) -> None:
        """Run ``change`` from now on, ``migrate`` applied to each key's state first."""
        self._instance.upgrade_code(change, migrate)

    def start_trial(self, change: CodeChange, migrate: Migration | None, batches: int, schema: pa.Schema | None,
                    reference: float | None, bound: float, report: Callable[[TrialVerdict], None]) -> None:
        """Run ``change`` on trial here for ``batches`` batches (a canary); ``report(verdict)`` when it ends."""
        logic = self._instance.logic
        self._instance.start_trial(lambda: CanaryTrial(logic, change, migrate, batches, schema, reference, bound,
                                                       report))

    def attach(self, target: object, payload: object) -> None:
        raise RuntimeError("attach() is only available inside on_complete")

    def attach_all(self, payload: object) -> None:
        raise RuntimeError("attach_all() is only available inside on_complete")

    def queue_ack(self, message: ControlMessage, payload: object, background: bool) -> None:
        """Acknowledge ``message``'s op to its controller (it leaves with this step's result)."""
        self._acks.append(Ack(message.origin, message.op_id, self.instance, payload, background))

    def take_acks(self) -> tuple[Ack, ...]:
        """The acks made since the last call (``ControlPort`` takes them after each processor call)."""
        if not self._acks:
            return ()
        acks = tuple(self._acks)
        self._acks.clear()
        return acks

    def sink_prepare(self, epoch: int, durable: int = 0) -> list[object]:
        logic = self._instance.logic
        if not isinstance(logic, SinkLogic) or logic.writer is None:
            raise TypeError(f"{self._instance.info}: sink_prepare() is only for sink instances")
        return logic.stage(epoch, durable)

    def take_in_kept(self) -> None:
        self._instance.take_in_kept()

    def statistics(self) -> InstanceStatistics:
        return self._instance.statistics()

    def source_offsets(self) -> dict[str, object] | None:
        logic = self._instance.logic
        return logic.offsets() if isinstance(logic, SourceLogic) else None

    def halt_source(self, halted: bool = True) -> None:
        if self._instance.is_source:
            self._instance.halt(halted)
