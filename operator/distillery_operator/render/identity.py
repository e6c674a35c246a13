"""The trainer pods' identity: a ServiceAccount, and a Role bound to it that lets them patch their own job's
status and nothing else."""

from __future__ import annotations

from typing import Any

from distillery.api import GROUP, PLURAL, DistillationJob
from distillery_operator import naming
from distillery_operator.render.common import RenderContext, metadata, stamp, user_labels

RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"


def trainer_service_account(job: DistillationJob) -> str:
    """The trainer pods' ServiceAccount: the user's, or the one the operator makes for the job."""
    return job.spec.service_account_name or naming.trainer_identity_name(job.metadata.name)


def trainer_identity_rules(job: DistillationJob) -> list[dict[str, Any]]:
    """What the runtime does with the API: merge-patch its own job's status (progress, checkpoint)."""
    return [
        {
            "apiGroups": [GROUP],
            "resources": [f"{PLURAL}/status"],
            "resourceNames": [job.metadata.name],
            "verbs": ["patch"],
        }
    ]


def render_trainer_identity(job: DistillationJob, ctx: RenderContext) -> list[dict[str, Any]]:
    """A ServiceAccount for the trainer pods and a Role (bound to it) that lets them patch this job's status
    and nothing else; none when the job names its own ServiceAccount. Owned by the job like every child.

    The operator can create the Role because it holds what the Role grants (RBAC refuses to grant more).
    """
    if job.spec.service_account_name:
        return []
    name = naming.trainer_identity_name(job.metadata.name)
    labels = naming.child_labels(job.metadata.name, "trainer", user_labels(job))
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(job, ctx, name, labels)}
    role = {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": metadata(job, ctx, name, labels),
        "rules": trainer_identity_rules(job),
    }
    binding = {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": metadata(job, ctx, name, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
    }
    return [stamp(account), stamp(role), stamp(binding)]
