"""One builder for the shape of every pod the operator renders: resources, security and placement.

Teachers, the Ray head, Ray workers and KubeRay's submitter all go through `shape_pod`, so a new pod kind
gets them by calling it and cannot forget one. What it applies:

- **resources**: the plan's (`distillery.plan.pods.resources`), CPU and memory requests and limits always
  set, GPUs from the pool; and, where the pod has one, the `sizeLimit` of its memory-backed `/dev/shm`.
- **security**: what Pod Security's `restricted` profile asks, so a namespace that enforces it admits the
  pod: non-root as the image's own user (RUNTIME_UID: `docker/runtime.Dockerfile`'s `USER 1000:1000`),
  no privilege escalation, every capability dropped, the runtime's default seccomp profile. `fsGroup`
  makes the claims the pods write (checkpoints) group-writable by that user; `OnRootMismatch` skips the
  recursive ownership change when the volume's root already has the right owner, so a large model claim
  is not walked file by file at every start.
- **scheduling** (`distillery.plan.pods.scheduling`, which decides it for each pod kind): node selector,
  tolerations, affinity, topology spread constraints, priority class and image pull secrets; the user's
  pod labels and annotations on the template's metadata (the operator's labels win, and the spec refuses
  keys under its prefixes anyway); the user's env, volumes and mounts after the operator's (the spec
  refuses names and paths the operator uses, so neither shadows the other).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distillery.api.base import ApiModel
from distillery.plan.pods.resources import ContainerResources
from distillery.plan.pods.scheduling import PodScheduling

RUNTIME_UID = 1000
"""The user and group of the runtime image (`docker/runtime.Dockerfile`: `USER 1000:1000`)."""
SHM_VOLUME = "dshm"


def _written(model: ApiModel) -> Any:
    """A user's object as the pod gets it: without the empty lists and maps its defaults fill in (the API
    server drops them, and a rendered spec is the same whether the job came from the user or from the
    applied ConfigMap, where every default is written out), but with `emptyDir: {}`, whose emptiness is
    the value."""

    def compact(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            kept = {k: compact(v, k) for k, v in value.items()}
            return {k: v for k, v in kept.items() if v not in ([], {}) or k == "emptyDir"}
        if isinstance(value, list):
            return [compact(v) for v in value]
        return value

    return compact(model.to_yaml_dict())


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUNTIME_UID,
        "runAsGroup": RUNTIME_UID,
        "fsGroup": RUNTIME_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def shape_pod(
    pod: dict[str, Any],
    resources: ContainerResources,
    scheduling: PodScheduling,
) -> dict[str, Any]:
    """`pod` (a pod spec with one container) with its resources, security and scheduling applied, and a
    memory-backed `/dev/shm` where the plan sizes one (vLLM, NCCL and Ray's object store use it; the
    container runtime's default is 64 MiB). Returns the same dict, changed."""
    containers = pod["containers"]
    if len(containers) != 1:
        raise ValueError(f"one container a pod, got {len(containers)}: the plan sizes one")
    container = containers[0]
    container["resources"] = resources.to_yaml_dict()
    for each in [*containers, *pod.get("initContainers", [])]:
        each["securityContext"] = container_security_context()
    pod["securityContext"] = pod_security_context()
    if resources.shm_size is not None:
        container.setdefault("volumeMounts", []).insert(0, {"name": SHM_VOLUME, "mountPath": "/dev/shm"})
        shm = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": resources.shm_size}}
        pod.setdefault("volumes", []).insert(0, shm)
    if scheduling.env:
        container.setdefault("env", []).extend(_written(e) for e in scheduling.env)
    if scheduling.volume_mounts:
        container.setdefault("volumeMounts", []).extend(_written(m) for m in scheduling.volume_mounts)
    if scheduling.volumes:
        pod.setdefault("volumes", []).extend(_written(v) for v in scheduling.volumes)
    if scheduling.node_selector:
        pod["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        pod["tolerations"] = [t.to_yaml_dict() for t in scheduling.tolerations]
    if scheduling.affinity is not None:
        pod["affinity"] = _written(scheduling.affinity)
    if scheduling.topology_spread_constraints:
        pod["topologySpreadConstraints"] = [_written(c) for c in scheduling.topology_spread_constraints]
    if scheduling.priority_class_name:
        pod["priorityClassName"] = scheduling.priority_class_name
    if scheduling.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in scheduling.image_pull_secrets]
    return pod


def pod_metadata(labels: Mapping[str, str], scheduling: PodScheduling) -> dict[str, Any]:
    """A pod template's metadata: the user's pod labels under the operator's `labels` (which win), and the
    user's pod annotations."""
    metadata: dict[str, Any] = {"labels": {**scheduling.pod_labels, **labels}}
    if scheduling.pod_annotations:
        metadata["annotations"] = dict(scheduling.pod_annotations)
    return metadata


def pod_template(
    labels: Mapping[str, str], pod: dict[str, Any], resources: ContainerResources, scheduling: PodScheduling
) -> dict[str, Any]:
    """A pod template (metadata and spec) of `pod` shaped by `shape_pod`: what every renderer returns."""
    return {"metadata": pod_metadata(labels, scheduling), "spec": shape_pod(pod, resources, scheduling)}
