"""hashing.py: the stable vectorised key hash, and key -> bin.

Every process that hashes the same key value gets the same 64-bit hash (never
Python's per-process salted ``hash()`` of a ``str``), so the router that sends a
record to an instance and the keyed state that stores it agree on its *bin*.
Bins are the unit of migration and checkpointing; ``num_bins`` is a power of
two fixed per keyed operator.

How keys are hashed (all vectorised over a column):

* strings and binaries: read straight from Arrow's offset and data buffers,
  8 bytes at a time, folded through splitmix64 (no Python objects, cost
  independent of how many values are distinct);
* integers (every width, signed or not), booleans and temporal types: the
  value as an ``int64`` through the splitmix64 finaliser (a bijection, so two
  distinct integers never share a hash); the same number at two integer widths
  hashes the same;
* floats: the ``float64`` bit pattern through splitmix64, with ``-0.0`` read
  as ``0.0`` and every NaN as one NaN;
* dictionary arrays: the dictionary is hashed, then gathered;
* any other type is cast to a string first;
* nulls always hash to :data:`NULL_HASH`.

The bin of a key is the top ``log2(num_bins)`` bits of its hash.

How keyed state groups keys and gives them slots lives in :mod:`operators.keyindex`.

Measured on this machine (one core, ``bins_of``, best of 5): 1M string keys
with 100K distinct values at about 12M rows/s; 1M ``int64`` keys at about
120M rows/s. Re-measure with ``python -m benchmarks.hashing``.

Example:
    >>> import pyarrow as pa
    >>> b = bins_of(pa.array(["a", "b", None]), 1024)
    >>> b.dtype.name, bool(((0 <= b) & (b < 1024)).all())
    ('int64', True)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "DEFAULT_NUM_BINS",
    "NULL_HASH",
    "check_num_bins",
    "hash_keys",
    "bins_of",
    "bins_from_hashes",
]

DEFAULT_NUM_BINS = 1024
"""Default number of key bins of a keyed operator."""

NULL_HASH = np.uint64(0x6A09E667F3BCC908)
"""The hash of a null key (a fixed constant)."""

_SIP_KEY = "chiray-bins-v1!!"  # 16 bytes: the fixed SipHash key; changing it moves every key
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_STRING_SEED = np.uint64(0x6368697261790001)  # "chiray" + version: changing it moves every key


def check_num_bins(n: int) -> int:
    """Validate a number of bins.

    Args:
        n: the proposed number of bins.

    Returns:
        ``n`` unchanged.

    Raises:
        ValueError: unless ``n`` is an ``int`` power of two >= 1.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 or (n & (n - 1)) != 0:
        raise ValueError(f"num_bins must be a power of two >= 1 (1, 2, 4, ..., 1024, ...); got {n!r}")
    return int(n)


