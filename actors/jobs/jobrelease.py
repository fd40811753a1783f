"""jobrelease.py: what a driver's job gives back when it ends: its actors killed, or its hosts kept warm for the
next job (``JobConfig.warm_hosts`` / ``reuse_hosts``), its unused spares returned to the pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import ray

from chiray.operators.graph import OperatorKind, PhysicalPlan

from ..runtime.controller import JobController
from .pool import warm_pool
from .supervisor import CONTROLLER_POOL_KEY, Deployment, release_outputs

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = ["release_actors"]


def _reusable(plan: PhysicalPlan, deployment: Deployment | None) -> bool:
    """Whether the job's hosts may serve the next job: the config asks for it and no source is fed from outside
    (such a source's host holds its feed)."""
    config = deployment.config if deployment is not None else None
    fed = any(n.source.fed_from_outside() for n in plan.graph.nodes.values()
              if n.kind is OperatorKind.SOURCE and n.source is not None)
    return config is not None and bool(config.warm_hosts or config.reuse_hosts) and not fed


def release_actors(plan: PhysicalPlan, deployment: Deployment | None, hosts: Sequence[ActorHandle],
                   actors: Sequence[ActorHandle]) -> None:
    """Kill the job's ``actors`` but for its ``hosts`` where they may serve the next job (those go back to the
    deployment's pool); release the sinks' outputs, return unused spares and, for warm hosts with a controller
    process of their own, start a warm controller for the next job."""
    kept = list(hosts) if _reusable(plan, deployment) else []
    for actor in actors:
        if actor not in kept:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
    if deployment is None:
        return
    deployment.recycle_hosts(kept)  # unused spares are still bare: they may serve the next job
    release_outputs(deployment.sinks)
    spares, deployment.spares = deployment.spares, []
    deployment.refill_pool(spares)
    if deployment.config.warm_hosts and deployment.config.controller_process:
        warm_pool().fill(CONTROLLER_POOL_KEY, 1, JobController.remote)  # type: ignore[attr-defined]
