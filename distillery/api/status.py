"""The `DistillationJob` status: what the operator observed. Written only through the status subresource."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from distillery.api.base import ApiModel
from distillery.api.spec import Placement


class Phase(StrEnum):
    PENDING = "Pending"
    STARTING_TEACHERS = "StartingTeachers"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})
"""The phases of a finished job: once in one, a job stays there (`distillery_operator.jobs.status.terminal_phase`)."""


class _WrittenByRuntime:
    """The marker of `RUNTIME_WRITES`."""


RUNTIME_WRITES = _WrittenByRuntime()
"""Marks a status field (as `Annotated` metadata, which leaves the CRD schema alone) that the runtime
writes and the operator never does: each field has one writer, so neither overwrites the other."""


class ConditionType(StrEnum):
    VALID = "Valid"
    TEACHERS_READY = "TeachersReady"
    TRAINER_READY = "TrainerReady"
    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"
    SPEC_APPLIED = "SpecApplied"
    TEACHER_UNAVAILABLE = "TeacherUnavailable"
    """True while the trainer waits for a teacher that stopped answering (status.teacherOutages)."""
    PODS_SCHEDULED = "PodsScheduled"
    """False while a pod of the starting job is refused by every node (the scheduler's reason in the
    message: an untolerated taint, too few GPUs, a selector no node matches)."""
    OUTPUT_KEPT = "OutputKept"
    """True when the checkpoints and the final model outlive the job (on a claim it does not own); False
    when they go with the job (checkpoint.deleteWithJob) or with its pods (checkpoint.ephemeral)."""
    STORAGE_READY = "StorageReady"
    """True when every PersistentVolumeClaim the job's pods mount exists and allows how they mount it
    (checked before the trainer and the teachers are made); False: a claim is missing (the job waits) or
    its access mode cannot serve the pods (the job is refused)."""


class Condition(ApiModel):
    """A typed condition, as metav1.Condition."""

    type: str
    status: str = Field(pattern="^(True|False|Unknown)$")
    reason: str = Field(min_length=1, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class TeacherStatus(ApiModel):
    """One teacher as the operator sees it."""

    name: str
    placement: Placement
    ready: bool = False
    replicas: int = 0
    ready_replicas: int = 0
    endpoint: str | None = None
    message: str | None = None


class Progress(ApiModel):
    """Training progress, patched into the status by the runtime."""

    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    kl: float | None = None
    tokens_per_second: float | None = None
    eval_accuracy: float | None = None
    updated_at: str | None = None


class CheckpointStatus(ApiModel):
    """The newest complete checkpoint."""

    step: int
    path: str
    time: str | None = None


class ModelStatus(ApiModel):
    """The model a finished run keeps: its last step's model/, published as `final/` beside the step
    folders (never pruned), which `vllm serve` and `from_pretrained` load as is."""

    path: str
    """The folder in the trainer pods (under spec.checkpoint.path, where `claim` is mounted)."""
    claim: str | None = None
    """The PersistentVolumeClaim the folder is on (at `path` relative to spec.checkpoint.path, so
    `pvc://CLAIM/final` for a job's default path); unset when the checkpoints were ephemeral."""
    step: int
    dtype: str
    """The weights' dtype (spec.checkpoint.modelDtype)."""
    time: str | None = None


class TeacherOutage(ApiModel):
    """A teacher the trainer cannot reach, as the runtime reports it while it waits (up to
    spec.teacherOutageTimeoutSeconds)."""

    name: str
    since: str
    """When the trainer's retries for it ran out (RFC 3339)."""
    message: str = ""
    """The last error the trainer saw."""


class StorageStatus(ApiModel):
    """Where the job's checkpoints, metrics (`runs/<job>/`) and final model (`final/`) are written: the
    trainer pods' spec.checkpoint.path, on a claim or (ephemeral) in the pods' own emptyDir."""

    claim: str | None = None
    """The PersistentVolumeClaim mounted at spec.checkpoint.path (spec.checkpoint.pvc, or the one the
    operator made); unset when ephemeral."""
    kept: bool = False
    """The claim outlives the job: `kubectl delete dj` leaves it, and the model on it."""
    ephemeral: bool = False
    """No claim: the output is lost with the trainer's pods."""
    size: str | None = None
    """The operator's claim's storage: its capacity once bound, else what it asks for."""
    phase: str | None = None
    """The operator's claim's phase (Pending, Bound, Lost); unset for a claim the operator does not watch
    (spec.checkpoint.pvc) or has not made yet."""
    message: str | None = None


class Children(ApiModel):
    """Names of the objects the operator created for the job."""

    ray_job: str | None = None
    config_map: str | None = None
    teacher_deployments: list[str] = Field(default_factory=list)
    teacher_services: list[str] = Field(default_factory=list)


# The operator writes every field but those marked RUNTIME_WRITES (the docstring is the CRD's description).
class DistillationJobStatus(ApiModel):
    """The observed state of a job."""

    phase: Phase = Phase.PENDING
    message: str | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    teachers: list[TeacherStatus] = Field(default_factory=list)
    teachers_ready: str | None = None
    """"ready/total" for the printer column."""
    progress: Annotated[Progress | None, RUNTIME_WRITES] = None
    children: Children | None = None
    storage: StorageStatus | None = None
    """Where the output lives (the checkpoint claim, whether it is kept), and the claim's state."""
    start_time: str | None = None
    completion_time: str | None = None
    last_checkpoint: Annotated[CheckpointStatus | None, RUNTIME_WRITES] = None
    model: Annotated[ModelStatus | None, RUNTIME_WRITES] = None
    """Written by the runtime once the run took its last step: where the final model is."""
    teacher_outages: Annotated[list[TeacherOutage], RUNTIME_WRITES] = Field(default_factory=list)
    """Written by the runtime: the teachers it is waiting for now (empty when all answer)."""

    @classmethod
    def operator_fields(cls) -> tuple[str, ...]:
        """The fields the operator writes (Python names, in declaration order): all but the runtime's."""
        return tuple(name for name, f in cls.model_fields.items() if RUNTIME_WRITES not in f.metadata)
