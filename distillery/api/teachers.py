"""The DistillationJob's teachers (`spec.teachers`): where each runs, its engine and inference settings, and
how the runtime reaches one served elsewhere."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import (
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_RE,
    MAX_INT,
    MAX_LOCATION,
    MAX_NAME,
    MAX_ROUTE,
    MAX_ROUTES,
    WHITESPACE,
    Location,
)
from distillery.api.data import MAX_SYSTEM_PROMPT
from distillery.api.pools import TeacherPool
from distillery.api.student import SecretKeyRef, pvc_rule


class Placement(StrEnum):
    STANDALONE = "standalone"
    COLOCATED = "colocated"
    EXTERNAL = "external"
    SHARED = "shared"
    STUDENT = "student"
    """The LoRA student's own frozen base model, scored by the student's rollout engine with the adapter off:
    no engine, GPU share or copy of the weights of its own (self-distillation; context distillation with
    `systemPrompt`)."""


SERVED_ELSEWHERE = frozenset({Placement.EXTERNAL, Placement.SHARED})
"""The placements whose server is not the job's: it loads nothing of theirs and makes no pods for them."""


class TeacherEngine(StrEnum):
    AUTO = "auto"
    VLLM = "vllm"
    TRANSFORMERS = "transformers"


class Inference(ApiModel):
    """How a teacher computes its log-probs: the engine, and vLLM's settings."""

    engine: TeacherEngine = TeacherEngine.AUTO
    """auto: vLLM wherever the teacher has GPUs or a server of its own; the model's transformers forward in
    the job's own processes where it computes on the student's CPU cores (a colocated teacher of a CPU
    student, a standalone teacher of a CPU `distillery run`), where vLLM's scoring costs more than the
    forward. vllm: always vLLM. transformers: colocated teachers only (it runs in the job's processes).
    `distillery plan` prints the choice."""
    max_model_len: int | None = Field(default=None, ge=16, le=MAX_INT)
    """Context length; default: maxPromptTokens + maxNewTokens + 1, the least that scoring needs."""
    memory_fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    """vLLM --gpu-memory-utilization. Standalone: of each of the teacher's GPUs (default 0.9). Colocated: of
    each student GPU, shared with the rollout engine, which is awake at the same time (default: what
    student.rollout.memoryFraction leaves below 0.9, split among the colocated teachers that set none)."""
    dtype: str = Field(default="auto", min_length=1, max_length=32)
    """vLLM --dtype."""
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=256)
    """Extra `vllm serve` arguments, passed as given."""
    hf_token_secret: SecretKeyRef | None = None
    """Secret holding a Hugging Face token, exposed to vLLM as HF_TOKEN."""


class TeacherRef(ApiModel):
    """A DistillationTeacher of the job's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=DNS_SUBDOMAIN_RE)]
    """The DistillationTeacher's metadata.name."""


SECRET_KEY_RE = r"^[-._a-zA-Z0-9]+$"
"""A key of a Secret's or ConfigMap's data (what the API server allows in a volume's `items`)."""


class CaBundle(ApiModel):
    """PEM certificates of the certificate authorities an https:// teacher's certificate must chain to, from
    a Secret or a ConfigMap of the job's namespace (cert-manager's `ca.crt`, a trust-manager bundle): for a
    server behind a private CA. Without one, the system's public CAs are trusted."""

    secret_name: str | None = Field(default=None, min_length=1, max_length=253)
    """A Secret holding the bundle."""
    config_map_name: str | None = Field(default=None, min_length=1, max_length=253)
    """A ConfigMap holding the bundle."""
    key: str = Field(default="ca.crt", min_length=1, max_length=253, pattern=SECRET_KEY_RE)
    """The bundle's key in that Secret or ConfigMap."""

    rules = (
        Rule(
            check=lambda b: (b.secret_name is None) != (b.config_map_name is None),
            cel="has(self.secretName) != has(self.configMapName)",
            message="names exactly one of secretName or configMapName",
        ),
    )


class ExternalAccess(ApiModel):
    """What it takes to talk to an external teacher besides its URL: the CA its certificate chains to and
    its API key. The trainer and the operator's health checks use both alike."""

    ca_bundle: CaBundle | None = None
    """The CAs to check an https:// endpoint's certificate against (default: the system's public CAs). The
    certificate is always checked, against the endpoint's host name."""
    api_key_secret: SecretKeyRef | None = None
    """A Secret holding the server's API key, sent as `Authorization: Bearer KEY` by the trainer and by the
    operator's health checks. The key is never copied into an object, the status, an Event or a log: the
    trainer pods read it from the Secret (an environment variable), the operator through the API."""


