"""Shared fixtures: one Ray instance per test session, started and stopped here."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Jobs hand their hosts to the next job (JobConfig.reuse_hosts): starting a host process costs more CPU
# than most of these jobs' work.
os.environ.setdefault("CHIRAY_REUSE_HOSTS", "6")


def start_private_ray() -> None:
    """Start this process's own local Ray, unless it has one.

    ``address="local"``: without it, ``ray.init()`` connects to the cluster named in
    ``/tmp/ray/ray_current_cluster`` when one is alive, as a ``ray.cluster_utils.Cluster`` of another
    test process is while it runs (``make test`` runs two pytest processes at once), and then fails on
    ``num_cpus`` ("When connecting to an existing cluster, num_cpus ... must not be provided")."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            logging_level="WARNING",
            log_to_driver=True,
            object_store_memory=512 * 1024 * 1024,
        )


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray instance for the whole session (never attaches to another cluster)."""
    import ray

    start_private_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3_server():
    """A private S3-compatible server (moto's, ``benchmarks.s3server.S3Server``) for the whole session,
    started by the first test that asks for it; stopped at the end of the session."""
    from benchmarks.s3server import S3Server

    with S3Server() as server:
        yield server