def hash_keys(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Hash a key column, the same way in every process.

    Args:
        keys: the key column.

    Returns:
        A ``uint64`` array with one hash per row.
    """
    if isinstance(keys, pa.ChunkedArray):
        parts = [_hash_array(chunk) for chunk in keys.chunks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
    if not isinstance(keys, pa.Array):
        raise TypeError(f"hash_keys expects a pyarrow Array or ChunkedArray, got {type(keys).__name__}")
    return _hash_array(keys)


def bins_from_hashes(hashes: np.ndarray, num_bins: int) -> np.ndarray:
    """Map hashes from :func:`hash_keys` to bins in ``[0, num_bins)`` (their top bits).

    Args:
        hashes: ``uint64`` hashes.
        num_bins: a power of two.

    Returns:
        An ``int64`` array of bins.
    """
    shift = 64 - (check_num_bins(num_bins).bit_length() - 1)
    if shift == 64:
        return np.zeros(len(hashes), dtype=np.int64)
    return (np.asarray(hashes, dtype=np.uint64) >> np.uint64(shift)).astype(np.int64)


def bins_of(keys: pa.Array | pa.ChunkedArray, num_bins: int) -> np.ndarray:
    """The bin of every key of a column (what the router and keyed state use).

    Args:
        keys: the key column.
        num_bins: a power of two.

    Returns:
        An ``int64`` array of bins in ``[0, num_bins)``, one per row.

    Raises:
        ValueError: if ``num_bins`` is not a power of two.
    """
    check_num_bins(num_bins)
    return bins_from_hashes(hash_keys(keys), num_bins)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser over ``uint64`` values (wrapping arithmetic, a bijection)."""
    z = x.copy()
    _splitmix64_into(z, np.empty_like(z))
    return z


def _splitmix64_into(z: np.ndarray, spare: np.ndarray) -> None:
    """:func:`_splitmix64` of ``z`` in place (``spare``: an array of ``z``'s length for the shifts). Fresh
    memory costs its first touch: hashing millions of keys in a new process (a restore) spent most of its
    time in the pages of the arrays each step used to make."""
    z += _GOLDEN
    np.right_shift(z, np.uint64(30), out=spare)
    z ^= spare
    z *= _MIX1
    np.right_shift(z, np.uint64(27), out=spare)
    z ^= spare
    z *= _MIX2
    np.right_shift(z, np.uint64(31), out=spare)
    z ^= spare


HASH_CHUNK_ROWS = 1 << 13
"""A longer array is hashed this many rows at a time (see :func:`_hash_array`)."""


def _hash_array(arr: pa.Array, distinct: bool = False) -> np.ndarray:
    """Hash one array; ``distinct`` says its values are distinct (no need to dictionary-encode).

    An array longer than ``HASH_CHUNK_ROWS`` is hashed that many rows at a time: each step of the hash
    makes arrays as long as its input, and fresh memory costs its first touch (the kernel clears its
    pages). A restore hashes millions of keys in a new process: 4M string keys took 0.34-0.81 s there
    at once, up to 0.59 s of it in the kernel; in steps, whose small arrays the allocator hands back
    from one step to the next, 0.11-0.13 s."""
    t = arr.type
    if len(arr) == 0:
        return np.empty(0, dtype=np.uint64)
    if pa.types.is_dictionary(t):
        return _gather(_hash_array(arr.dictionary), arr.indices)
    if len(arr) > HASH_CHUNK_ROWS:
        hashed = np.empty(len(arr), dtype=np.uint64)
        for lo in range(0, len(arr), HASH_CHUNK_ROWS):
            hashed[lo: lo + HASH_CHUNK_ROWS] = _hash_array(arr.slice(lo, HASH_CHUNK_ROWS))
        return hashed
    if pa.types.is_null(t):
        return np.full(len(arr), NULL_HASH, dtype=np.uint64)
    if _is_bytes_like(t):
        return _hash_strings(arr, distinct)
    if pa.types.is_floating(t):
        return _with_nulls(arr, _splitmix64(_float_bits(arr)))
    ints = _as_int64(arr)
    if ints is not None:
        return _with_nulls(arr, _splitmix64(ints.view(np.uint64)))
    return _hash_strings(_cast_to_string(arr))


def _is_bytes_like(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary_view(t)
    )


def _hash_strings(arr: pa.Array, distinct: bool = False) -> np.ndarray:
    """Hash strings and binaries straight from Arrow's offset and data buffers.

    Each value is folded 8 bytes at a time through splitmix64, seeded by its
    length; the 8-byte words are read unaligned through a strided view of the
    data buffer, so the cost is one NumPy gather per 8 bytes of the longest
    value, with no Python objects; each step writes into the arrays of the
    steps before. ``distinct`` is accepted for symmetry.
    """
    t = arr.type
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        arr, t = arr.cast(pa.large_string()), pa.large_string()
    elif pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t):
        arr, t = arr.cast(pa.large_binary()), pa.large_binary()
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[arr.offset: arr.offset + n + 1]
    lengths = np.diff(offsets).astype(np.int64, copy=False)
    hashed = lengths.astype(np.uint64)
    hashed ^= _STRING_SEED
    spare = np.empty_like(hashed)
    _splitmix64_into(hashed, spare)
    longest = int(lengths.max()) if n else 0
    if longest:
        words = _Words(np.frombuffer(bufs[2], dtype=np.uint8))
        at = offsets[:-1].astype(np.int64)  # where each value's next word starts
        left = lengths.copy()  # its bytes from there on
        for _ in range(0, longest, 8):
            live = None if int(left.min()) > 0 else np.flatnonzero(left > 0)
            if live is None:
                word = words.at(at)
                word &= _low_bytes_mask(left)
                hashed ^= word
                _splitmix64_into(hashed, spare)
                at += 8
                left -= 8
            else:
                some = hashed[live]  # (a copy: fancy indexing)
                some ^= words.at(at[live]) & _low_bytes_mask(left[live])
                _splitmix64_into(some, np.empty_like(some))
                hashed[live] = some
                at[live] += 8
                left[live] -= 8
    return _with_nulls(arr, hashed)


