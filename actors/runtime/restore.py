"""restore.py: what a checkpoint's manifest gives each new instance: source offsets and keyed bins.

Used both for recovery (the same job, rolled back) and for restoring into a
new job, possibly with a different parallelism: a keyed instance loads the
bins its *new* routing table assigns it, from whichever state files hold them:
per bin its full copy and the changes written after it (an incremental
checkpoint's chain; ``control.ops.chains``), each file read once.

A restore into a new dataflow matches state to operators by identity (an
operator's ``uid``, else its name; ``match_operators``): an operator renamed
since the checkpoint but given its old uid finds its state, and state that
no operator of the new dataflow claims is refused unless dropped explicitly.
"""

from __future__ import annotations

import base64
import dataclasses
import graphlib
from typing import Mapping

import cloudpickle

from chiray.control.ops.chains import BinChains, manifest_chains
from chiray.control.ops.checkpoint import decode_offsets
from chiray.operators.graph import OperatorKind, OperatorNode, PhysicalPlan
from chiray.operators.state import BinnedState
from chiray.operators.statecodec import SharedBins
from chiray.operators.upgrade import CodeChange

from .storage import CheckpointError, CheckpointStorage, Manifest

__all__ = ["RestoreInfo", "StoredBins", "match_operators", "reset_code", "restore_keyed"]


@dataclasses.dataclass(frozen=True)
class StoredBins:
    """Bins read from a checkpoint: their full copies, and their changes in rounds, for
    ``BinnedState.restore_bins``: a round per file of changes, each bin's in the order of its chain (a
    columnar state's whole bins, and its changes, are a stream per file: ``SharedBins``, decoded once)."""

    full: dict[int, bytes | SharedBins]
    changes: list[dict[int, bytes | SharedBins]]
    chains: dict[int, list[str]] = dataclasses.field(default_factory=dict)  # bin -> its files, full copy first


@dataclasses.dataclass(frozen=True)
class RestoreInfo:
    """A complete checkpoint to start from.

    Attributes:
        storage: where it lives.
        manifest: its manifest (``CheckpointStorage.load``).
    """

    storage: CheckpointStorage
    manifest: Manifest
    renames: Mapping[str, str | None] | None = None

    def _saved(self, operator: str) -> str | None:
        """The checkpoint's name of the operator the dataflow calls ``operator`` (``None``: no state)."""
        return operator if self.renames is None else self.renames.get(operator)

    @property
    def checkpoint_id(self) -> int:
        return int(self.manifest["checkpoint_id"])

    @property
    def path(self) -> str:
        """The checkpoint's directory."""
        return self.storage.chk_dir(self.checkpoint_id)

    def source_offsets(self, operator: str) -> dict[str, object]:
        """Split id -> offset, over every instance of the source (splits may be re-assigned)."""
        offsets: dict[str, object] = {}
        operator = self._saved(operator)  # type: ignore[assignment]
        for key, text in self.manifest.get("sources", {}).items():
            if key.rsplit("/", 1)[0] == operator:
                offsets.update(decode_offsets(text) or {})
        return offsets

    def load_bins(self, operator: str, index: int, table: list[int]) -> StoredBins:
        """The stored bins that ``table`` (bin -> instance) gives instance ``index``.

        Raises:
            CheckpointError: a file does not hold what the manifest says (a bin missing, or a chain that
                does not start with a full copy).
        """
        mine = {b for b, owner in enumerate(table) if owner == index}
        operator = self._saved(operator)  # type: ignore[assignment]
        chains: dict[int, list[str]] = {}
        for key, bins in manifest_chains(self.manifest).items():
            if key.rsplit("/", 1)[0] == operator:
                chains.update((b, files) for b, files in bins.items() if b in mine and b not in chains)
        wanted: dict[str, set[int]] = {}
        for b, files in chains.items():
            for rel in files:
                wanted.setdefault(rel, set()).add(b)
        parts = {rel: self.storage.read_parts(rel, bins) for rel, bins in sorted(wanted.items())}
        full: dict[int, bytes | SharedBins] = {}
        rounds: dict[str, dict[int, bytes | SharedBins]] = {}  # a round per file of changes
        for b, files in sorted(chains.items()):
            for i, rel in enumerate(files):
                data, delta = self._part(parts[rel], b, rel)
                if delta != (i > 0):
                    raise CheckpointError(f"checkpoint {self.checkpoint_id}: bin {b} of {operator!r} in {rel!r} "
                                          f"holds {'changes' if delta else 'a full copy'} where its chain has "
                                          f"{'changes' if i else 'its full copy'}")
                if i == 0:
                    full[b] = data
                else:
                    rounds.setdefault(rel, {})[b] = data
        return StoredBins(full, [rounds[rel] for rel in self._in_order(chains, rounds)], chains)

    def _in_order(self, chains: dict[int, list[str]], rounds: Mapping[str, object]) -> list[str]:
        """The files of ``rounds`` in an order that keeps every chain's (a file of changes holds those of
        many bins: each is applied once, after the files before it in each of their chains)."""
        order = graphlib.TopologicalSorter({rel: set() for rel in rounds})
        for files in chains.values():
            for before, after in zip(files[1:], files[2:]):
                order.add(after, before)
        try:
            return list(order.static_order())
        except graphlib.CycleError:
            raise CheckpointError(f"checkpoint {self.checkpoint_id}: its chains order their files in "
                                  f"contradicting ways") from None

    def _part(self, parts: dict[int, tuple[bytes | SharedBins, bool]], b: int,
              rel: str) -> tuple[bytes | SharedBins, bool]:
        if b not in parts:
            raise CheckpointError(f"checkpoint {self.checkpoint_id}: its state file {rel!r} lacks bin {b}")
        return parts[b]

    def code_change(self, operator: str, index: int | None = None) -> CodeChange | None:
        """The code an upgrade put in place of ``operator``'s (at instance ``index``, else the code most of its
        instances ran) when the checkpoint was cut: an ``operators.upgrade.CodeChange``, or None (its submitted
        code)."""
        operator = self._saved(operator)  # type: ignore[assignment]
        entries = {int(k.rsplit("/", 1)[1]): v for k, v in self.manifest.get("code", {}).items()
                   if k.rsplit("/", 1)[0] == operator}
        saved = self.manifest.get("job", {}).get("operators", {}).get(operator, {})
        running = int(saved.get("parallelism", 0)) or max(entries, default=-1) + 1
        if index is not None and index < running:
            entry = entries.get(index)
        else:
            counts: dict[str, int] = {}
            for v in entries.values():
                counts[v["identity"]] = counts.get(v["identity"], 0) + 1
            upgraded = max(counts.values(), default=0)
            entry = next((v for v in entries.values() if counts[v["identity"]] == upgraded), None)
            if upgraded * 2 < running:  # most instances ran the submitted code
                entry = None
        return None if entry is None else cloudpickle.loads(base64.b64decode(entry["change"]))

    def sink_staged(self, operator: str) -> list[object]:
        """What the checkpoint commits for a sink (to finish an interrupted commit): one value per staged
        epoch of each instance, which includes the epochs of failed checkpoints before it."""
        operator = self._saved(operator)  # type: ignore[assignment]
        by_epoch = self.manifest.get("sink_staged")
        if by_epoch is None:  # a checkpoint of an earlier version: one value per instance
            return [v for k, v in sorted(self.manifest.get("sinks", {}).items()) if k.rsplit("/", 1)[0] == operator]
        return [v for k, staged in sorted(by_epoch.items()) if k.rsplit("/", 1)[0] == operator for v in staged]


