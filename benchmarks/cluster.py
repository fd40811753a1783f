"""cluster.py: a private multi-process Ray cluster (``ray start --head --block``) that stops only its own processes.

``ray stop`` stops every Ray on the machine; ``LocalCluster`` instead starts
the head in a process group of its own, with its own ports and a short
``--temp-dir``, and on exit kills that group and any process whose command
line names its temp dir (the raylet's workers and agents).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

__all__ = ["LocalCluster", "free_ports"]

_START_LOG = "ray-start.log"  # a node's ``ray start`` output, in its temp dir
_STARTED = "Ray runtime started."  # what ``ray start`` prints once its node registered with the head
_PROBE_EVERY_S = 30.0  # nodes are probed this often anyway while a worker has not said so (another wording)
_STOP_WAIT_S = 5.0  # after SIGTERM, then SIGKILL: a node that drains first takes up to 30 s (ours do not drain)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _pids_naming(marker: str) -> list[int]:
    out = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(proc.name))
            except OSError:
                pass
    return out


class LocalCluster:
    """A head node of our own. Attributes once entered: ``address``, ``env`` (for subprocesses), ``metrics_port``."""

    max_worker_restarts = 2
    """How many times in all workers are started again while the cluster comes up."""

    host = "127.0.0.1"
    """The address the head listens on (``address`` is ``host:port``)."""

    def __init__(self, num_cpus: int = 4, metrics_report_ms: int = 500, worker_nodes: int = 0,
                 worker_cpus: int = 2, dashboard: bool = False):
        self.dashboard = dashboard
        self.dashboard_address = ""  # http://127.0.0.1:PORT with dashboard=True: for ``ray job submit``
        self.num_cpus = num_cpus
        self.metrics_report_ms = metrics_report_ms
        self.temp = tempfile.mkdtemp(prefix="crt", dir="/tmp")  # short: Ray's socket paths have a length limit
        self.worker_nodes = worker_nodes
        self.worker_cpus = worker_cpus
        self._workers: list[tuple[subprocess.Popen, str]] = []  # (its ray start, its temp dir)
        self.metrics_ports: list[int] = []  # every node's Prometheus endpoint, the head's first
        self.address = ""
        self.env: dict[str, str] = {}
        self.metrics_port = 0
        self._head: subprocess.Popen | None = None
        self.worker_restarts = 0  # workers started again because their `ray start` exited before joining

    def __enter__(self) -> "LocalCluster":
        port, self.metrics_port, agent, agent_grpc, runtime_env, client, node_mgr, obj_mgr, dash = free_ports(9)
        self.metrics_ports = [self.metrics_port]
        env = self._environment()
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
               f"--temp-dir={self.temp}", f"--num-cpus={self.num_cpus}",
               *(["--include-dashboard=true", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1"]
                 if self.dashboard else ["--include-dashboard=false"]),
               f"--metrics-export-port={self.metrics_port}", f"--dashboard-agent-listen-port={agent}",
               f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={runtime_env}",
               f"--ray-client-server-port={client}", f"--node-manager-port={node_mgr}",
               f"--object-manager-port={obj_mgr}", "--disable-usage-stats", *self._head_options()]
        with open(os.path.join(self.temp, _START_LOG), "wb") as log:  # read back into the error if it exits
            self._head = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        self.address = f"{self.host}:{port}"
        self.dashboard_address = f"http://127.0.0.1:{dash}" if self.dashboard else ""
        self.env = {**env, "RAY_ADDRESS": self.address}
        try:
            self._wait_up(port)
            for _ in range(self.worker_nodes):  # one at a time: those started are stopped if one fails
                self._workers.append(self._spawn_worker(env))
            self._wait_nodes(1 + self.worker_nodes, env)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _environment(self) -> dict[str, str]:
        """The environment of every node's ``ray start`` (and, with ``RAY_ADDRESS``, of ``env``)."""
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_AUTO_CONNECT": "0", "PYTHONWARNINGS": "ignore",
               "RAY_metrics_report_interval_ms": str(self.metrics_report_ms),
               "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}  # a node stops at once on SIGTERM: no drain to wait out
        env.pop("RAY_ADDRESS", None)
        return env

    def _head_options(self) -> list[str]:
        """Options the head's ``ray start`` takes beyond ports and sizes (a subclass adds its own)."""
        return []

    def _spawn_worker(self, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
        """A second node on this machine: a ``ray start`` that joins the head, with ports and a temp dir of its own."""
        temp = tempfile.mkdtemp(prefix="crw", dir="/tmp")
        metrics, agent, agent_grpc, runtime_env, node_mgr, obj_mgr = free_ports(6)
        self.metrics_ports.append(metrics)
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={self.address}", "--block",
               f"--temp-dir={temp}", f"--num-cpus={self.worker_cpus}", f"--metrics-export-port={metrics}",
               f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
               f"--runtime-env-agent-port={runtime_env}", f"--node-manager-port={node_mgr}",
               f"--object-manager-port={obj_mgr}", "--disable-usage-stats"]
        with open(os.path.join(temp, _START_LOG), "wb") as log:  # read back into the error if it never joins
            return subprocess.Popen(cmd, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT), temp

    def _respawn_dead_workers(self, env: dict[str, str]) -> None:
        """A worker whose ``ray start`` exited is started again on fresh ports (one that ``free_ports`` gave
        can be taken by another process before Ray binds it, and the node then exits)."""
        for i, (worker, temp) in enumerate(self._workers):
            if worker.poll() is not None:
                self._stop_worker(worker, temp)
                self._workers[i] = self._spawn_worker(env)
                self.metrics_ports[1 + i] = self.metrics_ports.pop()  # node order: the head's first
                self.worker_restarts += 1

    def _wait_nodes(self, count: int, env: dict[str, str], timeout: float = 180.0) -> None:
        """Until ``count`` nodes are alive (asked from a short-lived process, so this one stays off Ray).

        Generous: on a loaded two-core machine a node takes well over ten seconds to join. A worker
        that exits meanwhile is started again (``max_worker_restarts``); a timeout says what each probe saw.
        A probe (a Ray driver of its own) runs once every worker's ``ray start`` said that its node
        registered, or after ``_PROBE_EVERY_S`` without that line, not while the nodes are still starting."""
        if count <= 1:
            return
        code = ("import ray; ray.init(logging_level='ERROR', log_to_driver=False); "
                "print(sum(n['Alive'] for n in ray.nodes()))")
        deadline = time.monotonic() + timeout
        seen = "no probe finished"
        probed = time.monotonic()
        while time.monotonic() < deadline:
            if self.worker_restarts < self.max_worker_restarts:
                self._respawn_dead_workers(env)
            if not self._workers_started() and time.monotonic() - probed < _PROBE_EVERY_S:
                time.sleep(0.2)
                continue
            probed = time.monotonic()
            try:
                done = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True,
                                      timeout=max(5.0, min(60.0, deadline - time.monotonic())), check=False)
            except subprocess.TimeoutExpired:
                seen = "the last probe did not return within its timeout"
                continue
            alive = done.stdout.strip().splitlines()[-1:]
            if done.returncode == 0 and alive == [str(count)]:
                return
            seen = (f"the last probe saw {alive[0]} alive" if done.returncode == 0 and alive
                    else f"the last probe failed: {_tail(done.stderr)}")
            time.sleep(0.5)
        exits = [f"worker {i + 1}: " + ("running" if w.poll() is None else f"exited {w.returncode}: "
                                        + _tail(_read(os.path.join(temp, _START_LOG))))
                 for i, (w, temp) in enumerate(self._workers)]
        raise TimeoutError(f"{count} Ray nodes were not up within {timeout:.0f} s ({seen}; "
                           f"{self.worker_restarts} worker restarts; {'; '.join(exits)})")

    def _workers_started(self) -> bool:
        """Whether every worker's ``ray start`` is running and said that its node registered with the head."""
        return all(w.poll() is None and _STARTED in _read(os.path.join(temp, _START_LOG))
                   for w, temp in self._workers)

    def _wait_up(self, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection((self.host, port), timeout=1).close()
                return
            except OSError:
                assert self._head is not None
                if self._head.poll() is not None:
                    raise RuntimeError("ray start --head exited") from None
                time.sleep(0.2)
        raise TimeoutError(f"the head node did not listen on port {port} within {timeout} s")

    def _stop_worker(self, worker: subprocess.Popen, temp: str) -> None:
        _stop_groups([worker])
        _kill_naming(temp)
        shutil.rmtree(temp, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        """Every node at once (each ``ray start`` winds down in parallel), then what is left under each temp dir."""
        _stop_groups([worker for worker, _ in self._workers] + ([self._head] if self._head is not None else []))
        for temp in [temp for _, temp in self._workers] + [self.temp]:
            _kill_naming(temp)
            shutil.rmtree(temp, ignore_errors=True)
        self._workers = []


def _stop_groups(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each process group a ``ray start`` leads, then SIGKILL to what is left of them."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _STOP_WAIT_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        procs = [proc for proc in procs if proc.poll() is None]
        if not procs:
            return


def _kill_naming(temp: str) -> None:
    """Every process whose command line names ``temp`` (the raylet's workers and agents leave the group)."""
    for pid in _pids_naming(temp):
        if pid == os.getpid():  # a reaper whose own command line names it
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read(path: str) -> str:
    try:
        return pathlib.Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(no output)"
