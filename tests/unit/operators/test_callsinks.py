"""Sinks that hand batches to code as they arrive: ``to_callable(fn)`` and ``Stream.print()``, end to end
without Ray (``LocalRun``), against the input they were given."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pytest

from chiray.actors.jobs.harness import LocalRun
from chiray.operators import Dataflow, from_items, to_callable
from chiray.operators.callsinks import format_batch

ROWS = [{"word": w, "n": i} for i, w in enumerate("the cat sat on the mat and the dog".split())]


def _words(flow: Dataflow, splits: int = 2):
    return flow.source(from_items(ROWS, batch_size=2, num_splits=splits), parallelism=splits, name="words")


@pytest.mark.parametrize("p", [1, 2, 3])
def test_to_callable_hands_every_batch_to_the_function_as_it_comes(p):
    seen: list[pa.RecordBatch] = []
    flow = Dataflow("calls")
    _words(flow).map(lambda b: b, name="same", parallelism=p).sink(to_callable(seen.append), name="out",
                                                                   parallelism=p)
    result = LocalRun(flow, seed=p).run()
    assert result["out"] is None
    assert all(b.num_rows for b in seen)
    got = pd.concat([b.to_pandas() for b in seen]).sort_values("n").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, pd.DataFrame(ROWS))


def test_to_callable_refuses_what_is_not_a_function_and_its_errors_fail_the_job():
    with pytest.raises(TypeError, match="to_callable\\(\\): expected a function, got list"):
        to_callable([])

    def broken(batch):
        raise RuntimeError("webhook down")

    flow = Dataflow("broken")
    _words(flow, 1).sink(to_callable(broken), name="hook")
    with pytest.raises(Exception, match="hook.*webhook down"):
        LocalRun(flow).run()


def test_print_prints_each_batch_as_a_table_headed_by_the_sink(capsys):
    flow = Dataflow("printed")
    _words(flow).key_by("word").count(name="count", emit="updates").print(name="shown")
    LocalRun(flow, seed=4).run()
    blocks = capsys.readouterr().out.strip().split("shown: ")[1:]
    printed = []
    for block in blocks:
        head, columns, *rows = block.strip().splitlines()
        count = int(head.split()[0])
        assert columns.split() == ["word", "count"] and len(rows) == count
        printed.extend((r.split()[0], int(r.split()[1])) for r in rows)
    final = {}
    for word, count in printed:  # updates: the last printed count of a word is its total
        final[word] = count
    assert final == pd.Series([r["word"] for r in ROWS]).value_counts().to_dict()


def test_format_batch_aligns_numbers_right_text_left_and_cuts_long_tables():
    rng = random.Random(1)
    rows = [{"name": "x" * rng.randrange(1, 60), "v": rng.randrange(-1000, 1000), "f": None} for _ in range(30)]
    text = format_batch(pa.RecordBatch.from_pylist(rows), "out[1]", max_rows=5)
    lines = text.splitlines()
    assert lines[0] == "out[1]: 30 rows" and lines[-1] == "... 25 more" and len(lines) == 8
    assert lines[1].split() == ["name", "v", "f"]
    assert len({len(line) for line in lines[2:-1]}) == 1  # aligned columns (the header is right-stripped)
    assert len({line.index(" null") for line in lines[2:-1]}) == 1
    for line, row in zip(lines[2:-1], rows):
        name, value, null = line.split()
        assert value == str(row["v"]) and null == "null"
        assert name == (row["name"] if len(row["name"]) <= 40 else row["name"][:37] + "...")
