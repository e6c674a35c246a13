"""The `DistillationJob` spec: what a user declares. The single source of truth for the CRD and the runtime.

Every default lives here, once. Field docstrings become the CRD's descriptions and the README's spec
reference, so they are written for the user who reads `kubectl explain`.
"""

from __future__ import annotations

import random
import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from distillery import pvc
from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import (
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_RE,
    LABEL_VALUE_RE,
    MAX_INT,
    MAX_LABEL_VALUE,
    MAX_LIST,
    MAX_LOCATION,
    MAX_MAP,
    MAX_NAME,
    MAX_QUANTITY,
    MAX_ROUTE,
    MAX_ROUTES,
    MAX_ROUTES_IN_ALL,
    MAX_STOP_STRINGS,
    MAX_TOP_K,
    MIN_INT,
    POSITIVE_QUANTITY_RE,
    WHITESPACE,
    FieldName,
    LabelValue,
    Location,
    Name,
    QuantityValue,
    StopString,
    label_keys_rule,
)
from distillery.api.pod import MAX_PULL_SECRETS, POD_SETTINGS_RULES, PodSettings, PullSecretName

# ---------------------------------------------------------------------------------------------- pools


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


# ---------------------------------------------------------------------------------------------- student


class RolloutEngine(StrEnum):
    AUTO = "auto"
    VLLM = "vllm"
    TRANSFORMERS = "transformers"


class Rollout(ApiModel):
    """How the student samples its responses."""

    engine: RolloutEngine = RolloutEngine.AUTO
    """vllm (in-process engine, weights synced after each step) or transformers (a batched decode loop of
    the student's forward, where vLLM is not installed; slower than vLLM on a compiled or larger model).
    auto: vLLM, except for a student on CPU too small for vLLM's fixed cost of a decode step to pay off
    (about 1.5M parameters a token computes; `distillery plan` prints the choice)."""
    temperature: float = Field(default=1.0, gt=0.0, le=10.0)
    """Sampling temperature of the rollout."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold (1 = off)."""
    top_k: int = Field(default=0, ge=-1, le=MAX_TOP_K)
    """Sample among the topK most probable tokens only (0 or -1 = off, as vLLM's top_k)."""
    max_new_tokens: int = Field(default=1024, ge=1, le=131072)
    """Longest response the student samples; one that reaches it is cut (finish reason `length`, counted
    in the step's `rollout/truncated_fraction`). The default suits chat answers; short tasks set less."""
    stop: list[StopString] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    """Strings that end a response (the response keeps the tokens that wrote it), besides the end tokens,
    which are always used: every `eos_token_id` of the student's generation_config.json and its
    tokenizer's end-of-sequence token."""
    samples_per_prompt: int = Field(default=1, ge=1, le=256)
    """Responses sampled per prompt."""
    memory_fraction: float = Field(default=0.5, gt=0.0, le=1.0)
    """Fraction of each GPU's memory the rollout engine may take (vLLM gpu_memory_utilization)."""
    replicas: int | None = Field(default=None, ge=1, le=1024)
    """Data-parallel rollout engines, each a whole copy of the student on tensorParallel of the student's
    GPUs; a step's requests are split among them and one weight sync feeds them all. Unset: one engine per
    tensorParallel GPUs of the student's (every GPU the job holds samples; `distillery plan` prints it),
    one on CPU."""
    tensor_parallel: int = Field(default=1, ge=1, le=8)
    """vLLM engine only. GPUs (on CPU: processes) one rollout replica spans, for a student that does not
    fit one GPU: vLLM's tensor parallelism. Each tensor-parallel rank joins the weight sync itself and
    keeps its shard of every synced tensor."""
    enforce_eager: bool | None = None
    """vLLM engine only. true: run eagerly (no torch.compile, no CUDA graphs): faster start, slower steps.
    false: compile (and capture CUDA graphs on GPU). Unset: compiled on GPU, eager on CPU, where compiling
    costs ~10 s of start-up that small local jobs do not win back."""

    rules = (
        Rule(
            check=lambda r: r.tensor_parallel == 1 or r.engine != RolloutEngine.TRANSFORMERS,
            cel="self.tensorParallel == 1 || self.engine != 'transformers'",
            message="tensorParallel needs engine: vllm or auto (the transformers engine runs on one device)",
            field="tensorParallel",
        ),
    )


