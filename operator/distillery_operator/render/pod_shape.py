"""One builder for the shape of every pod the operator renders: resources, security and placement.

Teachers, the Ray head, Ray workers and KubeRay's submitter all go through `shape_pod`, so a new pod kind
gets them by calling it and cannot forget one. What it applies:

- **resources**: the plan's (`distillery.plan.pod_resources`), CPU and memory requests and limits always
  set, GPUs from the pool; and, where the pod has one, the `sizeLimit` of its memory-backed `/dev/shm`.
- **security**: what Pod Security's `restricted` profile asks, so a namespace that enforces it admits the
  pod: non-root as the image's own user (RUNTIME_UID: `docker/runtime.Dockerfile`'s `USER 1000:1000`),
  no privilege escalation, every capability dropped, the runtime's default seccomp profile. `fsGroup`
  makes the claims the pods write (checkpoints) group-writable by that user; `OnRootMismatch` skips the
  recursive ownership change when the volume's root already has the right owner, so a large model claim
  is not walked file by file at every start.
- **placement**: node selector and tolerations (the pool's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from distillery.api.spec import StudentPool, TeacherPool, Toleration
from distillery.plan.pod_resources import ContainerResources

RUNTIME_UID = 1000
"""The user and group of the runtime image (`docker/runtime.Dockerfile`: `USER 1000:1000`)."""
SHM_VOLUME = "dshm"


@dataclass(frozen=True)
class PodPlacement:
    """Where a pod may run."""

    node_selector: Mapping[str, str]
    tolerations: Sequence[Toleration]

    @classmethod
    def of(cls, pool: StudentPool | TeacherPool) -> PodPlacement:
        """A pool's placement (the head and the submitter take the student pool's)."""
        return cls(pool.node_selector, pool.tolerations)


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
    placement: PodPlacement,
) -> dict[str, Any]:
    """`pod` (a pod spec with one container) with its resources, security and placement applied, and a
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
    if placement.node_selector:
        pod["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod["tolerations"] = [t.to_yaml_dict() for t in placement.tolerations]
    return pod
