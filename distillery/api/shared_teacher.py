"""The `DistillationTeacher`: one teacher that the operator serves for many jobs, scaled by their demand.

A job uses it with `teachers[].placement: shared` and `teacherRef`. Its pool and vLLM settings are the
job's standalone-teacher models (one renderer serves both); `scaling` bounds the replicas that the
operator chooses from the replicas' queues (`distillery.plan.teachers.scaling`). The CRD is generated
from these models as the DistillationJob's is (`distillery.crd`).
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field

from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import MAX_INT, MAX_MAP, MAX_NAME, MAX_TOP_K, LabelValue, Location, label_keys_rule
from distillery.api.labels import reserved_labels_rule
from distillery.api.pod import MAX_PULL_SECRETS, PullSecretName
from distillery.api.spec import GROUP, VERSION, Inference, ObjectMeta, TeacherEngine, TeacherPool, pvc_rule
from distillery.api.status import Condition

TEACHER_KIND = "DistillationTeacher"
TEACHER_PLURAL = "distillationteachers"
TEACHER_API_VERSION = f"{GROUP}/{VERSION}"
MAX_REPLICAS = 256


class TeacherConditionType(StrEnum):
    READY = "Ready"
    """True while a replica is ready to score."""
    IN_USE = "InUse"
    """True while active jobs reference the teacher: its finalizer holds a deletion until they end."""
    VALID = "Valid"


class Scaling(ApiModel):
    """How many vLLM replicas the operator runs: from the jobs that use the teacher and their queues."""

    min_replicas: int = Field(default=0, ge=0, le=MAX_REPLICAS)
    """Replicas kept however idle the teacher is; 0: none while no active job references it (the first
    request of a job waits for a replica to load the model)."""
    max_replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    """The most replicas the queues may ask for."""
    target_waiting_per_replica: int = Field(default=8, ge=0, le=MAX_INT)
    """Requests waiting per replica (vLLM's `vllm:num_requests_waiting`, summed over the replicas and
    divided by their number) above which one more replica is started."""
    idle_seconds: int = Field(default=600, ge=0, le=MAX_INT)
    """How long no request waits or runs before the replicas go down to minReplicas (to one while a job
    still references the teacher)."""

    rules = (
        Rule(
            check=lambda s: s.min_replicas <= s.max_replicas,
            cel="self.minReplicas <= self.maxReplicas",
            message="must not exceed maxReplicas",
            field="minReplicas",
        ),
    )


class DistillationTeacherSpec(ApiModel):
    """A teacher served for every job of the namespace that references it."""

    model: Location
    """Hugging Face id, local path or URI (s3://, gs://, pvc://CLAIM/PATH) of the teacher model."""
    pool: TeacherPool = Field(default_factory=TeacherPool)
    inference: Inference = Field(default_factory=Inference)
    max_logprobs: int = Field(default=20, ge=1, le=MAX_TOP_K)
    """vLLM --max-logprobs: the largest loss.topK a job using the teacher may ask for."""
    scaling: Scaling = Field(default_factory=Scaling)
    image: Location = "ghcr.io/distillery-ai/distillery-runtime:0.1.0"
    """Image of the teacher server (the jobs' runtime image)."""
    startup_timeout_seconds: int = Field(default=1800, ge=1, le=MAX_INT)
    """How long a replica may take to load the model before Kubernetes restarts it."""
    labels: dict[str, LabelValue] = Field(default_factory=dict, max_length=MAX_MAP)
    """Labels added to the teacher's Deployment, Service and pods; not the reserved ones
    (`distillery.api.labels`: in metadata.labels the operator drops them)."""
    image_pull_secrets: list[PullSecretName] = Field(default_factory=list, max_length=MAX_PULL_SECRETS)
    """Secrets (of the teacher's namespace) to pull the image with, after the cluster's own."""

    rules = (
        label_keys_rule("labels", "labels"),
        reserved_labels_rule("labels", "labels"),
        pvc_rule("model", "model"),
        Rule(
            check=lambda s: s.inference.engine != TeacherEngine.TRANSFORMERS,
            cel="!has(self.inference) || !has(self.inference.engine) || self.inference.engine != 'transformers'",
            message="transformers is for a job's colocated teachers; a DistillationTeacher is a vLLM server",
            field="inference.engine",
        ),
    )


class DistillationTeacherStatus(ApiModel):
    """The observed state of a shared teacher."""

    replicas: int = 0
    """The replicas the operator asks for now."""
    ready_replicas: int = 0
    endpoint: str | None = Field(default=None, max_length=MAX_NAME)
    """The base URL that the jobs' trainers reach the teacher at (its Service)."""
    jobs: list[str] = Field(default_factory=list)
    """The jobs of the namespace that reference the teacher and have not finished."""
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None


class DistillationTeacher(ApiModel):
    """A whole DistillationTeacher manifest: apiVersion, kind, metadata and spec (status is the operator's)."""

    api_version: str = Field(default=TEACHER_API_VERSION, pattern=re.escape(TEACHER_API_VERSION) + "$")
    kind: str = Field(default=TEACHER_KIND, pattern=f"^{TEACHER_KIND}$")
    metadata: ObjectMeta
    spec: DistillationTeacherSpec
    status: DistillationTeacherStatus | None = None
