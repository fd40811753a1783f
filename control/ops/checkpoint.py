"""checkpoint.py: ``Checkpoint``, the in-band, aligned, durable checkpoint (a safe blocking op).

At each instance, in ``on_complete`` (so the barrier has arrived on every input
and the instance's state reflects exactly the records before it):

* a source acknowledges its split offsets;
* a keyed instance decides per bin what to write (``chains.BinChains``): a
  full copy, only its changes since its previous checkpoint (incremental), or
  nothing (unchanged); it copies those rows, then serialises and writes them to
  storage in a background thread (off the processing path) and acknowledges
  the files each bin is made of. A ``full`` checkpoint (a savepoint's) writes
  every bin whole, so its directory holds all it needs;
* a sink closes its output of this epoch as staged files and acknowledges them,
  with what it staged in earlier epochs whose checkpoint the controller has not
  seen durable (``durable``: a checkpoint that failed after the sinks staged
  commits nothing, so the next one lists and commits that output too). A sink
  holds back none of its inputs while the barrier is on its way on the others:
  it keeps apart what comes after the barrier on a channel and writes it once
  it has staged the epoch, as the next epoch's output (``keeps_input_apart``),
  so no upstream instance waits on it;
* any other instance acknowledges at once.

The controller commits the manifest (atomically, written last) when every sink
has returned the op and every instance has acknowledged; then it makes every
sink output the manifest lists visible (idempotently: committing a file twice
is harmless) and deletes old checkpoints beyond the retention. The op's result
is the checkpoint id. The manifest's ``sink_staged`` maps each sink instance to
its staged output per epoch (``sinks``, one value per instance, in checkpoints
of earlier versions); ``state_chains`` maps each keyed instance to the files
of each of its bins (formats 2 and 3, ``chains.manifest_chains``; format 1 had one
full file per instance in ``state_files``).
"""

from __future__ import annotations

import base64
import time
from typing import Any, Callable, Collection, Protocol

import cloudpickle

from chiray.operators.errors import ChirayError
from chiray.operators.statecodec import BinStream

from ..message import InstanceId
from ..op import ControlOp, InstanceHandler
from .chains import MANIFEST_FORMAT, ChainBound, CutPlan

__all__ = ["Checkpoint", "CheckpointStore", "InconsistentCheckpointError", "ResumeSources", "bins_held_twice",
           "encode_offsets", "decode_offsets", "instance_key", "code_entry"]


class InconsistentCheckpointError(ChirayError, RuntimeError):
    """A checkpoint's snapshots disagree (a key bin in two instances of one operator): it is not committed,
    so no recovery or restore can load it; the job runs on and the next checkpoint commits this one's output."""


def bins_held_twice(state_bins: dict[str, list[int]]) -> dict[str, dict[int, list[int]]]:
    """The key bins that more than one instance of an operator snapshotted: operator -> bin -> instances.

    Each bin of a keyed operator belongs to one instance at any cut of the dataflow; a bin in two
    snapshots means one of them was taken on the wrong side of a migration, and a restore would load
    state that saw records the restored sources replay.

    Example:
        >>> bins_held_twice({"count/0": [0, 1], "count/1": [1, 2], "sum/0": [1]})
        {'count': {1: [0, 1]}}
    """
    owners: dict[str, dict[int, list[int]]] = {}
    for key, bins in sorted(state_bins.items()):
        operator, index = key.rsplit("/", 1)
        for b in bins:
            owners.setdefault(operator, {}).setdefault(b, []).append(int(index))
    return {op: {b: sorted(who) for b, who in held.items() if len(who) > 1}
            for op, held in owners.items() if any(len(who) > 1 for who in held.values())}


class CheckpointStore(Protocol):
    """What the checkpoint op needs of durable storage (``actors.storage.CheckpointStorage``)."""

    root_uri: str

    def state_file(self, checkpoint_id: int, operator: str, index: int) -> str: ...

    def write_state(self, checkpoint_id: int, operator: str, index: int, bins: dict[int, bytes] | BinStream,
                    changes: dict[int, bytes] | BinStream | None = None) -> str: ...

    def commit(self, checkpoint_id: int, manifest: dict[str, Any]) -> None: ...

    def retain(self, keep: int, taking: Collection[int] = ()) -> None: ...


def instance_key(instance: InstanceId) -> str:
    """How an instance is named in a manifest: ``"operator/index"``."""
    return f"{instance[0]}/{instance[1]}"


