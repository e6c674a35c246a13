"""The `DistillationJob` spec: what a user declares. The single source of truth for the CRD and the runtime.

Every default lives here, once. Field docstrings become the CRD's descriptions and the README's spec
reference, so they are written for the user who reads `kubectl explain`.

The sections of the spec live in their own modules (`pools`, `student`, `teachers`, `data`, `loss`,
`schedule`, `checkpoint`); this one holds the job itself (`DistillationJobSpec`, `DistillationJob`) and
names every section's models too, so `from distillery.api.spec import X` reads any of them.
"""

from __future__ import annotations

import random
import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import (
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_RE,
    LABEL_VALUE_RE,
    MAX_INT,
    MAX_LABEL_VALUE,
    MAX_MAP,
    MAX_NAME,
    MAX_QUANTITY,
    MAX_ROUTES_IN_ALL,
    POSITIVE_QUANTITY_RE,
    LabelValue,
    Location,
    Name,
    label_keys_rule,
)
from distillery.api.checkpoint import (
    Checkpoint,
    ModelDtype,
    ResumePolicy,
)
from distillery.api.data import (
    FUNCTION_RE,
    HF_DATASET_RE,
    HF_DATASETS_SCHEME,
    MAX_CHAT_KWARG,
    MAX_PATTERN,
    MAX_SPLIT,
    MAX_SYSTEM_PROMPT,
    ChatKwargValue,
    ChatTemplateUse,
    Data,
    DataFormat,
    DataSource,
    Grader,
    GraderName,
    OverlongPolicy,
)
from distillery.api.environment import Environment, ToolCallFormat
from distillery.api.labels import reserved_labels_rule
from distillery.api.loss import (
    TOPK_MODES,
    Loss,
    LossMode,
    Objective,
    Reduction,
)
from distillery.api.pod import MAX_PULL_SECRETS, PullSecretName
from distillery.api.pools import (
    Resources,
    StudentHead,
    StudentPool,
    TeacherPool,
    Toleration,
)
from distillery.api.schedule import (
    Schedule,
)
from distillery.api.student import (
    Lora,
    Optimizer,
    Precision,
    Rollout,
    RolloutEngine,
    SecretKeyRef,
    Sharding,
    Student,
    Training,
    pvc_rule,
)
from distillery.api.teachers import (
    SECRET_KEY_RE,
    SERVED_ELSEWHERE,
    CaBundle,
    ExternalAccess,
    Inference,
    Placement,
    Teacher,
    TeacherEngine,
    TeacherRef,
)

__all__ = [
    "API_VERSION",
    "COLOCATED_MEMORY_CEILING",
    "COLOCATED_MEMORY_LIMIT",
    "FUNCTION_RE",
    "GENERATED_SUFFIX",
    "GROUP",
    "HF_DATASETS_SCHEME",
    "HF_DATASET_RE",
    "KIND",
    "MAX_ANNOTATIONS_BYTES",
    "MAX_CHAT_KWARG",
    "MAX_PATTERN",
    "MAX_SPLIT",
    "MAX_SYSTEM_PROMPT",
    "MIN_DEFAULT_FRACTION",
    "PLURAL",
    "SECRET_KEY_RE",
    "SERVED_ELSEWHERE",
    "STANDALONE_MEMORY_FRACTION",
    "TOPK_MODES",
    "VERSION",
    "AnnotationKey",
    "CaBundle",
    "ChatKwargValue",
    "ChatTemplateUse",
    "Checkpoint",
    "Data",
    "DataFormat",
    "DataSource",
    "DistillationJob",
    "DistillationJobSpec",
    "Environment",
    "ExternalAccess",
    "Grader",
    "GraderName",
    "Inference",
    "LabelKey",
    "Lora",
    "Loss",
    "LossMode",
    "MetadataLabelValue",
    "ModelCache",
    "ModelDtype",
    "ObjectMeta",
    "Objective",
    "Optimizer",
    "OverlongPolicy",
    "Placement",
    "Precision",
    "RayAuth",
    "Reduction",
    "Resources",
    "ResumePolicy",
    "Rollout",
    "RolloutEngine",
    "Schedule",
    "SecretKeyRef",
    "Sharding",
    "Student",
    "StudentHead",
    "StudentPool",
    "Teacher",
    "TeacherEngine",
    "TeacherPool",
    "TeacherRef",
    "Toleration",
    "ToolCallFormat",
    "Training",
    "pvc_rule",
]


# ---------------------------------------------------------------------------------------------- job


