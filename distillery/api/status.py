"""The `DistillationJob` status: what the operator observed. Written only through the status subresource."""

from __future__ import annotations

from enum import StrEnum

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


class TeacherOutage(ApiModel):
    """A teacher the trainer cannot reach, as the runtime reports it while it waits (up to
    spec.teacherOutageTimeoutSeconds)."""

    name: str
    since: str
    """When the trainer's retries for it ran out (RFC 3339)."""
    message: str = ""
    """The last error the trainer saw."""


class Children(ApiModel):
    """Names of the objects the operator created for the job."""

    ray_job: str | None = None
    config_map: str | None = None
    teacher_deployments: list[str] = Field(default_factory=list)
    teacher_services: list[str] = Field(default_factory=list)


class DistillationJobStatus(ApiModel):
    """The observed state of a job."""

    phase: Phase = Phase.PENDING
    message: str | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    teachers: list[TeacherStatus] = Field(default_factory=list)
    teachers_ready: str | None = None
    """"ready/total" for the printer column."""
    progress: Progress | None = None
    children: Children | None = None
    start_time: str | None = None
    completion_time: str | None = None
    last_checkpoint: CheckpointStatus | None = None
    teacher_outages: list[TeacherOutage] = Field(default_factory=list)
    """Written by the runtime: the teachers it is waiting for now (empty when all answer)."""