def encode_offsets(offsets: Any) -> str:
    """Source offsets (any picklable value) as manifest text."""
    return base64.b64encode(cloudpickle.dumps(offsets)).decode()


def decode_offsets(text: str) -> Any:
    return cloudpickle.loads(base64.b64decode(text))


class Checkpoint(ControlOp):
    """Take checkpoint ``checkpoint_id`` into ``storage``.

    Args:
        checkpoint_id: the id (also the epoch of sink output it commits).
        storage: where state files and the manifest go.
        keep: how many complete checkpoints to retain.
        commit_sinks: at the controller, makes one sink's staged output visible:
            ``commit_sinks(sink_name, [staged per instance])``.
        commit_sources: at the controller, tells one source the offsets the
            checkpoint holds: ``commit_sources(source_name, checkpoint_id, {split id: offset})``.
        job: metadata recorded in the manifest (operators, parallelism, bins).
        durable: the newest checkpoint the controller knows durable when this one starts: sinks list
            what they staged after it.
        on_durable: at the controller, called with the id once the manifest is written.
        final: a stop's last checkpoint: each source *halts* at the cut (reads nothing after it), so
            the job's input ends where the checkpoint does; :class:`ResumeSources` undoes it if the
            checkpoint fails and the job runs on.
        bound: when a bin's chain of changes gets a full copy again.
        full: write every bin whole (a savepoint's checkpoint: self-contained, needing no other's files).
        taking: at the controller, the ids of its checkpoints still being taken (retention leaves them).
    """

    blocking = True

    def __init__(self, checkpoint_id: int, storage: CheckpointStore, keep: int = 3,
                 commit_sinks: Callable[[str, list], None] | None = None,
                 job: dict[str, Any] | None = None, timeout_s: float | None = 120.0,
                 commit_sources: Callable[[str, int, dict[str, Any]], None] | None = None,
                 durable: int = 0, on_durable: Callable[[int], None] | None = None, final: bool = False,
                 bound: ChainBound | None = None, full: bool = False,
                 taking: Callable[[], Collection[int]] | None = None):
        super().__init__()
        self.checkpoint_id = checkpoint_id
        self.storage = storage
        self.keep = keep
        self.commit_sinks = commit_sinks
        self.commit_sources = commit_sources
        self.job = job or {}
        self.timeout_s = timeout_s
        self.durable = durable
        self.on_durable = on_durable
        self.final = final
        self.bound = bound or ChainBound()
        self.full = full
        self.taking = taking
        self.started = time.time()

    acks: dict[InstanceId, Any]  # filled at the controller as instances acknowledge

    def __getstate__(self) -> dict[str, Any]:
        # Travels to every instance: leave the controller's commit callback behind.
        state = dict(self.__dict__)
        state["commit_sinks"] = state["commit_sources"] = state["on_durable"] = state["taking"] = None
        return state

    def expected_acks(self, ctx: Any) -> set[InstanceId]:
        return set(map(tuple, ctx.instances))

    class Instance(InstanceHandler):
        def on_begin(self, ctx: Any) -> None:
            if ctx.kind == "sink":  # its output is staged by epoch: what comes after the barrier is the next's
                self.holds_inputs = False
                self.keeps_input_apart = True

        def on_complete(self, ctx: Any) -> None:
            op: Checkpoint = self.op  # type: ignore[assignment]
            if ctx.kind == "source":
                ctx.ack({"offsets": encode_offsets(ctx.source_offsets())})
                if op.final:
                    ctx.halt_source()
            elif ctx.kind == "sink":
                ctx.ack({"staged": ctx.sink_prepare(op.checkpoint_id, op.durable)})
            elif ctx.state is not None:
                ctx.ack_in_background(_with_code(_cut_state(op, ctx), _code_at(ctx)))
            else:
                code = _code_at(ctx)
                ctx.ack({"code": code} if code else None)

    def manifest(self, acks: dict[InstanceId, Any]) -> dict[str, Any]:
        manifest: dict[str, Any] = {"format_version": MANIFEST_FORMAT, "job": self.job, "created": time.time(),
                                    "epoch": self.checkpoint_id, "full": self.full, "state_chains": {},
                                    "state_bins": {}, "sources": {}, "sink_staged": {}}
        for instance, ack in acks.items():
            key = instance_key(instance)
            if not ack:
                continue
            if "chains" in ack:
                manifest["state_chains"][key] = ack["chains"]
                manifest["state_bins"][key] = ack["bins"]
            if "offsets" in ack:
                manifest["sources"][key] = ack["offsets"]
            if "staged" in ack:
                manifest["sink_staged"][key] = ack["staged"]
            if ack.get("code"):
                manifest.setdefault("code", {})[key] = ack["code"]
        return manifest

    def on_complete(self, ctx: Any) -> int:
        manifest = self.manifest(self.acks)
        twice = bins_held_twice(manifest["state_bins"])
        if twice:  # never committed: a recovery would load state ahead of the sources' offsets
            raise InconsistentCheckpointError(
                f"checkpoint {self.checkpoint_id} is not committed: key bins were snapshotted by two instances "
                + "; ".join(f"operator {op!r}: " + ", ".join(f"bin {b} by {who}" for b, who in sorted(held.items()))
                            for op, held in sorted(twice.items())))
        self.storage.commit(self.checkpoint_id, manifest)
        if self.on_durable is not None:
            self.on_durable(self.checkpoint_id)
        if self.commit_sinks is not None:
            by_sink: dict[str, list] = {}
            for key, staged in sorted(manifest["sink_staged"].items()):
                by_sink.setdefault(key.rsplit("/", 1)[0], []).extend(staged)
            for sink, staged in by_sink.items():
                self.commit_sinks(sink, staged)
        if self.commit_sources is not None:
            by_source: dict[str, dict[str, Any]] = {}
            for key, offsets in sorted(manifest["sources"].items()):
                by_source.setdefault(key.rsplit("/", 1)[0], {}).update(decode_offsets(offsets) or {})
            for source, merged in by_source.items():
                self.commit_sources(source, self.checkpoint_id, merged)
        self.storage.retain(self.keep, self.taking() if self.taking is not None else ())
        return self.checkpoint_id


