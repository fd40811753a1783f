"""s3server.py: a private S3-compatible server (moto's) for tests and benchmarks, stopped by pid.

``S3Server(host, port)`` runs moto's S3 server (``moto[server]``, in the test
extras) in a subprocess bound to ``host`` (``127.0.0.1``, or a private
address such as a namespace bridge's, so that every node of a test cluster
reaches it); ``port=0`` takes a free one, which the subprocess reports once
it listens. Entering waits, with a deadline, until the server answers HTTP.

What a job needs to use it:

- :meth:`S3Server.uri` -- a ``pyarrow.fs`` URI of a path in a bucket, with
  the endpoint, the scheme and the credentials moto accepts in it (a
  ``checkpoint_dir``, ``from_parquet``/``to_parquet`` paths): the URI alone
  is enough, in any process of any node, with no environment.
- :meth:`S3Server.filesystem` -- a ``pyarrow.fs.S3FileSystem`` on it, to
  write inputs and read outputs in a test.
- :attr:`S3Server.env` -- ``AWS_*`` variables (credentials, region,
  ``AWS_ENDPOINT_URL``) for subprocesses and clients that read them.

moto keeps everything in the server process's memory: stopping it forgets
every bucket.

Example::

    with S3Server() as s3:
        s3.make_bucket("chk")
        job = submit(flow, checkpoint_dir=s3.uri("chk", "wordcount"))

``python benchmarks/s3server.py HOST PORT`` is the server process (started by ``S3Server``).
"""

from __future__ import annotations

import collections
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["S3Server"]

ACCESS_KEY = "testing"
"""The access key the URIs carry (moto accepts any)."""
SECRET_KEY = "testing"
REGION = "us-east-1"
_READY = "listening on port "  # the server process's first line of output once it listens
_STOP_WAIT_S = 5.0  # after SIGTERM, then SIGKILL


class S3Server:
    """moto's S3 server in a subprocess of ours.

    Args:
        host: the address it listens on.
        port: its port; 0 takes a free one.
        start_timeout_s: how long entering waits for it to answer before it fails (``RuntimeError``).

    Lifecycle: ``__enter__`` starts the process and waits until it answers;
    ``__exit__`` (or :meth:`stop`, idempotent) kills it by pid. ``endpoint``,
    ``port`` and the methods are usable only in between.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0):
        if port < 0:
            raise ValueError(f"S3Server: port must be >= 0, got {port}")
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[str] | None = None
        self._drainer: threading.Thread | None = None
        self.output: collections.deque[str] = collections.deque(maxlen=200)
        """The server process's last lines of output (errors; requests are not logged)."""

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server process and wait until it answers.

        Raises:
            RuntimeError: it exited or did not answer within ``start_timeout_s`` (its output is in
                the message).
        """
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.host, str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + self.start_timeout_s
            self.port = self._read_port(deadline)
            self._drainer = threading.Thread(target=self._drain, name="s3server-output", daemon=True)
            self._drainer.start()
            self._wait_answers(deadline)
        except BaseException:
            self.stop()
            raise

    def _read_port(self, deadline: float) -> int:
        assert self.process is not None and self.process.stdout is not None
        lines = []
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            line = self.process.stdout.readline() if ready else ""
            if line.startswith(_READY):
                return int(line[len(_READY):].strip())
            if ready and not line:  # end of output: the process exited
                break
            lines.append(line)
        raise RuntimeError(f"the S3 server on {self.host}:{self.port} did not start within "
                           f"{self.start_timeout_s} s (exit code {self.process.poll()}):\n"
                           f"{''.join(lines)[-2000:]}")

    def _drain(self) -> None:
        """Keep reading the server's output (its last lines stay in ``output``): a pipe nobody reads fills
        up, and the server then blocks on its next line, in the middle of a request."""
        process = self.process
        if process is None or process.stdout is None:
            return
        try:
            for line in process.stdout:
                self.output.append(line)
        except (OSError, ValueError):  # closed by stop() meanwhile
            pass

    def _wait_answers(self, deadline: float) -> None:
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.endpoint + "/", timeout=2.0) as answer:
                    answer.read()
                return
            except urllib.error.HTTPError:
                return  # an HTTP answer, even an error, is an answer
            except OSError as exc:
                last = exc
                if self.process is not None and self.process.poll() is not None:
                    break
            time.sleep(0.05)  # polling a server with a deadline, not synchronising with one
        raise RuntimeError(f"the S3 server at {self.endpoint} did not answer within "
                           f"{self.start_timeout_s} s: {last}")

    def stop(self) -> None:
        """Kill the server process (SIGTERM, then SIGKILL); idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._drainer is not None:  # the process is gone: its output ends
            self._drainer.join(_STOP_WAIT_S)
            self._drainer = None
        if process.stdout is not None:
            process.stdout.close()

    # -- what clients use ------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """``AWS_*`` variables for a subprocess or a Ray ``runtime_env``: credentials, region, endpoint."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint}

    def uri(self, bucket: str, path: str = "") -> str:
        """A ``pyarrow.fs`` URI of ``path`` in ``bucket`` on this server, credentials included.

        Example: ``s3://testing:testing@chk/job1?endpoint_override=127.0.0.1:40123&scheme=http&region=us-east-1``.
        """
        query = urllib.parse.urlencode({"endpoint_override": f"{self.host}:{self.port}", "scheme": "http",
                                        "region": REGION}, safe=":")
        tail = "/".join(p.strip("/") for p in (bucket, path) if p.strip("/"))
        return f"s3://{ACCESS_KEY}:{SECRET_KEY}@{tail}?{query}"

    def filesystem(self) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` on this server (paths are ``bucket/key``)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION,
                                 endpoint_override=f"{self.host}:{self.port}", scheme="http",
                                 allow_bucket_creation=True)

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (a no-op if it exists); returns ``name``."""
        self.filesystem().create_dir(name)
        return name


def _serve(host: str, port: int) -> None:
    """The server process: moto's S3 app on ``host:port``, its port printed once it listens."""
    from moto.moto_server.werkzeug_app import (DomainDispatcherApplication, MotoRequestHandler,
                                               create_backend_app)
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"{_READY}{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
