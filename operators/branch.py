"""branch.py: a branch for a running dataflow: the operators and sinks ``job.add_branch`` adds downstream of a
running operator, built with the usual ``Stream`` verbs and checked before anything changes.

``branch_nodes`` hands ``build`` a ``Stream`` of a scratch copy of the job's graph positioned at the running
operator; whatever ``build`` adds there is the branch. A branch reads only the running operator (and its own
operators), adds no source, ends in at least one sink, and leaves no operator of its own unconsumed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .dataflow import Dataflow, Stream
from .errors import ChirayError
from .graph import LogicalGraph, OperatorKind, OperatorNode

__all__ = ["BranchError", "branch_nodes", "branch_of", "branch_root"]


class BranchError(ChirayError, ValueError):
    """A branch cannot be added or removed as asked (the message says why and what to change)."""


def branch_nodes(graph: LogicalGraph, from_operator: str, build: Callable[[Stream], Any],
                 num_bins: int) -> list[OperatorNode]:
    """The operators ``build(stream)`` adds downstream of ``from_operator`` (in the order added).

    Args:
        graph: the running job's logical graph (not changed).
        from_operator: the running operator the branch reads.
        build: ``fn(stream) -> anything``: adds operators and sinks to ``stream`` (the running operator's
            output) with the usual verbs.
        num_bins: the default bins of a keyed operator of the branch.

    Raises:
        BranchError: an unknown operator or a sink to branch from, a ``build`` that adds no sink, adds a
            source, reads another running operator, or leaves an operator of its own unconsumed.
    """
    where = f"add_branch from {from_operator!r}"
    node = graph.nodes.get(from_operator)
    if node is None:
        raise BranchError(f"{where}: unknown operator; operators: {sorted(graph.nodes)}")
    if node.kind is OperatorKind.SINK:
        raise BranchError(f"{where}: a sink has no output to branch from")
    if not callable(build):
        raise BranchError(f"{where}: build must be a function of a Stream, got {type(build).__name__}")
    flow = Dataflow(graph.name, num_bins=num_bins)
    for existing in graph.nodes.values():
        flow.graph.add(dataclasses.replace(existing, inputs=list(existing.inputs)))
    try:
        build(Stream(flow, flow.graph.nodes[from_operator]))
    except (TypeError, ValueError) as exc:  # a verb refused its arguments: say where
        raise BranchError(f"{where}: {exc}") from exc
    added = [n for name, n in flow.graph.nodes.items() if name not in graph.nodes]
    names = {n.name for n in added}
    if not any(n.kind is OperatorKind.SINK for n in added):
        raise BranchError(f"{where}: the branch adds no sink; end it with .sink(...) or .collect()")
    for n in added:
        if n.kind is OperatorKind.SOURCE:
            raise BranchError(f"{where}: a branch cannot add a source ({n.name!r})")
        others = [e.upstream for e in n.inputs if e.upstream not in names and e.upstream != from_operator]
        if others:
            raise BranchError(f"{where}: {n.describe()} reads running operator(s) {others}; a branch reads only "
                              f"{from_operator!r} and its own operators")
        if n.kind is not OperatorKind.SINK and not any(n.name in (e.upstream for e in m.inputs) for m in added):
            raise BranchError(f"{where}: the output of {n.describe()} is not consumed; add a .sink(...)")
    return added


def branch_of(graph: LogicalGraph, sink: str) -> list[str]:
    """The operators ``remove_branch(sink)`` removes: the sink and the operators upstream of it that feed
    nothing else, nearest first.

    Raises:
        BranchError: ``sink`` is no sink of the graph, or it is the job's only sink.
    """
    node = graph.nodes.get(sink)
    if node is None or node.kind is not OperatorKind.SINK:
        sinks = sorted(n.name for n in graph.nodes.values() if n.kind is OperatorKind.SINK)
        raise BranchError(f"remove_branch({sink!r}): not a sink of the job; its sinks: {sinks}")
    if sum(n.kind is OperatorKind.SINK for n in graph.nodes.values()) == 1:
        raise BranchError(f"remove_branch({sink!r}): it is the job's only sink (stop or cancel the job instead)")
    removed = [sink]
    pending = [e.upstream for e in node.inputs]
    while pending:
        name = pending.pop(0)
        up = graph.nodes[name]
        if name in removed or up.kind is OperatorKind.SOURCE:
            continue
        if all(c in removed for c in graph.consumers(name)):
            removed.append(name)
            pending.extend(e.upstream for e in up.inputs)
    return removed


def branch_root(graph: LogicalGraph, removed: list[str]) -> str:
    """The running operator that the branch of operators ``removed`` (``branch_of``) reads: its channels to
    the branch close at the cut of the removal's op.

    Raises:
        BranchError: the branch reads more than one running operator (it joins two parts of the job), or a
            source (the source would be left without a consumer).
    """
    gone = set(removed)
    roots = sorted({e.upstream for name in removed for e in graph.nodes[name].inputs if e.upstream not in gone})
    where = f"remove_branch({removed[0]!r})"
    if len(roots) != 1:
        raise BranchError(f"{where}: the branch reads several running operators {roots}; only a branch that "
                          "reads one can be removed while the job runs (stop the job with a savepoint and "
                          "restore it without the branch)")
    root = roots[0]
    if all(c in gone for c in graph.consumers(root)):  # only a source: branch_of keeps every source
        raise BranchError(f"{where}: nothing but the branch reads source {root!r}, which would be left without a "
                          "consumer")
    return root
