"""Tests for operators.state: binned keyed state, its versions, and moving bins between states."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pyarrow as pa
import pytest

from chiray.operators import codec
from chiray.operators.hashing import bins_of
from chiray.operators.keyindex import encode_keys
from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState
from chiray.operators.dictstate import DictState
from chiray.operators.state import BinnedState

from .support import move_bins

REPO = Path(__file__).resolve().parents[3]
ACCS = [Accumulator("n", "sum", "int64"), Accumulator("lo", "min", "float64"), Accumulator("hi", "max", "int64")]


def _bin(key: object, num_bins: int) -> int:
    return int(bins_of(pa.array([key]), num_bins)[0])


# -- DictState ------------------------------------------------------------------------------------


def test_dict_state_get_put_delete_and_versions() -> None:
    s = DictState(8)
    b = _bin("a", 8)
    assert s.get("a", b) is None and s.get("a", b, 5) == 5 and s.version(b) == 0
    s.put("a", b, 1)
    s.put("a", b, 2)
    assert s.get("a", b) == 2 and s.version(b) == 2 and s.bins() == [b]
    s.delete("a", b)
    assert s.get("a", b) is None and s.version(b) == 3 and s.bins() == [] and len(s) == 0
    s.delete("a", b)  # absent: not a write
    assert s.version(b) == 3


def test_dict_state_reports_bins_counts_and_sizes() -> None:
    s = DictState(16)
    keys = [f"k{i}" for i in range(100)] + [None]
    for k in keys:
        s.put(k, _bin(k, 16), {"v": k})
    expected = np.bincount(bins_of(pa.array(keys), 16), minlength=16)
    assert s.bins() == np.flatnonzero(expected).tolist()
    assert s.bin_key_counts() == {int(b): int(expected[b]) for b in np.flatnonzero(expected)}
    sizes = s.bin_sizes()
    assert sorted(sizes) == s.bins() and all(v > 0 for v in sizes.values())
    assert sorted(k for k, _ in s.items() if k is not None) == sorted(keys[:-1]) and len(s) == 101


def test_dict_state_rejects_bins_out_of_range() -> None:
    s = DictState(4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        s.put("a", 4, 1)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        s.version(-1)
    with pytest.raises(ValueError, match="power of two"):
        DictState(3)


def test_dict_state_snapshot_extract_install_round_trip() -> None:
    a, b = DictState(8), DictState(8)
    for i in range(200):
        a.put(i, _bin(i, 8), i * i)
    before = dict(a.items())
    moved = a.bins()[:3]
    snap = a.snapshot_bins(moved)
    assert dict(a.items()) == before  # a snapshot is a copy
    versions = {m: a.version(m) for m in moved}
    out = a.extract_bins(moved)
    assert out.keys() == snap.keys() and set(a.bins()).isdisjoint(moved)
    b.install_bins(out)
    assert b.bins() == moved and {m: b.version(m) for m in moved} == versions
    assert {**dict(a.items()), **dict(b.items())} == before
    with pytest.raises(ValueError, match="already present"):
        b.install_bins(snap)
    assert b.bins() == moved  # nothing installed on error


def test_dict_state_install_rejects_foreign_payloads() -> None:
    s = DictState(8)
    with pytest.raises(ValueError, match="not a DictState bin"):
        s.install_bins({0: b"garbage"})
    other = DictState(16)
    other.put("a", 3, 1)
    with pytest.raises(ValueError, match="16 bins"):
        s.install_bins({3: other.snapshot_bins([3])[3]})
    with pytest.raises(ValueError, match="bin 2"):
        s.install_bins({2: DictState(8).snapshot_bins([1])[1]})


class _Opaque:
    """A user object: only state kept with ``pickled=True`` may hold it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Opaque) and other.n == self.n


