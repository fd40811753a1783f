"""op.py: the reactive ``ControlOp`` API: controller-side and instance-side handlers, and their contexts.

A control operation is a class. Its controller-side handlers run in the
controller that started it; its instance-side handlers are a nested
:class:`InstanceHandler` class, of which the runtime makes one object per
instance the op reaches (so its attributes are the op's session variables
at that instance, Chi's ``$`` variables)::

    class CountRecords(ControlOp):
        blocking = False

        class Instance(InstanceHandler):
            def on_complete(self, ctx):
                ctx.attach_all({ctx.instance: ctx.statistics().records_in})

        def on_complete(self, ctx):
            return sum(self.returned.values()) ...

Order of calls (Chi Fig. 3b). At the controller: ``on_init`` (build the
per-instance configs) -> ``on_begin`` (first sink return) -> ``on_next`` (each
return) -> ``on_complete`` (every sink returned; its value is the op's result)
-> ``on_dispose``. At each instance: ``on_begin`` (first arrival) ->
``on_next`` (every arrival, with what the sender attached) -> ``on_complete``
(arrived on every expected input; attach payloads for downstream instances)
-> ``on_dispose``.

A *blocking* op holds back each input channel it arrived on until
``on_complete`` has run at that instance; a *non-blocking* op never does. A
*safe* blocking op touches operator state only in ``on_complete`` and is then
equivalent to freezing the world. A blocking op's handler may leave an
instance's inputs free (``InstanceHandler.holds_inputs = False``) where the op
touches no state: there it is tracked like a non-blocking op. At a sink it may
instead keep apart what arrives after it on each channel until ``on_complete``
(``keeps_input_apart``): a checkpoint does, so a sink never holds back an
upstream instance while it waits for the barrier on its other inputs.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from chiray.operators.logic import InstanceInfo

from .message import CONTROLLER, InstanceId

__all__ = ["ControlOp", "InstanceHandler", "InstanceContext", "ControllerContext", "CONTROLLER", "handles_nothing"]


@runtime_checkable
class InstanceContext(Protocol):
    """What an instance offers its control handlers (implemented by the runtime in ``actors/``)."""

    @property
    def instance(self) -> InstanceId:
        """This instance's name, (operator, index)."""

    @property
    def info(self) -> InstanceInfo:
        """Identity, parallelism and number of bins."""

    @property
    def kind(self) -> str:
        """"source", "transform", "keyed" or "sink"."""

    @property
    def state(self) -> Any | None:
        """The keyed state (a ``BinnedState``), or None for a stateless instance."""

    @property
    def checkpoint_chains(self) -> Any:
        """A keyed instance's ``control.ops.chains.BinChains``: which checkpoint files its bins are made of,
        kept for the instance's life (a new instance, as after a recovery, starts with none)."""

    @property
    def routers(self) -> list[Any]:
        """The routers of the output edges (hash routers hold the bin table)."""

    @property
    def downstream(self) -> list[InstanceId]:
        """The instances this one forwards control messages to (G and extra edges)."""

    def parameters(self) -> dict[str, Any]:
        """The operator's current parameters."""

    def set_parameters(self, **changes: Any) -> None:
        """Change operator parameters (e.g. in a blocking op's ``on_complete``)."""

    def attach(self, target: InstanceId | str, payload: Any) -> None:
        """Attach ``payload`` for one downstream instance (or ``CONTROLLER`` at a sink)."""

    def attach_all(self, payload: Any) -> None:
        """Attach ``payload`` for every downstream instance (and the controller at a sink)."""

    def ack(self, payload: Any) -> None:
        """In ``on_complete``: acknowledge the op to its controller directly, with ``payload``."""

    def ack_in_background(self, work: Any) -> None:
        """In ``on_complete``: run ``work()`` off the processing path, then acknowledge with its result."""

    def sink_prepare(self, epoch: int, durable: int = 0) -> list[Any]:
        """A sink: stage the output written since the last epoch as epoch ``epoch``; returns what every
        epoch after checkpoint ``durable`` (the newest the controller knows durable) staged, oldest first,
        so a checkpoint commits the output of the failed checkpoints before it too."""

    def take_in_kept(self) -> None:
        """A sink, after ``on_complete`` of an op that kept input apart here (``keeps_input_apart``): hand
        the operator the data that arrived after that op and no later one, in arrival order."""

    # What the built-in ops (``control.ops``) ask of a keyed instance while bins move:

    def set_bin_table(self, operator: str, table: list[int]) -> None:
        """Route the edge into ``operator`` by ``table`` (bin -> target instance) from now on."""

    def hold_bins(self, bins: list[int], key: str | Sequence[str]) -> None:
        """Hold back records of ``bins`` (their state is on its way) until :meth:`release_bins`;
        ``key``: their key column, or one per input."""

    def release_bins(self, bins: list[int]) -> None:
        """The state of ``bins`` is installed: process their held records, in arrival order."""

    def pause_event_time(self) -> None:
        """Defer the instance's watermarks (bins are leaving it) until :meth:`resume_event_time`."""

    def resume_event_time(self) -> None:
        """Apply the newest deferred watermark, unless held bins still wait."""

    def keep_replicas(self, operator: str, replicas: dict[int, tuple[int, bytes]]) -> None:
        """Keep copies of bins of ``operator``: bin -> (version, state)."""

    def take_replicas(self, operator: str, bins: list[int], versions: dict[int, int]) -> dict[int, bytes]:
        """Remove and return the replicas of ``bins``, which must be at ``versions``."""

    def statistics(self) -> Any:
        """This instance's ``InstanceStatistics`` now."""

    def source_offsets(self) -> dict[str, Any] | None:
        """A source's split offsets now (None for other instances)."""

    # What an upgrade (``control.ops.upgrade``) asks of an instance:

    def input_records(self) -> dict[int, int]:
        """Records taken so far per input channel id (the position of a cut)."""

    def recent_input(self) -> list[Any]:
        """A sample of the recent input: (record batch, input index) per input."""

    def code(self) -> Any:
        """The code an upgrade put in place here (an ``operators.upgrade.CodeChange``), or None."""

    def upgrade_code(self, change: Any, migrate: Any = None) -> None:
        """Run ``change`` from the next batch on, ``migrate(key, old) -> new`` applied to the state first."""

    def start_trial(self, change: Any, migrate: Any, batches: int, schema: Any, reference: float | None,
                    bound: float, report: Any) -> None:
        """Run ``change`` on trial for ``batches`` batches, output held (a canary); ``report(verdict)`` at its end."""

    def halt_source(self, halted: bool = True) -> None:
        """A source reads no further batch until ``halt_source(False)`` (it still takes control ops):
        the cut of a stop. Ignored by other instances."""


