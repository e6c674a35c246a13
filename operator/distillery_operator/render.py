"""Rendering: a DistillationJob in, the Kubernetes objects the operator owns out. Pure functions, no API calls.

Per job: one ConfigMap with the resolved runtime config, one Deployment + headless Service per standalone
teacher (external and colocated teachers get no objects), the checkpoint PersistentVolumeClaim (unless the
job names its own or none: `distillery.plan.checkpoint_storage`), and one KubeRay RayJob running the
student. `distillery render FILE` prints the same objects the operator creates, the way `helm template` does.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from distillery import pvc
from distillery.api import API_VERSION, GROUP, KIND, PLURAL, DistillationJob, Placement, Teacher
from distillery.api.spec import DistillationJobSpec, SecretKeyRef
from distillery.plan import resolve
from distillery.plan.checkpoint_storage import checkpoint_storage
from distillery.plan.vllm_env import cpu_kv_cache_env
from distillery.runtime_config import (
    CONFIG_KEY,
    CONFIG_MOUNT_DIR,
    RUNTIME_METRICS_PORT,
    TEACHER_PORT,
    resolve_runtime_config,
)
from distillery.validation import load_jobs
from distillery_operator import naming

RAYJOB_API_VERSION = "ray.io/v1"
RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"
ENTRYPOINT = f"distillery run {CONFIG_MOUNT_DIR}/{CONFIG_KEY}"
TEACHER_MODULE = "distillery_runtime.teachers.server"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
HEALTH_PATH = "/health"
RAY_HEAD_PORTS = (("gcs-server", 6379), ("dashboard", 8265), ("client", 10001), ("metrics", 8080))
"""The head's ports under KubeRay's names (its defaults for a head container that declares none)."""
STARTUP_PERIOD_SECONDS = 10


@dataclass(frozen=True)
class RenderContext:
    """What the objects depend on besides the spec."""

    namespace: str
    owner_uid: str | None = None
    """The job's uid; None (as in `distillery render`) leaves owner references out."""
    teachers_scaled_to_zero: bool = False
    """Suspended or finished jobs keep their teacher Deployments at zero replicas (no GPUs held)."""


def queued_by_kueue(job: DistillationJob) -> bool:
    return KUEUE_QUEUE_LABEL in job.metadata.labels or KUEUE_QUEUE_LABEL in job.spec.labels


def user_labels(job: DistillationJob) -> dict[str, str]:
    return {**job.metadata.labels, **job.spec.labels}


def owner_reference(job: DistillationJob, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(
    job: DistillationJob, ctx: RenderContext, name: str, labels: dict[str, str], *, owned: bool = True
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ctx.namespace, "labels": labels}
    if ctx.owner_uid and owned:
        meta["ownerReferences"] = [owner_reference(job, ctx.owner_uid)]
    return meta


# Fields the operator changes on a live object; the spec hash leaves them out so that changing them is
# not mistaken for drift.
LIVE_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "replicas"),),
    "RayJob": (("spec", "suspend"),),
}


def spec_hash(obj: Mapping[str, Any]) -> str:
    """A stable hash of an object's rendered content, without its live fields and metadata bookkeeping."""
    body = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    body["labels"] = obj.get("metadata", {}).get("labels", {})
    for path in LIVE_FIELDS.get(obj.get("kind", ""), ()):
        body = _without(body, path)
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _without(body: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    if len(path) == 1:
        return {k: v for k, v in body.items() if k != path[0]}
    inner = body.get(path[0])
    if not isinstance(inner, dict):
        return body
    return {**body, path[0]: _without(inner, path[1:])}


def _stamp(obj: dict[str, Any]) -> dict[str, Any]:
    # A JSON round trip unshares the dicts the builders reuse (labels, probes): callers may mutate.
    obj = orjson.loads(orjson.dumps(obj))
    obj["metadata"].setdefault("annotations", {})[naming.SPEC_HASH_ANNOTATION] = spec_hash(obj)
    return obj


# ---------------------------------------------------------------------------------------------- config


def render_config_map(job: DistillationJob, ctx: RenderContext) -> dict[str, Any]:
    config = resolve_runtime_config(job, ctx.namespace, in_cluster=True)
    data = config.model_dump_json(by_alias=True, exclude_none=True)
    labels = naming.child_labels(job.metadata.name, "config", user_labels(job))
    return _stamp(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(job, ctx, naming.config_map_name(job.metadata.name), labels),
            "data": {CONFIG_KEY: data},
        }
    )