class Optimizer(ApiModel):
    """AdamW with linear warmup then cosine decay to minLrRatio x lr."""

    lr: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Peak learning rate."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """Decoupled weight decay (AdamW)."""
    grad_clip: float = Field(default=1.0, ge=0.0)
    """Max global gradient norm (0 = no clipping)."""
    warmup_steps: int = Field(default=0, ge=0, le=MAX_INT)
    """Steps of linear warmup from 0 to lr."""
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """The cosine decay ends at minLrRatio x lr on the last step."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""


class Sharding(StrEnum):
    AUTO = "auto"
    FSDP = "fsdp"
    REPLICATE = "replicate"


class Training(ApiModel):
    """How the student's weights, gradients and optimizer state are laid out over its trainer ranks.

    Each memory feature costs time: leave it unset (or `auto`) and the memory plan turns it on only where
    the job needs it (`distillery.plan.memory_features`; `distillery plan` prints each choice and why).
    A value given here is used as is."""

    sharding: Sharding = Sharding.AUTO
    """fsdp: FSDP2, each decoder layer's float32 weights, gradients and AdamW state sharded over the ranks
    (16 bytes a parameter divided by the ranks); replicate: a full float32 copy on every rank (16 bytes a
    parameter on each), gradients all-reduced; auto: fsdp over more than one rank or where a replica does
    not fit its GPU, replicate otherwise."""
    activation_checkpointing: bool | None = None
    """Recompute each decoder layer in the backward pass instead of keeping its activations (about 30%
    more compute, a layer's activations instead of all of them). Unset: on only where the job does not
    fit its GPUs without it."""
    cpu_offload: bool | None = None
    """fsdp only: keep the sharded float32 weights, gradients and AdamW state in host memory (FSDP2
    CPUOffloadPolicy); the optimizer step runs on the CPU. For students whose state does not fit the GPUs.
    Unset: on only where nothing else makes the job fit."""

    rules = (
        Rule(
            check=lambda t: not t.cpu_offload or t.sharding != Sharding.REPLICATE,
            cel="!has(self.cpuOffload) || !self.cpuOffload || self.sharding != 'replicate'",
            message="cpuOffload needs sharding: fsdp (or auto)",
            field="cpuOffload",
        ),
    )


class Precision(StrEnum):
    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


