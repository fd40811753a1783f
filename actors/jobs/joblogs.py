"""joblogs.py: the log lines Ray keeps for a job's actors: its manager, its hosts and its controller.

Ray sends the stdout and stderr of every worker process to files in its
node's session log directory, ``worker-<worker id>-<job id>-<pid>.out`` and
``.err``: what user functions print, and the warnings and errors the
runtime logs. ``job_logs`` finds each actor in Ray's actor table (its node
and process id, kept after it died), then reads the newest files of that
process with one task per node, pinned there (``num_cpus=0``). Unlike Ray's
state API (``ray.util.state.get_log``), this needs no dashboard, and it
reads the files of a host that has ended.

A host's file is its process's: a host reused from the warm pool also
holds what it printed for the jobs it served before.

Example:
    >>> logs = job.logs(lines=20)                                   # doctest: +SKIP
    >>> for line in logs.lines:                                     # doctest: +SKIP
    ...     print(line)
    host-0 out | hello from a user function
    >>> newer = job.logs(since=logs.cursor)                         # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import TYPE_CHECKING, Mapping, Protocol, TypedDict

import ray

from ..errors import ChirayError

if TYPE_CHECKING:
    from .jobtopology import JobTopology

__all__ = ["LogLine", "JobLogs", "job_logs", "job_log_actors", "read_lines", "worker_log", "RAY_MARKERS"]

RAY_MARKERS = (":job_id:", ":actor_name:", ":task_name:")
"""Prefixes of the lines Ray writes into a worker's files for its own use (which driver a line goes to)."""

FOLLOW_BYTES = 1 << 20
"""The most bytes one call reads of a file after a cursor (a busy file: the newest MiB)."""

READ_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a job actor's log.

    Attributes:
        source: the actor: ``manager``, ``controller`` or ``host-<id>``.
        stream: ``out`` (stdout) or ``err`` (stderr, where ``logging`` writes).
        text: the line, without its end.
    """

    source: str
    stream: str
    text: str

    def __str__(self) -> str:
        return f"{self.source} {self.stream} | {self.text}"


class JobLogsJson(TypedDict):
    """``JobLogs.to_json()``: each line as ``{"source", "stream", "text"}``, and actor -> why its log is missing."""

    lines: list[dict[str, str]]
    missing: dict[str, str]


@dataclasses.dataclass(frozen=True, slots=True)
class JobLogs:
    """What ``JobHandle.logs`` read: the lines, where to go on from, and the actors whose logs it missed.

    Attributes:
        lines: each actor's lines, oldest first, actor by actor.
        cursor: where each file's reading stopped; ``logs(since=cursor)`` returns only the lines after it.
        missing: (actor, why) for each actor whose log could not be read.
    """

    lines: tuple[LogLine, ...]
    cursor: tuple[tuple[str, int], ...] = ()
    missing: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> JobLogsJson:
        """``{"lines": [{"source", "stream", "text"}...], "missing": {actor: why}}`` (``--json``)."""
        return {"lines": [dataclasses.asdict(line) for line in self.lines], "missing": dict(self.missing)}


def read_lines(path: str, lines: int, offset: int | None = None) -> tuple[list[str], int]:
    """The lines of the file ``path``: its last ``lines``, or (``offset`` given) every complete line after byte
    ``offset`` (at most the last ``FOLLOW_BYTES``). Ray's own marker lines are left out.

    Returns:
        The lines and the offset to read on from.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if offset is not None and offset <= size:
            start = max(offset, size - FOLLOW_BYTES)
            f.seek(start)
            data = f.read(size - start)
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
            texts = data[:end].decode("utf-8", "replace").splitlines()
            if start > offset and texts:
                texts = texts[1:]  # the first one is cut
            return [t for t in texts if not t.startswith(RAY_MARKERS)], start + end
        block = 1 << 16
        while True:  # the newest blocks, doubling, until they hold ``lines`` lines
            start = max(size - block, 0)
            f.seek(start)
            texts = f.read(size - start).decode("utf-8", "replace").splitlines()[1 if start else 0:]  # cut first
            texts = [t for t in texts if not t.startswith(RAY_MARKERS)]
            if start == 0 or len(texts) >= lines:
                return (texts[-lines:] if lines else []), size
            block *= 2


def worker_log(log_dir: str, pid: int, stream: str) -> str | None:
    """The newest ``worker-*-<pid>.<stream>`` file in ``log_dir`` (a pid may recur within a session)."""
    found = glob.glob(os.path.join(glob.escape(log_dir), f"worker-*-{int(pid)}.{stream}"))
    return max(found, key=os.path.getmtime) if found else None