# ---------------------------------------------------------------------------------------------- teachers


def teacher_command(job: DistillationJob, teacher: Teacher) -> list[str]:
    """The teacher server's command: the model at its mounted path, the Service's port, the plan's engine."""
    model = pvc.mounted_path(teacher.model) if pvc.is_pvc(teacher.model) else teacher.model
    address = ["--model", model, "--host", "0.0.0.0", "--port", str(TEACHER_PORT)]
    return ["python", "-m", TEACHER_MODULE, *address, *resolve(job.spec).engines[teacher.name].server_args()]


def _resources(
    gpus: int, gpu_resource: str, extra_requests: Mapping[str, Any], extra_limits: Mapping[str, Any]
) -> dict[str, Any]:
    limits = {k: str(v) for k, v in extra_limits.items()}
    requests = {k: str(v) for k, v in extra_requests.items()}
    if gpus > 0:
        limits[gpu_resource] = str(gpus)
        requests[gpu_resource] = str(gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _tolerations(items: list[Any]) -> list[dict[str, Any]]:
    return [t.to_yaml_dict() for t in items]


def _hf_token_env(secret: SecretKeyRef | None) -> list[dict[str, Any]]:
    if secret is None:
        return []
    # A reference, never the value: the token stays in the Secret.
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}]


def trainer_hf_token(spec: DistillationJobSpec) -> SecretKeyRef | None:
    """The Hugging Face token of the trainer pods (one HF_TOKEN): the student's, else that of the first
    colocated teacher that has one (a colocated teacher runs inside the trainer)."""
    colocated = [
        t.inference.hf_token_secret
        for t in spec.teachers
        if t.placement == Placement.COLOCATED and t.inference.hf_token_secret
    ]
    return spec.student.hf_token_secret or (colocated[0] if colocated else None)


def teacher_selector(job: DistillationJob, teacher: Teacher) -> dict[str, str]:
    return {
        naming.INSTANCE_LABEL: naming.label_value(job.metadata.name),
        naming.COMPONENT_LABEL: "teacher",
        naming.TEACHER_LABEL: teacher.name,
    }


def render_teacher_deployment(job: DistillationJob, teacher: Teacher, ctx: RenderContext) -> dict[str, Any]:
    name = naming.teacher_name(job.metadata.name, teacher.name)
    labels = naming.child_labels(
        job.metadata.name, "teacher", user_labels(job), extra={naming.TEACHER_LABEL: teacher.name}
    )
    pool = teacher.pool
    probe = {"httpGet": {"path": HEALTH_PATH, "port": "http"}}
    claim_volumes, claim_mounts = _claim_volumes(pvc.claims([teacher.model]))
    startup_failures = max(1, math.ceil(job.spec.teacher_ready_timeout_seconds / STARTUP_PERIOD_SECONDS))
    container: dict[str, Any] = {
        "name": "teacher",
        "image": job.spec.image,
        "command": teacher_command(job, teacher),
        "ports": [{"name": "http", "containerPort": TEACHER_PORT, "protocol": "TCP"}],
        "resources": _resources(
            pool.gpus_per_replica, pool.gpu_resource, pool.resources.requests, pool.resources.limits
        ),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, *claim_mounts],
        # Loading a large model takes minutes: the startup probe allows the job's teacher timeout,
        # and liveness only starts counting once the server has come up.
        "startupProbe": {
            **probe,
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "failureThreshold": startup_failures,
            "timeoutSeconds": 5,
        },
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 5},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5},
    }
    env = _hf_token_env(teacher.inference.hf_token_secret)
    if pool.gpus_per_replica == 0:
        # Found on a real node: without it vLLM's CPU worker wanted 90% of the node's memory and exited.
        env += [{"name": name, "value": value} for name, value in cpu_kv_cache_env().items()]
    if env:
        container["env"] = env
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, *claim_volumes],
        "automountServiceAccountToken": False,
    }
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        pod_spec["tolerations"] = _tolerations(pool.tolerations)
    replicas = 0 if ctx.teachers_scaled_to_zero else teacher.replicas
    return _stamp(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _metadata(job, ctx, name, labels),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": teacher_selector(job, teacher)},
                # No surge: a replica holds whole GPUs, and a rollout must not need spare ones.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                "progressDeadlineSeconds": max(job.spec.teacher_ready_timeout_seconds, 60),
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            },
        }
    )


