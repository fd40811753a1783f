"""A detached job operated with the ``chiray`` command line: list, status, rescale, checkpoint, stop...

Run it with ``python examples/detached_cli.py``.

A job submitted with ``detached=True`` belongs to a job manager actor on the
Ray cluster instead of the script that submitted it: the script may exit, and
the job is operated from any process, with ``chiray.attach(name)`` or with the
``chiray`` command. This program submits one and then runs the commands that
you would type in a shell, ``chiray status counts`` and so on, through the
command line's own entry point in this process (already connected to the
cluster), printing what each prints. Here the cluster is the local Ray that
``submit`` starts; see the tutorial for a ``ray start`` cluster, where the job
outlives this program.
"""

from __future__ import annotations

import contextlib
import io
import tempfile

import pyarrow as pa
import pyarrow.compute as pc

import chiray
import chiray.cli


def chiray_cli(*argv: str) -> str:
    """Run ``chiray ARGV...`` as a shell would, but in this process; print and return what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = chiray.cli.main(list(argv))
    print(f"$ chiray {' '.join(argv)}\n{out.getvalue()}", end="")
    if code != 0:
        raise RuntimeError(f"chiray {' '.join(argv)} exited with {code}")
    return out.getvalue()


def events() -> chiray.Source:
    """An endless, deterministic stream over 50 keys, 1,000 records a second."""
    return chiray.generate(None, rate=1_000, batch_size=100, num_keys=50, seed=3)


def main() -> tuple[pa.Table, int, dict[str, str]]:
    work = tempfile.mkdtemp()        # on a cluster of several machines: storage every node reaches (s3://...)
    flow = chiray.Dataflow("counts")
    (flow.source(events(), name="events")
         .key_by("key")
         .count(parallelism=2, name="count", emit="updates")
         .sink(chiray.collect(), name="out"))
    submitted = chiray.submit(flow, detached=True, checkpoint_dir=f"{work}/chk", spare_hosts=1)
    print(f"submitted {submitted.name!r}: it runs under its job manager, whatever becomes of this script")

    # --8<-- [start:attach]
    job = chiray.attach("counts")           # from any process that reaches the cluster
    while job.statistics().records_in("count") < 300:
        try:
            job.wait(timeout=0.1)           # raises TimeoutError while the job runs
        except TimeoutError:
            pass
    print(job.status().state.value, job.info().operators)
    # --8<-- [end:attach]

    said = {verb: chiray_cli(verb, *args) for verb, *args in [
        ("list",),
        ("status", "counts"),
        ("rescale", "counts", "count", "3", "--wait"),
        ("checkpoint", "counts"),
        ("rescales", "counts"),
        ("metrics", "counts"),
        ("tail", "counts", "out", "-n", "3"),
        ("stop", "counts", "--savepoint", f"{work}/savepoints"),
        ("savepoints", "counts"),
    ]}
    # The job ended; it keeps its name, record and results until it is forgotten.
    read = job.statistics().records_out("events")
    updates = job.result("out")
    counts = updates.group_by("key").aggregate([("count", "max")]).rename_columns(["key", "count"])
    print(f"{read:,} records read, {pc.sum(counts['count']).as_py():,} counted over {counts.num_rows} keys")
    said["forget"] = chiray_cli("forget", "counts")
    return counts, read, said


if __name__ == "__main__":
    main()