_ROUTES_IN_ALL_CEL = "self.teachers.map(t, has(t.routes) ? t.routes.size() : 0).sum()"

STANDALONE_MEMORY_FRACTION = 0.9
"""A standalone teacher's share of its own GPUs when it sets none (vLLM's default)."""
COLOCATED_MEMORY_CEILING = 0.9
"""What the rollout engine and colocated teachers that set no fraction may take of a student GPU together."""
COLOCATED_MEMORY_LIMIT = 0.95
"""What they may take at most when every fraction is set: the trainer's weights and state stay on the GPU."""
MIN_DEFAULT_FRACTION = 0.05
"""The least share a colocated teacher without a fraction may be given."""


class ModelCache(ApiModel):
    """Where the pods keep what they download from the Hugging Face Hub (their `HF_HOME`), so that a
    restarted container finds the weights instead of downloading them again (a 32B teacher is ~65 GB,
    longer than a startup probe waits). Unset: each pod that downloads a model (a Hub id; `pvc://` and
    local folders are not downloaded) gets an emptyDir sized for what it downloads (`distillery plan`
    prints it), with an `ephemeral-storage` request of that size, so the scheduler places it where the
    disk is and the kubelet does not evict it for using it."""

    pvc: str | None = Field(default=None, pattern=DNS_LABEL_RE, max_length=MAX_NAME)
    """A claim of the job's namespace shared by every pod (teachers, Ray head and workers) as their
    `HF_HOME`: weights downloaded once for every job that names it, and kept across pods. ReadWriteMany,
    unless all the pods share one node."""
    size_limit: str | None = Field(default=None, pattern=POSITIVE_QUANTITY_RE, max_length=MAX_QUANTITY)
    """The emptyDir's size in each pod (`sizeLimit` and the `ephemeral-storage` request), instead of the
    plan's estimate; set, every pod (teachers, Ray head and workers) gets one, even a pod whose models
    are all on claims."""
    enabled: bool = True
    """false: no cache volume; downloads go to the container's own filesystem (lost at every restart)."""

    rules = (
        Rule(
            check=lambda c: c.pvc is None or c.size_limit is None,
            cel="!has(self.pvc) || !has(self.sizeLimit)",
            message="sizeLimit sizes the pods' own emptyDir; a claim has its own size",
            field="sizeLimit",
        ),
        Rule(
            check=lambda c: c.enabled or (c.pvc is None and c.size_limit is None),
            cel="self.enabled || (!has(self.pvc) && !has(self.sizeLimit))",
            message="a disabled cache has no claim or size",
            field="enabled",
        ),
    )


class RayAuth(StrEnum):
    """Ray's token authentication of the trainer's cluster (KubeRay `authOptions.mode`)."""

    TOKEN = "token"
    DISABLED = "disabled"


