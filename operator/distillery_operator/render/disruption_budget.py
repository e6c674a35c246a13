"""A standalone teacher's PodDisruptionBudget: voluntary evictions (a node drain, the cluster autoscaler
taking a node away) take its vLLM replicas down one at a time.

`maxUnavailable: 1`, not `minAvailable`: a teacher of one replica can still be drained (a budget that
allows no eviction would block node maintenance until someone deletes it), and one of several goes at a
time, so the trainer keeps scoring on the others while it comes back. Involuntary disruptions (a node
failing) are not what a budget can prevent. Owned by the job like the Deployment, so the garbage
collector deletes it with the job.
"""

from __future__ import annotations

from typing import Any

from distillery.api import DistillationJob, Teacher
from distillery_operator import naming
from distillery_operator.render.common import RenderContext, metadata, stamp
from distillery_operator.render.teacher import teacher_labels, teacher_selector

PDB_API_VERSION = "policy/v1"


def render_teacher_disruption_budget(
    job: DistillationJob, teacher: Teacher, ctx: RenderContext
) -> dict[str, Any]:
    """The budget of one standalone teacher, named like its Deployment and selecting the same pods."""
    name = naming.teacher_name(job.metadata.name, teacher.name)
    return stamp(
        {
            "apiVersion": PDB_API_VERSION,
            "kind": "PodDisruptionBudget",
            "metadata": metadata(job, ctx, name, teacher_labels(job, teacher)),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": teacher_selector(job, teacher)},
            },
        }
    )
