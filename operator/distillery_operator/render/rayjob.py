"""The student's KubeRay RayJob: the Ray head (which runs the driver), the worker group, and the submitter.

Every pod of it (head, workers, KubeRay's submitter through `submitterPodTemplate`) goes through the one
pod-shape builder: the plan's resources, the restricted security context, and the student pool's
placement, so that on GPU nodes tainted `nvidia.com/gpu:NoSchedule` the head and submitter are placed
with the workers rather than Pending forever.
"""

from __future__ import annotations

import posixpath
from typing import Any

from distillery import pvc
from distillery.api import SERVED_ELSEWHERE, DistillationJob, Placement, RayAuth
from distillery.plan.access.auth import RAY_VERSION, ray_auth
from distillery.plan.access.network import DASHBOARD_PORT, RAY_METRICS_PORT
from distillery.plan.checkpoints.storage import checkpoint_storage
from distillery.plan.pods.model_cache import TRAINER, model_cache
from distillery.plan.pods.resources import ContainerResources, pod_resources
from distillery.plan.pods.scheduling import PodScheduling, pod_scheduling
from distillery.plan.teachers.client import teacher_client
from distillery.runtime_config import CONFIG_KEY, CONFIG_MOUNT_DIR, RUNTIME_METRICS_PORT, teacher_endpoints
from distillery_operator import naming
from distillery_operator.render.common import (
    RenderContext,
    claim_volumes,
    hf_token_env,
    metadata,
    mount_model_cache,
    queued_by_kueue,
    stamp,
    trainer_hf_token,
    user_labels,
)
from distillery_operator.render.identity import trainer_service_account
from distillery_operator.render.network_policy import ray_pod_labels
from distillery_operator.render.pod_shape import pod_template

RAYJOB_API_VERSION = "ray.io/v1"
ENTRYPOINT = f"distillery run {CONFIG_MOUNT_DIR}/{CONFIG_KEY}"
RAY_HEAD_PORTS = (
    ("gcs-server", 6379),
    ("dashboard", DASHBOARD_PORT),
    ("client", 10001),
    ("metrics", RAY_METRICS_PORT),
)
"""The head's ports under KubeRay's names (its defaults for a head container that declares none)."""
SUBMITTER_CONTAINER = "ray-job-submitter"
"""KubeRay's name for the submitter container; KubeRay fills in its command and environment."""
PRESTOP_MARGIN_SECONDS = 10
"""Of the grace period, what the hook leaves for stopping Ray after the driver is gone."""
HEAD_START_PARAMS = {"dashboard-host": "0.0.0.0", "num-cpus": "0", "num-gpus": "0"}
"""The head runs the driver (`distillery run`), which is not a Ray task, and no Ray work: it advertises no
CPUs and no GPUs, so Ray schedules nothing on it that reserves either. (The runtime's actors reserve no
CPU; on GPU jobs they sit in the placement groups of the workers' GPUs, `distillery_runtime.run.placement`; on
CPU-only jobs they reserve nothing, and Ray may still place those on the head: its memory default allows
for that.)"""


def trainer_locations(job: DistillationJob) -> list[str | None]:
    """Every model and data location the Ray pods may open (the driver checks standalone teachers'
    tokenizers too, so their models count)."""
    spec = job.spec
    models = [t.model for t in spec.teachers if t.placement not in SERVED_ELSEWHERE]
    data = [spec.data.train.path, spec.data.eval.path if spec.data.eval else None]
    return [spec.student.model, spec.student.tokenizer, *models, *data]