@runtime_checkable
class ControllerContext(Protocol):
    """What a controller offers an op's controller-side handlers."""

    @property
    def job_name(self) -> str: ...

    @property
    def operators(self) -> dict[str, dict[str, Any]]:
        """Operator name -> {"kind", "parallelism", "key", "num_bins", "uid"}."""

    @property
    def instances(self) -> list[InstanceId]: ...

    @property
    def sinks(self) -> list[InstanceId]: ...

    @property
    def sources(self) -> list[InstanceId]: ...

    def downstream_of(self, instance: InstanceId) -> list[InstanceId]:
        """The data-graph successors of ``instance``."""


class InstanceHandler:
    """Instance-side handlers of a control op; one object per (op, instance).

    Attributes:
        op: the op object.
        config: the configuration the controller injected for this instance.
        holds_inputs: whether a blocking op holds this instance's inputs (set it
            in ``__init__`` or ``on_begin``; read once, after ``on_begin``).
        keeps_input_apart: where a blocking op holds no inputs, whether the instance keeps
            apart the data that arrives on a channel after the op: it takes that data in
            (its sender goes on) but hands it to the operator only once ``on_complete`` has
            run here (``InstanceContext.take_in_kept``). Only a sink can: its output is
            staged by epoch, so what comes after a checkpoint's barrier belongs to the next
            epoch whether or not the barrier has come on every input yet.
    """

    holds_inputs: bool = True
    keeps_input_apart: bool = False

    def __init__(self, op: "ControlOp", config: Any):
        self.op = op
        self.config = config

    def on_begin(self, ctx: InstanceContext) -> None:
        """The op's first message reached this instance."""

    def on_next(self, ctx: InstanceContext, payload: Any, sender: InstanceId | str) -> None:
        """A message arrived from ``sender`` (an upstream instance or ``CONTROLLER``)."""

    def on_complete(self, ctx: InstanceContext) -> Any:
        """Arrived on every expected input; a non-None return is attached for all downstream."""
        return None

    def on_dispose(self, ctx: InstanceContext) -> None:
        """The op is done at this instance (release session resources)."""