class Teacher(ApiModel):
    """A model whose log-probs the student learns from."""

    name: Annotated[str, Field(min_length=1, max_length=40, pattern=DNS_LABEL_RE)]
    """Unique within the job; a DNS label (it names the teacher's Deployment and Service)."""
    model: Location
    """Hugging Face id, local path or URI (s3://, gs://, pvc://CLAIM/PATH); for external teachers, the served
    model name; for shared teachers, the DistillationTeacher's model."""
    placement: Placement = Placement.STANDALONE
    """standalone: own GPU pool run by the operator; colocated: on the student's GPUs; external: a URL;
    shared: a DistillationTeacher (teacherRef) that serves several jobs; student: a LoRA student's own base
    model (`model` is student.model), scored by the student's rollout engine with the adapter off, nothing
    loaded twice."""
    endpoint: str | None = Field(
        default=None, pattern=f"^https?://[^{WHITESPACE}/]+(/[^{WHITESPACE}]*)?$", max_length=MAX_LOCATION
    )
    """Base URL of an OpenAI-compatible server (external teachers only); https:// is checked against the
    host name's certificate (external.caBundle for a private CA)."""
    external: ExternalAccess | None = None
    """TLS and authentication of the endpoint (external teachers only)."""
    teacher_ref: TeacherRef | None = None
    """The DistillationTeacher that serves this teacher (shared teachers only)."""
    routes: list[Annotated[str, Field(min_length=1, max_length=MAX_ROUTE)]] = Field(
        default_factory=list, max_length=MAX_ROUTES
    )
    """Values of data.routeField whose samples this teacher scores (at most 64; a default teacher takes the
    rest)."""
    default: bool = False
    """Scores every sample whose route no teacher lists."""
    replicas: int = Field(default=1, ge=0, le=256)
    """vLLM replicas (standalone teachers only)."""
    pool: TeacherPool = Field(default_factory=TeacherPool)
    inference: Inference = Field(default_factory=Inference)
    max_concurrency: int = Field(default=32, ge=1, le=4096)
    """Scoring requests in flight per replica."""
    system_prompt: str | None = Field(default=None, min_length=1, max_length=MAX_SYSTEM_PROMPT)
    """Context distillation: a system turn this teacher sees before each prompt and the student does not (put
    before the prompt's own system turn, if any, with a blank line between). The student learns to answer
    without it as the teacher answers with it. The teacher's prompt must fit data.maxPromptTokens too
    (data.overlongPrompts applies to it)."""

    rules = (
        Rule(
            check=lambda t: (t.endpoint is not None) == (t.placement == Placement.EXTERNAL),
            cel="has(self.endpoint) == (self.placement == 'external')",
            message="is required for placement external and not allowed for the other placements",
            field="endpoint",
        ),
        Rule(
            check=lambda t: t.external is None or t.placement == Placement.EXTERNAL,
            cel="!has(self.external) || self.placement == 'external'",
            message="is for placement external (the operator serves its other teachers itself)",
            field="external",
        ),
        Rule(
            # Plain http has no certificate to check: a bundle there would be ignored without a word.
            check=lambda t: (
                t.external is None
                or t.external.ca_bundle is None
                or (t.endpoint or "").startswith("https://")
            ),
            cel="!has(self.external) || !has(self.external.caBundle) || "
            "(has(self.endpoint) && self.endpoint.startsWith('https://'))",
            message="checks a TLS certificate: the endpoint must be https://",
            field="external.caBundle",
        ),
        Rule(
            check=lambda t: (
                t.inference.engine != TeacherEngine.TRANSFORMERS or t.placement == Placement.COLOCATED
            ),
            cel="!has(self.inference) || !has(self.inference.engine) || self.inference.engine != 'transformers' "
            "|| self.placement == 'colocated'",
            message="transformers is for placement colocated (it runs in the job's own processes); a served "
            "teacher runs vLLM",
            field="inference.engine",
        ),
        Rule(
            check=lambda t: t.placement != Placement.STUDENT or t.inference.engine == TeacherEngine.AUTO,
            cel="self.placement != 'student' || !has(self.inference) || !has(self.inference.engine) "
            "|| self.inference.engine == 'auto'",
            message="placement student is scored by the student's rollout engine: leave it auto",
            field="inference.engine",
        ),
        Rule(
            check=lambda t: (t.teacher_ref is not None) == (t.placement == Placement.SHARED),
            cel="has(self.teacherRef) == (self.placement == 'shared')",
            message="is required for placement shared and not allowed for the other placements",
            field="teacherRef",
        ),
        pvc_rule("model", "model"),
    )