def render_teacher_service(job: DistillationJob, teacher: Teacher, ctx: RenderContext) -> dict[str, Any]:
    name = naming.teacher_name(job.metadata.name, teacher.name)
    labels = naming.child_labels(
        job.metadata.name, "teacher", user_labels(job), extra={naming.TEACHER_LABEL: teacher.name}
    )
    return _stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(job, ctx, name, labels),
            "spec": {
                # Headless: DNS answers with every ready replica, and the runtime spreads its scoring
                # requests over them itself (one long-lived connection per replica, no kube-proxy hop).
                "clusterIP": "None",
                "selector": teacher_selector(job, teacher),
                "ports": [{"name": "http", "port": TEACHER_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        }
    )


# ---------------------------------------------------------------------------------------------- trainer


def _locations(job: DistillationJob) -> list[str | None]:
    """Every model and data location the Ray pods may open (the driver checks standalone teachers'
    tokenizers too, so their models count)."""
    spec = job.spec
    models = [t.model for t in spec.teachers if t.placement != Placement.EXTERNAL]
    data = [spec.data.train.path, spec.data.eval.path if spec.data.eval else None]
    return [spec.student.model, spec.student.tokenizer, *models, *data]


def _claim_volumes(
    claims: list[str], checkpoint_claim: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read-only volumes and mounts for the claims of pvc:// locations, at `pvc.MOUNT_ROOT/CLAIM`. The
    checkpoint claim is already a volume of the pod: it is mounted a second time, read-only."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for claim in claims:
        name = "checkpoints" if claim == checkpoint_claim else pvc.volume_name(claim)
        if claim != checkpoint_claim:
            volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": name, "mountPath": f"{pvc.MOUNT_ROOT}/{claim}", "readOnly": True})
    return volumes, mounts


PRESTOP_MARGIN_SECONDS = 10
"""Of the grace period, what the hook leaves for stopping Ray after the driver is gone."""


def prestop_command(job: DistillationJob) -> list[str]:
    """The head's preStop hook: stop the driver (it checkpoints) within the grace period, then Ray."""
    timeout = job.spec.termination_grace_period_seconds - PRESTOP_MARGIN_SECONDS
    return ["python", "-m", "distillery_runtime.prestop", "--timeout", str(timeout)]


def _ray_pod_template(job: DistillationJob, container_name: str, *, worker: bool) -> dict[str, Any]:
    spec = job.spec
    pool = spec.student.pool
    mounts = [
        {"name": "distillery-config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    volumes: list[dict[str, Any]] = [
        {
            "name": "distillery-config",
            "configMap": {
                "name": naming.config_map_name(job.metadata.name),
                "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}],
            },
        },
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts.append({"name": "checkpoints", "mountPath": spec.checkpoint.path})
    checkpoint_claim = checkpoint_storage(job.metadata.name, spec).claim
    if checkpoint_claim:
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": checkpoint_claim}})
    else:
        # checkpoint.ephemeral: writable by the image's user, and it outlives a container restart. Not a
        # retry (a new pod): an ephemeral job cannot promise retries (the spec's backoffLimit rule).
        volumes.append({"name": "checkpoints", "emptyDir": {}})
    claim_volumes, claim_mounts = _claim_volumes(
        pvc.claims(_locations(job)), checkpoint_claim=checkpoint_claim
    )
    volumes.extend(claim_volumes)
    mounts.extend(claim_mounts)
    env: list[dict[str, Any]] = [
        {"name": "DISTILLERY_CONFIG", "value": f"{CONFIG_MOUNT_DIR}/{CONFIG_KEY}"},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    env.extend(_hf_token_env(trainer_hf_token(spec)))
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
    if worker:
        container["resources"] = _resources(
            pool.gpus_per_worker, pool.gpu_resource, pool.resources.requests, pool.resources.limits
        )
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "serviceAccountName": trainer_service_account(job),
        # Workers too: rank 0 writes the checkpoint, so they must outlive the driver's last step.
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
    }
    if worker and pool.node_selector:
        pod["nodeSelector"] = dict(pool.node_selector)
    if worker and pool.tolerations:
        pod["tolerations"] = _tolerations(pool.tolerations)
    labels = naming.child_labels(job.metadata.name, "trainer", user_labels(job))
    return {"metadata": {"labels": labels}, "spec": pod}


def render_rayjob(job: DistillationJob, ctx: RenderContext) -> dict[str, Any]:
    spec = job.spec
    pool = spec.student.pool
    labels = naming.child_labels(job.metadata.name, "trainer", user_labels(job), keep_kueue=True)
    rayjob_spec: dict[str, Any] = {
        "entrypoint": ENTRYPOINT,
        "submissionMode": "K8sJobMode",
        # Kueue refuses RayJobs that keep their cluster after the job; we want the GPUs back too.
        "shutdownAfterJobFinishes": True,
        # Queued jobs start suspended and Kueue unsuspends them on admission.
        "suspend": spec.suspend or queued_by_kueue(job),
        "backoffLimit": spec.backoff_limit,
        "rayClusterSpec": {
            "headGroupSpec": {
                # The head runs the driver (`distillery run`); the GPU work goes to the workers.
                "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
                "template": _ray_pod_template(job, "ray-head", worker=False),
            },
            "workerGroupSpecs": [
                {
                    "groupName": "student",
                    "replicas": pool.workers,
                    "minReplicas": pool.workers,
                    "maxReplicas": pool.workers,
                    "rayStartParams": {},
                    "template": _ray_pod_template(job, "ray-worker", worker=True),
                }
            ],
        },
    }
    if spec.active_deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    return _stamp(
        {
            "apiVersion": RAYJOB_API_VERSION,
            "kind": "RayJob",
            "metadata": _metadata(job, ctx, naming.rayjob_name(job.metadata.name), labels),
            "spec": rayjob_spec,
        }
    )


# ---------------------------------------------------------------------------------------------- checkpoints


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
    return _stamp(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": _metadata(job, ctx, claim.name, labels, owned=claim.delete_with_job),
            "spec": spec,
        }
    )


# ---------------------------------------------------------------------------------------------- identity


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
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(job, ctx, name, labels)}
    role = {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": _metadata(job, ctx, name, labels),
        "rules": trainer_identity_rules(job),
    }
    binding = {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": _metadata(job, ctx, name, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
    }
    return [_stamp(account), _stamp(role), _stamp(binding)]


# ---------------------------------------------------------------------------------------------- job


def standalone_teachers(job: DistillationJob) -> list[Teacher]:
    return [t for t in job.spec.teachers if t.placement == Placement.STANDALONE]


def render_job(job: DistillationJob, ctx: RenderContext) -> list[dict[str, Any]]:
    """Every child of a job, in creation order (config first: the trainer and teachers read it; the
    checkpoint claim before the trainer, whose pods mount it)."""
    objects = [render_config_map(job, ctx)]
    for teacher in standalone_teachers(job):
        objects.append(render_teacher_service(job, teacher, ctx))
        objects.append(render_teacher_deployment(job, teacher, ctx))
    claim = render_checkpoint_claim(job, ctx)
    if claim is not None:
        objects.append(claim)
    objects.append(render_rayjob(job, ctx))
    return objects


def render_manifest_stream(path: str | Path, namespace: str = "default") -> str:
    """`distillery render`: the objects of every job in a file as one YAML stream (InvalidManifest if bad)."""
    chunks: list[str] = []
    for job in load_jobs(path):
        ctx = RenderContext(namespace=namespace)
        for obj in [*render_trainer_identity(job, ctx), *render_job(job, ctx)]:
            header = f"# Source: {job.metadata.name} -> {obj['kind']}/{obj['metadata']['name']}\n"
            chunks.append("---\n" + header + yaml.safe_dump(obj, sort_keys=False, width=120))
    return "".join(chunks)
