"""The memory plan of a job: per-GPU bytes of the student's training and of what shares its GPUs (pure).

Arithmetic on the model's shape (`model_shapes.py`) and the job's settings, no torch: `distillery
validate` refuses a job whose plan does not fit its GPUs, `distillery plan FILE` prints the table, and
bench/gpu_scale.py sets each prediction beside the peak measured on a GPU.

What a trainer GPU holds (P parameters, N trainer ranks, c = 2 bytes for bfloat16 compute), by phase:
- state: float32 weights (4P), gradients (4P) and AdamW's two moments (8P), divided by N under FSDP2,
  whole on every rank when replicated, in host memory with cpuOffload;
- backward: the weights and AdamW state, the working weights (under FSDP2 the bfloat16 copies of the
  layers being computed: the root's embedding and head, held through forward and backward, two decoder
  layers, the root's bfloat16 gradients and one layer's gradient in flight; replicated with autocast,
  the bfloat16 copy of every weight autocast caches, cP), and the larger of the gradients and the
  activations + logits: gradients fill in as the backward frees activations. Activations of a
  micro-batch of T tokens: per layer and token 20H + 8I + 4 kv_dim + 4 heads + 4 head_dim bytes
  (measured with saved-tensor hooks on Hugging Face's Qwen2 layer, sdpa, bfloat16;
  tests/runtime/test_memory_plan_activations.py keeps it honest); with activation checkpointing each
  layer keeps only its input (2H a token) and one layer is recomputed at a time. Logits: T x V in
  bfloat16 and the float32 student log-probs of the R response positions (the loss works in chunks);
- optimizer step: weights, gradients, AdamW state, and foreach AdamW's whole-size temporary (4P/N;
  the fused kernel, the trainer's choice on a GPU, has none). bench/gpu_scale.py measured this term on
  an H200: 1.5B at 28.8 GiB = 16 bytes a parameter + 4 (foreach);
- rollout: the rollout engine wakes up and takes `rollout.memoryFraction` of the GPU, colocated
  teachers their `inference.memoryFraction`, while the trainer keeps its state; while the trainer
  steps they sleep (vLLM sleep mode frees weights and KV cache, ~1 GiB stays each). Inside its share
  the engine holds its weights, cP split over `rollout.tensorParallel` GPUs, and the KV cache in what
  is left: a share the weights fill leaves no KV cache, and vLLM refuses to start.
Every phase adds 1 GiB of CUDA context.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from distillery.api.spec import RolloutEngine
from distillery.model_shapes import ModelShape, resolve_shape
from distillery.plan.agents.episodes import response_tokens
from distillery.plan.lora import adapter_params, resolve_lora
from distillery.plan.memory.budget import gpu_budget
from distillery.plan.rollout.settings import rollout_engine

GIB = 1024**3
CUDA_CONTEXT_BYTES = 1 * GIB
"""CUDA context, cuBLAS workspace and NCCL buffers of the trainer process (not in torch's counters)."""
SLEEPING_ENGINE_BYTES = 1 * GIB
"""What a vLLM engine in sleep mode (either level, `rollout/sleep.py`) keeps on the GPU: CUDA graphs, its context."""
ADAM_BYTES = 8
MASTER_BYTES = 4


@dataclass(frozen=True)
class TrainingLayout:
    """The settings of a job that the plan depends on, as plain values."""

    shape: ModelShape
    ranks: int
    """Trainer ranks, one per GPU (FSDP2 shards over all of them)."""
    gpu_bytes: int
    sharding: str = "fsdp"
    cpu_offload: bool = False
    activation_checkpointing: bool = True
    micro_batch_tokens: int = 4096
    response_tokens: int = 2048
    """Of the micro-batch's tokens, how many are response positions (their logits enter the loss)."""
    compute_bytes: int = 2
    rollout_fraction: float = 0.0
    """Of each trainer GPU, what the rollout engine takes while it samples (0: no engine there)."""
    rollout_tensor_parallel: int = 1
    """GPUs one rollout engine's weights are split over."""
    teacher_fractions: tuple[float, ...] = ()
    """The same for each colocated teacher."""
    fused_optimizer: bool = True
    """The trainer's AdamW on a GPU is the fused kernel (no whole-size temporary); False: foreach."""
    adapter_params: int = 0
    """A LoRA student's adapter parameters (`plan.lora.adapter_params`); 0: full fine-tuning."""


@dataclass(frozen=True)
class PlanLine:
    name: str
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU bytes of each phase, by part; `peak_bytes` (the largest phase) is what must fit `gpu_bytes`."""

    layout: TrainingLayout
    phases: dict[str, list[PlanLine]] = field(default_factory=dict)
    """`backward` (the loss and the backward pass), `optimizer step`, `rollout` (engines awake)."""
    host_bytes: int = 0
    """Host memory per trainer rank for the offloaded state (cpuOffload)."""

    def phase_bytes(self, phase: str) -> int:
        return sum(line.bytes for line in self.phases.get(phase, []))

    @property
    def trainer_peak_bytes(self) -> int:
        """The trainer's own peak (what torch.cuda.max_memory_allocated measures in the trainer process)."""
        return max(
            sum(line.bytes for line in self.phases[phase] if line.name not in _NOT_TORCH)
            for phase in TRAINING_PHASES
        )

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.phase_bytes(self.peak_phase)

    @property
    def rollout_weight_bytes(self) -> int:
        """Per GPU, the rollout engine's weights (its tensor-parallel shard); 0 without an engine."""
        layout = self.layout
        if layout.rollout_fraction <= 0:
            return 0
        return layout.compute_bytes * layout.shape.params // layout.rollout_tensor_parallel

    @property
    def rollout_share_bytes(self) -> int:
        return int(self.layout.rollout_fraction * self.layout.gpu_bytes)

    @property
    def rollout_fits(self) -> bool:
        """The engine's weights leave room for a KV cache in its share of the GPU."""
        return self.rollout_weight_bytes < self.rollout_share_bytes or not self.rollout_weight_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.layout.gpu_bytes and self.rollout_fits

    @property
    def refused_field(self) -> str:
        """The field a refusal is reported on: the GPUs' memory, or the rollout engine's parallelism."""
        if self.peak_bytes > self.layout.gpu_bytes or self.rollout_fits:
            return "spec.student.pool.gpuMemoryGiB"
        return "spec.student.rollout.tensorParallel"

    def table(self) -> str:
        """The plan as a text table, GiB per GPU."""
        rows = [f"{'phase / part':<36}{'GiB':>8}  note"]
        for phase, lines in self.phases.items():
            rows.append(f"{phase}")
            rows += [f"  {line.name:<34}{line.bytes / GIB:>8.2f}  {line.note}" for line in lines]
            rows.append(f"  {'= total':<34}{self.phase_bytes(phase) / GIB:>8.2f}")
        verdict = "fits" if self.fits else "does NOT fit"
        rows.append(
            f"peak {self.peak_bytes / GIB:.2f} GiB ({self.peak_phase}) of {self.layout.gpu_bytes / GIB:.0f} GiB "
            f"per GPU: {verdict}"
        )
        if self.rollout_weight_bytes:
            room = "leaves room for" if self.rollout_fits else "leaves NO room for"
            rows.append(
                f"rollout engine: weights {self.rollout_weight_bytes / GIB:.2f} GiB per GPU "
                f"(tensorParallel {self.layout.rollout_tensor_parallel}) of its {self.rollout_share_bytes / GIB:.2f} "
                f"GiB share: {room} its KV cache"
            )
        if self.host_bytes:
            rows.append(f"host memory per trainer rank (offloaded state): {self.host_bytes / GIB:.2f} GiB")
        return "\n".join(rows)


TRAINING_PHASES = ("backward", "optimizer step")
_NOT_TORCH = frozenset({"CUDA context", "sleeping engines"})


def layer_activation_bytes_per_token(shape: ModelShape, compute_bytes: int = 2) -> int:
    """Bytes a decoder layer keeps for its backward, per token (bfloat16; see the module docstring)."""
    per_element = (
        20 * shape.hidden
        + 8 * shape.intermediate
        + 4 * shape.kv_dim
        + 4 * shape.heads
        + 4 * shape.dim_per_head
    )
    return per_element * compute_bytes // 2


def plan_memory(layout: TrainingLayout) -> MemoryPlan:
    """The per-GPU memory of one trainer rank and of the engines beside it."""
    if layout.adapter_params:
        return _plan_lora(layout)
    shape, n, c = layout.shape, layout.ranks, layout.compute_bytes
    p = shape.params
    fsdp = layout.sharding == "fsdp"
    shards = n if fsdp else 1
    on_gpu = not (fsdp and layout.cpu_offload)
    where = "" if on_gpu else "in host memory (cpuOffload)"
    split = f"/ {n} ranks" if fsdp else "full copy per rank"
    weights = PlanLine("weights (float32)", MASTER_BYTES * p // shards if on_gpu else 0, where or split)
    grads_bytes = MASTER_BYTES * p // shards if on_gpu else 0
    grads = PlanLine("gradients (float32)", grads_bytes, where or split)
    adam = PlanLine("AdamW state", ADAM_BYTES * p // shards if on_gpu else 0, where or split)
    if fsdp:
        layer, root = shape.layer_params, shape.embedding_params
        working = c * (root + 2 * layer) + c * root + (c + 4) * layer
        if not on_gpu:
            working += MASTER_BYTES * 2 * layer  # the float32 shards copied in before the all-gather
        working_note = "bf16 root + 2 layers, root grads, a layer's grads"
    else:
        working = c * p
        working_note = "autocast's bf16 weight copies"
    context = _context(layout)
    # The gradients fill in as the backward frees the activations: its peak is the larger of the two.
    activations = _activations(layout)
    backward = [
        weights,
        adam,
        PlanLine("working weights", working, working_note),
        dataclasses.replace(
            activations, name="activations + logits, or grads", bytes=max(activations.bytes, grads_bytes)
        ),
        *context,
    ]
    # foreach AdamW makes a whole-size temporary (sqrt of the second moment); the fused kernel none.
    temporary = 0 if layout.fused_optimizer or not on_gpu else MASTER_BYTES * p // shards
    step = [
        weights,
        grads,
        adam,
        PlanLine(
            "optimizer temporaries", temporary, "fused AdamW: none" if not temporary else "foreach AdamW"
        ),
        *context,
    ]
    host = 0 if on_gpu else (MASTER_BYTES * 2 + ADAM_BYTES) * p // shards
    rollout = _rollout_phase(layout, weights.bytes + grads.bytes + adam.bytes)
    return MemoryPlan(layout, {"backward": backward, "optimizer step": step, "rollout": rollout}, host)


def _context(layout: TrainingLayout) -> list[PlanLine]:
    """The CUDA context, and the engines asleep beside the trainer."""
    engines = (1 if layout.rollout_fraction > 0 else 0) + len(layout.teacher_fractions)
    context = [PlanLine("CUDA context", CUDA_CONTEXT_BYTES)]
    if engines:
        context.append(PlanLine("sleeping engines", engines * SLEEPING_ENGINE_BYTES, f"{engines} asleep"))
    return context


def _activations(layout: TrainingLayout) -> PlanLine:
    """A micro-batch's activations and logits at the backward's start."""
    shape, c = layout.shape, layout.compute_bytes
    t, r, v = layout.micro_batch_tokens, layout.response_tokens, shape.vocab
    per_layer = layer_activation_bytes_per_token(shape, c)
    if layout.activation_checkpointing:
        activations = shape.layers * t * c * shape.hidden + t * per_layer
        note = f"{shape.layers} layer inputs + 1 layer recomputed, {t} tokens"
    else:
        activations = shape.layers * t * per_layer
        note = f"{shape.layers} layers, {t} tokens"
    # The logits (bf16) and the student's float32 log-probs at the response positions; the loss itself
    # works in chunks of tokens (losses/terms/chunked.py), so nothing else of vocabulary size stays.
    logits = c * t * v + 4 * r * v
    return PlanLine("activations + logits", activations + logits, f"{note}; {t} x {v} logits, {r} scored")


def _rollout_phase(layout: TrainingLayout, trainer_state: int) -> list[PlanLine]:
    """The trainer's state beside the engines, awake in their shares."""
    rollout = [PlanLine("trainer state", trainer_state + CUDA_CONTEXT_BYTES)]
    if layout.rollout_fraction > 0:
        rollout.append(
            PlanLine(
                "rollout engine",
                int(layout.rollout_fraction * layout.gpu_bytes),
                f"rollout.memoryFraction {layout.rollout_fraction}",
            )
        )
    for i, fraction in enumerate(layout.teacher_fractions):
        rollout.append(
            PlanLine(f"colocated teacher {i + 1}", int(fraction * layout.gpu_bytes), f"{fraction}")
        )
    return rollout


def _plan_lora(layout: TrainingLayout) -> MemoryPlan:
    """A LoRA student: the frozen weights in the compute dtype (no float32 master, gradient or AdamW state
    for them), the adapter's float32 weights, gradients and AdamW state; activations as full training's
    (the backward still runs through every layer to reach the adapters below)."""
    shape, n, c, a = layout.shape, layout.ranks, layout.compute_bytes, layout.adapter_params
    fsdp = layout.sharding == "fsdp"
    shards = n if fsdp else 1
    on_gpu = not (fsdp and layout.cpu_offload)
    split = "" if on_gpu else "in host memory (cpuOffload)"
    split = split or (f"/ {n} ranks" if fsdp else "full copy per rank")
    frozen = PlanLine("frozen weights (compute dtype)", c * shape.params // shards if on_gpu else 0, split)
    adapter = PlanLine("adapter weights (float32)", MASTER_BYTES * a // shards if on_gpu else 0, split)
    grads = PlanLine("adapter gradients (float32)", MASTER_BYTES * a // shards if on_gpu else 0, split)
    adam = PlanLine("adapter AdamW state", ADAM_BYTES * a // shards if on_gpu else 0, split)
    if fsdp:
        # The gathered root and two layers in the compute dtype; no gradient of a frozen weight.
        working = PlanLine(
            "working weights", c * (shape.embedding_params + 2 * shape.layer_params), "root + 2 layers"
        )
    else:
        working = PlanLine("working weights", c * a, "autocast's copies of the adapter")
    context = _context(layout)
    activations = _activations(layout)
    backward = [frozen, adapter, adam, working, activations, grads, *context]
    step = [frozen, adapter, grads, adam, *context]
    host = 0 if on_gpu else (c * shape.params + (MASTER_BYTES * 2 + ADAM_BYTES) * a) // shards
    rollout = _rollout_phase(layout, frozen.bytes + adapter.bytes + grads.bytes + adam.bytes)
    return MemoryPlan(layout, {"backward": backward, "optimizer step": step, "rollout": rollout}, host)


# ------------------------------------------------------------------------------------------ from a job's spec


def base_layout(spec: Any) -> TrainingLayout | None:
    """The layout of a DistillationJobSpec with every memory feature off (replicated, no activation
    checkpointing, no offload: `memory_features` decides them); None for a CPU job or a student of unknown
    shape."""
    pool = spec.student.pool
    if pool.gpus_per_worker == 0:
        return None
    shape = resolve_shape(spec.student.model)
    if shape is None:
        return None
    # An episode's response is its turns and observations together (plan.episodes), not one turn.
    sequence = spec.data.max_prompt_tokens + response_tokens(spec)
    tokens = spec.schedule.micro_batch_tokens or spec.schedule.micro_batch_size * sequence
    response = tokens * response_tokens(spec) // sequence
    colocated = [t for t in spec.teachers if t.placement == "colocated"]
    budget = gpu_budget(spec)
    lora = resolve_lora(spec)
    return TrainingLayout(
        shape=shape,
        ranks=pool.workers * pool.gpus_per_worker,
        gpu_bytes=int(pool.gpu_memory_gib * GIB),
        sharding="replicate",
        cpu_offload=False,
        activation_checkpointing=False,
        micro_batch_tokens=tokens,
        response_tokens=response,
        compute_bytes=4 if spec.student.precision == "float32" else 2,
        rollout_fraction=spec.student.rollout.memory_fraction
        if rollout_engine(spec, shape) == RolloutEngine.VLLM
        else 0.0,
        rollout_tensor_parallel=spec.student.rollout.tensor_parallel,
        teacher_fractions=tuple(budget.teacher_fractions[t.name] for t in colocated),
        adapter_params=adapter_params(shape, lora) if lora is not None else 0,
    )


def refusal(plan: MemoryPlan) -> str | None:
    """One line saying why a plan does not fit and which fields to change; None when it fits."""
    if plan.fits:
        return None
    layout = plan.layout
    if plan.refused_field == "spec.student.rollout.tensorParallel":
        return (
            f"the rollout engine's weights take {plan.rollout_weight_bytes / GIB:.1f} GiB per GPU over "
            f"{layout.rollout_tensor_parallel} GPU(s) and its share (rollout.memoryFraction "
            f"{layout.rollout_fraction:g} of {layout.gpu_bytes / GIB:g} GiB) is {plan.rollout_share_bytes / GIB:.1f} "
            "GiB, with no room for its KV cache; use a higher student.rollout.tensorParallel or "
            "student.rollout.memoryFraction"
        )
    gib = layout.gpu_bytes / GIB
    phase = plan.peak_phase
    parts = ", ".join(f"{line.name} {line.bytes / GIB:.1f}" for line in plan.phases[phase] if line.bytes)
    fixes = [f"more student.pool.workers x gpusPerWorker (now {layout.ranks} rank(s))"]
    if layout.sharding != "fsdp":
        fixes.append("student.training.sharding: fsdp")
    elif not layout.cpu_offload:
        fixes.append("student.training.cpuOffload: true")
    if phase == "backward":  # the activations and logits count only there
        if not layout.activation_checkpointing:
            fixes.append("student.training.activationCheckpointing: true")
        fixes.append("a smaller schedule.microBatchTokens / microBatchSize")
    trainer_state = plan.phases["rollout"][0].bytes
    if phase == "rollout" and trainer_state < layout.gpu_bytes:
        # Only where the trainer's own state leaves room for the engines is a smaller share of any use.
        fixes = ["a lower student.rollout.memoryFraction or teachers' inference.memoryFraction", *fixes]
    return (
        f"the student needs {plan.peak_bytes / GIB:.1f} GiB per GPU in the {phase} phase ({parts} GiB) and "
        f"student.pool.gpuMemoryGiB is {gib:g}; use {', or '.join(fixes)}"
    )