def teacher_access(
    job: DistillationJob,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(env, volumes, mounts) that give the driver each served teacher's API key (an external one's, the
    job's teacher key for a standalone one) and CA bundle where its client settings say
    (`plan.teacher_client`): the key as a variable from a secretKeyRef (a reference: the value never enters
    the RayJob or the runtime config), the bundle as a file of its Secret or ConfigMap."""
    env: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for index, teacher in enumerate(job.spec.teachers):
        if teacher.placement not in (*SERVED_ELSEWHERE, Placement.STANDALONE):
            continue
        endpoints = teacher_endpoints(job, teacher, job.metadata.namespace)
        client = teacher_client(teacher, index, endpoints, in_cluster=True, job_name=job.metadata.name)
        if client is None:
            continue
        if client.api_key_secret is not None and client.api_key_env is not None:
            ref = client.api_key_secret
            env.append(
                {
                    "name": client.api_key_env,
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
                }
            )
        if client.ca_bundle is not None and client.ca_file is not None:
            bundle, name = client.ca_bundle, f"teacher-ca-{teacher.name}"
            items = [{"key": bundle.key, "path": posixpath.basename(client.ca_file)}]
            source = (
                {"secret": {"secretName": bundle.secret_name, "items": items}}
                if bundle.secret_name
                else {"configMap": {"name": bundle.config_map_name, "items": items}}
            )
            volumes.append({"name": name, **source})
            mounts.append({"name": name, "mountPath": posixpath.dirname(client.ca_file), "readOnly": True})
    return env, volumes, mounts


def prestop_command(job: DistillationJob) -> list[str]:
    """The head's preStop hook: stop the driver (it checkpoints) within the grace period, then Ray."""
    timeout = job.spec.termination_grace_period_seconds - PRESTOP_MARGIN_SECONDS
    return ["python", "-m", "distillery_runtime.prestop", "--timeout", str(timeout)]


def _ray_pod_template(
    job: DistillationJob,
    container_name: str,
    resources: ContainerResources,
    scheduling: PodScheduling,
    *,
    worker: bool,
) -> dict[str, Any]:
    spec = job.spec
    mounts = [{"name": "distillery-config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True}]
    volumes: list[dict[str, Any]] = [
        {
            "name": "distillery-config",
            "configMap": {
                "name": naming.config_map_name(job.metadata.name),
                "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}],
            },
        },
    ]
    mounts.append({"name": "checkpoints", "mountPath": spec.checkpoint.path})
    checkpoint_claim = checkpoint_storage(job.metadata.name, spec).claim
    if checkpoint_claim:
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": checkpoint_claim}})
    else:
        # checkpoint.ephemeral: writable by the image's user, and it outlives a container restart. Not a
        # retry (a new pod): an ephemeral job cannot promise retries (the spec's backoffLimit rule).
        volumes.append({"name": "checkpoints", "emptyDir": {}})
    more_volumes, more_mounts = claim_volumes(
        pvc.claims(trainer_locations(job)), checkpoint_claim=checkpoint_claim
    )
    volumes.extend(more_volumes)
    mounts.extend(more_mounts)
    env: list[dict[str, Any]] = [
        {"name": "DISTILLERY_CONFIG", "value": f"{CONFIG_MOUNT_DIR}/{CONFIG_KEY}"},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    env.extend(hf_token_env(trainer_hf_token(spec)))
    if not worker:
        # The driver alone talks to teachers: only the head gets their keys and CA bundles.
        teacher_env, teacher_volumes, teacher_mounts = teacher_access(job)
        env.extend(teacher_env)
        volumes.extend(teacher_volumes)
        mounts.extend(teacher_mounts)
    container: dict[str, Any] = {
        "name": container_name,
        "image": spec.image,
        "env": env,
        "volumeMounts": mounts,
    }
    if not worker:
        # The driver (`distillery run`) serves the runtime's Prometheus metrics; the chart's PodMonitor
        # scrapes this port by name.
        # KubeRay adds Ray's own ports only to a head container that declares none; declaring ours alone
        # left the head without "dashboard", and the RayJob never submitted ("dashboard port is not found",
        # found on a real node). So Ray's are declared too, by KubeRay's names and defaults.
        container["ports"] = [
            *({"name": name, "containerPort": port} for name, port in RAY_HEAD_PORTS),
            {"name": "runtime-metrics", "containerPort": RUNTIME_METRICS_PORT},
        ]
        # The kubelet's SIGTERM reaches only PID 1 (KubeRay's bash wrapper, which ignores it as PID 1):
        # the hook stops the driver, which saves a checkpoint first, within the grace period.
        container["lifecycle"] = {"preStop": {"exec": {"command": prestop_command(job)}}}
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "serviceAccountName": trainer_service_account(job),
        # Workers too: rank 0 writes the checkpoint, so they must outlive the driver's last step.
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
    }
    mount_model_cache(pod, model_cache(spec).get(TRAINER))
    # Head or worker, and the head's shared teachers: what the NetworkPolicies select by.
    network = ray_pod_labels(job, head=not worker)
    labels = naming.child_labels(job.metadata.name, "trainer", user_labels(job), extra=network)
    return pod_template(labels, pod, resources, scheduling)


def submitter_pod_template(job: DistillationJob, scheduling: PodScheduling) -> dict[str, Any]:
    """KubeRay's submitter pod (`ray job submit`, then `ray job logs --follow`), ours only for its shape:
    KubeRay fills in the container's command and environment, as it does for its default template. The
    image is the head's, as KubeRay's default is (the Ray CLI must match the cluster's version)."""
    container = {"name": SUBMITTER_CONTAINER, "image": job.spec.image}
    # Kubernetes Jobs allow Never or OnFailure; KubeRay's default is Never (the Job's backoff retries).
    pod: dict[str, Any] = {"containers": [container], "restartPolicy": "Never"}
    resources = pod_resources(job.spec).submitter
    # Not "trainer": selectors of the trainer pods (the chart's PodMonitor) must not pick the submitter.
    labels = naming.child_labels(job.metadata.name, "submitter", user_labels(job))
    return pod_template(labels, pod, resources, scheduling)


def ray_auth_options(job: DistillationJob, ctx: RenderContext) -> dict[str, Any]:
    """`authOptions` of the RayCluster where the job's Ray authentication is on (`plan.access.auth.ray_auth`):
    KubeRay makes the token's Secret (owned by the RayCluster, gone with it), sets `RAY_AUTH_MODE` and
    `RAY_AUTH_TOKEN` on the head, the workers and the submitter, and sends the token itself when it
    follows the job through the dashboard. Off: no `authOptions` at all, the RayJob of a KubeRay that
    predates them."""
    if ray_auth(job.spec, ctx.cluster.ray_auth) != RayAuth.TOKEN:
        return {}
    return {"authOptions": {"mode": RayAuth.TOKEN.value}}


def render_rayjob(job: DistillationJob, ctx: RenderContext) -> dict[str, Any]:
    spec = job.spec
    pool = spec.student.pool
    resources = pod_resources(spec)
    scheduling = pod_scheduling(spec, ctx.cluster.image_pull_secrets)
    labels = naming.child_labels(job.metadata.name, "trainer", user_labels(job), keep_kueue=True)
    rayjob_spec: dict[str, Any] = {
        "entrypoint": ENTRYPOINT,
        "submissionMode": "K8sJobMode",
        # Kueue refuses RayJobs that keep their cluster after the job; we want the GPUs back too.
        "shutdownAfterJobFinishes": True,
        # Queued jobs start suspended and Kueue unsuspends them on admission.
        "suspend": spec.suspend or queued_by_kueue(job),
        "backoffLimit": spec.backoff_limit,
        "submitterPodTemplate": submitter_pod_template(job, scheduling.submitter),
        "rayClusterSpec": {
            "rayVersion": RAY_VERSION,
            **ray_auth_options(job, ctx),
            "headGroupSpec": {
                "rayStartParams": dict(HEAD_START_PARAMS),
                "template": _ray_pod_template(job, "ray-head", resources.head, scheduling.head, worker=False),
            },
            "workerGroupSpecs": [
                {
                    "groupName": "student",
                    "replicas": pool.workers,
                    "minReplicas": pool.workers,
                    "maxReplicas": pool.workers,
                    "rayStartParams": {},
                    "template": _ray_pod_template(
                        job, "ray-worker", resources.worker, scheduling.worker, worker=True
                    ),
                }
            ],
        },
    }
    if spec.active_deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    return stamp(
        {
            "apiVersion": RAYJOB_API_VERSION,
            "kind": "RayJob",
            "metadata": metadata(job, ctx, naming.rayjob_name(job.metadata.name), labels),
            "spec": rayjob_spec,
        }
    )
