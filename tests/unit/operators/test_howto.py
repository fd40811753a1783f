"""The how-to guide's own source and sink (docs/how-to/sources-and-sinks.md) work: its code, run without Ray.

The guide's example is executed as it stands (its ``__main__`` part aside,
which submits a job); the test then drives its source and sink the way the
runtime does and compares what they read and commit with a plain Python
reading of the same files.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import cloudpickle
import pytest

from chiray.operators.logic import InstanceInfo

GUIDE = pathlib.Path(__file__).resolve().parents[3] / "docs" / "how-to" / "sources-and-sinks.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)


@pytest.fixture(scope="module")
def guide() -> dict:
    """The namespace of the guide's complete example (the block that defines ``LinesSource``)."""
    (code,) = [b for b in blocks() if "class LinesSource" in b]
    assert "from chiray import SinkWriter, SourceSplit, SplitReader" in code
    namespace: dict = {"__name__": "howto_example"}
    exec(compile(code, str(GUIDE), "exec"), namespace)
    return namespace


def test_every_code_block_of_the_guide_compiles():
    assert len(blocks()) >= 2
    for code in blocks():
        compile(code, str(GUIDE), "exec")


def lines_of(paths) -> list[tuple[str, str]]:
    return [(p, line.rstrip("\n")) for p in sorted(paths) for line in open(p, encoding="utf-8")]


def test_the_guides_source_reads_every_line_once_and_resumes_at_an_offset(guide, tmp_path):
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"in-{i}.txt"))
        pathlib.Path(paths[-1]).write_text("".join(f"file {i} line {n}\n" for n in range(23 + i)))
    source = cloudpickle.loads(cloudpickle.dumps(guide["LinesSource"](paths, batch_size=5)))
    read, resumed = [], []
    for split in source.splits():
        reader = source.open_split(split)
        head = [reader.read(), reader.read()]
        again = source.open_split(split, reader.offset())  # a restore at the offset after two batches
        rest = []
        while (batch := again.read()) is not None:
            rest.append(batch)
        for batch in head + rest:
            read.extend(zip(batch["file"].to_pylist(), batch["line"].to_pylist()))
        reader.close()
        again.close()
        resumed.append(sum(b.num_rows for b in rest))
    assert read == lines_of(paths)
    assert resumed == [23 - 10, 24 - 10, 25 - 10]


def test_the_guides_sink_commits_each_row_once_across_a_recovery(guide, tmp_path):
    import pyarrow as pa

    out = str(tmp_path / "out")
    sink = guide["JsonLinesSink"](out).bind_output("/unused", "out", "r0123abcd")
    sink = cloudpickle.loads(cloudpickle.dumps(sink))

    def rows(start, n):
        return pa.record_batch({"file": ["f"] * n, "line": [f"l{i}" for i in range(start, start + n)]})

    w0, w1 = (sink.create_writer(InstanceInfo("out", i, 2)) for i in (0, 1))
    w0.write(rows(0, 3))
    w1.write(rows(3, 2))
    epoch1 = [w0.prepare_commit(1), w1.prepare_commit(1)]
    w0.write(rows(5, 4))
    w0.prepare_commit(2)  # staged, but its checkpoint never completed: the replay writes it again
    sink.recover(epoch1)  # the restore of checkpoint 1: commits it, discards epoch 2
    sink.commit(epoch1)  # a repeated commit is harmless
    w0, w1 = (sink.create_writer(InstanceInfo("out", i, 2)) for i in (0, 1))
    w0.write(rows(5, 4))
    w1.write(rows(9, 1))
    results = [w0.finish(), w1.finish()]
    sink.commit_final(results)
    files = sink.combine(results)
    got = sorted(json.loads(line)["line"] for path in files for line in open(path, encoding="utf-8"))
    assert got == sorted(f"l{i}" for i in range(10))
    assert not [n for n in os.listdir(out) if n.startswith(".")]
