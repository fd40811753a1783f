"""rowbins.py: rows held in key bins, addressed by position: the state of the row-keeping keyed operators.

The lifetime join (``lifetime.py``), the top rows per key (``keyedtop.py``)
and the rolling aggregates (``rolling.py``) keep whole input rows, not one
accumulator per key. They keep them in a :class:`RowBins`: an Arrow table,
appended a batch at a time, beside two NumPy columns, the bin of every row
and its *due* time (when it leaves: a lifetime's end, an event's time). Rows
are addressed by position; a dropped row is a tombstone until
:meth:`RowBins.compact` renumbers the live ones. The table is a few chunks
(a new batch is merged into the last chunk while that chunk is not much
larger, so there are O(log rows) of them) and :meth:`RowBins.take` gathers
from each chunk on its own: taking a few rows costs what they cost, not
what the table holds (``Table.take`` concatenates every chunk first).

:class:`RowsState` is the :class:`~operators.state.BinnedState` of one or
more named ``RowBins``: a bin travels as one :mod:`operators.codec`
document holding, per part, the bin's live rows with their due times.
Subclasses may add to what a bin carries of a part (``_rows_in``,
``_install``) and learn of bins that leave (``_removed``) and of positions
that change (``_renumbered``), to keep their own indexes.

Only the owning logic touches them (single thread).

Example:
    >>> rows = RowBins(4, np.zeros(4, dtype=np.int64))
    >>> at = rows.add(pa.table({"k": ["a", "b"], "v": [1, 2]}), np.array([1, 3]), np.array([10, 20]))
    >>> rows.take(at[::-1]).column("v").to_pylist(), rows.due_by(15).tolist()
    ([2, 1], [0])
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import codec
from .state import BinnedState

__all__ = ["RowBins", "RowsState", "DUE"]

DUE = "__due"
"""The column that carries each row's due time in a serialised bin."""
COMPACT_MIN = 4096
"""A ``RowBins`` compacts once its tombstones are at least this many and outnumber its live rows."""


