"""Who may use a job's endpoints, decided once: Ray's token authentication of the trainer's cluster, and the
key its standalone teachers want on every request.

- **Ray.** KubeRay's `authOptions.mode: token` (v1.5+, Ray 2.52+): KubeRay makes a random token in a Secret
  of the RayCluster's, gives it to the head, the workers and the submitter (`RAY_AUTH_MODE`,
  `RAY_AUTH_TOKEN`) and sends it itself when it follows the job through the dashboard. The job's own
  `spec.rayAuth` wins; unset, the platform's (the chart's `rayAuth`, token unless a platform turns it off).
- **Teachers.** One Secret per job (`teacher_key_secret`), made by the operator with the job's other
  children and owned by the job; its one key is the job's API key for its standalone teachers and for the
  shared teachers it references. A standalone teacher's pods get it as `VLLM_API_KEY` (the server refuses
  every request without it but `/health` and `/metrics`, `distillery_runtime.teachers.serving.server_auth`), the
  trainer's head pod as the variable its client settings name (`plan.teacher_client`), both through a
  secretKeyRef: the key is in no rendered object, config or status. A local run has no Secret and its
  teachers no key.
- **Shared teachers.** A DistillationTeacher serves many jobs, each with its own key: its replicas read the
  SHA-256 digests of the keys of the active jobs that reference it from a Secret of the teacher's
  (`clients_secret_name`, `clients_document`), mounted as a file that the kubelet keeps current. The server
  takes the job a request scores for from the key it carries, not from the `X-Distillery-Job` header, so
  one job cannot be counted as another; a job that ends (or is deleted) leaves the file and its key stops
  working, while the others' keep theirs. The file holds digests only: a 256-bit random key cannot be
  found from its digest, and the replicas never hold a job's key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import orjson

from distillery.api import DistillationJobSpec, Placement, RayAuth, SecretKeyRef, Teacher
from distillery.names import child_name

RAY_VERSION = "2.52.0"
"""The `rayVersion` every RayJob declares: the least Ray the runtime image carries (pyproject's `ray[default]`
floor; tests/operator/test_job_access.py keeps the two equal). KubeRay reads it to gate what the cluster
may use, and refuses `authOptions.mode: token` without one of at least 2.52 (found on the test node: every
job Failed "authOptions.mode is 'token' but RayVersion was not specified")."""

TEACHER_KEY = "api-key"
"""The data key of the job's teacher key Secret."""
TEACHER_KEY_ENV = "VLLM_API_KEY"
"""The teacher pods' variable holding the key: vLLM's own (it guards /v1 with it too), which our server's
guard of every other route reads as well."""


def ray_auth(spec: DistillationJobSpec, platform: RayAuth = RayAuth.TOKEN) -> RayAuth:
    """The job's Ray authentication: its own `spec.rayAuth` where set, else the platform's."""
    return spec.ray_auth if spec.ray_auth is not None else platform


def teacher_key_secret_name(job_name: str) -> str:
    """The name of the job's teacher key Secret."""
    return child_name(job_name, "teacher-key")


KEYED_PLACEMENTS = (Placement.STANDALONE, Placement.SHARED)
"""The teachers the operator runs, which want the job's key."""
CLIENTS_KEY = "clients.json"
"""The data key of a shared teacher's clients Secret."""
CLIENTS_DIR = "/etc/distillery/clients"
"""Where a shared teacher's replicas mount their clients Secret."""
CLIENTS_ENV = "DISTILLERY_TEACHER_CLIENTS"
"""The shared teacher server's variable naming its clients file (`CLIENTS_DIR/CLIENTS_KEY`)."""


def needs_teacher_key(spec: DistillationJobSpec) -> bool:
    """Whether the job uses teachers that want its key (standalone or shared ones)."""
    return any(t.placement in KEYED_PLACEMENTS for t in spec.teachers)


def teacher_key(job_name: str, teacher: Teacher) -> SecretKeyRef | None:
    """Where the key a teacher of the job wants is, in a cluster: the job's Secret for a standalone or a
    shared teacher; None for the others (an external one names its own `external.apiKeySecret`, a colocated
    one runs in the trainer's processes)."""
    if teacher.placement not in KEYED_PLACEMENTS:
        return None
    return SecretKeyRef(name=teacher_key_secret_name(job_name), key=TEACHER_KEY)


def job_identity(name: str, namespace: str | None) -> str:
    """A job as a teacher knows it (the `X-Distillery-Job` header, a shared teacher's clients and metrics):
    `namespace/name` in a cluster, the bare name in a local run."""
    return f"{namespace}/{name}" if namespace else name


def key_digest(key: str) -> str:
    """The SHA-256 of a key (hex), which a shared teacher's clients file holds in place of the key."""
    return hashlib.sha256(key.strip().encode()).hexdigest()


def clients_secret_name(teacher_name: str) -> str:
    """The Secret holding the digests of a DistillationTeacher's clients' keys."""
    return child_name(teacher_name, "clients")


def clients_file() -> str:
    """The clients file as the shared teacher's replicas see it."""
    return f"{CLIENTS_DIR}/{CLIENTS_KEY}"


def clients_document(clients: Mapping[str, str]) -> str:
    """A shared teacher's clients file: `{"jobs": {identity: key digest}}`, in one order always, so that the
    same clients give the same Secret (and no write)."""
    return orjson.dumps({"jobs": dict(sorted(clients.items()))}).decode()
