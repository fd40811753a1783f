"""Every operator on real Ray actors against pandas, at parallelism 1, 2 and 3.

One dataflow per parallelism holds one source per input shape, each fanned out
to every operator under test, each ending in its own collect sink, so the
suite pays for one deployment per parallelism.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chiray.operators import Dataflow, from_arrow

pytestmark = pytest.mark.usefixtures("ray_session")

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("x", pa.float64())])


def make_input(shape: str, seed: int) -> list[pa.RecordBatch]:
    """Random batches of (k, v, x) of the given shape."""
    rng = np.random.default_rng(seed)
    if shape == "empty":
        return [pa.RecordBatch.from_pylist([], schema=SCHEMA)]
    n = {"many_keys": 3000, "one_key": 500, "null_keys": 2000, "empty_batches": 1200}[shape]
    nkeys = {"many_keys": 700, "one_key": 1, "null_keys": 30, "empty_batches": 50}[shape]
    keys = [f"key{int(i)}" for i in rng.integers(0, nkeys, n)]
    if shape == "null_keys":
        keys = [None if rng.random() < 0.15 else k for k in keys]
    v = [None if rng.random() < 0.05 else int(x) for x in rng.integers(-1000, 1000, n)]
    x = rng.normal(size=n).tolist()
    table = pa.table({"k": keys, "v": v, "x": x}, schema=SCHEMA)
    batches = table.to_batches(max_chunksize=97)
    if shape == "empty_batches":
        empty = pa.RecordBatch.from_pylist([], schema=SCHEMA)
        batches = [b for pair in zip(batches, [empty] * len(batches)) for b in pair] + [empty]
    return batches


SHAPES = ["many_keys", "one_key", "null_keys", "empty_batches", "empty"]
OUTPUTS = ("map", "filter", "flat_map", "map_records", "filter_records", "flat_map_records", "count",
           "sum", "min", "max", "mean", "updates", "reduce", "process", "union", "picks")


def build(inputs: dict[str, list[pa.RecordBatch]], p: int) -> Dataflow:
    flow = Dataflow(f"ops-p{p}")
    for shape, batches in inputs.items():
        add_operators(flow, shape, batches, p)
    return flow


def add_operators(flow: Dataflow, shape: str, batches: list[pa.RecordBatch], p: int) -> None:
    """Every operator under test on the input ``batches``; operator ``NAME`` is ``{shape}_NAME``, and it
    ends in sink ``o_{shape}_NAME``."""
    def n(name: str) -> str:
        return f"{shape}_{name}" if not name.startswith("o_") else f"o_{shape}_{name[2:]}"

    src = flow.source(from_arrow(batches, num_splits=max(p, 1), batch_size=None), parallelism=p, name=n("src"))
    src.map(lambda b: b.append_column("v2", pc.multiply(b.column("v"), 2)), name=n("map")).collect(
        name=n("o_map"))
    src.filter(lambda b: pc.equal(pc.bit_wise_and(pc.fill_null(b.column("v"), 1), 1), 0),
               name=n("filter")).collect(name=n("o_filter"))
    src.flat_map(lambda b: [b, b.slice(0, 1)], name=n("flat_map")).collect(name=n("o_flat_map"))
    src.map_records(lambda r: {"k": r["k"], "x3": r["x"] * 3}, name=n("map_records")).collect(
        name=n("o_map_records"))
    src.filter_records(lambda r: r["x"] > 0, name=n("filter_records")).collect(name=n("o_filter_records"))
    src.flat_map_records(lambda r: [r] * (1 if r["x"] > 0 else 2), name=n("flat_map_records")).collect(
        name=n("o_flat_map_records"))
    keyed = src.key_by("k")
    keyed.count(parallelism=p, name=n("count")).collect(name=n("o_count"))
    for func in ("sum", "min", "max", "mean"):
        getattr(keyed, func)("v", parallelism=p, name=n(func)).collect(name=n(f"o_{func}"))
    keyed.agg(n=(None, "count"), s=("x", "sum"), parallelism=p, emit="updates",
              name=n("updates")).collect(name=n("o_updates"))
    keyed.agg(d=("v", "count_distinct"), top=("x", "arg_max", "v"), name=n("picks")).collect(name=n("o_picks"))
    keyed.reduce(lambda acc, r: {**acc, "v": (acc["v"] or 0) + (r["v"] or 0)}, parallelism=p,
                 name=n("reduce")).collect(name=n("o_reduce"))

    def running(key, rows, state):
        state.value = (state.value or 0) + rows.num_rows
        return [{"k": key, "seen": state.value}]

    keyed.process(running, parallelism=p, name=n("process"),
                  schema=pa.schema([("k", pa.string()), ("seen", pa.int64())])).collect(name=n("o_process"))
    src.union(src.filter(lambda b: pc.greater(b.column("x"), 1.0), name=n("big")), name=n("union")).collect(
        name=n("o_union"))


def frame(table: pa.Table, cols: list[str] | None = None) -> pd.DataFrame:
    df = table.to_pandas() if table.num_columns else pd.DataFrame(columns=cols or [])
    if cols is not None:
        df = df[cols] if len(df.columns) else pd.DataFrame(columns=cols)
    return df.astype(object).where(df.notna(), None)


def same_rows(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Equal as multisets of rows (order across instances is not defined); floats approx."""
    assert len(got) == len(expected), f"{len(got)} rows, expected {len(expected)}"
    def norm(df):
        rows = [tuple(_norm(v) for v in r) for r in df.itertuples(index=False)]
        return sorted(rows, key=repr)
    for a, b in zip(norm(got), norm(expected)):
        assert len(a) == len(b)
        for u, w in zip(a, b):
            if isinstance(u, float) or isinstance(w, float):
                assert (u is None and w is None) or math.isclose(u, w, rel_tol=1e-9, abs_tol=1e-9), (a, b)
            else:
                assert u == w, (a, b)


