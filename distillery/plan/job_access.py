"""Who may use a job's endpoints, decided once: Ray's token authentication of the trainer's cluster, and the
key its standalone teachers want on every request.

- **Ray.** KubeRay's `authOptions.mode: token` (v1.5+, Ray 2.52+): KubeRay makes a random token in a Secret
  of the RayCluster's, gives it to the head, the workers and the submitter (`RAY_AUTH_MODE`,
  `RAY_AUTH_TOKEN`) and sends it itself when it follows the job through the dashboard. The job's own
  `spec.rayAuth` wins; unset, the platform's (the chart's `rayAuth`, token unless a platform turns it off).
- **Teachers.** One Secret per job (`teacher_key_secret`), made by the operator with the job's other
  children and owned by the job; its one key is the job's standalone teachers' API key. The teacher pods
  get it as `VLLM_API_KEY` (the server refuses every request without it but `/health` and `/metrics`,
  `distillery_runtime.teachers.server_auth`), the trainer's head pod as the variable its client settings
  name (`plan.teacher_client`), both through a secretKeyRef: the key is in no rendered object, config or
  status. A local run has no Secret and its teachers no key.
"""

from __future__ import annotations

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


def needs_teacher_key(spec: DistillationJobSpec) -> bool:
    """Whether the job runs teachers of its own that want a key (standalone ones)."""
    return any(t.placement == Placement.STANDALONE for t in spec.teachers)


def teacher_key(job_name: str, teacher: Teacher) -> SecretKeyRef | None:
    """Where the key a teacher of the job wants is, in a cluster: the job's Secret for a standalone teacher;
    None for the others (an external one names its own `external.apiKeySecret`, a colocated one runs in the
    trainer's processes, a shared one takes no key yet)."""
    if teacher.placement != Placement.STANDALONE:
        return None
    return SecretKeyRef(name=teacher_key_secret_name(job_name), key=TEACHER_KEY)
