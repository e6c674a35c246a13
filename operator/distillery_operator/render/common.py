"""What every object builder shares: the render context, metadata and owner references, the spec hash, and
the small volume and env pieces that several pods use."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from distillery import pvc
from distillery.api import API_VERSION, KIND, DistillationJob, Placement, RayAuth
from distillery.api.labels import without_reserved
from distillery.api.spec import DistillationJobSpec, SecretKeyRef
from distillery.plan.access.network import DEFAULT_NETWORK_POLICY, NetworkPolicySettings
from distillery.plan.pods.model_cache import HF_HOME, CacheVolume
from distillery.plan.pods.model_cache import VOLUME_NAME as CACHE_VOLUME
from distillery_operator import naming

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclass(frozen=True)
class ClusterSettings:
    """What the chart tells the operator about the cluster, the same for every job (its environment)."""

    image_pull_secrets: tuple[str, ...] = ()
    """The chart's `imagePullSecrets` (`DISTILLERY_IMAGE_PULL_SECRETS`): every pod gets them, before the
    job's own."""
    network_policy: NetworkPolicySettings | None = DEFAULT_NETWORK_POLICY
    """Where the callers from outside a job run (the chart's `networkPolicy`); None: no NetworkPolicies (the
    chart's `networkPolicy.enabled: false`). On by default: a pod must not run code on a job's GPUs only
    because nobody configured anything."""
    ray_auth: RayAuth = RayAuth.TOKEN
    """The chart's `rayAuth` (`DISTILLERY_RAY_AUTH`): Ray token authentication for jobs that do not choose
    (`plan.access.auth.ray_auth`)."""


NO_CLUSTER_SETTINGS = ClusterSettings()
"""No pull secrets, the default network policies (`distillery render`, tests)."""


@dataclass(frozen=True)
class RenderContext:
    """What the objects depend on besides the spec."""

    namespace: str
    owner_uid: str | None = None
    """The job's uid; None (as in `distillery render`) leaves owner references out."""
    teachers_scaled_to_zero: bool = False
    """Suspended or finished jobs keep their teacher Deployments at zero replicas (no GPUs held)."""
    cluster: ClusterSettings = NO_CLUSTER_SETTINGS
    """What the chart says of the cluster: pull secrets, network policies."""


def queued_by_kueue(job: DistillationJob) -> bool:
    return KUEUE_QUEUE_LABEL in job.metadata.labels or KUEUE_QUEUE_LABEL in job.spec.labels


def user_labels(job: DistillationJob) -> dict[str, str]:
    """The author's labels the children carry: metadata.labels, then spec.labels, less the reserved keys.

    metadata.labels is no part of the spec the models judge, and refusing a job for them would refuse
    every Helm release (Helm sets app.kubernetes.io/managed-by on what it installs): dropped instead, so a
    job labelled `distillery.io/uses-teacher-<victim>` gets no pod of it into that teacher's policy. spec.labels
    is refused by the model (the CRD's rule, and the operator's parse of the job, which marks it Invalid)."""
    return without_reserved({**job.metadata.labels, **job.spec.labels})


def owner_reference(job: DistillationJob, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(
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
    body = without_live_fields(body, str(obj.get("kind", "")))
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def without_live_fields(body: dict[str, Any], kind: str) -> dict[str, Any]:
    """`body` (an object of `kind`, or a view of it) without the LIVE_FIELDS of that kind: what the spec hash
    and drift both judge."""
    for path in LIVE_FIELDS.get(kind, ()):
        body = _without(body, path)
    return body


def _without(body: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """`body` without the field at `path` (a copy along the path; the rest is shared)."""
    if len(path) == 1:
        return {k: v for k, v in body.items() if k != path[0]}
    inner = body.get(path[0])
    if not isinstance(inner, dict):
        return body
    return {**body, path[0]: _without(inner, path[1:])}


def stamp(obj: dict[str, Any]) -> dict[str, Any]:
    # A JSON round trip unshares the dicts the builders reuse (labels, probes): callers may mutate.
    obj = orjson.loads(orjson.dumps(obj))
    obj["metadata"].setdefault("annotations", {})[naming.SPEC_HASH_ANNOTATION] = spec_hash(obj)
    return obj


def hf_token_env(secret: SecretKeyRef | None) -> list[dict[str, Any]]:
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


def claim_volumes(
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


def mount_model_cache(pod: dict[str, Any], cache: CacheVolume | None) -> dict[str, Any]:
    """`pod` (one container) with its model cache (`distillery.plan.pods.model_cache`) mounted at HF_HOME and
    HF_HOME set; unchanged without one. Returns the same dict."""
    if cache is None:
        return pod
    (container,) = pod["containers"]
    container.setdefault("volumeMounts", []).append({"name": CACHE_VOLUME, "mountPath": HF_HOME})
    container.setdefault("env", []).append({"name": "HF_HOME", "value": HF_HOME})
    pod.setdefault("volumes", []).append(cache.volume())
    return pod
