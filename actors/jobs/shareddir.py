"""shareddir.py: whether the cluster's nodes share a local checkpoint directory; submit refuses it if not.

A job's hosts and controller run on any node, and a host that restarts
elsewhere reads the checkpoints the others wrote: a checkpoint directory on a
local disk works on one machine only. On a cluster of more than one alive
node, ``submit`` therefore probes a local ``checkpoint_dir`` (or, without
one, the temporary directory it would make one in) before the job starts:
every node writes a token file into it, then every node reads the file of
the next node (in node-id order, a ring: however the nodes fall into groups
that share a disk, one reader sits in another group than its writer). A node
that cannot write there, or reads no token or another one, refuses the
directory with an :class:`UnsharedStorageError` that names both nodes and
the fix: an ``s3://`` (or another ``pyarrow.fs``) URI, or a mount that every
node shares. URIs are not probed, nor is a cluster of one node. A directory
that passed is not probed again by this process while the nodes stay the
same.

Each probe is a Ray task of no CPU pinned to its node
(``NodeAffinitySchedulingStrategy``, not soft): two rounds of one task per
node. Readers delete what they read; the files of a failed probe are removed
by a third round. Nodes of one machine share its disk, so the probe passes on
a ``ray.cluster_utils`` cluster; on nodes with disks of their own (separate
machines, or a mount namespace each) it refuses. To probe by hand::

    from chiray.actors.jobs.shareddir import check_shared_dir
    check_shared_dir("/data/chk")           # raises UnsharedStorageError if some node cannot read it

:func:`probe` takes the runner as an argument (``ray_runner`` by default):
a test gives one that runs the same functions in-process, each node with a
directory of its own.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import tempfile
import uuid
from typing import Callable, Mapping, Sequence

from ..errors import ChirayError

__all__ = ["UnsharedStorageError", "ProbeFailure", "probe", "check_shared_dir", "ray_runner", "alive_nodes"]

PROBE_TIMEOUT_S = 120.0
"""How long a round of the probe waits for every node's task (a busy node starts a worker first)."""

_PROBE_PREFIX = ".chiray-probe-"

Runner = Callable[[Callable[..., object], Mapping[str, tuple]], Mapping[str, object]]
"""Runs ``fn(*args)`` on each node (node id -> args); node id -> its result, or the exception it raised."""

_passed: set[tuple[str, frozenset[str]]] = set()  # (directory, nodes) probed and shared, in this process


class UnsharedStorageError(ChirayError, ValueError):
    """A local checkpoint directory that the nodes of the cluster do not share (raised at submit)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeFailure:
    """One failed step of a probe: ``reader`` could not read what ``writer`` wrote (or ``writer`` could not
    write, then ``reader`` is ``None``); ``why`` says what happened."""

    writer: str
    reader: str | None
    why: str


# -- what runs on each node ----------------------------------------------------------------------------


def write_token(path: str, token: str) -> None:
    """Write ``token`` to ``path`` (its directory created, private to the user)."""
    os.makedirs(posixpath.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w") as f:
        f.write(token)


def read_token(path: str) -> str | None:
    """The token at ``path`` (then deleted, and its directory once empty), or ``None`` if there is none."""
    try:
        with open(path) as f:
            token = f.read()
    except FileNotFoundError:
        return None
    remove_token(path)
    return token


def remove_token(path: str) -> None:
    """Delete ``path`` if there, and its directory once empty."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    try:
        os.rmdir(posixpath.dirname(path))
    except OSError:
        pass  # another node's file is still there, or it is gone already


# -- the decision --------------------------------------------------------------------------------------


def probe(directory: str, nodes: Sequence[str], run_on: Runner) -> list[ProbeFailure]:
    """Whether every node in ``nodes`` reads what another wrote in ``directory``: the failures (none: shared).

    Args:
        directory: a local directory (it need not exist on every node).
        nodes: node ids, at least two.
        run_on: runs a function on each node (``ray_runner()``; a test injects its own).
    """
    ring = sorted(nodes)
    where = posixpath.join(directory, f"{_PROBE_PREFIX}{uuid.uuid4().hex[:12]}")
    files = {node: posixpath.join(where, f"{i}.token") for i, node in enumerate(ring)}
    tokens = {node: uuid.uuid4().hex for node in ring}
    wrote = run_on(write_token, {node: (files[node], tokens[node]) for node in ring})
    failures = [ProbeFailure(node, None, f"could not write there ({_why(error)})")
                for node in ring if isinstance(error := wrote[node], BaseException)]
    readers = {node: ring[(i - 1) % len(ring)] for i, node in enumerate(ring)}  # writer -> who reads its file
    asked = {readers[w]: (files[w],) for w in ring if not isinstance(wrote[w], BaseException)}
    read = run_on(read_token, asked) if asked else {}
    for writer in ring:
        reader = readers[writer]
        if reader not in asked:
            continue
        got = read[reader]
        if isinstance(got, BaseException):
            failures.append(ProbeFailure(writer, reader, f"reading failed ({_why(got)})"))
        elif got is None:
            failures.append(ProbeFailure(writer, reader, "no file there"))
        elif got != tokens[writer]:
            failures.append(ProbeFailure(writer, reader, "another file there"))
    if failures:  # the files the readers did not see are on their writers' disks
        run_on(remove_token, {node: (files[node],) for node in ring})
    return failures


