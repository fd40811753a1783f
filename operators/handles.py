"""handles.py: what the fluent API's helpers (windows, connected streams) need of a stream, and what
``Dataflow.submit`` returns, as protocols.

``Stream`` and ``KeyedStream`` (``dataflow.py``) satisfy the stream protocols. ``windowed.py`` and
``connected.py`` type against these instead of importing ``dataflow.py``, which imports them: the import
graph stays acyclic. They are generic in the stream type ``S`` their operators return, which
``dataflow.py`` fixes to ``Stream``: ``key_by(k).window(...)`` is a ``WindowedStream[Stream]``, so a
type checker knows that its ``agg`` returns a ``Stream`` with every verb.

``JobLike`` is the job handle as this layer can name it: the runtime (``chiray.actors``) implements it, and
its ``JobHandle`` satisfies it with narrower return types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar, runtime_checkable

import pyarrow as pa

from .graph import InputEdge, OperatorNode, Partition

__all__ = ["StreamLike", "KeyedStreamLike", "S", "JobLike", "RescaleLike"]


class StreamLike(Protocol):
    """A stream of a dataflow: the output (or a side output) of one operator."""

    flow: Any
    node: OperatorNode
    port: str | None

    @property
    def name(self) -> str: ...

    @property
    def schema(self) -> pa.Schema | None: ...

    def side_output(self, port: str, schema: pa.Schema | None = None) -> Any: ...

    def _edge(self, partition: Partition = Partition.FORWARD, key: str | None = None,
              num_bins: int = 0) -> InputEdge: ...


# S: the stream type that the operators of a window or a connected pair return (``dataflow.Stream``). Type
# checkers see a default (PEP 696): a bare ``WindowedStream`` annotation is a ``WindowedStream[StreamLike]``.
if TYPE_CHECKING:
    from typing_extensions import TypeVar as TypeVarWithDefault

    S = TypeVarWithDefault("S", bound=StreamLike, default=StreamLike)
else:
    S = TypeVar("S", bound=StreamLike)


class KeyedStreamLike(Protocol[S]):
    """A stream partitioned by ``key`` into ``num_bins`` bins, whose keyed operators return an ``S``."""

    stream: S
    key: str
    num_bins: int

    def _keyed(self, verb: str, make: Callable[[], Any], *, name: str | None,
               parallelism: int | None, schema: pa.Schema | None, origin: str = "") -> S: ...

    def _agg_specs(self, op_name: str, aggregates: dict[str, Any]) -> list[Any]: ...


@runtime_checkable
class RescaleLike(Protocol):
    """A rescale or migration in progress, as ``JobLike.rescale`` returns it (``chiray.actors``' ``RescaleControl``)."""

    def progress(self) -> Any: ...

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> Any: ...


@runtime_checkable
class JobLike(Protocol):
    """The job ``Dataflow.submit`` returns: the verbs of ``chiray.JobHandle``, which documents them.

    The same verbs with the same parameters (a unit test holds them equal); where a verb returns a value of
    the runtime (``JobInfo``, ``CheckpointInfo``...), here it is ``Any``. ``chiray.submit(flow)`` returns
    the runtime's own types.
    """

    name: str

    def status(self) -> Any: ...

    def info(self) -> Any: ...

    def statistics(self) -> Any: ...

    def metrics(self, timeout: float | None = 60.0) -> Any: ...

    def rescale(self, operator: str, parallelism: int, strategy: str = "all_at_once", planner: str = "ssm",
                **knobs: Any) -> RescaleLike: ...

    def migrate(self, operator: str, assignment: list[int], strategy: str = "all_at_once",
                **knobs: Any) -> RescaleLike: ...

    def rescales(self) -> tuple[Any, ...]: ...

    def upgrade(self, operator: str, fn: Any, *, on_timer: Any = None, schema: Any = None,
                migrate_state: Any = None, canary: int = 0, rate_bound: float = 0.5,
                timeout: float | None = 60.0) -> Any: ...

    def upgrades(self) -> tuple[Any, ...]: ...

    def add_branch(self, from_operator: str, build: Callable[..., object], timeout: float | None = 60.0) -> Any: ...

    def remove_branch(self, sink: str, timeout: float | None = 60.0) -> Any: ...

    def checkpoint(self, timeout: float | None = 120.0) -> int: ...

    def checkpoint_info(self, timeout: float | None = 120.0) -> Any: ...

    def savepoint(self, dir: str | None = None, timeout: float | None = 120.0) -> str: ...

    def savepoints(self) -> tuple[Any, ...]: ...

    def delete_savepoint(self, path: str) -> Any: ...

    def stop(self, savepoint: str | None = None, timeout: float | None = 120.0) -> Any: ...

    def cancel(self) -> None: ...

    def wait(self, timeout: float | None = None) -> None: ...

    def result(self, sink: str | None = None) -> Any: ...

    def tail(self, sink: str | None = None, n: int = 10) -> Any: ...

    def logs(self, lines: int = 100, since: Any = None) -> Any: ...

    def run_control(self, op: Any, controller: str | None = None) -> Any: ...

    def autoscale(self, enabled: bool = True, **options: Any) -> Any: ...

    def forget(self) -> None: ...
