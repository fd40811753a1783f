"""config.py: the options of a job's runtime: channel bounds, host resources, placement.

Example:
    >>> from chiray.actors.config import JobConfig
    >>> JobConfig(channel_capacity=4).channel_capacity
    4
"""

from __future__ import annotations

import dataclasses
import os

from chiray.operators.staging import check_run_id
from chiray.operators.validation import check_name

__all__ = ["JobConfig"]


MEMORY_POOLS = (None, "jemalloc", "mimalloc", "system")


@dataclasses.dataclass(frozen=True, slots=True)
class JobConfig:
    """Runtime options of one job (pass as ``submit(flow, config=...)`` or as keywords).

    Attributes:
        channel_capacity: data messages a channel may hold, in flight plus
            buffered (the initial credit); about 8 keeps Ray's 2-3 ms call cost hidden.
        channel_capacity_bytes: bytes a channel may hold (one larger batch still goes alone).
        num_hosts: host actors to start; default: the largest parallelism, instances of
            every operator sharing them (see ``placement``).
        colocate: without ``num_hosts``, keyed instances share hosts with the others (the
            default: fewer processes, less memory); False gives keyed instances hosts of
            their own (the largest keyed plus the largest other parallelism hosts).
        host_num_cpus: CPUs each host actor requests (fractions allowed) so that
            Ray spreads hosts over nodes by resources.
        host_resources: extra custom resources each host requests.
        host_options: extra ``ray.remote`` options for hosts (e.g. a scheduling strategy).
        poll_interval_s: how often the controller checks that hosts are alive.
        liveness_timeout_s: a host that has not answered the controller's liveness check within this
            many seconds counts as dead, and the job recovers (a host answers while its operators
            run, but an operator step that holds its process, such as a function that hangs in C
            code, delays the answer: keep this above the longest step you expect).
        controller_process: run the job controller in an actor (a process) of its own.
            Default: in host 0's process, on a thread of its own, so a job costs no
            process beyond its hosts (about 140 MB less); it moves to a process of its
            own at the job's first recovery (the hosts are replaced then).
        placement: optional pins, operator name -> host id per instance index
            (``{"sink": [1]}``); unpinned instances follow the default rule.
        control_fanout: fan-out of the control broadcast / aggregation trees
            (None: the controller talks to every source and sink directly).
        control_batch_s: while earlier ops are still running, ops started within
            this long of the last injection wait and are injected together, so that
            under a high rate of ops they share every call and channel hop (an op
            that finds no other running goes at once; 0: every op at once). A
            driver's ``run_control`` calls that come meanwhile also reach the
            controller in one call.
        checkpoint_dir: where checkpoints (and the staged output of collect
            sinks) go: a local directory or a ``pyarrow.fs`` URI (shared storage
            on a cluster). Default: a fresh directory under the system's temp
            directory, removed when the job finishes or is cancelled (kept when it
            fails, for a restore).
        checkpoint_interval_s: take a checkpoint this often (None: only on ``job.checkpoint()``).
        restore_checkpoint_s: a job restored from a checkpoint takes its own first checkpoint this many
            seconds after it starts (None: not before a periodic or manual one). Until then, a
            recovery rolls it back to the checkpoint it was restored from.
        checkpoints_to_keep: complete checkpoints retained (with every file of older ones that they need:
            an incremental checkpoint's bins may be made of files of earlier checkpoints).
        checkpoint_max_deltas: checkpoints are incremental: per key bin, a checkpoint writes only the
            rows written (and the keys deleted) since the bin's previous checkpoint, and nothing for a bin
            that did not change; after this many such changes a bin is written whole again, so a restore
            reads a full copy and at most this many changes per bin. 0: every checkpoint writes every
            bin whole. Built-in aggregations, ``reduce``, ``process`` and joins are incremental; other
            keyed state is written whole at every checkpoint (see the checkpoints page of the docs).
            Savepoints are always whole.
        checkpoint_max_delta_ratio: a bin is also written whole once the changes written since its full
            copy hold more than this many times the full copy's bytes.
        max_restarts: recoveries allowed after hosts die before the job fails.
        restart_window_s: count only the recoveries of the last this many seconds against
            ``max_restarts`` (a failure rate: at most ``max_restarts`` per window, as Flink's
            failure-rate restart strategy); None: every recovery of the job's life counts.
        recovery_timeout_s: how long the recovery attempts (or the job controller's replacements) in a
            row may keep failing (storage unreachable, hosts dying while they start; each next attempt
            after a pause that doubles up to 5 s) before the job fails.
        step_warning_s: a step of operator code (one batch through a user function) running longer
            than this becomes an event of the job, naming the operator, instance and function, again
            at each doubling; the step is not stopped (None: no watchdog).
        restart_on_operator_error: also recover when a user function raises
            (off by default: a deterministic error would only repeat).
        deploy_timeout_s: how long starting the hosts may take before the job
            fails (Ray has no room for them, say).
        spare_hosts: idle host actors kept started beside the job: a scale-out
            sets them up instead of starting new processes (a second or more
            on a busy node, while the job runs); ``Job.refill_spare_hosts()``
            starts new ones for those taken. Each is an idle process that holds
            ``host_num_cpus``.
        warm_hosts: bare host actors (and one job controller, with ``controller_process``) this driver keeps
            started between jobs, so that the next ``submit`` (or a recovery or
            scale-out) sets them up instead of starting processes (see
            ``actors/jobs/pool.py``). When this job ends, its hosts that are still
            alive become bare again and join them (``OperatorHost.recycle``),
            and new ones are started for those missing; each idle warm host
            holds ``host_num_cpus``; ``release_warm_actors()`` stops them.
            Not used for hosts with ``host_options``.
        reuse_hosts: when this job ends, up to this many of its live hosts become bare again
            (``OperatorHost.recycle``) and wait in the warm pool for this driver's next job, which
            takes them instead of starting processes; unlike ``warm_hosts``, no process is started
            to keep the pool full. Default: the ``CHIRAY_REUSE_HOSTS`` environment variable, else 0.
        detached: run the job under a job manager actor on the cluster (see
            ``actors/jobs/manager.py``), so that it outlives the driver; reach it
            with ``chiray.attach(name)`` or the ``chiray`` CLI. Default: the
            job ends with its driver.
        metrics_interval_s: how often a detached job's manager exports the
            job's statistics through ``ray.util.metrics`` (``actors/jobs/metrics.py``);
            None: not at all.
        memory_pool: the Arrow memory pool of the job's hosts: ``"system"`` (the
            default), ``"jemalloc"`` (``"system"`` where pyarrow lacks it), ``"mimalloc"``,
            or None for pyarrow's own default (mimalloc). Measured on 2 cores: mimalloc
            held about 35 MB more per host in ``benchmarks.keyed_count`` at no gain in
            speed, and both it and jemalloc cut the unthrottled rate of a count over 8M
            keys (``benchmarks.migration --large``) to a third of the system pool's.
        name: the job's name (default: the dataflow's); a detached job's
            manager actor is named by it, in the ``"chiray"`` namespace.
        run_id: this life of the job (``r`` and 8 hex digits), part of every output file's name so
            that a restored job never replaces the files of the job it came from. Default: a new
            one per ``submit`` (a restore is a new run; a recovery, or a detached job's manager
            restart, keeps it).
    """

    channel_capacity: int = 8
    channel_capacity_bytes: int = 64 << 20
    num_hosts: int | None = None
    colocate: bool = True
    host_num_cpus: float = 0.5
    host_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    host_options: dict[str, object] = dataclasses.field(default_factory=dict)
    poll_interval_s: float = 1.0
    liveness_timeout_s: float = 120.0
    controller_process: bool = False
    placement: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    control_fanout: int | None = 8
    control_batch_s: float = 0.05
    checkpoint_dir: str | None = None
    checkpoint_interval_s: float | None = None
    restore_checkpoint_s: float | None = 1.0
    checkpoints_to_keep: int = 3
    checkpoint_max_deltas: int = 8
    checkpoint_max_delta_ratio: float = 1.0
    max_restarts: int = 3
    restart_window_s: float | None = None
    recovery_timeout_s: float = 60.0
    step_warning_s: float | None = 60.0
    restart_on_operator_error: bool = False
    deploy_timeout_s: float = 120.0
    spare_hosts: int = 0
    warm_hosts: int = 0
    reuse_hosts: int = dataclasses.field(default_factory=lambda: int(os.environ.get("CHIRAY_REUSE_HOSTS", "0")))
    detached: bool = False
    name: str | None = None
    run_id: str | None = None
    metrics_interval_s: float | None = 1.0
    memory_pool: str | None = "system"

    def __post_init__(self) -> None:
        self._check_channels()
        self._check_checkpoints()
        self._check_recovery()
        self._check_hosts()

    def _check_channels(self) -> None:
        """Channels, hosts and the control plane's fan-out and batching."""
        if self.channel_capacity < 1:
            raise ValueError(f"JobConfig: channel_capacity must be >= 1, got {self.channel_capacity}")
        if self.channel_capacity_bytes < 1:
            raise ValueError(
                f"JobConfig: channel_capacity_bytes must be >= 1, got {self.channel_capacity_bytes}"
            )
        if self.num_hosts is not None and self.num_hosts < 1:
            raise ValueError(f"JobConfig: num_hosts must be >= 1 or None, got {self.num_hosts}")
        if self.control_fanout is not None and self.control_fanout < 2:
            raise ValueError(f"JobConfig: control_fanout must be >= 2 or None, got {self.control_fanout}")
        if self.control_batch_s < 0:
            raise ValueError(f"JobConfig: control_batch_s must be >= 0, got {self.control_batch_s}")

    def _check_checkpoints(self) -> None:
        """Checkpoints, liveness and restores."""
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise ValueError(
                f"JobConfig: checkpoint_interval_s must be positive or None, got {self.checkpoint_interval_s}")
        if not self.liveness_timeout_s > 0:
            raise ValueError(f"JobConfig: liveness_timeout_s must be positive, got {self.liveness_timeout_s}")
        if self.restore_checkpoint_s is not None and self.restore_checkpoint_s < 0:
            raise ValueError(
                f"JobConfig: restore_checkpoint_s must be >= 0 or None, got {self.restore_checkpoint_s}")
        if self.checkpoints_to_keep < 1:
            raise ValueError(f"JobConfig: checkpoints_to_keep must be >= 1, got {self.checkpoints_to_keep}")
        if self.checkpoint_max_deltas < 0:
            raise ValueError(f"JobConfig: checkpoint_max_deltas must be >= 0, got {self.checkpoint_max_deltas}")
        if not self.checkpoint_max_delta_ratio > 0:
            raise ValueError(
                f"JobConfig: checkpoint_max_delta_ratio must be positive, got {self.checkpoint_max_delta_ratio}")

    def _check_recovery(self) -> None:
        """Restarts and recoveries."""
        if self.max_restarts < 0:
            raise ValueError(f"JobConfig: max_restarts must be >= 0, got {self.max_restarts}")
        if self.restart_window_s is not None and not self.restart_window_s > 0:
            raise ValueError(f"JobConfig: restart_window_s must be positive or None, got {self.restart_window_s}")
        if self.step_warning_s is not None and not self.step_warning_s > 0:
            raise ValueError(f"JobConfig: step_warning_s must be positive or None, got {self.step_warning_s}")
        if not self.recovery_timeout_s > 0:
            raise ValueError(f"JobConfig: recovery_timeout_s must be positive, got {self.recovery_timeout_s}")

    def _check_hosts(self) -> None:
        """Spare, warm and reused hosts, memory, metrics, the job's name and run id, host CPUs."""
        if self.spare_hosts < 0:
            raise ValueError(f"JobConfig: spare_hosts must be >= 0, got {self.spare_hosts}")
        if self.warm_hosts < 0:
            raise ValueError(f"JobConfig: warm_hosts must be >= 0, got {self.warm_hosts}")
        if self.reuse_hosts < 0:
            raise ValueError(f"JobConfig: reuse_hosts must be >= 0, got {self.reuse_hosts}")
        if self.memory_pool not in MEMORY_POOLS:
            raise ValueError(f"JobConfig: memory_pool must be one of {sorted(MEMORY_POOLS, key=str)}, "
                             f"got {self.memory_pool!r}")
        if self.metrics_interval_s is not None and self.metrics_interval_s <= 0:
            raise ValueError(f"JobConfig: metrics_interval_s must be positive or None, got {self.metrics_interval_s}")
        if self.name is not None:
            check_name("JobConfig: job", self.name)
        if self.run_id is not None:
            check_run_id(self.run_id)
        if self.host_num_cpus < 0:
            raise ValueError(f"JobConfig: host_num_cpus must be >= 0, got {self.host_num_cpus}")