def test_dict_state_of_user_objects_pickles_and_built_in_state_refuses_them() -> None:
    b = _bin("a", 8)
    user, built_in = DictState(8, pickled=True), DictState(8)
    for s in (user, built_in):
        s.put("a", b, [_Opaque(1)])
    payload = user.snapshot_bins([b])[b]
    assert codec.is_pickle(payload)
    other = DictState(8, pickled=True)
    other.install_bins({b: payload})
    assert other.get("a", b) == [_Opaque(1)]
    with pytest.raises(TypeError, match=rf"bin {b} of a DictState: cannot encode a .*_Opaque at "
                                        rf"value\['items'\]\['a'\]\[0\].*pickled=True"):
        built_in.snapshot_bins([b])
    with pytest.raises(ValueError, match=f"bin {b}: the DictState payload is pickled; built-in state reads"):
        DictState(8).install_bins({b: payload})


def test_pickled_dict_state_reads_arrow_bins_and_writes_empty_ones_as_arrow() -> None:
    b = _bin("a", 8)
    built_in = DictState(8)
    built_in.put("a", b, (1, pa.record_batch({"x": [1]})))
    user = DictState(8, pickled=True)
    user.install_bins(built_in.snapshot_bins([b]))
    assert user.get("a", b)[0] == 1 and user.get("a", b)[1].equals(pa.record_batch({"x": [1]}))
    emptied = DictState(8, pickled=True)
    emptied.put("x", b, _Opaque(2))
    emptied.delete("x", b)
    payload = emptied.snapshot_bins([b])[b]
    assert not codec.is_pickle(payload)
    built_in = DictState(8)
    built_in.install_bins({b: payload})
    assert built_in.bins() == [] and built_in.version(b) == 2


def test_dict_state_drops_bins_without_serialising_them() -> None:
    s = DictState(8)
    s.put("a", _bin("a", 8), object())  # (would not serialise)
    s.put("b", _bin("b", 8), 1)
    s.drop_bins([_bin("a", 8)])
    assert s.get("a", _bin("a", 8)) is None and s.get("b", _bin("b", 8)) == 1
    assert s.version(_bin("a", 8)) == 1 and s.bins() == [_bin("b", 8)]  # (a and b: other bins)
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        s.drop_bins([8])


def test_install_of_an_empty_bin_carries_its_version_only() -> None:
    a, b = DictState(4), DictState(4)
    a.put("x", 1, 1)
    a.delete("x", 1)
    b.install_bins(a.snapshot_bins([1]))
    assert b.bins() == [] and b.version(1) == 2


# -- ColumnarAggState -----------------------------------------------------------------------------


class _Oracle:
    """A plain-dict model of a ColumnarAggState with ACCS."""

    def __init__(self) -> None:
        self.values: dict[object, list] = {}

    def update(self, keys: list, n: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        for i, k in enumerate(keys):
            cur = self.values.setdefault(k, [0, np.inf, np.iinfo(np.int64).min])
            cur[0] += int(n[i])
            cur[1] = min(cur[1], float(lo[i]))
            cur[2] = max(cur[2], int(hi[i]))


def _dump(state: ColumnarAggState) -> dict[object, list]:
    slots = state.slots()
    values = state.values(slots)
    keys = state.keys_at(slots).to_pylist()
    return {k: [int(values["n"][i]), float(values["lo"][i]), int(values["hi"][i])] for i, k in enumerate(keys)}


KEY_MAKERS = {
    "string": (pa.string(), lambda v: None if v == 0 else f"key-{v}"),
    "int": (pa.int64(), lambda v: None if v == 0 else v * 1_000_003),
    "float": (pa.float64(), lambda v: None if v == 0 else v / 8),
    "bool": (pa.bool_(), lambda v: None if v == 0 else bool(v % 2)),
    "timestamp": (pa.timestamp("ms"), lambda v: None if v == 0 else datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=v)),
}


