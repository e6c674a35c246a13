"""The checkpoint PersistentVolumeClaim the operator makes (`distillery.plan.checkpoints.storage` decides)."""

from __future__ import annotations

from typing import Any

from distillery.api import DistillationJob
from distillery.plan.checkpoints.storage import checkpoint_storage
from distillery_operator import naming
from distillery_operator.render.common import RenderContext, metadata, stamp, user_labels


def render_checkpoint_claim(job: DistillationJob, ctx: RenderContext) -> dict[str, Any] | None:
    """The PersistentVolumeClaim of the job's checkpoints, metrics and final model, when the operator makes
    it (none when the job names its own claim or is ephemeral). Owned by the job only with
    `checkpoint.deleteWithJob`: otherwise it has no owner, so the garbage collector leaves it (and the
    model on it) when the job is deleted, and a job made again with the same name mounts it again."""
    claim = checkpoint_storage(job.metadata.name, job.spec).operator_claim
    if claim is None:
        return None
    labels = naming.child_labels(job.metadata.name, "checkpoints", user_labels(job))
    spec: dict[str, Any] = {
        "accessModes": [claim.access_mode],
        "resources": {"requests": {"storage": claim.size}},
        "volumeMode": "Filesystem",
    }
    if claim.storage_class_name:
        spec["storageClassName"] = claim.storage_class_name
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": metadata(job, ctx, claim.name, labels, owned=claim.delete_with_job),
            "spec": spec,
        }
    )
