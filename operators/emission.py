"""emission.py: the check that an aggregation left to emit only at end of input is not fed by a source that never ends.

A keyed aggregation (``agg``, ``count``, ``sum``... and ``reduce``) emits its
results when its input ends unless told ``emit="updates"``; a keyed ``top``
without ``idle=`` emits each key's rows only when its input ends too. Downstream of a
source that never ends it would emit nothing, and nothing would say so. What
the source says of itself (:meth:`~operators.logic.Source.bounded`) decides
what ``submit`` does, for an aggregation whose ``emit`` was left at its default:

* ``False`` (it never ends, as ``generate(None)``): refused, with
  :class:`FinalOnUnboundedError`, naming the aggregation, the source and the fix;
* ``None`` (it cannot tell: a custom source, a Structured Streaming query
  without an ending trigger): a :class:`FinalOnlyWarning`, naming the same;
* ``True``: nothing to say.

An explicit ``emit="final"`` is the user's choice and is left alone.

Example:
    >>> from chiray.operators import Dataflow, generate
    >>> flow = Dataflow("counts")
    >>> _ = flow.source(generate(None, rate=10), name="events").key_by("key").count(name="count").collect()
    >>> try:
    ...     check_final_only(flow.graph)
    ... except FinalOnUnboundedError as exc:
    ...     print(str(exc).split(";")[0])
    dataflow 'counts': operator 'count' emits only when its input ends (emit="final", the default), but source 'events' (generate(uniform)) never ends, so it would emit nothing
"""

from __future__ import annotations

import warnings

from .errors import ChirayError
from .graph import LogicalGraph, OperatorKind, OperatorNode

__all__ = ["FinalOnUnboundedError", "FinalOnlyWarning", "check_final_only"]


class FinalOnUnboundedError(ChirayError, ValueError):
    """An aggregation that emits only at end of input is fed by a source that never ends."""


class FinalOnlyWarning(ChirayError, UserWarning):
    """An aggregation that emits only at end of input is fed by a source that may never end."""


def check_final_only(graph: LogicalGraph) -> None:
    """Refuse (or warn about) each aggregation left at ``emit="final"`` that a source that never ends feeds.

    Raises:
        FinalOnUnboundedError: a source upstream of one says it never ends.
    """
    for node in graph.nodes.values():
        if not node.final_by_default:
            continue
        sources = _sources_above(graph, node)
        never = [s for s in sources if s.source is not None and s.source.bounded() is False]
        if never:
            raise FinalOnUnboundedError(_message(graph.name, node, never[0], "never ends"))
        unknown = [s for s in sources if s.source is not None and s.source.bounded() is None]
        if unknown:
            warnings.warn(FinalOnlyWarning(
                _message(graph.name, node, unknown[0], "may never end (it does not say whether it ends: "
                                                       "its bounded() is None)")
                + "; a source that does end can say so (Source.bounded() returning True)"), stacklevel=4)


def _sources_above(graph: LogicalGraph, node: OperatorNode) -> list[OperatorNode]:
    pending, seen, found = [e.upstream for e in node.inputs], set(), []
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        up = graph.nodes[name]
        if up.kind is OperatorKind.SOURCE:
            found.append(up)
        pending.extend(e.upstream for e in up.inputs)
    return sorted(found, key=lambda n: list(graph.nodes).index(n.name))


def _message(flow: str, node: OperatorNode, source: OperatorNode, why: str) -> str:
    described = source.source.describe() if source.source is not None else ""
    if node.final_fix:
        return (f"dataflow {flow!r}: operator {node.name!r} emits only when its input ends, but source "
                f"{source.name!r} ({described}) {why}, so it would emit nothing; {node.final_fix}")
    return (f"dataflow {flow!r}: operator {node.name!r} emits only when its input ends (emit=\"final\", the "
            f"default), but source {source.name!r} ({described}) {why}, so it would emit nothing; pass "
            f"emit=\"updates\" to {node.name!r} to emit each key's new value as its batches arrive (or "
            f"emit=\"final\" to keep it so knowingly)")
