"""netns.py: a Ray cluster of separate hosts on one machine (a network namespace per node), and its faults.

``NetnsCluster(nodes=3)`` makes a bridge with a private ``/24`` (one not used
on the machine) and puts each worker node in a network namespace of its own,
joined to the bridge by a veth pair, with its own address, temp directory and
data directory; the head runs in the machine's own namespace on the bridge's
address, so a driver on this machine reaches it. Ray's token authentication
is on: ``env`` carries the token to the drivers and CLIs a test starts. The
head marks a silent node dead after ``health_check_s`` (Ray's health-check
period and failure threshold, set short).

Each worker also has a mount namespace of its own in which its data
directory is mounted over ``data_dir``: a path that every node has, but each
its own (as a local disk on separate machines). Storage that every node
shares is the S3-compatible server (``s3``, on the bridge's address).

Faults: ``lose_node(i)`` kills node i's processes and deletes its
directories (a lost machine); ``partition(i, seconds)`` cuts its link (its
packets are dropped without an answer, as on a real partition) and heals it
after ``seconds`` (or at ``heal(i)``); ``slow_link(i, delay_ms, loss_pct)``
delays and drops packets with ``tc netem`` where the kernel has it
(``netem_available()``). ``restart_node(i)`` starts a fresh node in its place.

Everything it makes (namespaces, links, processes, directories) has a name
of its own, ``cn`` and 6 hex digits, and ``__exit__`` removes all of it,
whatever happened; a *reaper* process does the same if the process that made
the cluster dies without running ``__exit__`` (killed, say). Only root may
make namespaces: ``unavailable()`` says why a cluster cannot be made here.

Example (as root)::

    with NetnsCluster(nodes=3) as cluster:
        subprocess.run([sys.executable, "driver.py"], env=cluster.env)   # RAY_ADDRESS and the token
        cluster.partition(1, seconds=5.0)

``python -m benchmarks.netns reap STATE`` is the reaper (started by the cluster).
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.cluster import _START_LOG, LocalCluster, _kill_naming, _read, _stop_groups, _tail
from benchmarks.s3server import S3Server

__all__ = ["NetnsCluster", "netem_available", "unavailable"]

_HEALTH_CHECK_PERIOD_MS = 500


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why a namespace cluster cannot be made on this machine (None: it can)."""
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "the ip and unshare commands (iproute2, util-linux) are not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    name = f"cnprobe{secrets.token_hex(3)}"
    done = _ip("netns", "add", name, check=False)
    if done.returncode != 0:
        return f"ip netns add is not permitted here: {done.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def netem_available() -> bool:
    """Whether this kernel has the ``netem`` queueing discipline (``tc ... netem``)."""
    if shutil.which("tc") is None:
        return False
    name = f"cnq{secrets.token_hex(3)}"
    try:
        _ip("link", "add", name, "type", "dummy")
    except subprocess.CalledProcessError:
        return False
    try:
        done = subprocess.run(["tc", "qdisc", "add", "dev", name, "root", "netem", "delay", "1ms"],
                              capture_output=True, timeout=30, check=False)
        return done.returncode == 0
    finally:
        _ip("link", "del", name, check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that no address or route of this machine overlaps."""
    used = [ipaddress.ip_network(word, strict=False)
            for line in _ip("-o", "-4", "addr").stdout.splitlines() + _ip("-4", "route").stdout.splitlines()
            for word in line.split() if "/" in word and word[0].isdigit()]
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet for the namespace cluster")


class NetnsCluster(LocalCluster):
    """A head and ``nodes - 1`` worker nodes, each worker in network and mount namespaces of its own.

    Args:
        nodes: Ray nodes in all, the head included (worker ``i`` is node ``i``, 1 <= i < nodes).
        head_cpus: the head's CPUs; ``worker_cpus`` each worker's.
        health_check_s: about how long a node that does not answer stays alive in Ray's eyes.

    Attributes once entered: ``address``, ``env`` (``RAY_ADDRESS`` and the token, for drivers and CLIs),
    ``data_dir`` (a path each node has privately), ``root`` (every directory of the cluster is under it).
    Lifecycle: made -> entered (``__enter__``) -> closed (``__exit__``, idempotent); faults in between.
    """

    max_worker_restarts = 6
    """A node's ``ray start`` gives up when its raylet took over 30 s to register (a loaded machine): it is
    started again, this many times in all."""

    def __init__(self, nodes: int = 3, head_cpus: int = 1, worker_cpus: int = 2, health_check_s: float = 2.0,
                 metrics_report_ms: int = 500):
        if nodes < 2:
            raise ValueError(f"NetnsCluster: nodes must be at least 2 (a head and a worker), got {nodes}")
        super().__init__(num_cpus=head_cpus, metrics_report_ms=metrics_report_ms, worker_nodes=nodes - 1,
                         worker_cpus=worker_cpus)
        os.rmdir(self.temp)  # LocalCluster's head dir: ours is under root
        self.tag = "cn" + secrets.token_hex(3)
        self.root = self.data_dir = ""  # made by __enter__
        self.token = secrets.token_hex(32)
        self.health_check_s = health_check_s
        self.subnet = ipaddress.IPv4Network("10.0.0.0/24")
        self.host = ""
        self._spawned = 0
        self._heals: dict[int, threading.Timer] = {}
        self._reaper: subprocess.Popen | None = None
        self.s3: S3Server | None = None
        self._closed = False

    # -- names -------------------------------------------------------------------------

    def namespace(self, i: int) -> str:
        return f"{self.tag}-{i}"

    def _link(self, i: int) -> str:
        return f"{self.tag}v{i}"  # the bridge's end of node i's veth pair (15 characters at most)

    @property
    def _bridge(self) -> str:
        return f"{self.tag}br"

    def node_ip(self, i: int) -> str:
        """Node ``i``'s address (the head's, node 0, is the bridge's)."""
        return str(self.subnet.network_address + 1 + i)

    def node_index(self, ip: str) -> int:
        return int(ipaddress.IPv4Address(ip)) - int(self.subnet.network_address) - 1

    def node_data(self, i: int) -> str:
        """Where node ``i``'s private ``data_dir`` lives on this machine's disk."""
        return self.data_dir if i == 0 else os.path.join(self.root, f"d{i}")

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> "NetnsCluster":
        self.root = tempfile.mkdtemp(prefix=self.tag, dir="/tmp")  # short: Ray's socket paths have a limit
        self.temp = os.path.join(self.root, "h")
        self.data_dir = os.path.join(self.root, "data")
        try:
            self._start_reaper()
            self._make_network()
            os.makedirs(self.temp)
            os.makedirs(self.data_dir)
            self.s3 = S3Server(host=self.host).__enter__()
            self._write_state()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        super().__enter__()
        return self

    def _make_network(self) -> None:
        self.subnet = _free_subnet()
        self.host = self.node_ip(0)
        _ip("link", "add", self._bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host}/24", "dev", self._bridge)
        _ip("link", "set", self._bridge, "up")
        for i in range(1, 1 + self.worker_nodes):
            ns, link, peer = self.namespace(i), self._link(i), f"{self.tag}p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", link, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("link", "set", link, "master", self._bridge)
            _ip("link", "set", link, "up")
            _ip("-n", ns, "addr", "add", f"{self.node_ip(i)}/24", "dev", peer)
            _ip("-n", ns, "link", "set", peer, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def _environment(self) -> dict[str, str]:
        return {**super()._environment(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def _head_options(self) -> list[str]:
        threshold = max(2, round(self.health_check_s * 1000 / _HEALTH_CHECK_PERIOD_MS))
        config = {"health_check_period_ms": _HEALTH_CHECK_PERIOD_MS, "health_check_timeout_ms": 400,
                  "health_check_failure_threshold": threshold, "health_check_initial_delay_ms": 0}
        return [f"--node-ip-address={self.host}", f"--system-config={json.dumps(config)}"]

    def _spawn_worker(self, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
        self.metrics_ports.append(8080)  # in the node's own namespace, at its address
        return self._spawn_node(len(self._workers) + 1, env)

    def _spawn_node(self, i: int, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
        """Worker node ``i`` in its namespace, its data dir mounted over ``data_dir`` in a mount namespace of
        its own; returns its ``ray start`` and its temp dir."""
        self._spawned += 1
        temp = os.path.join(self.root, f"n{i}-{self._spawned}")
        os.makedirs(temp)
        os.makedirs(self.node_data(i), exist_ok=True)
        mount = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        cmd = ["ip", "netns", "exec", self.namespace(i), "unshare", "--mount", "--propagation", "private",
               "sh", "-c", mount, "sh", self.node_data(i), self.data_dir,
               sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={self.address}", "--block",
               f"--node-ip-address={self.node_ip(i)}", f"--temp-dir={temp}", f"--num-cpus={self.worker_cpus}",
               "--metrics-export-port=8080", "--disable-usage-stats"]
        with open(os.path.join(temp, "ray-start.log"), "wb") as log:
            return subprocess.Popen(cmd, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT), temp

    def _wait_nodes(self, count: int, env: dict[str, str], timeout: float = 420.0) -> None:
        super()._wait_nodes(count, env, timeout)

    def _respawn_dead_workers(self, env: dict[str, str]) -> None:
        if self._head is not None and self._head.poll() is not None:  # no node joins any more: fail now
            said = _tail(_read(os.path.join(self.temp, _START_LOG)), 6)
            raise RuntimeError(f"the head node's ray start exited ({self._head.returncode}): {said}; its logs are "
                               f"under {self.temp} until the cluster is closed")
        for i, (worker, _) in enumerate(self._workers):
            if worker.poll() is not None:
                self._replace(i + 1, env)
                self.worker_restarts += 1

    def _replace(self, i: int, env: dict[str, str]) -> None:
        self._stop_node(i)
        self._workers[i - 1] = self._spawn_node(i, env)

    def _stop_node(self, i: int) -> None:
        """Every process of node ``i`` (its ``ray start`` group, what names its temp dir, what runs in its
        namespace); its temp dir goes."""
        worker, temp = self._workers[i - 1]
        _stop_groups([worker])
        _kill_naming(temp)
        _kill_namespace(self.namespace(i))
        shutil.rmtree(temp, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        """Every process, then every link and namespace, then every directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for timer in self._heals.values():
            timer.cancel()
        if self.s3 is not None:
            self.s3.stop()
        try:  # no node needs a graceful stop: every process is killed at once, then LocalCluster's own checks
            for i in range(1, 1 + self.worker_nodes):
                _kill_namespace(self.namespace(i))
            _kill_naming(self.root)
            super().__exit__(*exc)
        finally:
            _reap(self._state())
            if self._reaper is not None:
                assert self._reaper.stdin is not None
                self._reaper.stdin.close()
                self._reaper.wait(timeout=60)

    def _state(self) -> dict:
        """What the reaper removes: the namespaces, what runs under ``root``, and the S3 server."""
        s3 = self.s3.process if self.s3 is not None else None
        return {"tag": self.tag, "root": self.root, "s3_pid": s3.pid if s3 is not None else None,
                "namespaces": [self.namespace(i) for i in range(1, 1 + self.worker_nodes)]}

    @property
    def _state_path(self) -> str:
        """Beside ``root``, not in it: the reaper kills every process whose command line names ``root``."""
        return f"{self.root}.reap.json"

    def _write_state(self) -> None:
        with open(self._state_path + ".tmp", "w") as f:
            json.dump(self._state(), f)
        os.replace(self._state_path + ".tmp", self._state_path)

    def _start_reaper(self) -> None:
        """A process of its own session that cleans up once this process is gone (its stdin closes); it reads
        what to remove from its state file then (rewritten as the cluster starts things)."""
        self._write_state()
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self._reaper = subprocess.Popen([sys.executable, "-m", "benchmarks.netns", "reap", self._state_path], cwd=here,
                                        stdin=subprocess.PIPE, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # -- faults ------------------------------------------------------------------------

    def _check_worker(self, i: int) -> None:
        if not 1 <= i <= self.worker_nodes:
            raise ValueError(f"NetnsCluster: node must be a worker, 1..{self.worker_nodes}, got {i}")

    def lose_node(self, i: int) -> None:
        """Node ``i`` is lost with its disk: its processes are killed and its directories deleted."""
        self._check_worker(i)
        self._stop_node(i)
        shutil.rmtree(self.node_data(i), ignore_errors=True)

    def restart_node(self, i: int, timeout: float = 420.0) -> None:
        """A fresh node ``i`` (new temp dir, same address) in place of the one there; returns once all nodes
        are alive."""
        self._check_worker(i)
        self._replace(i, self._environment())
        self._wait_nodes(1 + self.worker_nodes, self._environment(), timeout)

    def partition(self, i: int, seconds: float | None = None) -> None:
        """Cut node ``i`` off (its packets are dropped); healed after ``seconds`` (None: at ``heal(i)``)."""
        self._check_worker(i)
        _ip("link", "set", self._link(i), "down")
        if seconds is not None:
            timer = threading.Timer(seconds, self.heal, args=(i,))
            timer.daemon = True
            self._heals[i] = timer
            timer.start()

    def heal(self, i: int) -> None:
        """Node ``i``'s link is back."""
        self._check_worker(i)
        timer = self._heals.pop(i, None)
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        if not self._closed:
            _ip("link", "set", self._link(i), "up")

    def slow_link(self, i: int, delay_ms: float, loss_pct: float = 0.0) -> None:
        """Node ``i``'s packets are delayed by ``delay_ms`` and ``loss_pct`` % of them lost (``tc netem``).

        Raises:
            RuntimeError: this kernel has no netem (see ``netem_available()``).
        """
        self._check_worker(i)
        done = subprocess.run(["tc", "qdisc", "replace", "dev", self._link(i), "root", "netem", "delay",
                               f"{delay_ms}ms", "loss", f"{loss_pct}%"], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"NetnsCluster.slow_link: tc netem failed on this machine ({done.stderr.strip()}); "
                               "check netem_available() first")

    def pids(self, i: int) -> list[int]:
        """The processes that run in node ``i``'s namespace."""
        return _namespace_pids(self.namespace(i))

    def leftovers(self) -> dict[str, list]:
        """What of this cluster is still on the machine (empty lists once closed)."""
        return leftovers(self.tag, self.root)


def _namespace_pids(ns: str) -> list[int]:
    done = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _kill_namespace(ns: str) -> None:
    for pid in _namespace_pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def leftovers(tag: str, root: str) -> dict[str, list]:
    """The namespaces, links, processes and directories named by ``tag`` / under ``root`` that still exist."""
    from benchmarks.cluster import _pids_naming

    namespaces = [n.split()[0] for n in _ip("netns", "list", check=False).stdout.splitlines() if n.startswith(tag)]
    links = [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", check=False).stdout.splitlines()
             if f" {tag}" in line]
    procs = [p for p in _pids_naming(root) if p != os.getpid()]
    return {"namespaces": namespaces, "links": links, "processes": procs,
            "directories": [root] if os.path.exists(root) else []}


def _reap(state: dict) -> None:
    """Remove what a cluster made: processes (by namespace and by directory), namespaces, links, directories."""
    s3 = state.get("s3_pid")
    if s3 is not None and "s3server" in _cmdline(s3):  # still ours, not a reused pid
        os.kill(s3, signal.SIGKILL)
    for ns in state["namespaces"]:
        _kill_namespace(ns)
    for _ in range(3):
        _kill_naming(state["root"])
        if not leftovers(state["tag"], state["root"])["processes"]:
            break
        time.sleep(0.2)
    for ns in state["namespaces"]:
        _ip("netns", "del", ns, check=False)  # its veth end goes with it, and the pair with it
    for link in leftovers(state["tag"], state["root"])["links"]:
        _ip("link", "del", link, check=False)
    for _ in range(3):  # a mount namespace that still holds a directory makes rmtree fail once
        shutil.rmtree(state["root"], ignore_errors=True)
        if not os.path.exists(state["root"]):
            break
        time.sleep(0.2)
    for path in (f"{state['root']}.reap.json", f"{state['root']}.reap.json.tmp"):
        if os.path.exists(path):
            os.remove(path)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _reaper_main(state_path: str) -> None:
    with open(state_path) as f:
        state = json.load(f)
    sys.stdin.buffer.read()  # until the cluster's process closes it or dies
    try:  # the newest state (the cluster rewrites it as it starts things), if the cluster left it
        with open(state_path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        pass
    _reap(state)


if __name__ == "__main__":
    if sys.argv[1:2] == ["reap"] and len(sys.argv) == 3:
        _reaper_main(sys.argv[2])
    else:
        sys.exit("usage: python -m benchmarks.netns reap STATE")