def _why(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # a RayTaskError carries the task's own exception
    exc = cause if isinstance(cause, BaseException) else exc
    return f"{type(exc).__name__}: {exc}"


def refusal(directory: str, given: bool, failures: Sequence[ProbeFailure], names: Mapping[str, str],
            count: int) -> UnsharedStorageError:
    """The error that refuses ``directory``: what failed, between which nodes (``names``: node id -> what to
    call it), and the fix."""
    first = failures[0]
    name = lambda node: names.get(node, node[:12])  # noqa: E731
    what = (f"node {name(first.writer)} {first.why}" if first.reader is None else
            f"node {name(first.reader)} could not read what node {name(first.writer)} wrote there: "
            f"{first.why}")
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    which = (f"checkpoint_dir {directory!r} is a local directory" if given else
             f"without checkpoint_dir, checkpoints go to a temporary directory under {directory!r}, which is "
             f"local")
    return UnsharedStorageError(
        f"{which} that the {count} nodes of this Ray cluster do not share: {what}{more}. Every node must "
        f"read the checkpoints (a host that restarts on another node reads what the others wrote): give "
        f"checkpoint_dir an s3:// URI (or another pyarrow.fs URI that every node reaches, such as "
        f"'s3://bucket/chk?endpoint_override=host:9000&scheme=http'), or a directory on a mount that every "
        f"node shares")


# -- the Ray shell -------------------------------------------------------------------------------------


def alive_nodes() -> dict[str, str]:
    """The cluster's alive nodes: node id -> its address (for messages)."""
    import ray

    return {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes() if n.get("Alive")}


def ray_runner(timeout_s: float = PROBE_TIMEOUT_S) -> Runner:
    """A runner of one Ray task per node, pinned to it (no CPU); a task that fails or is not done within
    ``timeout_s`` gives its exception."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def run_on(fn: Callable[..., object], args: Mapping[str, tuple]) -> dict[str, object]:
        task = ray.remote(num_cpus=0, max_retries=0)(fn)
        refs = {node: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(*a) for node, a in args.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        out: dict[str, object] = {}
        for node, ref in refs.items():
            if ref not in ready:
                ray.cancel(ref, force=True)
                out[node] = TimeoutError(f"the probe task did not run within {timeout_s} s")
                continue
            try:
                out[node] = ray.get(ref)
            except Exception as exc:
                out[node] = exc
        return out

    return run_on


def check_shared_dir(checkpoint_dir: str | None, run_on: Runner | None = None,
                     nodes: Mapping[str, str] | None = None) -> None:
    """Refuse a local ``checkpoint_dir`` (``None``: the temporary directory) that the cluster's alive nodes do
    not share; URIs and clusters of one node pass unprobed. Needs ``ray.init()`` unless ``nodes`` is given.

    Args:
        checkpoint_dir: the job's ``checkpoint_dir``.
        run_on: how to run the probe on each node (default: pinned Ray tasks, :func:`ray_runner`).
        nodes: node id -> address (default: the cluster's alive nodes, :func:`alive_nodes`).

    Raises:
        UnsharedStorageError: some node cannot read what another wrote there (naming both, and the fix).
    """
    if checkpoint_dir is not None and "://" in checkpoint_dir and not checkpoint_dir.startswith("file://"):
        return
    nodes = alive_nodes() if nodes is None else nodes
    if len(nodes) < 2:
        return
    directory = tempfile.gettempdir() if checkpoint_dir is None else checkpoint_dir.removeprefix("file://")
    directory = os.path.abspath(directory.split("?", 1)[0])
    key = (directory, frozenset(nodes))
    if key in _passed:
        return
    failures = probe(directory, list(nodes), run_on or ray_runner())
    if failures:
        raise refusal(directory, checkpoint_dir is not None, failures,
                      {n: f"{n[:12]} ({address})" for n, address in nodes.items()}, len(nodes))
    _passed.add(key)