@pytest.mark.parametrize("index_hash_bits", [64, 3])
@pytest.mark.parametrize("kind", sorted(KEY_MAKERS))
def test_columnar_state_matches_oracle_while_bins_move(kind: str, index_hash_bits: int) -> None:
    key_type, make_key = KEY_MAKERS[kind]
    rng = np.random.default_rng(11)
    states = [ColumnarAggState(16, index_hash_bits=index_hash_bits) for _ in range(2)]
    for s in states:
        s.configure(key_type, ACCS)
    oracle = _Oracle()
    owner = {b: 0 for b in range(16)}  # the "router": bin -> state
    for step in range(12):
        # route a random update to each state by bin: split keys by owner
        raw = [make_key(int(v)) for v in rng.integers(0, 300, 150)]
        uniques, _ = encode_keys(pa.array(raw, key_type))
        bins = bins_of(uniques, 16)
        m = len(uniques)
        n, lo, hi = rng.integers(0, 5, m), rng.random(m), rng.integers(-1000, 1000, m)
        for i, s in enumerate(states):
            mine = np.flatnonzero([owner[int(b)] == i for b in bins])
            if mine.size:
                s.update(uniques.take(mine), {"n": n[mine], "lo": lo[mine], "hi": hi[mine]})
        oracle.update(uniques.to_pylist(), n, lo, hi)
        if step % 3 == 2:  # move some random bins from one state to the other
            src = int(rng.integers(0, 2))
            move_bins(states, owner, src, [b for b in states[src].bins() if rng.random() < 0.5])
    merged = {**_dump(states[0]), **_dump(states[1])}
    assert len(states[0]) + len(states[1]) == len(merged) == len(oracle.values)
    for k, expected in oracle.values.items():
        assert merged[k][0] == expected[0] and merged[k][2] == expected[2]
        assert merged[k][1] == pytest.approx(expected[1])
    for s in states:  # every key sits in its own bin, as the router computes it
        keys = s.keys_at(s.slots())
        assert set(bins_of(keys, 16).tolist()) == set(s.bins())


def test_columnar_state_versions_count_writes_per_bin_and_travel() -> None:
    s = ColumnarAggState(8)
    s.configure(pa.string(), ACCS)
    keys = pa.array([f"k{i}" for i in range(40)])
    one = {"n": np.ones(40, np.int64), "lo": np.zeros(40), "hi": np.zeros(40, np.int64)}
    s.update(keys, one)
    s.update(keys.slice(0, 1), {name: v[:1] for name, v in one.items()})
    b0 = _bin("k0", 8)
    assert s.version(b0) == 2
    assert all(s.version(b) == 1 for b in s.bins() if b != b0)
    other = ColumnarAggState(8)
    other.install_bins(s.extract_bins([b0]))
    assert other.version(b0) == 2 and s.version(b0) == 2  # never decreases
    assert other.layout == s.layout


def test_columnar_state_extracted_keys_start_over_when_seen_again() -> None:
    s = ColumnarAggState(4)
    s.configure(pa.int64(), [Accumulator("n", "sum", "int64")])
    keys = pa.array(range(100))
    s.update(keys, {"n": np.ones(100, np.int64)})
    gone = s.bins()[:2]
    s.extract_bins(gone)
    s.update(keys, {"n": np.ones(100, np.int64)})
    counts = dict(zip(s.keys_at(s.slots()).to_pylist(), s.values(s.slots())["n"].tolist()))
    bins = bins_of(keys, 4)
    assert counts == {k: (1 if bins[k] in gone else 2) for k in range(100)}


def test_columnar_state_moves_bins_one_by_one_and_back() -> None:
    """Bins extracted one at a time (tombstones, then a compaction) and installed back stay exact."""
    a, b = ColumnarAggState(16), ColumnarAggState(16)
    a.configure(pa.int64(), [Accumulator("n", "sum", "int64")])
    keys = pa.array(range(400))
    weights = np.arange(400, dtype=np.int64) % 7 + 1
    a.update(keys, {"n": weights})
    expected = dict(zip(range(400), weights.tolist()))

    def contents(s):
        return dict(zip(s.keys_at(s.slots()).to_pylist(), s.values(s.slots())["n"].tolist()))

    for bin in range(12):  # past half the slots: a compaction happens on the way
        b.install_bins(a.extract_bins([bin]))
        assert len(a) + len(b) == 400
        assert {**contents(a), **contents(b)} == expected
    a.install_bins(b.extract_bins(range(6)))  # some come back to where they were tombstoned
    mine = set(a.bins())
    owned = pa.array([k for k in range(400) if int(bins_of(pa.array([k]), 16)[0]) in mine])
    a.update(owned, {"n": np.ones(len(owned), np.int64)})
    assert set(contents(a)) & set(contents(b)) == set()
    got = {**contents(b), **contents(a)}
    assert got == {k: v + 1 if int(bins_of(pa.array([k]), 16)[0]) in mine else v for k, v in expected.items()}