def code_entry(change: Any) -> dict[str, str] | None:
    """How a manifest records the code an upgrade put in place at an instance (None: the submitted code):
    its identity, its name and the pickled change (so a restore needs nothing beside the checkpoint)."""
    if change is None:
        return None
    return {"identity": change.identity, "qualname": change.qualname,
            "change": base64.b64encode(change.dumps()).decode()}


def _code_at(ctx: Any) -> dict[str, str] | None:
    """The manifest entry of the code an instance runs (a context that runs no upgrades has no ``code``)."""
    code = getattr(ctx, "code", None)
    return code_entry(code()) if code is not None else None


def _with_code(work: Callable[[], dict[str, Any]], code: dict[str, str] | None) -> Callable[[], dict[str, Any]]:
    if code is None:
        return work
    return lambda: {**work(), "code": code}


def _sizes(part: dict[int, bytes] | BinStream) -> dict[int, int]:
    """Bytes per bin written (of a stream of several bins, each one's share)."""
    return part.sizes if isinstance(part, BinStream) else {b: len(data) for b, data in part.items()}


def _cut_state(op: Checkpoint, ctx: Any) -> Callable[[], dict[str, Any]]:
    """At a keyed instance, in ``on_complete``: plan what each bin writes and copy those rows now; returns
    the work that serialises and writes them off the processing path, and gives the acknowledgement."""
    state, chains = ctx.state, ctx.checkpoint_chains
    operator, index = ctx.instance
    versions = {b: state.version(b) for b in state.bins()}
    plan: CutPlan = chains.cut(op.storage.root_uri, op.checkpoint_id,
                               op.storage.state_file(op.checkpoint_id, operator, index), versions, op.bound,
                               op.full, state.changes_since if state.tracks_changes else None,
                               (index, ctx.info.parallelism))
    try:
        encode = state.snapshot_changes_later(plan.full, plan.since)  # copies now
    except BaseException:
        chains.failed(plan)
        raise

    def write() -> dict[str, Any]:
        try:
            full, changes = encode()
            sizes = {b: n for part in (full, changes) for b, n in _sizes(part).items()}
            if sizes:
                op.storage.write_state(op.checkpoint_id, operator, index, full, changes)
        except BaseException:
            chains.failed(plan)
            raise
        chains.written(plan, sizes)
        chains.settle(plan, op.timeout_s)
        return {"chains": plan.manifest_entry(), "bins": sorted(versions)}

    return write


class ResumeSources(ControlOp):
    """The sources that a failed stop's final checkpoint (``Checkpoint(final=True)``) halted read on."""

    blocking = False

    def __init__(self, timeout_s: float | None = 60.0):
        super().__init__()
        self.timeout_s = timeout_s

    class Instance(InstanceHandler):
        def on_begin(self, ctx: Any) -> None:
            if ctx.kind == "source":
                ctx.halt_source(False)
