"""Rendering: a DistillationJob in, the Kubernetes objects the operator owns out. Pure functions, no API calls.

Per job: one ConfigMap with the resolved runtime config (`config_map`), one Deployment + headless Service per
standalone teacher (`teacher`) and its PodDisruptionBudget (`disruption_budget`; external and colocated
teachers get no objects), a NetworkPolicy per group of its pods (`network_policy`, unless the chart turns them off), the checkpoint PersistentVolumeClaim (`claim`, unless the job names its own or
none: `distillery.plan.checkpoints.storage`), the trainer pods' ServiceAccount and Role (`identity`), the standalone teachers' key Secret (`teacher_key`), and one
KubeRay RayJob running the student (`rayjob`). Every pod of them gets its resources, security and placement from one builder (`pod_shape`),
as KubeRay's `controllers/ray/common/` builds each child in a module of its own. `distillery render FILE`
prints the same objects the operator creates, the way `helm template` does (`job`).
"""

from distillery_operator.render.claim import render_checkpoint_claim
from distillery_operator.render.common import (
    KUEUE_QUEUE_LABEL,
    LIVE_FIELDS,
    NO_CLUSTER_SETTINGS,
    ClusterSettings,
    NetworkPolicySettings,
    RenderContext,
    owner_reference,
    queued_by_kueue,
    spec_hash,
    trainer_hf_token,
    user_labels,
    without_live_fields,
)
from distillery_operator.render.config_map import render_config_map
from distillery_operator.render.disruption_budget import PDB_API_VERSION, render_teacher_disruption_budget
from distillery_operator.render.identity import (
    RBAC_API_VERSION,
    render_trainer_identity,
    trainer_identity_rules,
    trainer_service_account,
)
from distillery_operator.render.job import (
    pod_templates,
    render_job,
    render_manifest_stream,
    standalone_teachers,
)
from distillery_operator.render.network_policy import (
    NETWORK_POLICY_API_VERSION,
    job_pod_selector,
    render_network_policies,
)
from distillery_operator.render.pod_shape import (
    RUNTIME_UID,
    container_security_context,
    pod_metadata,
    pod_security_context,
    pod_template,
    shape_pod,
)
from distillery_operator.render.rayjob import (
    ENTRYPOINT,
    HEAD_START_PARAMS,
    PRESTOP_MARGIN_SECONDS,
    RAY_HEAD_PORTS,
    RAYJOB_API_VERSION,
    prestop_command,
    render_rayjob,
    submitter_pod_template,
    trainer_locations,
)
from distillery_operator.render.shared_teacher import (
    render_shared_teacher,
    render_shared_teacher_clients,
    render_shared_teacher_policy,
    shared_teacher_labels,
    shared_teacher_selector,
)
from distillery_operator.render.teacher import (
    HEALTH_PATH,
    STARTUP_PERIOD_SECONDS,
    TEACHER_MODULE,
    render_teacher_deployment,
    render_teacher_service,
    teacher_command,
    teacher_labels,
    teacher_pod_template,
    teacher_selector,
)
from distillery_operator.render.teacher_key import render_teacher_key_secret, with_new_key

__all__ = [
    "ENTRYPOINT",
    "HEAD_START_PARAMS",
    "HEALTH_PATH",
    "KUEUE_QUEUE_LABEL",
    "LIVE_FIELDS",
    "NETWORK_POLICY_API_VERSION",
    "NO_CLUSTER_SETTINGS",
    "PDB_API_VERSION",
    "PRESTOP_MARGIN_SECONDS",
    "RAYJOB_API_VERSION",
    "RAY_HEAD_PORTS",
    "RBAC_API_VERSION",
    "RUNTIME_UID",
    "STARTUP_PERIOD_SECONDS",
    "TEACHER_MODULE",
    "ClusterSettings",
    "NetworkPolicySettings",
    "RenderContext",
    "container_security_context",
    "job_pod_selector",
    "owner_reference",
    "pod_metadata",
    "pod_security_context",
    "pod_template",
    "pod_templates",
    "prestop_command",
    "queued_by_kueue",
    "render_checkpoint_claim",
    "render_config_map",
    "render_job",
    "render_manifest_stream",
    "render_network_policies",
    "render_rayjob",
    "render_shared_teacher",
    "render_shared_teacher_clients",
    "render_shared_teacher_policy",
    "render_teacher_deployment",
    "render_teacher_disruption_budget",
    "render_teacher_key_secret",
    "render_teacher_service",
    "render_trainer_identity",
    "shape_pod",
    "shared_teacher_labels",
    "shared_teacher_selector",
    "spec_hash",
    "standalone_teachers",
    "submitter_pod_template",
    "teacher_command",
    "teacher_labels",
    "teacher_pod_template",
    "teacher_selector",
    "trainer_hf_token",
    "trainer_identity_rules",
    "trainer_locations",
    "trainer_service_account",
    "user_labels",
    "with_new_key",
    "without_live_fields",
]
