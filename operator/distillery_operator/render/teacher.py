"""A teacher's vLLM replicas: a Deployment and the headless Service in front of it.

One renderer for both kinds of teacher the operator runs: a job's standalone teacher (owned by the job) and a
DistillationTeacher that many jobs share (owned by it, `render/shared_teacher.py`). Each is first resolved
into a `distillery.plan.shared_teacher.TeacherServer`; the objects are made from that alone.
"""

from __future__ import annotations

import math
from typing import Any

from distillery import pvc
from distillery.api import DistillationJob, SecretKeyRef, Teacher
from distillery.plan.access.auth import CLIENTS_DIR, CLIENTS_ENV, TEACHER_KEY_ENV, clients_file, teacher_key
from distillery.plan.env.vllm import NO_TRACKING_ENV, cpu_kv_cache_env
from distillery.plan.shared_teacher import TeacherServer, teacher_server
from distillery.runtime_config import TEACHER_PORT
from distillery_operator import naming
from distillery_operator.render.common import (
    RenderContext,
    claim_volumes,
    hf_token_env,
    metadata,
    mount_model_cache,
    stamp,
    user_labels,
)
from distillery_operator.render.pod_shape import pod_template

TEACHER_MODULE = "distillery_runtime.teachers.server"
HEALTH_PATH = "/health"
STARTUP_PERIOD_SECONDS = 10


def server_command(server: TeacherServer) -> list[str]:
    """The teacher server's command: the model at its mounted path, the Service's port, the plan's engine."""
    model = pvc.mounted_path(server.model) if pvc.is_pvc(server.model) else server.model
    address = ["--model", model, "--host", "0.0.0.0", "--port", str(TEACHER_PORT)]
    return ["python", "-m", TEACHER_MODULE, *address, *server.engine.server_args()]


def teacher_command(job: DistillationJob, teacher: Teacher) -> list[str]:
    """A standalone teacher's server command."""
    return server_command(teacher_server(job.spec, teacher))


def teacher_selector(job: DistillationJob, teacher: Teacher) -> dict[str, str]:
    return {
        naming.INSTANCE_LABEL: naming.label_value(job.metadata.name),
        naming.COMPONENT_LABEL: "teacher",
        naming.TEACHER_LABEL: teacher.name,
    }


def teacher_labels(job: DistillationJob, teacher: Teacher) -> dict[str, str]:
    """The labels of a standalone teacher's objects and pods."""
    return naming.child_labels(
        job.metadata.name, "teacher", user_labels(job), extra={naming.TEACHER_LABEL: teacher.name}
    )


def api_key_env(api_key: SecretKeyRef | None) -> list[dict[str, Any]]:
    """The server's key (`plan.job_access`), by secretKeyRef: a reference, never the value. vLLM guards /v1
    with it, our server every other route but /health and /metrics (`teachers.serving.server_auth`)."""
    if api_key is None:
        return []
    ref = {"name": api_key.name, "key": api_key.key}
    return [{"name": TEACHER_KEY_ENV, "valueFrom": {"secretKeyRef": ref}}]


CLIENTS_VOLUME = "teacher-clients"


def clients_mount(
    clients_secret: str | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The volume, mount and variable of a shared teacher's clients file (`plan.job_access`), from its
    Secret; none without one."""
    if clients_secret is None:
        return [], [], []
    volume = {"name": CLIENTS_VOLUME, "secret": {"secretName": clients_secret}}
    mount = {"name": CLIENTS_VOLUME, "mountPath": CLIENTS_DIR, "readOnly": True}
    return [volume], [mount], [{"name": CLIENTS_ENV, "value": clients_file()}]


def server_pod_template(
    server: TeacherServer,
    labels: dict[str, str],
    api_key: SecretKeyRef | None = None,
    clients_secret: str | None = None,
) -> dict[str, Any]:
    """The pod template of one replica; `api_key`: where the key every request must carry is (None: none);
    `clients_secret`: a shared teacher's Secret of its clients' key digests, which it takes instead. The
    probes ask /health, which answers without a key and tells nothing but that the server is up."""
    probe = {"httpGet": {"path": HEALTH_PATH, "port": "http"}}
    volumes, mounts = claim_volumes(pvc.claims([server.model]))
    clients_volumes, clients_mounts, clients_env = clients_mount(clients_secret)
    volumes, mounts = volumes + clients_volumes, mounts + clients_mounts
    startup_failures = max(1, math.ceil(server.ready_timeout_seconds / STARTUP_PERIOD_SECONDS))
    container: dict[str, Any] = {
        "name": "teacher",
        "image": server.image,
        "command": server_command(server),
        "ports": [{"name": "http", "containerPort": TEACHER_PORT, "protocol": "TCP"}],
        "volumeMounts": mounts,
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
    env = hf_token_env(server.inference.hf_token_secret) + api_key_env(api_key) + clients_env
    variables = dict(NO_TRACKING_ENV)
    if server.pool.gpus_per_replica == 0:
        # Found on a real node: without it vLLM's CPU worker wanted 90% of the node's memory and exited.
        variables.update(cpu_kv_cache_env())
    env += [{"name": name, "value": value} for name, value in variables.items()]
    container["env"] = env
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "automountServiceAccountToken": False,
    }
    mount_model_cache(pod, server.cache)
    return pod_template(labels, pod, server.resources, server.scheduling)


def teacher_pod_template(job: DistillationJob, teacher: Teacher, ctx: RenderContext) -> dict[str, Any]:
    """The pod template of one replica of a standalone teacher."""
    server = teacher_server(job.spec, teacher, ctx.cluster.image_pull_secrets)
    return server_pod_template(server, teacher_labels(job, teacher), teacher_key(job.metadata.name, teacher))


def server_deployment_spec(
    server: TeacherServer,
    replicas: int,
    selector: dict[str, str],
    labels: dict[str, str],
    api_key: SecretKeyRef | None = None,
    clients_secret: str | None = None,
) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "selector": {"matchLabels": selector},
        # No surge: a replica holds whole GPUs, and a rollout must not need spare ones.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        "progressDeadlineSeconds": max(server.ready_timeout_seconds, 60),
        "template": server_pod_template(server, labels, api_key, clients_secret),
    }


def server_service_spec(selector: dict[str, str]) -> dict[str, Any]:
    return {
        # Headless: DNS answers with every ready replica, and the runtime spreads its scoring
        # requests over them itself (one long-lived connection per replica, no kube-proxy hop).
        "clusterIP": "None",
        "selector": selector,
        "ports": [{"name": "http", "port": TEACHER_PORT, "targetPort": "http", "protocol": "TCP"}],
    }


def render_teacher_deployment(job: DistillationJob, teacher: Teacher, ctx: RenderContext) -> dict[str, Any]:
    name = naming.teacher_name(job.metadata.name, teacher.name)
    labels = teacher_labels(job, teacher)
    replicas = 0 if ctx.teachers_scaled_to_zero else teacher.replicas
    server = teacher_server(job.spec, teacher, ctx.cluster.image_pull_secrets)
    return stamp(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata(job, ctx, name, labels),
            "spec": server_deployment_spec(
                server,
                replicas,
                teacher_selector(job, teacher),
                labels,
                teacher_key(job.metadata.name, teacher),
            ),
        }
    )


def render_teacher_service(job: DistillationJob, teacher: Teacher, ctx: RenderContext) -> dict[str, Any]:
    name = naming.teacher_name(job.metadata.name, teacher.name)
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(job, ctx, name, teacher_labels(job, teacher)),
            "spec": server_service_spec(teacher_selector(job, teacher)),
        }
    )