def test_columnar_state_install_next_to_tombstones_touches_only_the_installed_rows() -> None:
    """Installing into a state holding tombstones rebuilds nothing: keys that stayed keep their
    slots, keys that come back get their old slots again, keys new to the state get new ones."""
    a, b = ColumnarAggState(16), ColumnarAggState(16)
    a.configure(pa.int64(), [Accumulator("n", "sum", "int64")])
    a.update(pa.array(range(300)), {"n": np.arange(300, dtype=np.int64)})
    slot_of = dict(zip(a.keys_at(a.slots()).to_pylist(), a.slots().tolist()))
    bin_of = {k: int(v) for k, v in zip(range(2000), bins_of(pa.array(range(2000)), 16))}
    leaving = a.bins()[:5]  # under half the slots: tombstones, no compaction
    b.install_bins(a.extract_bins(leaving))
    fresh = [k for k in range(300, 2000) if bin_of[k] == leaving[0]][:20]  # keys a never held
    b.update(pa.array(fresh), {"n": np.full(len(fresh), 7, np.int64)})
    a.install_bins(b.extract_bins(leaving[:3]))

    slots = dict(zip(a.keys_at(a.slots()).to_pylist(), a.slots().tolist()))
    held = {k for k in range(300) if bin_of[k] not in leaving[3:]}
    assert set(slots) == held | set(fresh)
    assert all(slots[k] == slot_of[k] for k in held), "a slot moved: the state was rebuilt"
    assert min(slots[k] for k in fresh) >= 300
    values = dict(zip(a.keys_at(a.slots()).to_pylist(), a.values(a.slots())["n"].tolist()))
    assert values == {**{k: k for k in held}, **{k: 7 for k in fresh}}
    a.update(pa.array(range(300)), {"n": np.ones(300, np.int64)})  # each key finds exactly one slot
    values = dict(zip(a.keys_at(a.slots()).to_pylist(), a.values(a.slots())["n"].tolist()))
    assert values == {**{k: (k + 1 if k in held else 1) for k in range(300)}, **{k: 7 for k in fresh}}


def test_columnar_state_reports_bins_counts_and_sizes() -> None:
    s = ColumnarAggState(32)
    assert s.bins() == [] and s.bin_sizes() == {} and s.snapshot_bins([]) == {}
    s.configure(pa.string(), ACCS)
    keys = pa.array([f"key-{i}" for i in range(500)])
    s.update(keys, {"n": np.ones(500, np.int64), "lo": np.zeros(500), "hi": np.zeros(500, np.int64)})
    expected = np.bincount(bins_of(keys, 32), minlength=32)
    assert s.bin_key_counts() == {int(b): int(expected[b]) for b in np.flatnonzero(expected)}
    assert sorted(s.bin_sizes()) == s.bins() and min(s.bin_sizes().values()) > 0
    snap = s.snapshot_bins(range(32))
    assert len(snap) == 32 and len(s) == 500


def test_columnar_state_errors() -> None:
    s = ColumnarAggState(8)
    with pytest.raises(ValueError, match="before configure"):
        s.update(pa.array(["a"]), {"n": np.ones(1, np.int64)})
    s.configure(pa.string(), ACCS)
    s.configure(pa.string(), ACCS)  # the same again is fine
    with pytest.raises(ValueError, match="already configured"):
        s.configure(pa.int64(), ACCS)
    with pytest.raises(ValueError, match="expected"):
        s.update(pa.array(["a"]), {"n": np.ones(1, np.int64)})
    with pytest.raises(ValueError, match="unique"):
        ColumnarAggState(8).configure(pa.string(), [ACCS[0], ACCS[0]])
    with pytest.raises(ValueError, match="op must be"):
        Accumulator("x", "avg", "int64")
    with pytest.raises(ValueError, match="dtype must be"):
        Accumulator("x", "sum", "int32")