def reset_code(plan: PhysicalPlan, restore: RestoreInfo | None) -> bool:
    """Set each operator's recorded code (``node.code``, what a later scale-out builds new instances with) to
    the code ``restore``'s checkpoint recorded for it (None: the submitted code, as when a job starts again
    from the start); a recovery to a checkpoint cut before an upgrade, or a restore into a new job, needs it.

    Returns:
        Whether any operator's code changed (a plan already in the object store must then be put again).
    """
    changed = False
    for node in plan.graph.nodes.values():
        if node.kind not in (OperatorKind.TRANSFORM, OperatorKind.KEYED) or node.make_logic is None:
            continue
        code = restore.code_change(node.name) if restore is not None else None
        if (None if code is None else code.identity) != (None if node.code is None else node.code.identity):
            changed = True
        node.code = code
    return changed


def _holding_state(manifest: Manifest) -> dict[str, str]:
    """Operators of a checkpoint that hold state, by their checkpoint name -> what they hold."""
    held: dict[str, str] = {}
    for key in manifest_chains(manifest):  # every keyed instance, even one that held no bins
        held[key.rsplit("/", 1)[0]] = "keyed state"
    for key, text in manifest.get("sources", {}).items():
        if decode_offsets(text):
            held.setdefault(key.rsplit("/", 1)[0], "source offsets")
    return held


def match_operators(manifest: Manifest, nodes: Mapping[str, OperatorNode]
                    ) -> tuple[dict[str, str | None], dict[str, str], list[str]]:
    """Match a checkpoint's operators to a dataflow's by identity (uid, else name) and kind.

    Args:
        manifest: the checkpoint's manifest.
        nodes: the dataflow's operators (name -> ``OperatorNode``).

    Returns:
        (renames, orphans, empty): each operator of the dataflow -> the checkpoint operator whose state
        it takes (``None``: none); the checkpoint's operators whose state nothing takes -> what they
        hold; and the dataflow's stateful operators (keyed, sources) that get no state.
    """
    saved = manifest.get("job", {}).get("operators", {})
    by_uid = {info.get("uid", name): name for name, info in saved.items()}
    renames: dict[str, str | None] = {}
    for name, node in nodes.items():
        old = by_uid.get(node.state_id)
        renames[name] = old if old is not None and saved[old].get("kind") == node.kind.value else None
    taken = {old for old in renames.values() if old is not None}
    orphans = {old: what for old, what in _holding_state(manifest).items() if old not in taken}
    empty = [name for name, node in nodes.items()
             if node.kind.value in ("keyed", "source") and renames[name] is None]
    return renames, orphans, empty


def restore_keyed(state: BinnedState, chains: BinChains, restore: RestoreInfo, stored: StoredBins) -> None:
    """Install the bins a restore read into a new keyed instance's ``state``; its checkpoint ``chains``
    then build on the files they came from (in the same storage, its first checkpoint writes only what
    changed since, not every bin whole)."""
    if stored.full:
        state.restore_bins(stored.full, stored.changes)
        chains.adopt(restore.storage.root_uri, stored.chains, {b: state.version(b) for b in stored.chains})