def pvc_rule(field: str, attr: str, *, optional: bool = False) -> Rule:
    """A `pvc://` location in `field` must name a claim and a path (the operator mounts the claim)."""
    unset = f"!has(self.{field}) || " if optional else ""
    return Rule(
        check=lambda m: pvc.is_valid(getattr(m, attr) or ""),
        cel=f"{unset}!self.{field}.startsWith('{pvc.SCHEME}') || self.{field}.matches('{pvc.PATTERN}')",
        message="a pvc:// location is pvc://CLAIM/PATH, CLAIM a PersistentVolumeClaim of the job's namespace",
        field=field,
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the job's namespace; its value is never copied into any object."""

    name: str = Field(min_length=1, max_length=253)
    """Secret name."""
    key: str = Field(min_length=1, max_length=253)
    """Key inside the Secret."""


class Student(ApiModel):
    """The model being trained."""

    model: Location
    """Hugging Face id, local path, or URI (s3://, gs://, pvc://CLAIM/PATH) of the initial weights."""
    tokenizer: Location | None = None
    """Tokenizer to use instead of the model's own (a location like `model`); the kept model (checkpoints'
    `model/`, `final/`) carries it, chat template included."""
    hf_token_secret: SecretKeyRef | None = None
    """Secret holding a Hugging Face token, exposed to the trainer pods (the Ray head and workers) as
    HF_TOKEN: for a gated or private student or tokenizer on the Hub. It wins over a colocated teacher's
    inference.hfTokenSecret, which the trainer pods otherwise get."""
    precision: Precision = Precision.AUTO
    """auto = bfloat16 where the device supports it, float32 otherwise."""
    rollout: Rollout = Field(default_factory=Rollout)
    optimizer: Optimizer = Field(default_factory=Optimizer)
    training: Training = Field(default_factory=Training)
    pool: StudentPool = Field(default_factory=StudentPool)
    head: StudentHead = Field(default_factory=StudentHead)
    """The Ray head's own resources and placement; unset fields follow `pool`."""

    rules = (
        pvc_rule("model", "model"),
        pvc_rule("tokenizer", "tokenizer", optional=True),
        Rule(
            # Skipped when pool.workers is out of its bounds, which reports it (the server runs every rule;
            # found on the server: workers 0 was reported twice, once on rollout.replicas).
            check=lambda s: (
                s.pool.gpus_per_worker == 0
                or s.pool.workers < 1
                or s.pool.gpus_per_worker % s.rollout.tensor_parallel != 0
                or s.rollout.replicas is None
                or s.rollout.replicas * s.rollout.tensor_parallel <= s.pool.workers * s.pool.gpus_per_worker
            ),
            cel="self.pool.gpusPerWorker == 0 || self.pool.workers < 1 || self.pool.gpusPerWorker % self.rollout.tensorParallel != 0 || !has(self.rollout.replicas) || self.rollout.replicas * self.rollout.tensorParallel <= self.pool.workers * self.pool.gpusPerWorker",
            message="each rollout replica shares rollout.tensorParallel of the student's GPUs: replicas x tensorParallel at most pool.workers x pool.gpusPerWorker",
            field="rollout.replicas",
        ),
        Rule(
            # A replica's tensor-parallel ranks talk over NVLink/PCIe: the GPUs of one worker pod.
            check=lambda s: (
                s.pool.gpus_per_worker == 0 or s.pool.gpus_per_worker % s.rollout.tensor_parallel == 0
            ),
            cel="self.pool.gpusPerWorker == 0 || self.pool.gpusPerWorker % self.rollout.tensorParallel == 0",
            message="a rollout replica's tensor-parallel ranks are GPUs of one worker: a divisor of pool.gpusPerWorker",
            field="rollout.tensorParallel",
        ),
    )


# ---------------------------------------------------------------------------------------------- teachers


class Placement(StrEnum):
    STANDALONE = "standalone"
    COLOCATED = "colocated"
    EXTERNAL = "external"
    SHARED = "shared"


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
    shared: a DistillationTeacher (teacherRef) that serves several jobs."""
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
            check=lambda t: (t.teacher_ref is not None) == (t.placement == Placement.SHARED),
            cel="has(self.teacherRef) == (self.placement == 'shared')",
            message="is required for placement shared and not allowed for the other placements",
            field="teacherRef",
        ),
        pvc_rule("model", "model"),
    )


# ---------------------------------------------------------------------------------------------- data


class DataFormat(StrEnum):
    AUTO = "auto"
    JSONL = "jsonl"
    PARQUET = "parquet"


class OverlongPolicy(StrEnum):
    REJECT = "reject"
    DROP = "drop"
    TRUNCATE = "truncate"


class ChatTemplateUse(StrEnum):
    AUTO = "auto"
    NONE = "none"


HF_DATASETS_SCHEME = "hf://datasets/"
HF_DATASET_RE = "^hf://datasets/[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$"
"""`hf://datasets/ORG/NAME`: the Hub's repository id rules (letters, digits, `-`, `_`, `.`)."""
"""A Hugging Face Hub dataset, `hf://datasets/ORG/NAME`, read through the `datasets` library."""
MAX_SPLIT = 253
MAX_SYSTEM_PROMPT = 65536
MAX_CHAT_KWARG = 1024
"""Longest string value of data.chatTemplateKwargs."""
ChatKwargValue = bool | int | float | Annotated[str, Field(max_length=MAX_CHAT_KWARG)]
"""A chat template variable: a scalar (templates read flags such as enable_thinking and short strings)."""


class DataSource(ApiModel):
    """A dataset: a file or a `datasets.save_to_disk` folder (local path in the runtime image, or URI), or a
    Hugging Face Hub dataset."""

    path: Location
    """Local path (in the image), or URI: pvc://CLAIM/PATH (mounted by the operator), s3://, gs://,
    synthetic://TASK/SPLIT, hf://datasets/ORG/NAME (the Hub, through the `datasets` library). A file is
    .jsonl, a JSON array (.json) or .parquet; a folder is one written by `datasets`' save_to_disk."""
    format: DataFormat = DataFormat.AUTO
    """auto = from the file extension (.jsonl/.json, .parquet)."""
    split: str = Field(default="train", min_length=1, max_length=MAX_SPLIT)
    """hf:// datasets and save_to_disk folders holding several splits: the split to read."""
    subset: Name | None = None
    """hf:// datasets only: the subset (`datasets`' config name), for datasets that have several, e.g.
    `main` of openai/gsm8k."""

    rules = (
        pvc_rule("path", "path"),
        Rule(
            check=lambda s: s.subset is None or s.path.startswith(HF_DATASETS_SCHEME),
            cel=f"!has(self.subset) || self.path.startsWith('{HF_DATASETS_SCHEME}')",
            message=f"applies only to {HF_DATASETS_SCHEME}ORG/NAME paths",
            field="subset",
        ),
        Rule(
            check=lambda s: (
                not s.path.startswith(HF_DATASETS_SCHEME) or re.fullmatch(HF_DATASET_RE, s.path) is not None
            ),
            cel=f"!self.path.startsWith('{HF_DATASETS_SCHEME}') || self.path.matches('{HF_DATASET_RE}')",
            message=f"a Hub dataset is {HF_DATASETS_SCHEME}ORG/NAME",
            field="path",
        ),
    )


class GraderName(StrEnum):
    AUTO = "auto"
    EXACT = "exact"
    GSM8K = "gsm8k"
    MATH = "math"
    REGEX = "regex"
    MODULE = "module"


MAX_PATTERN = 1024
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*"
FUNCTION_RE = f"^{_DOTTED}:{_DOTTED}$"
"""`package.module:function` (the function may be an attribute path, `module:Class.method`)."""


class Grader(ApiModel):
    """How a response is graded against its row's answerField (held-out accuracy, taskRewardCoef's reward)."""

    name: GraderName = GraderName.AUTO
    """auto: a synthetic:// task's own grader, exact otherwise; exact: the whole response equals the answer
    (surrounding whitespace ignored); gsm8k: the number after `####` in the response, else its last number,
    equals the answer's (taken the same way; 1,234 and 72.0 read as numbers); math: the answer and the
    response's \\boxed{} answer (else its last expression) are mathematically equal (math-verify); regex: the
    first group (else the whole match) of `pattern` in the response equals the answer; module: `function`
    decides."""
    pattern: str | None = Field(default=None, min_length=1, max_length=MAX_PATTERN)
    """regex only: a Python regular expression searched for in the response, e.g. `answer: (-?[0-9]+)`."""
    function: str | None = Field(default=None, max_length=MAX_NAME, pattern=FUNCTION_RE)
    """module only: `package.module:function`, importable in the runtime image, called as
    function(response, answer) and returning a bool or a score in [0, 1]."""

    rules = (
        Rule(
            check=lambda g: (g.pattern is not None) == (g.name == GraderName.REGEX),
            cel="has(self.pattern) == (self.name == 'regex')",
            message="is required for name regex and not allowed for the other graders",
            field="pattern",
        ),
        Rule(
            check=lambda g: (g.function is not None) == (g.name == GraderName.MODULE),
            cel="has(self.function) == (self.name == 'module')",
            message="is required for name module and not allowed for the other graders",
            field="function",
        ),
    )


class Data(ApiModel):
    """Prompts, and how each is routed to its teacher."""

    train: DataSource
    """The prompts the student trains on."""
    eval: DataSource | None = None
    """Held-out prompts for evaluation (accuracy: the grader's mean score on answerField)."""
    prompt_field: FieldName = "prompt"
    """Field holding the prompt text: one user turn through the student's chat template (after systemPrompt's
    system turn) when the tokenizer has one, the raw text otherwise or with chatTemplate: none."""
    messages_field: FieldName | None = None
    """Field holding a conversation (a list of {role, content}); when set, it is used instead of promptField.
    Every turn before the last assistant turn is the prompt (system turn and history kept), rendered with
    the student's chat template; that last assistant turn is the row's reference response (the off-policy
    share) and, when the row has no answerField value, its reference answer."""
    response_field: FieldName | None = None
    """Field holding a reference response, used for the off-policy share when onPolicyFraction < 1 (messages
    rows: the last assistant turn, unless this field is set and present)."""
    answer_field: FieldName | None = "answer"
    """Field holding the reference answer that `grader` compares a response with (a number is read as its
    shortest form: 72.0 is "72")."""
    system_prompt: str | None = Field(default=None, min_length=1, max_length=MAX_SYSTEM_PROMPT)
    """A system turn put before every prompt that has none (promptField rows; messages rows without a
    system turn of their own)."""
    chat_template: ChatTemplateUse = ChatTemplateUse.AUTO
    """auto: render prompts with the student tokenizer's chat template when it has one; none: promptField
    text is tokenized as it is (base models)."""
    chat_template_kwargs: dict[str, ChatKwargValue] | None = Field(default=None, max_length=MAX_MAP)
    """Variables passed to every rendering of the chat template, e.g. {enable_thinking: false} for Qwen3
    (teachers score the student's token ids, so they see the same rendering)."""
    grader: Grader = Field(default_factory=Grader)
    route_field: FieldName = "data_source"
    """Field whose value picks the teacher of a sample."""
    max_prompt_tokens: int = Field(default=1024, ge=1, le=1048576)
    """Longest prompt, in student tokens."""
    overlong_prompts: OverlongPolicy = OverlongPolicy.REJECT
    """reject: fail the job naming the rows; drop: skip them (counted, named in the log); truncate: cut the
    last turn's content from its start (raw text: keep the last maxPromptTokens tokens), so the template's
    opening and the assistant header stay (counted)."""

    rules = (
        Rule(
            check=lambda d: d.messages_field is None or d.chat_template != ChatTemplateUse.NONE,
            cel="!has(self.messagesField) || self.chatTemplate != 'none'",
            message="messagesField needs the chat template: leave chatTemplate auto",
            field="chatTemplate",
        ),
        Rule(
            check=lambda d: d.system_prompt is None or d.chat_template != ChatTemplateUse.NONE,
            cel="!has(self.systemPrompt) || self.chatTemplate != 'none'",
            message="a system turn needs the chat template: leave chatTemplate auto",
            field="systemPrompt",
        ),
        Rule(
            # Set at all, even to {}: the CRD sees the map (its values untyped) but cannot count its keys.
            # Unset is None, so that a spec written back (to_yaml_dict) leaves it out.
            check=lambda d: d.chat_template_kwargs is None or d.chat_template != ChatTemplateUse.NONE,
            cel="!has(self.chatTemplateKwargs) || self.chatTemplate != 'none'",
            message="applies to the chat template, which chatTemplate: none turns off",
            field="chatTemplateKwargs",
        ),
        Rule(
            # The CRD keeps these values untyped (a scalar union has no structural schema, and CEL sees no
            # type in an untyped value): the API server accepts any, the operator refuses the job.
            check=lambda d: all(
                not isinstance(v, dict | list) for v in (d.chat_template_kwargs or {}).values()
            ),
            cel=None,
            message=f"values are booleans, numbers or strings of at most {MAX_CHAT_KWARG} characters",
            field="chatTemplateKwargs",
        ),
    )


# ---------------------------------------------------------------------------------------------- loss


class LossMode(StrEnum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"
    ABS = "abs"
    FORWARD_KL_TOPK = "forward_kl_topk"
    REVERSE_KL_TOPK = "reverse_kl_topk"
    JSD = "jsd"


TOPK_MODES = frozenset({LossMode.FORWARD_KL_TOPK, LossMode.REVERSE_KL_TOPK, LossMode.JSD})


class Objective(StrEnum):
    POLICY_GRADIENT = "policy_gradient"
    DIRECT = "direct"


class Reduction(StrEnum):
    TOKEN_MEAN = "token_mean"
    SEQUENCE_MEAN = "sequence_mean"
    SUM = "sum"


class Loss(ApiModel):
    """What the student minimises: a per-token divergence between the student's and the teacher's log-probs
    of the sampled tokens (or of the teacher's top-k), reduced over the batch."""

    mode: LossMode = LossMode.K3
    """k1, k2, k3, abs: sampled-token estimators; forward_kl_topk, reverse_kl_topk, jsd: over teacher top-k."""
    top_k: int = Field(default=0, ge=0, le=1024)
    """Teacher log-probs per position; >= 1 for the top-k modes, 0 = sampled token only."""
    beta: float = Field(default=0.5, ge=0.0, le=1.0)
    """JSD interpolation: 0 = forward KL(teacher||student), 1 = reverse KL(student||teacher)."""
    temperature: float = Field(default=1.0, gt=0.0, le=10.0)
    """Student logits are divided by it before the loss."""
    objective: Objective = Objective.DIRECT
    """direct: back-propagate the loss; policy_gradient: advantage = -loss in a PPO-clipped objective."""
    renormalize: bool = False
    """forward_kl_topk: renormalise the student over the teacher's top-k (ms-swift) instead of full softmax."""
    add_tail: bool = False
    """Top-k modes: add the bucket log(1 - sum exp(top-k)) for the mass outside the top-k (TRL)."""
    loss_max_clamp: float | None = Field(default=None, ge=0.0)
    """Per-token loss clamp; 0 = none. Unset: 10 (verl's), but none for k2: a clamp at c zeroes k2's gradient
    where |s - t| > sqrt(2c), the tokens the teacher rejects (k2 with 10 collapsed on the bundled task)."""
    log_prob_min_clamp: float = Field(default=-10.0, le=0.0)
    """Floor for log-probs entering a loss (0 = none)."""
    clip_ratio_low: float = Field(default=0.2, ge=0.0, le=1.0)
    """PPO clip: the ratio is kept above 1 - clipRatioLow (policy_gradient)."""
    clip_ratio_high: float = Field(default=0.2, ge=0.0, le=10.0)
    """PPO clip: the ratio is kept below 1 + clipRatioHigh (policy_gradient)."""
    reduction: Reduction = Reduction.TOKEN_MEAN
    """token_mean: mean over all response tokens of the batch; sequence_mean: mean of per-sequence means; sum."""
    on_policy_fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    """lambda: probability that a batch is sampled by the student; else dataset responses are used."""
    task_reward_coef: float = Field(default=0.0, ge=0.0)
    """> 0 adds task-reward advantages (data.grader's score on answerField) to the distillation advantages."""

    rules = (
        Rule(
            check=lambda loss: loss.mode not in TOPK_MODES or loss.top_k >= 1,
            cel="!(self.mode in ['forward_kl_topk', 'reverse_kl_topk', 'jsd']) || self.topK >= 1",
            message="must be >= 1 for the top-k modes (forward_kl_topk, reverse_kl_topk, jsd)",
            field="topK",
        ),
        Rule(
            check=lambda loss: not (loss.mode == LossMode.K1 and loss.objective == Objective.DIRECT),
            cel="!(self.mode == 'k1' && self.objective == 'direct')",
            message="k1 needs objective policy_gradient (its direct gradient is not a KL gradient)",
            field="objective",
        ),
        Rule(
            check=lambda loss: loss.objective == Objective.DIRECT or loss.mode not in TOPK_MODES,
            cel="self.objective == 'direct' || !(self.mode in ['forward_kl_topk', 'reverse_kl_topk', 'jsd'])",
            message="policy_gradient applies to the sampled-token modes (k1, k2, k3, abs) only",
            field="objective",
        ),
        Rule(
            check=lambda loss: not loss.add_tail or loss.mode in TOPK_MODES,
            cel="!self.addTail || self.mode in ['forward_kl_topk', 'reverse_kl_topk', 'jsd']",
            message="applies to the top-k modes only",
            field="addTail",
        ),
    )


# ---------------------------------------------------------------------------------------------- schedule


class Schedule(ApiModel):
    """How long and how big each step is."""

    steps: int = Field(default=100, ge=1, le=10_000_000)
    """Optimizer steps of the whole job."""
    prompts_per_step: int = Field(default=32, ge=1, le=1_000_000)
    """Prompts rolled out per step (each gives samplesPerPrompt samples)."""
    micro_batch_size: int = Field(default=8, ge=1, le=100_000)
    """Samples per forward/backward on one rank; gradients accumulate over micro-batches."""
    micro_batch_tokens: int | None = Field(default=None, ge=16, le=1_048_576)
    """Token budget of a micro-batch: samples are packed end to end (no padding, each attends only to
    itself) until the next would exceed it; a longer sample gets a micro-batch of its own. Unset:
    microBatchSize samples, right-padded to the longest."""
    checkpoint_every: int = Field(default=50, ge=0, le=MAX_INT)
    """Steps between checkpoints (0 = only at the end)."""
    eval_every: int = Field(default=0, ge=0, le=MAX_INT)
    """Steps between held-out evaluations (0 = never; needs data.eval)."""
    seed: int = Field(default=0, ge=0, le=MAX_INT)
    """Seed of data order, sampling and initialisation (CPU runs are deterministic)."""
    one_step_off: bool = False
    """Overlap the rollout of step i+1 with training of step i (samples are one policy version stale)."""


# ---------------------------------------------------------------------------------------------- checkpoint


class ResumePolicy(StrEnum):
    AUTO = "auto"
    NEVER = "never"
    REQUIRED = "required"


_NO_OPERATOR_CLAIM = "not with pvc (an existing claim is yours) or ephemeral (no claim)"


def _operator_claim_rule(field: str, attr: str) -> Rule:
    """`field` shapes the claim the operator makes: neither a claim of the user's nor no claim at all."""
    return Rule(
        check=lambda c: getattr(c, attr) is None or (c.pvc is None and not c.ephemeral),
        cel=f"!has(self.{field}) || (!has(self.pvc) && !self.ephemeral)",
        message=f"applies to the claim the operator makes: {_NO_OPERATOR_CLAIM}",
        field=field,
    )


class ModelDtype(StrEnum):
    """The dtype of the kept model's weights (a checkpoint's `model/`, `final/`)."""

    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class Checkpoint(ApiModel):
    """Where checkpoints, the run's metrics and the final model go, and how a restarted job picks them up.

    In a cluster they go to a PersistentVolumeClaim mounted at `path` in the trainer pods: the one `pvc`
    names, else one the operator makes for the job (`<job>-checkpoints`, kept after the job is deleted
    unless `deleteWithJob`), else, with `ephemeral`, the pods' own emptyDir. A local run (`distillery run`)
    writes to its output folder and ignores all four."""

    path: Location = "/checkpoints"
    """Absolute directory inside the trainer pods, where the checkpoint claim is mounted; one sub-directory
    per step, `final/` (the model you keep) and `runs/<job>/` (metrics, report). Object-store URIs are not
    supported."""
    pvc: str | None = Field(default=None, pattern=DNS_LABEL_RE, max_length=MAX_NAME)
    """Your own PersistentVolumeClaim, mounted at `path` in the Ray head and every worker pod (the driver on
    the head finds the checkpoint to resume, rank 0 writes them, every rank loads them): ReadWriteMany,
    unless all the pods share one node. The operator never changes or deletes it. Unset: the operator makes
    a claim for the job (`size`, `storageClassName`, `deleteWithJob`), unless `ephemeral`."""
    size: str | None = Field(default=None, pattern=POSITIVE_QUANTITY_RE, max_length=MAX_QUANTITY)
    """Storage the operator's claim asks for, a Kubernetes quantity (`200Gi`). Unset: estimated from the
    student's parameters, (keep + 1) checkpoints and a copy of the model with 10% headroom (`distillery
    plan` prints it), or 100Gi when the student's shape is unknown."""
    storage_class_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN_RE, max_length=MAX_NAME)
    """StorageClass of the operator's claim; unset: the cluster's default class. It must provide
    ReadWriteMany (NFS, CephFS, EFS, Filestore ...): the Ray head and the workers are pods that may run on
    different nodes."""
    delete_with_job: bool = False
    """The operator's claim is owned by the job, so `kubectl delete dj` deletes it with the model on it.
    Default: kept (no owner), for you to read back and delete (`kubectl delete pvc <job>-checkpoints`); a
    job made again with the same name uses it again."""
    ephemeral: bool = False
    """No claim: checkpoints, metrics and the final model go to the trainer pods' emptyDir and are lost with
    the pods, which KubeRay deletes when the run ends. For tests and throwaway runs."""
    keep: int = Field(default=3, ge=1, le=1000)
    """Complete checkpoints kept; older ones are deleted after a new one is written."""
    resume: ResumePolicy = ResumePolicy.AUTO
    """auto: continue from this job's newest complete checkpoint if any; never: start fresh; required: fail if
    none. A job deleted and made again finds the old one's checkpoints at the same path: auto and never stop
    before the first step, naming them (never deleted); required continues from them."""
    model_dtype: ModelDtype = ModelDtype.BFLOAT16
    """dtype of the weights in each checkpoint's `model/` folder and in `final/`, the model `vllm serve` and
    `from_pretrained` load as is (with the tokenizer the job used and its generation_config.json). Resuming
    reads the exact float32 weights the checkpoint keeps beside it, whatever this is."""

    rules = (
        Rule(
            # It was documented as "(or URI)" and an s3:// path became a local folder named "s3:".
            check=lambda c: c.path.startswith("/"),
            cel="self.path.startsWith('/')",
            message="must be an absolute directory in the trainer pods (a claim is mounted there); "
            "object-store URIs are not supported",
            field="path",
        ),
        # An existing claim is the user's (its size, class and life are theirs); ephemeral has no claim.
        _operator_claim_rule("size", "size"),
        _operator_claim_rule("storageClassName", "storage_class_name"),
        Rule(
            check=lambda c: not c.delete_with_job or (c.pvc is None and not c.ephemeral),
            cel="!self.deleteWithJob || (!has(self.pvc) && !self.ephemeral)",
            message=f"applies to the claim the operator makes: {_NO_OPERATOR_CLAIM}",
            field="deleteWithJob",
        ),
        Rule(
            check=lambda c: not c.ephemeral or c.pvc is None,
            cel="!self.ephemeral || !has(self.pvc)",
            message="ephemeral means no claim at all: not with pvc",
            field="ephemeral",
        ),
    )


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
    """Labels added to every child object (metadata.labels of the job are passed through as well)."""
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