def test_columnar_state_install_rejects_conflicts_and_foreign_payloads() -> None:
    a = ColumnarAggState(8)
    a.configure(pa.string(), ACCS)
    keys = pa.array([f"k{i}" for i in range(50)])
    a.update(keys, {"n": np.ones(50, np.int64), "lo": np.zeros(50), "hi": np.zeros(50, np.int64)})
    b0 = a.bins()[0]
    snap = a.snapshot_bins([b0])
    with pytest.raises(ValueError, match="already present"):
        a.install_bins(snap)
    other_layout = ColumnarAggState(8)
    other_layout.configure(pa.string(), ACCS[:1])
    with pytest.raises(ValueError, match="differ"):
        other_layout.install_bins(snap)
    with pytest.raises(ValueError, match="16 bins"):
        ColumnarAggState(16).install_bins({b0: snap[b0]})
    with pytest.raises(ValueError, match="not a ColumnarAggState bin"):
        a.install_bins({b0: DictState(8).snapshot_bins([b0])[b0]})
    with pytest.raises(ValueError, match="not a ColumnarAggState bin"):
        a.install_bins({b0: b"\x00garbage"})


def test_states_implement_binned_state() -> None:
    assert isinstance(DictState(2), BinnedState) and isinstance(ColumnarAggState(2), BinnedState)


_CHILD = """
import sys, cloudpickle
sys.path.insert(0, {repo!r})
from chiray.operators.columnarstate import ColumnarAggState
from chiray.operators.dictstate import DictState
payloads = cloudpickle.loads(sys.stdin.buffer.read())
c, d = ColumnarAggState(8), DictState(8)
c.install_bins(payloads["columnar"])
d.install_bins(payloads["dict"])
values = c.values(c.slots())["n"].tolist()
print(sorted(zip(c.keys_at(c.slots()).to_pylist(), values)), sorted(d.items()))
"""


def test_bins_load_in_another_process() -> None:
    c, d = ColumnarAggState(8), DictState(8)
    c.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    keys = [f"k{i}" for i in range(30)]
    c.update(pa.array(keys), {"n": np.arange(30)})
    for i, k in enumerate(keys):
        d.put(k, _bin(k, 8), i)
    payloads = {"columnar": c.snapshot_bins(c.bins()), "dict": d.snapshot_bins(d.bins())}
    out = subprocess.run([sys.executable, "-c", _CHILD.format(repo=str(REPO))], input=cloudpickle.dumps(payloads),
                         capture_output=True, check=True)
    expected = sorted(zip(keys, range(30)))
    assert out.stdout.decode().strip() == f"{expected} {expected}"


def test_snapshot_later_captures_the_state_as_it_was_when_called() -> None:
    s = ColumnarAggState(8)
    s.configure(pa.string(), ACCS)
    keys = pa.array([f"k{i}" for i in range(40)])
    one = {"n": np.ones(40, np.int64), "lo": np.zeros(40), "hi": np.zeros(40, np.int64)}
    s.update(keys, one)
    before = _dump(s)
    encode = s.snapshot_later(s.bins())
    s.update(keys, {name: v * 5 for name, v in one.items()})  # the state moves on before encoding
    s.update(pa.array(["new-key"]), {name: v[:1] for name, v in one.items()})
    restored = ColumnarAggState(8)
    restored.install_bins(encode())
    assert _dump(restored) == before
    assert _dump(restored) != _dump(s)


def _random_update(state: ColumnarAggState, rng: np.random.Generator, bins: set[int] | None, n: int = 60) -> None:
    """A write of ``n`` random keys (of ``bins`` only, when given) to ``state``."""
    uniques, _ = encode_keys(pa.array([f"key-{int(v)}" for v in rng.integers(0, 400, n)]))
    if bins is not None:
        uniques = uniques.filter(pa.array(np.isin(bins_of(uniques, 16), sorted(bins))))
    m = len(uniques)
    if m:
        state.update(uniques, {"n": rng.integers(0, 5, m), "lo": rng.random(m), "hi": rng.integers(-9, 9, m)})


