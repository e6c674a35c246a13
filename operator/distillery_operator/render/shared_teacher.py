"""A DistillationTeacher's objects: its vLLM Deployment and headless Service, owned by the teacher.

The same pod shape as a job's standalone teacher (`render/teacher.py`, from a `TeacherServer`), named after
the teacher (`runtime_config.shared_teacher_service_name`: the jobs reach it there) and labelled with no job:
no job's selector, NetworkPolicy or label query takes its pods for its own. Its own NetworkPolicy
(`render_shared_teacher_policy`) lets in the jobs that reference it, and its clients Secret
(`render_shared_teacher_clients`) holds the digests of their keys, which the replicas want on every request
(`distillery.plan.access.auth`). The replica count is the operator's scaling decision
(`distillery.plan.teachers.scaling`), a live field that the spec hash leaves out.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from distillery.api import TEACHER_API_VERSION, TEACHER_KIND, DistillationTeacher
from distillery.api.labels import without_reserved
from distillery.plan.access.auth import CLIENTS_KEY, clients_document, clients_secret_name
from distillery.plan.shared_teacher import shared_teacher_server
from distillery.runtime_config import shared_teacher_service_name
from distillery_operator import naming
from distillery_operator.render.common import NO_CLUSTER_SETTINGS, ClusterSettings, stamp
from distillery_operator.render.network_policy import NETWORK_POLICY_API_VERSION, shared_teacher_policy_spec
from distillery_operator.render.teacher import server_deployment_spec, server_service_spec

COMPONENT = "shared-teacher"


def shared_teacher_selector(name: str) -> dict[str, str]:
    """The labels that select the replicas of the DistillationTeacher `name`."""
    return {
        naming.INSTANCE_LABEL: naming.label_value(name),
        naming.COMPONENT_LABEL: COMPONENT,
        # The standalone teachers' label too: the teachers' PodMonitor names the teacher from it.
        naming.TEACHER_LABEL: naming.label_value(name),
    }


def shared_teacher_labels(teacher: DistillationTeacher) -> dict[str, str]:
    """The user's labels first (the teacher's metadata, then its spec's, less the reserved keys:
    `distillery_operator.render.common.user_labels` says why), ours last."""
    labels = without_reserved({**teacher.metadata.labels, **teacher.spec.labels})
    labels = {k: v for k, v in labels.items() if not k.startswith(naming.KUEUE_PREFIX)}
    labels.update(
        {
            "app.kubernetes.io/name": "distillery",
            "app.kubernetes.io/part-of": "distillery",
            naming.MANAGED_BY_LABEL: naming.MANAGED_BY,
            **shared_teacher_selector(teacher.metadata.name),
        }
    )
    return labels


def _metadata(teacher: DistillationTeacher, namespace: str, owner_uid: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": shared_teacher_service_name(teacher.metadata.name),
        "namespace": namespace,
        "labels": shared_teacher_labels(teacher),
    }
    if owner_uid:
        # Deleting the DistillationTeacher deletes its replicas (once its finalizer lets it go).
        meta["ownerReferences"] = [
            {
                "apiVersion": TEACHER_API_VERSION,
                "kind": TEACHER_KIND,
                "name": teacher.metadata.name,
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return meta


def render_shared_teacher(
    teacher: DistillationTeacher,
    *,
    namespace: str,
    replicas: int,
    owner_uid: str | None = None,
    cluster: ClusterSettings | None = None,
) -> list[dict[str, Any]]:
    """The Deployment (at `replicas`) and Service of a DistillationTeacher."""
    secrets = cluster.image_pull_secrets if cluster else ()
    server = shared_teacher_server(teacher.metadata.name, teacher.spec, secrets)
    labels = shared_teacher_labels(teacher)
    selector = shared_teacher_selector(teacher.metadata.name)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(teacher, namespace, owner_uid),
        "spec": server_deployment_spec(
            server, replicas, selector, labels, clients_secret=clients_secret_name(teacher.metadata.name)
        ),
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(teacher, namespace, owner_uid),
        "spec": server_service_spec(selector),
    }
    return [stamp(deployment), stamp(service)]


def render_shared_teacher_policy(
    teacher: DistillationTeacher,
    *,
    namespace: str,
    owner_uid: str | None = None,
    cluster: ClusterSettings = NO_CLUSTER_SETTINGS,
) -> dict[str, Any] | None:
    """The NetworkPolicy of a DistillationTeacher's replicas (`distillery.plan.access.network.shared_teacher_flows`:
    the jobs that reference it, the operator, Prometheus); None where the chart turns them off."""
    if cluster.network_policy is None:
        return None
    name = teacher.metadata.name
    meta = {**_metadata(teacher, namespace, owner_uid), "name": naming.shared_teacher_policy_name(name)}
    spec = shared_teacher_policy_spec(name, shared_teacher_selector(name), cluster.network_policy)
    return stamp(
        {"apiVersion": NETWORK_POLICY_API_VERSION, "kind": "NetworkPolicy", "metadata": meta, "spec": spec}
    )


def render_shared_teacher_clients(
    teacher: DistillationTeacher,
    *,
    namespace: str,
    clients: Mapping[str, str],
    owner_uid: str | None = None,
) -> dict[str, Any]:
    """The Secret of a DistillationTeacher's clients: the key digest of each job it serves now (`clients`,
    job identity -> digest). Rendered whole with its data: digests, never a key."""
    meta = {**_metadata(teacher, namespace, owner_uid), "name": clients_secret_name(teacher.metadata.name)}
    document = clients_document(clients).encode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {CLIENTS_KEY: base64.b64encode(document).decode()},
    }