class _Words:
    """The little-endian 8-byte words of a data buffer, read at any byte position; a word that runs past
    the buffer's end reads zeros there. Read in place: the buffer is not copied to pad its end."""

    def __init__(self, data: np.ndarray) -> None:
        self.safe = max(len(data) - 7, 0)  # positions below this read 8 bytes of the buffer
        self._words = np.ndarray(shape=(self.safe,), dtype=np.uint64, buffer=data, strides=(1,))
        tail = np.zeros(16, dtype=np.uint8)  # the buffer's last bytes (up to 8), then zeros
        self._tail_from = max(len(data) - 8, 0)
        tail[:len(data) - self._tail_from] = data[self._tail_from:]
        self._tail = np.ndarray(shape=(9,), dtype=np.uint64, buffer=tail, strides=(1,))

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The words starting at ``positions`` (ascending, each below the buffer's length), in a new array."""
        if not len(positions) or int(positions[-1]) < self.safe:
            return self._words[positions]
        past = positions >= self.safe
        out = np.empty(len(positions), dtype=np.uint64)
        out[~past] = self._words[positions[~past]]
        out[past] = self._tail[positions[past] - self._tail_from]
        return out


_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _low_bytes_mask(nbytes: np.ndarray) -> np.ndarray:
    """Per value, a mask of its low ``min(nbytes, 8)`` bytes (little-endian words)."""
    return _BYTE_MASKS[np.minimum(nbytes, 8)]


def _gather(dictionary_hashes: np.ndarray, indices: pa.Array) -> np.ndarray:
    """``dictionary_hashes[indices]`` with null indices mapped to :data:`NULL_HASH`."""
    table = np.append(dictionary_hashes, NULL_HASH)
    if indices.null_count:
        indices = pc.fill_null(indices, len(dictionary_hashes))
    return table[indices.to_numpy()]


def _with_nulls(arr: pa.Array, hashed: np.ndarray) -> np.ndarray:
    if arr.null_count:
        hashed[arr.is_null().to_numpy(zero_copy_only=False)] = NULL_HASH
    return hashed


def _float_bits(arr: pa.Array) -> np.ndarray:
    """Float values as canonical ``uint64`` bit patterns (-0.0 -> 0.0, one NaN)."""
    values = arr.cast(pa.float64()).fill_null(0.0).to_numpy()
    values = values + 0.0  # turns -0.0 into 0.0 (and copies)
    values[np.isnan(values)] = np.nan
    return values.view(np.uint64)


def _as_int64(arr: pa.Array) -> np.ndarray | None:
    """Integer-like values as ``int64`` (nulls as 0), or ``None`` if not integer-like."""
    t = arr.type
    if pa.types.is_boolean(t):
        arr = arr.cast(pa.int8())
    elif pa.types.is_temporal(t):
        width = t.bit_width
        if width not in (32, 64):
            return None
        arr = arr.view(pa.int32() if width == 32 else pa.int64())
    elif not pa.types.is_integer(t):
        return None
    if arr.null_count:
        arr = arr.fill_null(0)
    if pa.types.is_uint64(arr.type):
        return arr.to_numpy().view(np.int64)
    return arr.to_numpy().astype(np.int64, copy=False)


def _cast_to_string(arr: pa.Array) -> pa.Array:
    """Keys of any other type, as strings (Arrow's cast, else the repr of each value)."""
    try:
        return arr.cast(pa.large_string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return pa.array([None if v is None else repr(v) for v in arr.to_pylist()], pa.large_string())
