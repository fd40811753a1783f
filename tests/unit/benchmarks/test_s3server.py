"""The private S3 server: its URIs reach it from pyarrow, its paths compose with storage's, it stops."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from benchmarks.s3server import S3Server
from chiray.actors.runtime.storage import child_uri, split_uri


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_uri_writes_what_the_filesystem_reads(s3_server):
    bucket = s3_server.make_bucket("unit-s3server")
    assert s3_server.make_bucket(bucket) == bucket  # a second time is a no-op
    table = pa.table({"k": ["a", "b", "c"], "v": [1, 2, 3]})
    root = s3_server.uri(bucket, "job/")
    target = child_uri(root, "out", "part-0.parquet")
    assert split_uri(target) == (child_uri(root, "out"), "part-0.parquet")

    fs, path = pafs.FileSystem.from_uri(target)
    assert path == f"{bucket}/job/out/part-0.parquet"
    pq.write_table(table, path, filesystem=fs)

    assert pq.read_table(f"{bucket}/job/out/part-0.parquet", filesystem=s3_server.filesystem()).equals(table)
    listed = s3_server.filesystem().get_file_info(pafs.FileSelector(f"{bucket}/job", recursive=True))
    assert sorted(i.path for i in listed if i.type == pafs.FileType.File) == [path]


def test_env_names_the_endpoint_and_the_credentials(s3_server):
    env = s3_server.env
    assert env["AWS_ENDPOINT_URL"] == s3_server.endpoint == f"http://127.0.0.1:{s3_server.port}"
    assert s3_server.port > 0
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(env)


def test_stop_kills_the_process_and_is_idempotent():
    with S3Server() as server:
        pid = server.process.pid
        assert _alive(pid)
        server.make_bucket("unit-stop")
    assert not _alive(pid)
    server.stop()


def test_a_server_that_cannot_listen_fails_with_its_output():
    with pytest.raises(RuntimeError, match="did not start") as info:
        S3Server(host="192.0.2.1", start_timeout_s=60).start()  # TEST-NET-1: no interface has it
    assert "192.0.2.1" in str(info.value)


def test_a_negative_port_is_refused():
    with pytest.raises(ValueError, match="port"):
        S3Server(port=-1)
