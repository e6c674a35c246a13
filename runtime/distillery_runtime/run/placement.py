"""The student's GPUs in Ray: the placement groups of the plan's `GpuPlacement`, and each actor's Ray options.

The plan decides which bundle every actor takes (`distillery.plan.placement.gpus`); this module only
translates: it reserves one placement group per student worker, waits until Ray has placed them (or names
what it could not find), and gives each role its `ray.remote(...).options(...)`. On CPU (no placement) no
group is made and no actor reserves anything, so a small machine is never short of Ray's logical CPUs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from distillery.plan.placement.gpus import STRATEGY, GpuPlacement, PlacedActor

log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_SECONDS = 600.0
"""How long the run waits for Ray to place the student's placement groups before it fails. KubeRay submits
the job once the cluster is up, but a worker pod may still be pulling its image or waiting for its node."""
PLACEMENT_LOG_EVERY_SECONDS = 60.0

CPU_OPTIONS: dict[str, Any] = {"num_cpus": 0}
"""An actor of a CPU job, or one that computes off the student's GPUs (a local run's CPU teacher)."""


class PlacementTimeout(RuntimeError):
    """Ray did not place the student's placement groups in time: the cluster has fewer GPUs than the job."""


class RayPlacement:
    """The job's placement groups (none on CPU) and the Ray options of every actor on the student's GPUs."""

    def __init__(self, placement: GpuPlacement | None) -> None:
        self.placement = placement
        self.groups: list[Any] = []

    def reserve(self, timeout: float = PLACEMENT_TIMEOUT_SECONDS) -> None:
        """One placement group per student worker, waited for: an actor scheduled on a group that Ray
        cannot place would wait for ever, so the run fails here instead, saying what it asked for."""
        import ray
        from ray.util.placement_group import placement_group

        if self.placement is None or self.groups:
            return
        p = self.placement
        self.groups = [
            placement_group(p.bundles, strategy=STRATEGY, name=f"distillery-student-worker-{w}")
            for w in range(p.workers)
        ]
        pending = {g.ready(): w for w, g in enumerate(self.groups)}
        start = time.monotonic()
        while pending:
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                self.release()
                raise PlacementTimeout(
                    f"Ray placed {p.workers - len(pending)} of the student's {p.workers} worker(s) in "
                    f"{timeout:.0f} s: each needs {p.gpus_per_worker} GPU(s) on one node, and the cluster "
                    f"has {_gpus_by_node()} (spec.student.pool.gpusPerWorker, workers)"
                )
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(left, PLACEMENT_LOG_EVERY_SECONDS))
            for ref in ready:
                pending.pop(ref)
            if not ready:
                log.info(
                    "waiting for Ray to place %d of %d student worker(s) (%d GPU(s) each); nodes: %s",
                    len(pending),
                    p.workers,
                    p.gpus_per_worker,
                    _gpus_by_node(),
                )

    def release(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if ray.is_initialized():
            for group in self.groups:
                remove_placement_group(group)
        self.groups = []

    def trainer(self, rank: int) -> dict[str, Any]:
        if self.placement is None:
            return dict(CPU_OPTIONS)
        return self._on_bundle(self.placement.trainer(rank))

    def rollout(self, replica: int) -> dict[str, Any]:
        """A rollout replica's engine actor. With one GPU it sits on its bundle; with tensor parallelism the
        actor only drives vLLM's Ray workers, which vLLM starts in this actor's placement group (captured by
        its children) on the bundles named in VLLM_RAY_BUNDLE_INDICES, each taking VLLM_RAY_PER_WORKER_GPUS
        of its bundle's GPU."""
        if self.placement is None:
            return dict(CPU_OPTIONS)
        ranks = self.placement.rollout(replica)
        if len(ranks) == 1:
            return self._on_bundle(ranks[0])
        env = {
            "VLLM_RAY_BUNDLE_INDICES": ",".join(str(a.slot.gpu) for a in ranks),
            "VLLM_RAY_PER_WORKER_GPUS": str(ranks[0].gpu_share),
        }
        return {
            "num_cpus": 0,
            "num_gpus": 0,
            "scheduling_strategy": self._strategy(ranks[0], capture_children=True),
            "runtime_env": {"env_vars": env},
        }

    def teacher(self, index: int, colocated: bool) -> dict[str, Any]:
        """Teacher `spec.teachers[index]` computed in the run: on the student's GPU where colocated."""
        if self.placement is None or not colocated:
            return dict(CPU_OPTIONS)
        return self._on_bundle(self.placement.teacher(index))

    def _on_bundle(self, actor: PlacedActor) -> dict[str, Any]:
        return {"num_cpus": 0, "num_gpus": actor.gpu_share, "scheduling_strategy": self._strategy(actor)}

    def _strategy(self, actor: PlacedActor, *, capture_children: bool = False) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not self.groups:
            raise RuntimeError("RayPlacement.reserve() must run before the actors are placed")
        return PlacementGroupSchedulingStrategy(
            placement_group=self.groups[actor.slot.worker],
            placement_group_bundle_index=actor.slot.gpu,
            placement_group_capture_child_tasks=capture_children,
        )


def _gpus_by_node() -> str:
    """Each alive node's GPUs as Ray counts them (total, free), for an error or a log line."""
    import ray

    free = ray.available_resources()  # cluster-wide; per node below
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    parts = [f"{n['NodeManagerAddress']}: {n['Resources'].get('GPU', 0):g} GPU" for n in nodes]
    return f"{', '.join(parts) or 'no nodes'} ({free.get('GPU', 0):g} free in all)"
