"""handles.py: what the fluent API's helpers (windows, connected streams) need of a stream, as protocols.

``Stream`` and ``KeyedStream`` (``dataflow.py``) satisfy them. ``windowed.py`` and ``connected.py`` type
against these instead of importing ``dataflow.py``, which imports them: the import graph stays acyclic.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import pyarrow as pa

from .graph import InputEdge, OperatorNode, Partition

__all__ = ["StreamLike", "KeyedStreamLike"]


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


class KeyedStreamLike(Protocol):
    """A stream partitioned by ``key`` into ``num_bins`` bins."""

    stream: Any
    key: str
    num_bins: int

    def _keyed(self, verb: str, make: Callable[[], Any], *, name: str | None,
               parallelism: int | None, schema: pa.Schema | None, origin: str = "") -> Any: ...

    def _agg_specs(self, op_name: str, aggregates: dict[str, Any]) -> list[Any]: ...
