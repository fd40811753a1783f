"""chains.py: which checkpoint files make up each key bin of a keyed instance (incremental checkpoints).

A checkpoint writes, per bin, either a *full copy* or the *changes* since the
bin's previous checkpoint (the rows written and the keys deleted since the
version it was at). A bin's *chain* is its newest full copy and the changes
written after it, oldest first; a restore installs the full copy and applies
each change in order. A bin whose version has not moved since its previous
checkpoint writes nothing: its chain stays as it was.

:class:`BinChains` keeps one instance's chains between checkpoints and decides,
at each cut, which bins get a full copy (a bin new here, one whose chain grew
past its :class:`ChainBound`, every bin of a ``full`` checkpoint such as a
savepoint's), which only their changes and which nothing. The instances of an
operator take their full copies in turn (:func:`lead`), so that their hosts do
not all copy their whole state at one checkpoint. It is updated at the
cut, with the name the checkpoint's file will have, so that the next cut builds
on it even before that file is written; a checkpoint whose chains lean on a
file whose write failed fails too (:meth:`BinChains.settle`), and the bins of
that file get full copies again. An instance that a recovery restored adopts
the chains it read (:meth:`BinChains.adopt`), so its first checkpoint in the
same storage writes only what changed since.

In a manifest (formats 2 and 3) each instance's chains are ``{"files": [relative
paths], "chains": [[bin, i_full, i_change, ...], ...]}``, indexes into its
``files``; :func:`manifest_chains` reads formats 1 (one full file per
instance), 2 and 3, :func:`manifest_files` lists every file a manifest needs.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Collection, Mapping, Sequence

from chiray.operators.errors import ChirayError

__all__ = ["BinChains", "Chain", "ChainBound", "ChainWriteError", "CutPlan", "Link", "MANIFEST_FORMAT",
           "ManifestFormatError", "manifest_chains", "manifest_files", "check_manifest_format", "lead"]

MANIFEST_FORMAT = 3
"""The manifest format this version writes (1: one full state file per instance, no ``format_version``; 2:
chains of files per bin, each file a payload per bin; 3: as 2, and a file may hold a stream of several bins,
which a version that reads up to 2 would not find its bins in: it refuses the checkpoint by its format)."""


class ManifestFormatError(ChirayError, ValueError):
    """A manifest of a format this version of chiray cannot read (written by a newer one)."""


class ChainWriteError(ChirayError, RuntimeError):
    """A checkpoint's state leans on a file of an earlier checkpoint whose write failed."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChainBound:
    """When a bin's chain is cut short by a full copy.

    Attributes:
        max_deltas: changes a chain holds after its full copy; the checkpoint after writes a full copy
            (0: every checkpoint writes full copies).
        max_delta_ratio: a chain whose changes hold more bytes than this many times its full copy's
            gets a full copy (a restore then reads at most ``1 + max_delta_ratio`` times the bin).
    """

    max_deltas: int = 8
    max_delta_ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.max_deltas < 0:
            raise ValueError(f"ChainBound: max_deltas must be >= 0, got {self.max_deltas}")
        if not self.max_delta_ratio > 0:
            raise ValueError(f"ChainBound: max_delta_ratio must be positive, got {self.max_delta_ratio}")


@dataclasses.dataclass(frozen=True, slots=True)
class Link:
    """One file of a chain: the checkpoint that wrote it and its path relative to the storage root."""

    checkpoint_id: int
    file: str


@dataclasses.dataclass(frozen=True, slots=True)
class Chain:
    """A bin's files, its full copy first, then its changes oldest first; ``version``: the bin's version
    at the newest of them."""

    links: tuple[Link, ...]
    version: int