def _read_on_node(wanted: list[tuple[str, int]], lines: int,
                  since: Mapping[str, int] | None) -> tuple[list[tuple[str, str, list[str], str, int]],
                                                          list[tuple[str, str]]]:
    """On one node: for each (actor, pid), its ``out`` and ``err`` lines (with their file and the offset to go
    on from), and the actors without a log file there."""
    node = ray._private.worker.global_worker.node  # the session's log directory on this node
    log_dir = node.get_logs_dir_path() if node is not None else None
    if log_dir is None:
        return [], [(source, "this node's Ray log directory is unknown") for source, _ in wanted]
    read, missing = [], []
    for source, pid in wanted:
        files = {stream: worker_log(log_dir, pid, stream) for stream in ("out", "err")}
        if not any(files.values()):
            missing.append((source, f"no log file of process {pid} in {log_dir}"))
        for stream, path in files.items():
            if path is not None:
                texts, offset = read_lines(path, lines, None if since is None else since.get(path))
                read.append((source, stream, texts, path, offset))
    return read, missing


_read_task = ray.remote(num_cpus=0, max_retries=0)(_read_on_node)


def _locate(actor_id: str) -> tuple[str, int]:
    """The node id and process id of actor ``actor_id`` (hex), from Ray's actor table (also once it died)."""
    try:
        entry = ray._private.state.actors(actor_id)  # the GCS table: no dashboard needed
        node, pid = entry["Address"]["NodeID"], entry["Pid"]
    except (AttributeError, KeyError, TypeError):  # another Ray version: its state API (needs the dashboard)
        from ray.util.state import get_actor

        state = get_actor(actor_id)
        if state is None:
            raise ChirayError(f"Ray does not know actor {actor_id}") from None
        node, pid = state.node_id, state.pid
    if not node or not pid:
        raise ChirayError(f"actor {actor_id} has not started")
    return node, int(pid)


def _by_node(actors: Mapping[str, str]) -> tuple[dict[str, list[tuple[str, int]]], list[tuple[str, str]]]:
    """Node id -> (name, process id) of each of ``actors`` (name -> actor id) that runs there; and
    (name, why) of those not found."""
    by_node: dict[str, list[tuple[str, int]]] = {}
    missing: list[tuple[str, str]] = []
    for source, actor_id in actors.items():
        try:
            node, pid = _locate(actor_id)
        except Exception as exc:
            missing.append((source, str(exc)))
            continue
        by_node.setdefault(node, []).append((source, pid))
    return by_node, missing


class _RanJob(Protocol):
    """A driver's ``Job``, as far as its logs go: its topology's actors."""

    topology: JobTopology


def job_log_actors(job: _RanJob) -> dict[str, str]:
    """``controller`` (where it has an actor of its own) and ``host-<id>`` -> the actor id, for a driver's
    ``Job`` (running, or the actors it had when it ended)."""
    from ..runtime.controller import controller_host

    snap = job.topology.snapshot()
    out = {}
    if snap.controller is not None and controller_host(snap.controller) is None:
        out["controller"] = snap.controller._actor_id.hex()
    for host_id, host in zip(snap.host_ids, snap.hosts):
        out[f"host-{host_id}"] = host._actor_id.hex()
    return out


def job_logs(actors: Mapping[str, str], lines: int = 100, since: JobLogs | tuple | None = None) -> JobLogs:
    """The log lines of ``actors`` (name -> actor id), each actor's in turn.

    Args:
        actors: what to read, by the name its lines carry.
        lines: how many of each file's last lines (ignored for a file that ``since`` has read from).
        since: an earlier answer's ``cursor`` (or the answer): only the lines written after it.

    Raises:
        ValueError: ``lines`` is not an int from 0 to 100,000.
    """
    if isinstance(lines, bool) or not isinstance(lines, int) or not 0 <= lines <= 100_000:
        raise ValueError(f"logs(): lines must be an int from 0 to 100,000, got {lines!r}")
    cursor = since.cursor if isinstance(since, JobLogs) else since
    seen = None if cursor is None else dict(cursor)
    by_node, missing = _by_node(actors)
    pending = {node: _read_task.options(scheduling_strategy=ray.util.scheduling_strategies.
                                        NodeAffinitySchedulingStrategy(node, soft=False)).remote(wanted, lines, seen)
               for node, wanted in by_node.items()}
    found: dict[str, list[LogLine]] = {}
    offsets = []
    for node, ref in pending.items():
        try:
            read, lost = ray.get(ref, timeout=READ_TIMEOUT_S)
        except Exception as exc:  # the node is gone or does not answer
            missing += [(source, f"node {node[:8]}: {type(exc).__name__}") for source, _ in by_node[node]]
            continue
        missing += lost
        for source, stream, texts, path, offset in read:
            found.setdefault(source, []).extend(LogLine(source, stream, t) for t in texts)
            offsets.append((path, offset))
    ordered = tuple(line for source in actors for line in found.get(source, ()))
    return JobLogs(ordered, tuple(offsets), tuple(missing))
