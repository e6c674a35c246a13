"""The student's training settings, resolved: what a trainer rank needs, derived from the spec once.

`resolve_training` is the one place where the spec's optimizer, schedule, layout, precision and loss become
the TrainerSettings that every trainer rank reads. The defaults of a TrainerSettings built directly (tests,
benchmarks) are the trainer's plain ones: one replicated float32 copy, no checkpointing, no offload.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distillery.api.spec import DistillationJobSpec, Precision, Sharding
from distillery.plan.attention import eager_attention_width
from distillery.plan.data.padding import trainer_forward_cost
from distillery.plan.lora import LoraSettings, resolve_lora
from distillery.plan.loss import LossConfig, resolve_loss
from distillery.plan.memory.features import resolve_memory_features
from distillery.plan.rollout.settings import trainer_world_size


@dataclass(frozen=True)
class TrainerSettings:
    """What a rank needs to know to train."""

    lr: float
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_ratio: float = 0.0
    micro_batch_size: int = 8
    precision: Precision = Precision.AUTO
    """auto is resolved by each rank on its own device (trainer.resolve_precision)."""
    seed: int = 0
    loss: LossConfig = field(default_factory=LossConfig)
    sharding: Sharding = Sharding.REPLICATE
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    offload_pinned: bool = True
    """Offloaded state in pinned host memory (fast copies; the pinned allocator rounds blocks up, so it
    takes more host memory: +28% measured at 1.5B)."""
    micro_batch_tokens: int | None = None
    """Token budget of a packed micro-batch; None: micro_batch_size samples, padded."""
    sharded_load: bool = False
    """Build the student on the meta device on every rank and fill each rank's FSDP2 shards from rank 0's
    reading of the safetensors files (`distillery_runtime.training.sharded_load`): no rank holds a whole float32
    copy. False: every rank runs from_pretrained on the whole model, then shards it."""
    sharded_checkpoint: bool = False
    """Each rank saves its own shards of the optimizer state (torch.distributed.checkpoint, resumable onto
    another number of ranks) instead of rank 0 gathering the whole state into trainer.pt."""
    streamed_export: bool = False
    """Write a checkpoint's master/ and model/ weights a tensor at a time, gathered from the shards and
    appended to safetensors shard files by rank 0 (`distillery_runtime.checkpoints.streamed_export`): no rank holds the
    whole state dict. False: every rank gathers the whole float32 state dict, rank 0 save_pretrained's it."""
    eager_attention_width: int = 0
    """Micro-batches of up to this many tokens a row train with eager attention, wider ones with the model's
    own kernel (`attention.eager_attention_width`); 0: always the model's own."""
    lora: LoraSettings | None = None
    """Train a LoRA adapter on the frozen student (`plan.lora`); None: every weight."""
    forward_cost_tokens: int | None = None
    """Padded micro-batches: at most micro_batch_size samples each, sorted by length and cut where a cut saves
    more padded tokens than this (`data.padding.trainer_forward_cost`); None: the fewest micro-batches."""


def resolve_training(spec: DistillationJobSpec, total_steps: int) -> TrainerSettings:
    """The trainer settings of a spec, for a run of `total_steps` optimizer steps (the schedule's steps,
    unless a local run stops earlier): the learning-rate schedule spans the steps the run takes."""
    opt = spec.student.optimizer
    features = resolve_memory_features(spec)
    lora = resolve_lora(spec)
    # A LoRA student loads its frozen weights whole on every rank, in the compute dtype, and is put on the
    # adapter before it is sharded: the meta-device load names the checkpoint's tensors, not peft's.
    sharded = sharded_state(features.sharding, trainer_world_size(spec)) and lora is None
    return TrainerSettings(
        lr=opt.lr,
        weight_decay=opt.weight_decay,
        betas=opt.betas,
        grad_clip=opt.grad_clip,
        warmup_steps=opt.warmup_steps,
        total_steps=total_steps,
        min_lr_ratio=opt.min_lr_ratio,
        micro_batch_size=spec.schedule.micro_batch_size,
        precision=spec.student.precision,
        seed=spec.schedule.seed,
        loss=resolve_loss(spec.loss),
        sharding=features.sharding,
        activation_checkpointing=features.activation_checkpointing,
        cpu_offload=features.cpu_offload,
        micro_batch_tokens=spec.schedule.micro_batch_tokens,
        sharded_load=sharded,
        sharded_checkpoint=sharded and checkpoint_root_shared(spec),
        # Every layout: a replicated or single rank also writes without a whole cast copy of the model.
        streamed_export=True,
        eager_attention_width=eager_attention_width(spec),
        forward_cost_tokens=trainer_forward_cost(spec, features.sharding),
        lora=lora,
    )


def checkpoint_root_shared(spec: DistillationJobSpec) -> bool:
    """Whether every trainer rank sees the same checkpoint folder, as optimizer shards written by each rank
    need. A claim (the user's or the operator's, ReadWriteMany) and a local run's folder are; with
    `checkpoint.ephemeral` each worker pod has its own emptyDir, shared only when one pod holds every rank."""
    return not spec.checkpoint.ephemeral or spec.student.pool.workers == 1


def sharded_state(sharding: Sharding, ranks: int) -> bool:
    """Load onto the shards from rank 0, and checkpoint the optimizer in shards, where the state is
    sharded: FSDP2 over several ranks. A world of one holds the whole model anyway, and the replicated
    layout a whole copy per rank."""
    return sharding == Sharding.FSDP and ranks > 1