def _norm(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


def oracle_agg(df: pd.DataFrame, func: str) -> pd.DataFrame:
    g = df.groupby("k", dropna=False)
    if func == "count":
        out = g.size().rename("count")
    else:
        out = getattr(g["v"], func)()
        if func in ("sum", "mean", "min", "max"):
            has = g["v"].count()
            out = out.astype(object).where(has > 0, None)
        out = out.rename(func)
    return out.reset_index()


@pytest.mark.parametrize("p", [1, 2, 3])
def test_operators_against_pandas(p):
    shapes = [s for s in SHAPES if p != 2 or s not in ("one_key", "empty")]  # those two: at 1 and 3
    inputs = {shape: make_input(shape, seed=p) for shape in shapes}
    job = build(inputs, p).submit()
    job.wait(timeout=120)
    for shape, batches in inputs.items():
        check(batches, p, {name: job.result(f"o_{shape}_{name}") for name in OUTPUTS})


def check(batches: list[pa.RecordBatch], p: int, r: dict[str, pa.Table]) -> None:
    """The outputs ``r`` of the operators on ``batches`` against pandas."""
    df = pa.Table.from_batches(batches, schema=SCHEMA).to_pandas()

    exp_map = df.assign(v2=df["v"] * 2)
    same_rows(frame(r["map"], ["k", "v", "x", "v2"]), frame(pa.Table.from_pandas(exp_map, preserve_index=False)))
    same_rows(frame(r["filter"], ["k", "v", "x"]), df[df["v"].fillna(1) % 2 == 0])
    source = from_arrow(batches, num_splits=max(p, 1), batch_size=None)  # the batches the source emits
    emitted = []
    for split in source.splits():
        reader = source.open_split(split)
        while (batch := reader.read()) is not None:
            emitted.append(batch)
    firsts = [b.slice(0, 1).to_pandas() for b in emitted if b.num_rows]
    same_rows(frame(r["flat_map"], ["k", "v", "x"]), pd.concat([df, *firsts]) if firsts else df)
    same_rows(frame(r["map_records"], ["k", "x3"]), df.assign(x3=df["x"] * 3)[["k", "x3"]])
    same_rows(frame(r["filter_records"], ["k", "v", "x"]), df[df["x"] > 0])
    same_rows(frame(r["flat_map_records"], ["k", "v", "x"]), pd.concat([df, df[df["x"] <= 0]]))
    for func in ("count", "sum", "min", "max", "mean"):
        same_rows(frame(r[func], ["k", func]), oracle_agg(df, func))

    if len(df):  # x is random floats: no ties, so the row of each key's greatest x is one row
        g = df.groupby("k", dropna=False)
        picks = pd.DataFrame({"d": g["v"].nunique(), "top": df.loc[g["x"].idxmax(), "v"].to_numpy()}).reset_index()
        same_rows(frame(r["picks"], ["k", "d", "top"]), frame(pa.Table.from_pandas(picks, preserve_index=False)))
    else:
        assert r["picks"].num_rows == 0
    # The changelog's last value per key is the final aggregate.
    updates = r["updates"].to_pandas() if r["updates"].num_rows else pd.DataFrame(columns=["k", "n", "s"])
    last = updates.groupby("k", dropna=False, sort=False).tail(1)
    g = df.groupby("k", dropna=False)
    same_rows(frame(pa.Table.from_pandas(last[["k", "n"]], preserve_index=False)),
              g.size().rename("n").reset_index())
    # fn is first called with a key's second row: a one-row key keeps its row (and its null) as is.
    reduced = g["v"].apply(lambda s: s.iloc[0] if len(s) == 1 else int(s.fillna(0).sum())).rename("v").reset_index()
    same_rows(frame(r["reduce"], ["k", "v"]), reduced)
    seen = frame(r["process"], ["k", "seen"])
    if len(df):
        assert seen.groupby("k", dropna=False)["seen"].max().to_dict() == g.size().to_dict()
    same_rows(frame(r["union"], ["k", "v", "x"]), pd.concat([df, df[df["x"] > 1.0]]))
