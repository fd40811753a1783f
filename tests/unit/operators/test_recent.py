"""The newest rows a sink instance keeps for ``job.tail``, and their merge across instances, against a plain
list of every row written."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest

from chiray.operators.recent import TAIL_ROWS, RecentRows, check_tail_rows, newest_rows


@pytest.mark.parametrize("seed", range(5))
def test_the_newest_rows_of_several_instances_are_the_last_written(seed):
    rng = random.Random(seed)
    ticks = itertools.count()
    clock = lambda: float(next(ticks))  # noqa: E731 - one clock for every instance: a global order
    instances = [RecentRows(limit=50, clock=clock) for _ in range(3)]
    written: list[int] = []
    for value in range(0, 2_000, 1):
        if rng.random() < 0.05:
            size = rng.choice([0, 1, 7, 60])
            batch = pa.record_batch({"v": list(range(value, value + size))})
            rng.choice(instances).add(batch)
            written.extend(range(value, value + size))
    for n in (1, 13, 50):
        parts = [part for inst in instances for part in inst.last(n)]
        assert newest_rows(parts, n).column("v").to_pylist() == written[-n:]
    kept = sum(b.num_rows for inst in instances for _, b in inst._batches)
    assert kept < 3 * (50 + 60)  # bounded: the newest 50 rows of each and at most one batch more


def test_no_rows_yet_is_an_empty_table_of_the_sinks_schema_and_n_is_checked():
    schema = pa.schema([("word", pa.string())])
    assert newest_rows([], 5, schema).schema == schema
    assert check_tail_rows(TAIL_ROWS) == TAIL_ROWS
    for bad in (0, TAIL_ROWS + 1, 2.0, True):
        with pytest.raises(ValueError, match="tail: n must be an int from 1 to 1000"):
            check_tail_rows(bad)