@dataclasses.dataclass(frozen=True, slots=True)
class CutPlan:
    """What one instance writes at one checkpoint, and its chains after it.

    Attributes:
        checkpoint_id: the checkpoint.
        file: the file it writes (nothing is written if ``full`` and ``since`` are both empty).
        full: bins written whole.
        since: bins written as their changes since these versions.
        chains: every bin the instance holds -> its chain after this checkpoint (the manifest's).
    """

    checkpoint_id: int
    file: str
    full: tuple[int, ...]
    since: Mapping[int, int]
    chains: Mapping[int, Chain]

    def depends_on(self) -> set[int]:
        """The earlier checkpoints whose files this one's chains name."""
        return {link.checkpoint_id for chain in self.chains.values() for link in chain.links} - {self.checkpoint_id}

    def manifest_entry(self) -> dict[str, Any]:
        """The instance's chains as a manifest holds them (formats 2 and 3)."""
        files: dict[str, int] = {}
        rows = []
        for b, chain in sorted(self.chains.items()):
            rows.append([b, *(files.setdefault(link.file, len(files)) for link in chain.links)])
        return {"files": list(files), "chains": rows}


class BinChains:
    """One keyed instance's chains between checkpoints (lives as long as the instance).

    The instance's processing thread calls :meth:`cut`; the background thread
    that writes a checkpoint's file calls :meth:`written` or :meth:`failed`,
    then :meth:`settle`. A lock guards the fields. A restore builds new
    instances; one that read its bins from a checkpoint adopts their chains
    (:meth:`adopt`), else its chains start empty and its first checkpoint
    writes full copies.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root: str | None = None
        self._chains: dict[int, Chain] = {}
        # per bin, once its files are written: the bytes of its chain's full copy, and of its changes
        # (summed as they are written: a cut looks at each bin's chain in constant time)
        self._full_bytes: dict[int, int] = {}
        self._change_bytes: dict[int, int] = {}
        self._newest: dict[int, tuple[int, ...]] = {}  # bin -> bytes of its two newest changes (:func:`lead`)
        self._writing: dict[int, threading.Event] = {}  # checkpoint id -> set once its write ended
        self._failed: set[int] = set()

    def chains(self) -> dict[int, Chain]:
        """Bin -> chain as of the newest cut."""
        with self._lock:
            return dict(self._chains)

    def adopt(self, root: str, files: Mapping[int, Sequence[str]], versions: Mapping[int, int]) -> None:
        """Start from the chains a restore read (bin -> its files, full copy first, relative to ``root``;
        ``versions``: each bin's version once restored): the next cut in ``root`` writes only what changed
        since, instead of every bin whole. Only a new instance, before its first cut, adopts chains."""
        with self._lock:
            assert not self._chains and self._root is None, "bug: BinChains.adopt() after a cut"
            self._root = root
            self._chains = {b: Chain(tuple(Link(_checkpoint_of(rel), rel) for rel in rels), int(versions[b]))
                            for b, rels in files.items() if rels and b in versions}

    def cut(self, root: str, checkpoint_id: int, file: str, versions: Mapping[int, int], bound: ChainBound,
            full: bool, can_delta: Callable[[Mapping[int, int]], Collection[int]] | None,
            turn: tuple[int, int] = (0, 1)) -> CutPlan:
        """Plan checkpoint ``checkpoint_id`` of the bins held now and record the chains it leaves.

        Args:
            root: the storage the files go to; chains in another storage are not built on.
            checkpoint_id: the checkpoint.
            file: the path (relative to ``root``) of the file this checkpoint writes.
            versions: every bin held now -> its version.
            bound: when a chain gets a full copy.
            full: write every bin whole (a savepoint's checkpoint: self-contained).
            can_delta: given bin -> version of a previous checkpoint, the bins whose changes since then
                the state can write (``BinnedState.changes_since``); None: a state that tracks no
                changes (every bin whole at every checkpoint).
            turn: (this instance's index, the operator's parallelism): the instances of an operator take
                their full copies in turn (:func:`lead`).
        """
        with self._lock:
            if root != self._root:
                self._root, self._chains, self._newest = root, {}, {}
                self._full_bytes, self._change_bytes = {}, {}
            kept, since = ({}, {}) if full or can_delta is None else self._builds_on(
                versions, bound, can_delta, lead(checkpoint_id, turn, bound))
            own = Link(checkpoint_id, file)
            chains = dict(kept)
            for b, v in since.items():
                chains[b] = Chain(self._chains[b].links + (own,), versions[b])
            whole = tuple(sorted(b for b in versions if b not in chains))
            for b in whole:
                chains[b] = Chain((own,), versions[b])
            for b in whole + tuple(self._chains.keys() - chains.keys()):  # a chain starts again, or is gone
                self._full_bytes.pop(b, None)
                self._change_bytes.pop(b, None)
            for b in self._newest.keys() - chains.keys():
                del self._newest[b]
            self._chains = chains
            if whole or since:
                self._writing[checkpoint_id] = threading.Event()
            return CutPlan(checkpoint_id, file, whole, since, chains)

    def _builds_on(self, versions: Mapping[int, int], bound: ChainBound,
                   can_delta: Callable[[Mapping[int, int]], Collection[int]], ahead: int = 0,
                   ) -> tuple[dict[int, Chain], dict[int, int]]:
        """What a cut that is not ``full`` builds on (under the lock): the bins whose chains stay as they are
        (unchanged since their previous checkpoint) and bin -> the version whose changes it writes; a chain
        that would pass its bound within ``ahead`` more checkpoints gets its full copy now."""
        since: dict[int, int] = {}
        kept: dict[int, Chain] = {}
        if bound.max_deltas <= 0:
            return kept, since
        for b, version in versions.items():
            chain = self._chains.get(b)
            if chain is None:
                continue
            if chain.version == version:
                kept[b] = chain  # unchanged since its previous checkpoint: nothing to write
            elif self._within(chain, b, bound, ahead):
                since[b] = chain.version
        if since:
            allowed = set(can_delta(since))
            since = {b: v for b, v in since.items() if b in allowed}
        return kept, since

    def _within(self, chain: Chain, b: int, bound: ChainBound, ahead: int = 0) -> bool:
        """Whether ``chain`` (of bin ``b``) may take one more change, and ``ahead`` more after it, each the
        size of the smaller of the bin's two newest changes (in this chain or the one before; none known:
        nothing): one change far larger than the rest, as after a long pause, does not bring a full copy
        forward."""
        deltas = len(chain.links) - 1
        if deltas + ahead >= bound.max_deltas:
            return False
        full = self._full_bytes.get(b)
        changes = self._change_bytes.get(b, 0)
        newest = self._newest.get(b, ())
        pace = min(newest) if len(newest) == 2 else 0
        return full is None or changes + ahead * pace <= bound.max_delta_ratio * full

    def written(self, plan: CutPlan, sizes: Mapping[int, int]) -> None:
        """``plan``'s file is written; ``sizes``: bytes per bin in it (for the bound)."""
        with self._lock:
            for b, n in sizes.items():
                chain = self._chains.get(b)
                if chain is not None and chain.links[0].file == plan.file:
                    self._full_bytes[b] = n
                elif chain is not None and any(link.file == plan.file for link in chain.links[1:]):
                    self._change_bytes[b] = self._change_bytes.get(b, 0) + n
                # (else a later cut started the bin's chain again, or it is gone)
                if b in plan.since:
                    self._newest[b] = (*self._newest.get(b, ())[-1:], n)
            event = self._writing.pop(plan.checkpoint_id, None)
        if event is not None:
            event.set()

    def failed(self, plan: CutPlan) -> None:
        """Writing ``plan``'s file failed: every chain that names it starts again with a full copy."""
        with self._lock:
            self._failed.add(plan.checkpoint_id)
            self._chains = {b: chain for b, chain in self._chains.items()
                            if all(link.checkpoint_id != plan.checkpoint_id for link in chain.links)}
            event = self._writing.pop(plan.checkpoint_id, None)
        if event is not None:
            event.set()

    def settle(self, plan: CutPlan, timeout: float | None = None) -> None:
        """Wait until the earlier writes ``plan`` builds on have ended.

        Raises:
            ChainWriteError: one of them failed (or had not ended after ``timeout``).
        """
        for checkpoint_id in sorted(plan.depends_on()):
            with self._lock:
                event = self._writing.get(checkpoint_id)
            if event is not None and not event.wait(timeout):
                raise ChainWriteError(f"checkpoint {plan.checkpoint_id} builds on the state file of checkpoint "
                                      f"{checkpoint_id}, still not written after {timeout} s")
            with self._lock:
                failed = checkpoint_id in self._failed
            if failed:
                raise ChainWriteError(f"checkpoint {plan.checkpoint_id} builds on the state file of checkpoint "
                                      f"{checkpoint_id}, whose write failed; the next checkpoint writes those bins "
                                      "whole")


def lead(checkpoint_id: int, turn: tuple[int, int], bound: ChainBound) -> int:
    """How many checkpoints ahead an instance looks when it decides which chains get a full copy now.

    Chains reach their bound together: an instance's bins all got their full copies at its first
    checkpoint, and take changes at the same pace after. Left alone, every instance of an operator would
    copy its whole state at one checkpoint, and its hosts would all do that work at once. Instead each
    checkpoint is the *turn* of one instance in ``slots`` (the parallelism, at most one more than
    ``max_deltas``): on its turn, an instance gives a full copy to every chain that would pass its bound
    before its next turn (``slots - 1`` ahead); off its turn it looks no further than the bound. Every
    chain keeps within its bound, full copies come at most ``slots - 1`` checkpoints early, and the
    instances take them on different checkpoints.

    Example:
        >>> [lead(c, (1, 2), ChainBound()) for c in range(4)]
        [0, 1, 0, 1]
    """
    index, parallelism = turn
    slots = min(parallelism, bound.max_deltas + 1)
    return slots - 1 if slots > 1 and checkpoint_id % slots == index % slots else 0


def _checkpoint_of(rel: str) -> int:
    """The checkpoint whose directory holds the state file ``rel`` (``chk-000012/...`` -> 12)."""
    head = rel.split("/", 1)[0]
    if not head.startswith("chk-") or not head[4:].isdigit():
        raise ValueError(f"not a state file of a checkpoint directory: {rel!r}")
    return int(head[4:])


def check_manifest_format(manifest: Mapping[str, Any]) -> int:
    """The format of ``manifest`` (1 where it names none).

    Raises:
        ManifestFormatError: a format this version does not know.
    """
    version = manifest.get("format_version", 1)
    if not isinstance(version, int) or not 1 <= version <= MANIFEST_FORMAT:
        raise ManifestFormatError(f"manifest format {version!r} is not one this version of chiray reads "
                                  f"(formats 1 to {MANIFEST_FORMAT}): the checkpoint was written by a newer "
                                  "version; restore it with that one")
    return version


def manifest_chains(manifest: Mapping[str, Any]) -> dict[str, dict[int, list[str]]]:
    """Per instance (``"operator/index"``) the files of each bin: its full copy first, then its changes.

    Example:
        >>> manifest_chains({"state_files": {"count/0": "chk-000001/s.arrow"}, "state_bins": {"count/0": [3, 5]}})
        {'count/0': {3: ['chk-000001/s.arrow'], 5: ['chk-000001/s.arrow']}}
        >>> manifest_chains({"format_version": 2, "state_chains": {"count/0": {
        ...     "files": ["chk-000001/s.arrow", "chk-000002/s.arrow"], "chains": [[3, 0, 1], [5, 0]]}}})
        {'count/0': {3: ['chk-000001/s.arrow', 'chk-000002/s.arrow'], 5: ['chk-000001/s.arrow']}}
    """
    if check_manifest_format(manifest) == 1:
        bins = manifest.get("state_bins", {})
        return {key: {int(b): [rel] for b in bins.get(key, [])} for key, rel in manifest.get("state_files", {}).items()}
    out: dict[str, dict[int, list[str]]] = {}
    for key, entry in manifest.get("state_chains", {}).items():
        files = entry["files"]
        out[key] = {int(row[0]): [files[i] for i in row[1:]] for row in entry["chains"]}
    return out


def manifest_files(manifest: Mapping[str, Any]) -> set[str]:
    """Every state file ``manifest`` needs (relative to its storage root)."""
    if check_manifest_format(manifest) == 1:
        return set(manifest.get("state_files", {}).values())
    return {rel for entry in manifest.get("state_chains", {}).values() for rel in entry["files"]}
