"""The DistillationJob's pools: the Kubernetes settings of the student's workers and head and of the teachers'
pods (`spec.studentPool`, `spec.studentHead`, `spec.teacherPool`)."""

from __future__ import annotations

from pydantic import Field

from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import (
    MAX_INT,
    MAX_LABEL_VALUE,
    MAX_LIST,
    MAX_MAP,
    MAX_NAME,
    MAX_QUANTITY,
    MIN_INT,
    POSITIVE_QUANTITY_RE,
    LabelValue,
    Name,
    QuantityValue,
    label_keys_rule,
)
from distillery.api.pod import POD_SETTINGS_RULES, PodSettings


class Toleration(ApiModel):
    """A Kubernetes toleration, passed through to the pods."""

    key: str | None = Field(default=None, max_length=MAX_NAME + 1 + MAX_LABEL_VALUE)
    operator: str | None = Field(default=None, pattern="^(Exists|Equal)$", max_length=6)
    value: str | None = Field(default=None, max_length=MAX_LABEL_VALUE)
    effect: str | None = Field(
        default=None, pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$", max_length=16
    )
    toleration_seconds: int | None = Field(default=None, ge=MIN_INT, le=MAX_INT)


class Resources(ApiModel):
    """Container resources of the pool's pods; unset CPU and memory get the plan's defaults (docs/operator.md).

    GPUs are set from the pool's GPU count."""

    requests: dict[str, QuantityValue] = Field(default_factory=dict, max_length=MAX_MAP)
    limits: dict[str, QuantityValue] = Field(default_factory=dict, max_length=MAX_MAP)


class StudentPool(PodSettings):
    """Where the student trains and rolls out: the Ray worker group of the RayJob. Its placement and pod
    settings are the Ray head's and KubeRay's submitter's too, except where `student.head` sets its own."""

    workers: int = Field(default=1, ge=1, le=1024)
    """Ray worker pods; each runs one data-parallel trainer rank per GPU."""
    gpus_per_worker: int = Field(default=1, ge=0, le=16)
    """GPUs per worker pod (0 = CPU only, for tests and tiny jobs)."""
    gpu_resource: Name = "nvidia.com/gpu"
    """The extended resource name that counts GPUs."""
    gpu_memory_gib: float = Field(default=80.0, gt=0.0, le=4096.0, alias="gpuMemoryGiB")
    """Memory of one of the pool's GPUs in GiB (80: H100, A100 80GB), for the memory plan that
    `distillery validate` and `distillery plan` check."""
    resources: Resources = Field(default_factory=Resources)
    shared_memory: str | None = Field(default=None, pattern=POSITIVE_QUANTITY_RE, max_length=MAX_QUANTITY)
    """`sizeLimit` of the Ray workers's memory-backed `/dev/shm` (vLLM, NCCL and Ray's object store use it; it
    counts toward the memory limit). Unset: half the pod's memory limit."""
    node_selector: dict[str, LabelValue] = Field(default_factory=dict, max_length=MAX_MAP)
    """Node labels the Ray pods (head and workers) and KubeRay's submitter pod must match."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_LIST)
    """Tolerations of the Ray pods (head and workers) and KubeRay's submitter pod."""

    rules = (*POD_SETTINGS_RULES, label_keys_rule("nodeSelector", "node_selector"))


class StudentHead(PodSettings):
    """The Ray head (it runs the driver) and KubeRay's submitter, which follows the head's placement. Each
    field left unset follows the student pool; one set here wins for the head and the submitter (`{}` or
    `[]`: none)."""

    resources: Resources | None = None
    """The head's container resources, over its defaults key by key (docs/operator.md); not the
    submitter's."""
    node_selector: dict[str, LabelValue] | None = Field(default=None, max_length=MAX_MAP)
    """Node labels the head and the submitter must match (unset: the student pool's)."""
    tolerations: list[Toleration] | None = Field(default=None, max_length=MAX_LIST)
    """Tolerations of the head and the submitter (unset: the student pool's)."""

    rules = (*POD_SETTINGS_RULES, label_keys_rule("nodeSelector", "node_selector"))


class TeacherPool(PodSettings):
    """Where a standalone teacher's (or a DistillationTeacher's) vLLM replicas run."""

    gpus_per_replica: int = Field(default=1, ge=0, le=16)
    """GPUs per vLLM replica; must be a multiple of tensorParallel."""
    tensor_parallel: int = Field(default=1, ge=1, le=16)
    """vLLM --tensor-parallel-size."""
    gpu_resource: Name = "nvidia.com/gpu"
    """The extended resource name that counts GPUs."""
    resources: Resources = Field(default_factory=Resources)
    shared_memory: str | None = Field(default=None, pattern=POSITIVE_QUANTITY_RE, max_length=MAX_QUANTITY)
    """`sizeLimit` of each replica's memory-backed `/dev/shm` (vLLM, NCCL and Ray's object store use it; it
    counts toward the memory limit). Unset: half the pod's memory limit."""
    node_selector: dict[str, LabelValue] = Field(default_factory=dict, max_length=MAX_MAP)
    """Node labels the teacher pods must match."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_LIST)
    """Tolerations of the teacher pods."""

    rules = (
        Rule(
            check=lambda p: p.gpus_per_replica == 0 or p.gpus_per_replica % p.tensor_parallel == 0,
            cel="self.gpusPerReplica == 0 || self.gpusPerReplica % self.tensorParallel == 0",
            message="must be a multiple of tensorParallel (one vLLM replica spans gpusPerReplica GPUs)",
            field="gpusPerReplica",
        ),
        *POD_SETTINGS_RULES,
        label_keys_rule("nodeSelector", "node_selector"),
    )
