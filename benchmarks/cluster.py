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

    def __enter__(self) -> "LocalCluster":
        port, self.metrics_port, agent, agent_grpc, runtime_env, client, node_mgr, obj_mgr, dash = free_ports(9)
        self.metrics_ports = [self.metrics_port]
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_AUTO_CONNECT": "0", "PYTHONWARNINGS": "ignore",
               "RAY_metrics_report_interval_ms": str(self.metrics_report_ms)}
        env.pop("RAY_ADDRESS", None)
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
               f"--temp-dir={self.temp}", f"--num-cpus={self.num_cpus}",
               *(["--include-dashboard=true", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1"]
                 if self.dashboard else ["--include-dashboard=false"]),
               f"--metrics-export-port={self.metrics_port}", f"--dashboard-agent-listen-port={agent}",
               f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={runtime_env}",
               f"--ray-client-server-port={client}", f"--node-manager-port={node_mgr}",
               f"--object-manager-port={obj_mgr}", "--disable-usage-stats"]
        self._head = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        self.address = f"127.0.0.1:{port}"
        self.dashboard_address = f"http://127.0.0.1:{dash}" if self.dashboard else ""
        self.env = {**env, "RAY_ADDRESS": self.address}
        try:
            self._wait_up(port)
            for _ in range(self.worker_nodes):
                self._start_worker(env)
            self._wait_nodes(1 + self.worker_nodes)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start_worker(self, env: dict[str, str]) -> None:
        """A second node on this machine: a ``ray start`` that joins the head, with ports and a temp dir of its own."""
        temp = tempfile.mkdtemp(prefix="crw", dir="/tmp")
        metrics, agent, agent_grpc, runtime_env, node_mgr, obj_mgr = free_ports(6)
        self.metrics_ports.append(metrics)
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={self.address}", "--block",
               f"--temp-dir={temp}", f"--num-cpus={self.worker_cpus}", f"--metrics-export-port={metrics}",
               f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
               f"--runtime-env-agent-port={runtime_env}", f"--node-manager-port={node_mgr}",
               f"--object-manager-port={obj_mgr}", "--disable-usage-stats"]
        self._workers.append((subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL), temp))

    def _wait_nodes(self, count: int, timeout: float = 60.0) -> None:
        """Until ``count`` nodes are alive (asked from a short-lived process, so this one stays off Ray)."""
        if count <= 1:
            return
        code = ("import ray; ray.init(logging_level='ERROR', log_to_driver=False); "
                "print(sum(n['Alive'] for n in ray.nodes()))")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True,
                                  timeout=60)
            if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{count} Ray nodes were not up within {timeout} s")

    def _wait_up(self, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                assert self._head is not None
                if self._head.poll() is not None:
                    raise RuntimeError("ray start --head exited") from None
                time.sleep(0.2)
        raise TimeoutError(f"the head node did not listen on port {port} within {timeout} s")

    def __exit__(self, *exc: object) -> None:
        for worker, temp in self._workers:
            try:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            for pid in _pids_naming(temp):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(temp, ignore_errors=True)
        if self._head is not None:
            try:
                os.killpg(self._head.pid, signal.SIGTERM)
                self._head.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        for pid in _pids_naming(self.temp):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp, ignore_errors=True)