@pytest.mark.parametrize("seed", range(6))
def test_changes_since_a_copy_rebuild_the_bins_exactly(seed: int) -> None:
    """A copy of some bins at their versions, plus ``extract_changes`` since those versions, equals
    the bins extracted whole; with bins that left the state and came back in between."""
    rng = np.random.default_rng(seed)
    old, away, new, oracle = (ColumnarAggState(16) for _ in range(4))
    for s in (old, away, new, oracle):
        s.configure(pa.string(), ACCS)
    for _ in range(5):
        _random_update(old, rng, None)
    moving = sorted(int(b) for b in rng.choice(old.bins(), size=6, replace=False))
    copy = old.snapshot_bins(moving)
    since = {b: old.version(b) for b in moving}
    for step in range(6):  # later writes to some bins; one bin leaves and comes back
        _random_update(old, rng, set(moving[: 2 + step % 3]))
        if step == 2:
            away.install_bins(old.extract_bins([moving[-1]]))
            _random_update(away, rng, {moving[-1]})
            old.install_bins(away.extract_bins([moving[-1]]))
    whole = ColumnarAggState(16)
    whole.install_bins(old.snapshot_bins(moving))
    changes = old.extract_changes(since)
    assert set(changes) == set(moving) and not set(old.bins()) & set(moving)
    unchanged = [b for b in moving if whole.version(b) == since[b]]
    assert all(ColumnarAggState(16).install_bins({b: changes[b]}) is None for b in unchanged)
    new.install_bins(copy)
    new.apply_changes(changes)
    assert _dump(new) == _dump(whole)
    assert all(new.version(b) == whole.version(b) for b in moving)
    changed_rows = sum(len(pa.ipc.open_stream(p).read_all()) for p in changes.values())
    assert changed_rows < len(whole)  # only the rows written since the copy travel


def test_changes_of_an_unwritten_bin_are_empty_and_keep_its_version() -> None:
    s = ColumnarAggState(16)
    s.configure(pa.string(), ACCS)
    _random_update(s, np.random.default_rng(1), None)
    b = s.bins()[0]
    version = s.version(b)
    copy = s.snapshot_bins([b])
    changes = s.extract_changes({b: version})
    assert pa.ipc.open_stream(changes[b]).read_all().num_rows == 0
    other = ColumnarAggState(16)
    other.install_bins(copy)
    before = _dump(other)
    other.apply_changes(changes)
    assert _dump(other) == before and other.version(b) == version


def test_apply_changes_rejects_foreign_payloads_and_dict_state_does_not_track() -> None:
    s = ColumnarAggState(16)
    s.configure(pa.string(), ACCS)
    _random_update(s, np.random.default_rng(2), None)
    b = s.bins()[0]
    other = ColumnarAggState(16)
    other.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    with pytest.raises(ValueError, match="accumulators differ"):
        other.apply_changes(s.extract_changes({b: 0}))
    d = DictState(16)
    d.put("a", _bin("a", 16), 1)
    assert d.extract_changes({_bin("a", 16): 0}) is None and d.bins() == [_bin("a", 16)]
    with pytest.raises(ValueError, match="full bin"):  # changes (of checkpoints) only, never a whole bin
        d.apply_changes(d.snapshot_bins(d.bins()))


def test_columnar_state_compacts_only_when_few_keys_are_live_and_resets_when_none() -> None:
    s = ColumnarAggState(64)
    s.configure(pa.string(), ACCS)
    rng = np.random.default_rng(5)
    for _ in range(10):
        _random_update(s, rng, None)
    before, slots = _dump(s), len(s.slots())
    bins = s.bins()
    s.extract_bins(bins[:8])  # an eighth of the keys leave: no compaction, their slots stay
    assert s._n == slots and len(s) < slots
    s.extract_bins(bins[8:-1])  # a 32nd or less left: compacted to the live keys
    assert s._n == len(s) == sum(1 for k in before if _bin(k, 64) == bins[-1])
    assert _dump(s) == {k: v for k, v in before.items() if _bin(k, 64) == bins[-1]}
    s.extract_bins(bins[-1:])
    assert s._n == len(s) == 0 and s.bins() == []
    s.install_bins({})  # still configured, still usable
    _random_update(s, rng, None)
    assert len(s) > 0
