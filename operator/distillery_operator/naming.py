"""Names and labels of a job's children: deterministic, valid for each kind, and the same after a restart.

`distillery.names.child_name` gives DNS-1123 labels of at most 63 characters. Two kinds are stricter:
Services must be DNS-1035 labels (start with a letter: `distillery.names.dns1035`), and KubeRay refuses
RayJob names longer than 47 characters (it appends 6 characters to name the RayCluster, whose Services must
stay under 63).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from distillery.names import child_name, dns1035, shorten
from distillery.plan.checkpoints.storage import checkpoint_claim_name
from distillery.runtime_config import teacher_service_name

MAX_RAYJOB_NAME = 47
"""KubeRay's MaxRayJobNameLength (MaxRayClusterNameLength 53 - 6)."""

MANAGED_BY = "distillery-operator"
JOB_LABEL = "distillery.io/job"
TEACHER_LABEL = "distillery.io/teacher"
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
SPEC_HASH_ANNOTATION = "distillery.io/spec-hash"
"""Hash of the rendered child (without its live fields); a different hash means someone else changed it."""
KUEUE_PREFIX = "kueue.x-k8s.io/"
RAY_NODE_LABEL = "distillery.io/ray-node"
"""`head` or `worker` on the job's Ray pods: the head's NetworkPolicy selects by it."""
TEACHER_CLIENT_PREFIX = "distillery.io/uses-teacher-"

_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_value(job_name: str) -> str:
    """The job's name as a label value (at most 63 characters, alphanumeric at both ends)."""
    return job_name if len(job_name) <= 63 and _LABEL_VALUE_RE.match(job_name) else child_name(job_name)


def config_map_name(job_name: str) -> str:
    return child_name(job_name, "config")


def rayjob_name(job_name: str) -> str:
    return shorten(dns1035(child_name(job_name, "trainer")), MAX_RAYJOB_NAME)


def trainer_identity_name(job_name: str) -> str:
    """The ServiceAccount, Role and RoleBinding the operator makes for a job's trainer (one name, three kinds)."""
    return child_name(job_name, "trainer")


def network_policy_name(job_name: str, pods: str = "") -> str:
    """The job's NetworkPolicy for one group of its pods (`distillery.plan.access.network.Pods`). The Ray pods' has
    the bare name a job's one policy had before there were several: an upgraded operator rewrites that
    policy instead of leaving it, wider than the new ones, beside them."""
    return child_name(job_name, "network", *((pods,) if pods else ()))


def shared_teacher_policy_name(teacher: str) -> str:
    """The NetworkPolicy of the DistillationTeacher `teacher`'s replicas."""
    return child_name(teacher, "shared-teacher-network")


def teacher_client_label(teacher: str) -> str:
    """The label the operator puts on the head pods of the jobs that reference the DistillationTeacher
    `teacher`: its policy lets them in. Under distillery.io/, which a job's podLabels may not set."""
    # A label key's name (after the prefix's "/") has at most 63 characters, "uses-teacher-" 13 of them.
    return TEACHER_CLIENT_PREFIX + shorten(label_value(teacher), 50)


def checkpoint_claim(job_name: str) -> str:
    """The PersistentVolumeClaim the operator makes for a job's checkpoints (the plan names it:
    `distillery.plan.checkpoints.storage`), the same for every job of that name."""
    return checkpoint_claim_name(job_name)


def teacher_name(job_name: str, teacher: str) -> str:
    """Name of a standalone teacher's Deployment and Service (the runtime config resolves the same one)."""
    return teacher_service_name(job_name, teacher)


def standard_labels(job_name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "distillery",
        INSTANCE_LABEL: label_value(job_name),
        COMPONENT_LABEL: component,
        "app.kubernetes.io/part-of": "distillery",
        MANAGED_BY_LABEL: MANAGED_BY,
        JOB_LABEL: label_value(job_name),
    }


def child_labels(
    job_name: str,
    component: str,
    user_labels: Mapping[str, str],
    *,
    keep_kueue: bool = False,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """User labels first, ours last so that selectors keep working whatever the user sets.

    Kueue's labels go on the RayJob only: on a Deployment they would ask Kueue to queue the teacher too.
    """
    labels = {k: v for k, v in user_labels.items() if keep_kueue or not k.startswith(KUEUE_PREFIX)}
    labels.update(standard_labels(job_name, component))
    labels.update(extra or {})
    return labels
