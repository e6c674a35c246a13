"""The DistillationJob's student (`spec.student`): its model, rollout engine, training layout and optimizer."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from distillery import pvc
from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import (
    MAX_INT,
    MAX_NAME,
    MAX_STOP_STRINGS,
    MAX_TOP_K,
    Location,
    StopString,
)
from distillery.api.pools import StudentHead, StudentPool


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
    the job needs it (`distillery.plan.memory.features`; `distillery plan` prints each choice and why).
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


MAX_LORA_RANK = 512
"""vLLM's largest `max_lora_rank`."""
MAX_LORA_MODULES = 32
LoraModule = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=r"^[A-Za-z0-9_.]+$")]
"""A module name as peft matches it: the last part of a module's path (`q_proj`) or a dotted suffix."""


class Lora(ApiModel):
    """A LoRA adapter trained on the frozen student (peft): only the adapter gets gradients and AdamW
    state, only the adapter is synced to the rollout engines, and each checkpoint keeps the adapter
    (`adapter/`) and the merged model (`model/`)."""

    rank: int = Field(default=16, ge=1, le=MAX_LORA_RANK)
    """The adapter's rank r: each adapted weight W (d_out x d_in) trains B (d_out x r) and A (r x d_in)."""
    alpha: int | None = Field(default=None, ge=1, le=1 << 20)
    """The adapter's scale is alpha / rank. Unset: 2 x rank (a scale of 2)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input in training (never in the rollout)."""
    target_modules: list[LoraModule] | None = Field(default=None, min_length=1, max_length=MAX_LORA_MODULES)
    """The linear layers that get an adapter, by name. Unset: every linear layer of the decoder for the
    architectures Distillery knows (Llama, Qwen2/3, Mistral: q/k/v/o and the MLP's gate/up/down), peft's
    `all-linear` (every linear layer but the output head) otherwise; `distillery plan` prints the choice."""
    modules_to_save: list[LoraModule] = Field(default_factory=list, max_length=MAX_LORA_MODULES)
    """Modules trained whole beside the adapter (e.g. `lm_head`), saved in `adapter/`. vLLM's LoRA loads
    low-rank modules only: with any, the rollout engine is the transformers engine."""

    rules = (
        Rule(
            check=lambda lora: (
                lora.target_modules is None or len(set(lora.target_modules)) == len(lora.target_modules)
            ),
            # A conditional, not `!has(...) || ...`: an evaluator may walk the list on the right of || anyway.
            cel="has(self.targetModules) ? self.targetModules.all(m, self.targetModules.exists_one(n, n == m)) : true",
            message="targetModules names each module once",
            field="targetModules",
        ),
        Rule(
            check=lambda lora: not set(lora.modules_to_save) & set(lora.target_modules or ()),
            cel="has(self.targetModules) && has(self.modulesToSave) ? !self.modulesToSave.exists(m, m in self.targetModules) : true",
            message="a module is either adapted (targetModules) or trained whole (modulesToSave), not both",
            field="modulesToSave",
        ),
    )


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
    lora: Lora | None = None
    """Train a LoRA adapter on the frozen model instead of every weight (unset: full fine-tuning)."""
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
        Rule(
            check=lambda s: (
                s.lora is None or not s.lora.modules_to_save or s.rollout.engine != RolloutEngine.VLLM
            ),
            cel="!has(self.lora) || !has(self.lora.modulesToSave) || size(self.lora.modulesToSave) == 0 || self.rollout.engine != 'vllm'",
            message="vLLM's LoRA loads low-rank modules only: lora.modulesToSave needs rollout.engine transformers or auto",
            field="lora.modulesToSave",
        ),
        Rule(
            check=lambda s: s.lora is None or not s.lora.modules_to_save or s.rollout.tensor_parallel == 1,
            cel="!has(self.lora) || !has(self.lora.modulesToSave) || size(self.lora.modulesToSave) == 0 || self.rollout.tensorParallel == 1",
            message="lora.modulesToSave samples with the transformers engine, on one device: rollout.tensorParallel 1",
            field="lora.modulesToSave",
        ),
    )