class ControlOp:
    """A control operation; subclass it and override the handlers you need.

    Attributes:
        blocking: blocking (aligned) or non-blocking semantics.
        observes_only: the op only reads statistics at instances: a canary trial under way there goes on
            through it (any other op ends the trial first: it must see the instance's settled state).
        timeout_s: the op fails if not complete after this many seconds (None: never).
        Instance: the instance-side handler class.
        returned: at the controller, sink instance -> payload returned so far.
        acks: at the controller, instance -> payload it acknowledged directly so far (instances
            acknowledge with ``InstanceContext.ack``; the op completes once every instance that
            ``expected_acks`` names has).
    """

    blocking: bool = True
    timeout_s: float | None = 60.0
    observes_only: bool = False
    Instance: type[InstanceHandler] = InstanceHandler

    def __init__(self) -> None:
        self.returned: dict[InstanceId, Any] = {}
        self.acks: dict[InstanceId, Any] = {}

    @property
    def kind(self) -> str:
        return type(self).__name__

    def on_init(self, ctx: ControllerContext) -> Mapping[InstanceId, Any] | None:
        """Build per-instance configurations (instance -> config); others get ``default_config``."""
        return None

    def default_config(self) -> Any:
        """The configuration of instances ``on_init`` did not name."""
        return None

    def extra_edges(self, ctx: ControllerContext) -> Iterable[tuple[InstanceId, InstanceId]]:
        """Edges added to the meta-topology G' for this op (must keep it acyclic)."""
        return ()

    def expected_acks(self, ctx: ControllerContext) -> Iterable[InstanceId]:
        """The instances that must acknowledge the op directly before it completes (default: none)."""
        return ()

    def on_begin(self, ctx: ControllerContext) -> None:
        """The first sink returned the op."""

    def on_next(self, ctx: ControllerContext, payloads: Mapping[InstanceId, Any]) -> None:
        """Sinks returned the op with ``payloads`` (sink instance -> payload)."""

    def on_complete(self, ctx: ControllerContext) -> Any:
        """Every sink returned the op; the value is the op's result."""
        return dict(self.returned)

    def on_dispose(self, ctx: ControllerContext) -> None:
        """The op is finished (complete or failed)."""

    def combine(self, a: Mapping[InstanceId, Any], b: Mapping[InstanceId, Any]) -> dict[InstanceId, Any]:
        """Merge two returned payloads at an aggregation relay (default: union by sink)."""
        merged = dict(a)
        merged.update(b)
        return merged


_HANDLERS = ("__init__", "on_begin", "on_next", "on_complete", "on_dispose")


@functools.lru_cache(maxsize=256)
def handles_nothing(handler_class: type) -> bool:
    """Whether every instance-side handler of ``handler_class`` is ``InstanceHandler``'s no-op.

    Instances skip such an op's handlers (and its configuration) altogether:
    they only align or track it and forward it with no payload.
    """
    return all(getattr(handler_class, name, None) is getattr(InstanceHandler, name) for name in _HANDLERS)