class DistillationJobSpec(ApiModel):
    """A distillation job: a student, its teachers, the data, the loss and the schedule."""

    student: Student
    teachers: list[Teacher] = Field(min_length=1, max_length=32)
    """One or more teachers; with several, each sample goes to the teacher of its route."""
    data: Data
    environment: Environment | None = None
    """What answers the student's tool calls: each rollout becomes a multi-turn episode
    (docs/guide/agents.md). Unset: one response per prompt."""
    loss: Loss = Field(default_factory=Loss)
    schedule: Schedule = Field(default_factory=Schedule)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    model_cache: ModelCache = Field(default_factory=ModelCache)
    image: Location = "ghcr.io/distillery-ai/distillery-runtime:0.1.0"
    """Runtime image of the Ray head and workers (and standalone teachers)."""
    service_account_name: Name | None = None
    """Service account of the trainer pods; needs the distillery-runtime Role for status updates."""
    suspend: bool = False
    """Suspended jobs hold no pods (Kueue sets and clears it)."""
    active_deadline_seconds: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Wall-clock limit of the trainer (RayJob activeDeadlineSeconds)."""
    backoff_limit: int = Field(default=0, ge=0, le=100)
    """Retries of the trainer (each resumes from the newest checkpoint)."""
    teacher_ready_timeout_seconds: int = Field(default=1800, ge=1, le=MAX_INT)
    """How long the trainer waits for its teachers before it fails."""
    teacher_outage_timeout_seconds: int = Field(default=1800, ge=0, le=MAX_INT)
    """How long the trainer waits for a teacher that stops answering mid-run (scoring pauses; scored
    samples and finished steps are kept) before it saves a checkpoint and fails; 0 = fail at once."""
    termination_grace_period_seconds: int = Field(default=600, ge=30, le=MAX_INT)
    """How long a stopping trainer (its pods deleted or evicted) has to finish its step and save a
    checkpoint: the Ray pods' terminationGracePeriodSeconds (the head's preStop hook stops the driver)."""
    labels: dict[str, LabelValue] = Field(default_factory=dict, max_length=MAX_MAP)
    """Labels added to every child object (metadata.labels of the job are passed through as well); not
    the reserved distillery.io/*, ray.io/*, app.kubernetes.io/created-by|managed-by (`distillery.api.labels`:
    in metadata.labels the operator drops them)."""
    image_pull_secrets: list[PullSecretName] = Field(default_factory=list, max_length=MAX_PULL_SECRETS)
    """Secrets (of the job's namespace) to pull the images of every pod with, after the cluster's own
    (the chart's `imagePullSecrets`)."""
    ray_auth: RayAuth | None = None
    """Ray's token authentication of the trainer's cluster: its dashboard, Jobs API and GCS answer only
    requests carrying the cluster's token (KubeRay makes it, in a Secret of the RayCluster's). Unset: the
    platform's choice (the chart's `rayAuth`, token unless changed); `disabled` opts this job out (a Ray
    or KubeRay too old for it, docs/security.md)."""

    rules = (
        label_keys_rule("labels", "labels"),
        reserved_labels_rule("labels", "labels"),
        Rule(
            check=lambda s: len({t.name for t in s.teachers}) == len(s.teachers),
            cel="self.teachers.all(t, self.teachers.exists_one(u, u.name == t.name))",
            message="teacher names must be unique",
            field="teachers",
            cel_reason="FieldValueDuplicate",
        ),
        Rule(
            check=lambda s: sum(t.default for t in s.teachers) <= 1,
            cel="self.teachers.filter(t, has(t.default) && t.default).size() <= 1",
            message="at most one teacher may be the default",
            field="teachers",
        ),
        Rule(
            check=lambda s: len(s.teachers) == 1 or all(t.routes or t.default for t in s.teachers),
            cel="self.teachers.size() == 1 || self.teachers.all(t, (has(t.routes) && t.routes.size() > 0) || (has(t.default) && t.default))",
            message="with several teachers each needs routes or default: true",
            field="teachers",
        ),
        Rule(
            check=lambda s: _routes_in_all(s.teachers) <= MAX_ROUTES_IN_ALL,
            cel=f"{_ROUTES_IN_ALL_CEL} <= {MAX_ROUTES_IN_ALL}",
            message=f"at most {MAX_ROUTES_IN_ALL} route values in all teachers together",
            field="teachers",
        ),
        Rule(
            # Skipped over the bound above, which reports it: its cost grows with the square of the routes.
            check=lambda s: _routes_in_all(s.teachers) > MAX_ROUTES_IN_ALL or _routes_unique(s.teachers),
            cel=f"{_ROUTES_IN_ALL_CEL} > {MAX_ROUTES_IN_ALL} || self.teachers.all(t, !has(t.routes) || t.routes.all(r, self.teachers.filter(u, has(u.routes) && r in u.routes).size() == 1))",
            message="a route value may be listed by one teacher only",
            field="teachers",
            cel_reason="FieldValueDuplicate",
        ),
        Rule(
            check=lambda s: (
                s.student.pool.gpus_per_worker > 0
                or all(t.placement != Placement.COLOCATED for t in s.teachers)
                or all(
                    t.pool.gpus_per_replica == 0 for t in s.teachers if t.placement == Placement.STANDALONE
                )
            ),
            cel="self.student.pool.gpusPerWorker > 0 || self.teachers.all(t, t.placement != 'colocated') || self.teachers.all(t, t.placement != 'standalone' || t.pool.gpusPerReplica == 0)",
            message="a colocated teacher runs on the student's GPUs: student.pool.gpusPerWorker must be >= 1 when the job uses GPUs",
            field="teachers",
        ),
        Rule(
            check=lambda s: _colocated_memory_fits(s),
            cel=(
                "!self.teachers.exists(t, t.placement == 'colocated') || (self.student.rollout.memoryFraction"
                " + self.teachers.filter(t, t.placement == 'colocated' && has(t.inference.memoryFraction))"
                ".map(t, t.inference.memoryFraction).sum()"
                f" + {MIN_DEFAULT_FRACTION} * double(self.teachers.filter(t, t.placement == 'colocated'"
                " && !has(t.inference.memoryFraction)).size())"
                " <= (self.teachers.exists(t, t.placement == 'colocated' && !has(t.inference.memoryFraction))"
                f" ? {COLOCATED_MEMORY_CEILING} : {COLOCATED_MEMORY_LIMIT}))"
            ),
            message=(
                "the rollout engine and colocated teachers are awake together on the student's GPUs: "
                "student.rollout.memoryFraction plus the colocated teachers' inference.memoryFraction must be "
                f"<= {COLOCATED_MEMORY_LIMIT}, or <= {COLOCATED_MEMORY_CEILING} with {MIN_DEFAULT_FRACTION} left "
                "for each colocated teacher that sets none (the trainer keeps its weights on the GPU too)"
            ),
            field="teachers",
        ),
        Rule(
            # A fully trained student has no frozen base left to score with once its first step lands.
            check=lambda s: (
                s.student.lora is not None or all(t.placement != Placement.STUDENT for t in s.teachers)
            ),
            cel="has(self.student.lora) || self.teachers.all(t, t.placement != 'student')",
            message="placement student scores with the student's frozen base model: it needs student.lora "
            "(a fully trained student's weights change; use placement colocated to load the base again)",
            field="teachers",
        ),
        Rule(
            check=lambda s: all(
                t.model == s.student.model for t in s.teachers if t.placement == Placement.STUDENT
            ),
            cel="self.teachers.all(t, t.placement != 'student' || t.model == self.student.model)",
            message="a teacher of placement student is the student's base model: its model must be student.model",
            field="teachers",
        ),
        Rule(
            check=lambda s: (
                s.data.chat_template != ChatTemplateUse.NONE
                or all(t.system_prompt is None for t in s.teachers)
            ),
            cel="self.data.chatTemplate != 'none' || self.teachers.all(t, !has(t.systemPrompt))",
            message="a teacher's systemPrompt is a system turn, which needs the chat template: leave "
            "data.chatTemplate auto",
            field="teachers",
        ),
        Rule(
            # A retry is a new head pod: checkpoints anywhere but on a claim went with the old one, and the
            # retry would start again from step 0 while the job said it resumes.
            check=lambda s: s.backoff_limit == 0 or not s.checkpoint.ephemeral,
            cel="self.backoffLimit == 0 || !self.checkpoint.ephemeral",
            message=(
                "backoffLimit > 0 promises retries that resume from the newest checkpoint: unset "
                "checkpoint.ephemeral (checkpoints in a pod's own emptyDir are gone when a retry starts a new pod)"
            ),
            field="backoffLimit",
        ),
        Rule(
            check=lambda s: s.schedule.eval_every == 0 or s.data.eval is not None,
            cel="self.schedule.evalEvery == 0 || has(self.data.eval)",
            message="evalEvery > 0 needs data.eval",
            field="schedule.evalEvery",
        ),
        Rule(
            check=lambda s: (
                s.loss.on_policy_fraction == 1.0
                or s.data.response_field is not None
                or s.data.messages_field is not None
            ),
            cel="self.loss.onPolicyFraction == 1.0 || has(self.data.responseField) || has(self.data.messagesField)",
            message="onPolicyFraction < 1 needs data.responseField or data.messagesField (the off-policy responses)",
            field="loss.onPolicyFraction",
        ),
        Rule(
            # A dataset response is one text: nothing in it says which tokens a tool wrote, so an off-policy
            # batch would train the student to write its tools' output.
            check=lambda s: s.environment is None or s.loss.on_policy_fraction == 1.0,
            cel="!has(self.environment) || self.loss.onPolicyFraction == 1.0",
            message="an environment's episodes train on-policy only: onPolicyFraction must be 1 (a dataset response marks no tool output)",
            field="loss.onPolicyFraction",
        ),
        Rule(
            check=lambda s: (
                s.schedule.micro_batch_size
                <= s.schedule.prompts_per_step * s.student.rollout.samples_per_prompt
            ),
            cel="self.schedule.microBatchSize <= self.schedule.promptsPerStep * self.student.rollout.samplesPerPrompt",
            message="must not exceed promptsPerStep x samplesPerPrompt (the samples of one step)",
            field="schedule.microBatchSize",
        ),
    )

    def loaded_models(self) -> list[str]:
        """The model and tokenizer locations the trainer's processes load (external and shared teachers are
        served elsewhere and load nothing here)."""
        models = [
            self.student.model,
            *(t.model for t in self.teachers if t.placement not in SERVED_ELSEWHERE),
        ]
        return [*models, self.student.tokenizer] if self.student.tokenizer else models


def _colocated_fractions(s: DistillationJobSpec) -> tuple[float, int]:
    """(rollout fraction + the colocated teachers' set fractions, number of colocated teachers with none)."""
    colocated = [t for t in s.teachers if t.placement == Placement.COLOCATED]
    taken = s.student.rollout.memory_fraction + sum(
        t.inference.memory_fraction for t in colocated if t.inference.memory_fraction is not None
    )
    return taken, sum(t.inference.memory_fraction is None for t in colocated)


def _colocated_memory_fits(s: DistillationJobSpec) -> bool:
    if all(t.placement != Placement.COLOCATED for t in s.teachers):
        return True
    taken, unset = _colocated_fractions(s)
    if unset:
        return taken + MIN_DEFAULT_FRACTION * unset <= COLOCATED_MEMORY_CEILING
    return taken <= COLOCATED_MEMORY_LIMIT


def _routes_unique(teachers: list[Teacher]) -> bool:
    """No route value listed by two teachers (one teacher may repeat its own, as the CEL rule counts
    teachers)."""
    seen: set[str] = set()
    for teacher in teachers:
        mine = set(teacher.routes)
        if mine & seen:
            return False
        seen |= mine
    return True


def _routes_in_all(teachers: list[Teacher]) -> int:
    return sum(len(t.routes) for t in teachers)


def _qualified_name(key: str) -> str:
    """A label or annotation key as the API server checks it: [DNS-subdomain prefix/]name, name <= 63."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > MAX_NAME or not re.fullmatch(DNS_SUBDOMAIN_RE, prefix)):
        raise ValueError("the prefix of a key must be a DNS subdomain (lowercase, '-', '.'; <= 253)")
    if not re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", name) or len(name) > MAX_LABEL_VALUE:
        raise ValueError(
            "a key's name must be <= 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
        )
    return key


LabelKey = Annotated[str, AfterValidator(_qualified_name)]


def _annotation_key(key: str) -> str:
    """Annotation keys are checked lowercased (their prefix may have capitals)."""
    _qualified_name(key.lower())
    return key


AnnotationKey = Annotated[str, AfterValidator(_annotation_key)]
MetadataLabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE, pattern=LABEL_VALUE_RE)]
MAX_ANNOTATIONS_BYTES = 256 * 1024
GENERATED_SUFFIX = 5
"""Random characters the API server appends to metadata.generateName."""


class ObjectMeta(ApiModel):
    """The parts of Kubernetes metadata that Distillery reads, checked as the API server checks them; the
    other ObjectMeta fields are accepted as they are, unknown ones refused (strict field validation)."""

    name: str = Field(min_length=1, max_length=MAX_NAME, pattern=DNS_SUBDOMAIN_RE)
    generate_name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)
    namespace: str | None = Field(default=None, max_length=MAX_LABEL_VALUE, pattern=DNS_LABEL_RE)
    labels: dict[LabelKey, MetadataLabelValue] = Field(default_factory=dict)
    annotations: dict[AnnotationKey, str] = Field(default_factory=dict)
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    self_link: str | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None
    owner_references: list[dict[str, Any]] | None = None
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _generated_name(cls, data: Any) -> Any:
        """With generateName and no name, the server makes the name: the prefix and 5 random characters."""
        if isinstance(data, dict) and "name" not in data and isinstance(data.get("generateName"), str):
            prefix = data["generateName"][: MAX_NAME - GENERATED_SUFFIX]
            suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=GENERATED_SUFFIX))
            return {**data, "name": prefix + suffix}
        return data

    @field_validator("annotations")
    @classmethod
    def _annotations_size(cls, value: dict[str, str]) -> dict[str, str]:
        size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
        if size > MAX_ANNOTATIONS_BYTES:
            raise ValueError(f"annotations may hold at most {MAX_ANNOTATIONS_BYTES} bytes, got {size}")
        return value


GROUP = "distillery.io"
VERSION = "v1alpha1"
KIND = "DistillationJob"
PLURAL = "distillationjobs"
API_VERSION = f"{GROUP}/{VERSION}"


class DistillationJob(ApiModel):
    """A whole manifest: apiVersion, kind, metadata and spec (status is the operator's)."""

    api_version: str = Field(default=API_VERSION, pattern=re.escape(API_VERSION) + "$")
    kind: str = Field(default=KIND, pattern=f"^{KIND}$")
    metadata: ObjectMeta
    spec: DistillationJobSpec
    status: dict[str, Any] | None = None
    """Written by the operator; accepted so that `kubectl get -o yaml` output validates again."""