class RowBins:
    """Rows of one schema, each in a bin with a due time, appended batch by batch.

    Args:
        num_bins: the operator's bins; a row of bin ``num_bins`` is a tombstone.
        versions: the owning state's version per bin; every add and drop counts a write to its bins.
    """

    def __init__(self, num_bins: int, versions: np.ndarray) -> None:
        self.num_bins = num_bins
        self._versions = versions
        self.schema: pa.Schema | None = None
        self._chunks: list[pa.Table] = []
        self._starts: list[int] = []
        self._bin = np.zeros(0, dtype=np.int32)
        self._due = np.zeros(0, dtype=np.int64)
        self._n = 0
        self._dead = 0

    def __len__(self) -> int:
        return self._n - self._dead

    @property
    def size(self) -> int:
        """Positions in use, tombstones included."""
        return self._n

    def add(self, rows: pa.Table, bins: np.ndarray, due: np.ndarray | None = None) -> np.ndarray:
        """Append ``rows`` (the first rows fix the schema; later ones are cast to it); returns their positions."""
        count = rows.num_rows
        if count == 0:
            return np.zeros(0, dtype=np.int64)
        if self.schema is None:
            self.schema = rows.schema
        elif not rows.schema.equals(self.schema):
            rows = rows.select(self.schema.names).cast(self.schema)
        start = self._n
        if start + count > len(self._bin):
            capacity = max(start + count, 2 * len(self._bin), 1024)
            self._bin = _grown(self._bin, capacity, start)
            self._due = _grown(self._due, capacity, start)
        self._bin[start:start + count] = bins
        self._due[start:start + count] = 0 if due is None else due
        self._append(rows.combine_chunks())
        self._n += count
        self._touch(bins)
        return np.arange(start, start + count, dtype=np.int64)

    def _append(self, rows: pa.Table) -> None:
        """Add a chunk; merge the last chunks while the one before is under twice the size of the last."""
        self._chunks.append(rows)
        self._starts.append(self._n)
        while len(self._chunks) > 1 and self._chunks[-2].num_rows < 2 * self._chunks[-1].num_rows:
            last = self._chunks.pop()
            self._starts.pop()
            self._chunks[-1] = pa.concat_tables([self._chunks[-1], last]).combine_chunks()

    def take(self, positions: np.ndarray) -> pa.Table:
        """The rows at ``positions``, in that order (each chunk gathered on its own)."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.schema is None:
            raise ValueError("bug in RowBins.take(): no rows were ever added")
        if not len(positions):
            return self.schema.empty_table()
        if len(self._chunks) == 1:
            return self._chunks[0].take(pa.array(positions))
        chunk = np.searchsorted(np.asarray(self._starts), positions, side="right") - 1
        order = np.argsort(chunk, kind="stable")
        bounds = np.searchsorted(chunk[order], np.arange(len(self._chunks) + 1))
        parts = []
        for c in range(len(self._chunks)):
            lo, hi = bounds[c], bounds[c + 1]
            if hi > lo:
                parts.append(self._chunks[c].take(pa.array(positions[order[lo:hi]] - self._starts[c])))
        gathered = pa.concat_tables(parts).combine_chunks()
        if len(parts) == 1:
            return gathered
        back = np.empty(len(order), dtype=np.int64)
        back[order] = np.arange(len(order))
        return gathered.take(pa.array(back))

    def column(self, name: str) -> pa.ChunkedArray:
        """Column ``name`` of every position, tombstones included (no copy)."""
        if self.schema is None:
            raise ValueError("bug in RowBins.column(): no rows were ever added")
        return pa.chunked_array([c.column(name).combine_chunks() for c in self._chunks], self.schema.field(name).type)

    def is_live(self) -> np.ndarray:
        """Per position, whether its row is live."""
        return self._bin[: self._n] != self.num_bins

    def drop(self, positions: np.ndarray) -> None:
        """Make the rows at ``positions`` (live, distinct) tombstones."""
        if not len(positions):
            return
        self._touch(self._bin[positions])
        self._bin[positions] = self.num_bins
        self._dead += len(positions)

    def live(self) -> np.ndarray:
        """The positions of every live row, ascending."""
        return np.flatnonzero(self._bin[: self._n] != self.num_bins)

    def bins_of(self, positions: np.ndarray) -> np.ndarray:
        return self._bin[positions]

    def due_of(self, positions: np.ndarray) -> np.ndarray:
        return self._due[positions]

    def due_by(self, time: int) -> np.ndarray:
        """The live rows due at or before ``time``, by due time (then position)."""
        found = np.flatnonzero((self._due[: self._n] <= time) & (self._bin[: self._n] != self.num_bins))
        return found[np.argsort(self._due[found], kind="stable")]

    def bin_counts(self) -> np.ndarray:
        """Live rows per bin."""
        return np.bincount(self._bin[: self._n], minlength=self.num_bins + 1)[: self.num_bins]

    def rows_in(self, bins: list[int]) -> dict[int, pa.Table]:
        """Per bin of ``bins``, a copy of its live rows (in position order) with their due times."""
        wanted = np.zeros(self.num_bins + 1, dtype=bool)
        wanted[bins] = True
        found = np.flatnonzero(wanted[self._bin[: self._n]])
        found = found[np.argsort(self._bin[found], kind="stable")]
        bounds = np.searchsorted(self._bin[found], np.append(bins, self.num_bins))
        rows = self.take(found).append_column(DUE, pa.array(self._due[found])) if len(found) else None
        return {b: rows.slice(bounds[i], bounds[i + 1] - bounds[i]) if rows is not None else None
                for i, b in enumerate(bins) if bounds[i + 1] > bounds[i]}

    def positions_in(self, bins: list[int]) -> np.ndarray:
        wanted = np.zeros(self.num_bins + 1, dtype=bool)
        wanted[bins] = True
        return np.flatnonzero(wanted[self._bin[: self._n]])

    def compact(self, force: bool = False) -> np.ndarray | None:
        """Renumber the live rows ``0..len-1`` once tombstones are many (or ``force``); returns the new
        position of each old one (-1: dropped), or ``None`` when nothing changed."""
        if not self._dead or not (force or (self._dead >= COMPACT_MIN and self._dead > len(self))):
            return None
        keep = self.live()
        renumber = np.full(self._n, -1, dtype=np.int64)
        renumber[keep] = np.arange(len(keep))
        table = self.take(keep) if len(keep) else None
        self._bin, self._due = self._bin[keep].copy(), self._due[keep].copy()
        self._chunks, self._starts = ([table], [0]) if table is not None else ([], [])
        self._n, self._dead = len(keep), 0
        return renumber

    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._chunks) + self._bin.nbytes + self._due.nbytes

    def _touch(self, bins: np.ndarray) -> None:
        held = np.unique(bins)
        self._versions[held[held < self.num_bins]] += 1


def _grown(array: np.ndarray, capacity: int, used: int) -> np.ndarray:
    out = np.zeros(capacity, dtype=array.dtype)
    out[:used] = array[:used]
    return out


class RowsState(BinnedState):
    """The keyed state of named :class:`RowBins` parts, a bin travelling as one codec document.

    Args:
        num_bins: the operator's bins.
        parts: the names of the parts.
        format: the document's format tag (one per kind of state: a bin is installed only where it fits).
        sequence: a column of arrival numbers (:meth:`numbers`) in the parts' rows, if any: installed rows
            move the next number past theirs, so a key's rows keep their arrival order as its bin moves.
    """

    def __init__(self, num_bins: int, parts: Iterable[str], format: str, sequence: str | None = None) -> None:
        super().__init__(num_bins)
        self.parts = {name: RowBins(self._num_bins, self._versions) for name in parts}
        self._format = format
        self._sequence = sequence
        self._next = 0

    def numbers(self, count: int) -> np.ndarray:
        """``count`` arrival numbers, above every one handed out or installed here."""
        out = np.arange(self._next, self._next + count, dtype=np.int64)
        self._next += count
        return out

    def _counts(self) -> np.ndarray:
        return sum((p.bin_counts() for p in self.parts.values()), np.zeros(self._num_bins, dtype=np.int64))

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts.values())

    def bins(self) -> list[int]:
        return np.flatnonzero(self._counts()).tolist()

    def bin_key_counts(self) -> dict[int, int]:
        counts = self._counts()
        return {int(b): int(counts[b]) for b in np.flatnonzero(counts)}

    def bin_sizes(self) -> dict[int, int]:
        size = 0
        for part in self.parts.values():
            size += part.nbytes()
        per_row = size / max(sum(p.size for p in self.parts.values()), 1)
        return {b: int(n * per_row) + 64 for b, n in self.bin_key_counts().items()}

    def snapshot_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        wanted = self._check_bins(bins)
        found = {name: self._rows_in(name, wanted) for name in self.parts}
        return {b: codec.encode({
            "format": self._format, "num_bins": self._num_bins, "bin": b, "version": int(self._versions[b]),
            "parts": {name: rows[b] for name, rows in found.items() if b in rows}}) for b in wanted}

    def extract_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        out = self.snapshot_bins(bins)
        gone = list(out)
        for part in self.parts.values():
            part.drop(part.positions_in(gone))
        self._removed(gone)
        self.compact()
        return out

    def install_bins(self, data: Mapping[int, bytes]) -> None:
        docs = {self._check_bin(b): self._decode(b, payload) for b, payload in data.items()}
        counts = self._counts()
        for b, doc in docs.items():
            if doc["parts"] and counts[b]:
                raise ValueError(f"cannot install bin {b}: it is already present here with {int(counts[b])} rows")
        for b, doc in docs.items():
            for name in self.parts:  # in the parts' order: a part's rows may refer to an earlier part's
                if name in doc["parts"]:
                    rows = doc["parts"][name]
                    if self._sequence in rows.column_names and rows.num_rows:
                        self._next = max(self._next, int(pc.max(rows.column(self._sequence)).as_py()) + 1)
                    self._install(name, b, rows)
            self._carry_version(b, doc["version"])

    def compact(self) -> None:
        """Renumber each part whose tombstones are many (subclasses remap what points into it)."""
        for name, part in self.parts.items():
            renumber = part.compact()
            if renumber is not None:
                self._renumbered(name, renumber)

    def _rows_in(self, part: str, bins: list[int]) -> dict[int, pa.Table]:
        """What a serialised bin holds of ``part``: per bin, its live rows with their due times."""
        return self.parts[part].rows_in(bins)

    def _install(self, part: str, b: int, rows: pa.Table) -> np.ndarray:
        """Add the rows of ``part`` of an installed bin ``b`` (as ``_rows_in`` gave them); returns their positions."""
        due = rows.column(DUE).to_numpy()
        return self.parts[part].add(rows.drop_columns([DUE]), np.full(rows.num_rows, b, dtype=np.int32), due)

    def _removed(self, bins: list[int]) -> None:
        """``bins`` left (their rows are tombstones already; default: nothing to do)."""

    def _renumbered(self, part: str, renumber: np.ndarray) -> None:
        """``part`` was compacted: old position ``p`` is now ``renumber[p]`` (default: nothing to do)."""

    def _decode(self, b: int, payload: bytes) -> dict[str, Any]:
        doc = codec.decode_document(payload, type(self).__name__, self._format, b)
        if doc["num_bins"] != self._num_bins or doc["bin"] != b:
            raise ValueError(f"bin {b}: payload is bin {doc['bin']} of a state with {doc['num_bins']} bins; "
                             f"this state has {self._num_bins} bins")
        unknown = sorted(set(doc["parts"]) - set(self.parts))
        if unknown:
            raise ValueError(f"bin {b}: payload has parts {unknown} this {type(self).__name__} does not keep")
        return doc
