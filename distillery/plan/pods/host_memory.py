"""Host memory of a student worker pod, by phase (pure): what `distillery plan` prints, what `distillery
validate` holds the pool's memory request to, and where the worker pod's default memory comes from.

A GPU pod's host memory is not the GPUs' memory: with a memory limit (KubeRay's advice, or a namespace's
LimitRange) a pod that goes over it is OOM-killed, and without one it is the first evicted under node
pressure. For a worker pod with g trainer ranks (one a GPU) of a job with N ranks, a student of P
parameters (`model_shapes`), the plan counts:

- **runtime**: RUNTIME_GIB_PER_GPU a GPU, always: a trainer rank's process (Python, torch, CUDA's host-side
  context, NCCL's buffers; bench/gpu_scale.py measured 1.9 GiB of peak host memory for a 1.5B rank) and a
  rollout engine's (vLLM's own process, CUDA context, its scheduler), with Ray's worker beside them.
- **load**: with the sharded load (FSDP2 over several ranks, `TrainerSettings.sharded_load`), the rank
  that reads the safetensors files maps them (P x the file's bytes a parameter; the page cache counts
  toward the pod's memory cgroup) and every rank holds one broadcast chunk of LOAD_CHUNK_FRACTION of the
  float32 model. Otherwise every rank builds the whole student in float32 (4P) before sharding it.
- **resident while training**: the offloaded state with cpuOffload (float32 weights, gradients and AdamW's
  moments, 16P/N a rank, PINNED_OVERHEAD more in pinned memory), and each engine asleep on the pod's GPUs
  at sleep level 1 (`rollout/sleep.py`: its weights in host memory, the engine's bytes a parameter): the colocated
  teachers whose shape is known. The rollout engines sleep at level 2 and keep no host copy (the weight
  sync after each wake-up reloads them).
- **checkpoint**: on top of what is resident, master/ and model/ are streamed (`streamed_export`): every
  rank gathers one float32 tensor at a time (the largest: the embedding or an MLP matrix) and rank 0 also
  holds its cast to the kept dtype; without the stream, every rank gathers the whole float32 weights (4P)
  and rank 0 converts them whole (2P). The optimizer state is written in shards (`sharded_checkpoint`,
  nothing gathered) or gathered whole on rank 0 (12P: float32 moments and step counts, `trainer.pt`).
  bench/host_memory.py measures the streamed checkpoint at 0.17 of the float32 model at 2 ranks (the
  whole-gather path: 3.3).

The peak is the largest phase; the worker pod's default memory request and limit are the peak with
HEADROOM on top (`pod_resources`), and a pool whose memory the user sets below the peak is refused,
naming the field and both numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distillery.api.spec import DistillationJobSpec, Precision, Sharding
from distillery.model_shapes import resolve_shape
from distillery.plan.lora import adapter_params
from distillery.plan.pods.quantity import memory_bytes
from distillery.plan.rollout.settings import (
    rollout_engine,
    rollout_replicas,
    rollout_sleep_level,
    trainer_world_size,
)
from distillery.plan.rollout.sleep import SleepLevel
from distillery.plan.teachers.engines import teacher_sleep_level
from distillery.plan.teachers.scoring_engine import scoring_engine
from distillery.plan.training import resolve_training

GIB = 1024**3
RUNTIME_GIB_PER_GPU = 6
LOAD_CHUNK_FRACTION = 1 / 16
"""Of the float32 model, what the sharded load broadcasts at once (`distillery_runtime.training.sharded_load`)."""
FILE_BYTES = 2
"""Bytes a parameter of the student's safetensors files (bfloat16, as models ship)."""
PINNED_OVERHEAD = 1.3
"""Pinned host memory of offloaded state over its size (the allocator's rounding; +28% measured at 1.5B)."""
HEADROOM = 1.15
"""The default memory request over the plan's peak: the phases' transients are estimates."""
OPTIMIZER_GATHER_BYTES = 12
"""Bytes a parameter of AdamW's state gathered whole on rank 0 (two float32 moments and the step)."""
PHASES = ("load", "training", "checkpoint")


@dataclass(frozen=True)
class HostMemoryPlan:
    """Host bytes of one student worker pod in each phase, with what each is made of."""

    gpus: int
    """Trainer ranks (GPUs) of the pod."""
    parts: dict[str, list[tuple[str, int]]]
    """By phase (PHASES): (what, bytes) of the pod, the runtime included."""

    def phase_bytes(self, phase: str) -> int:
        return sum(n for _, n in self.parts[phase])

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=self.phase_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.phase_bytes(self.peak_phase)

    @property
    def default_memory_gib(self) -> int:
        """The worker pod's default memory request and limit."""
        return math.ceil(self.peak_bytes * HEADROOM / GIB)

    def lines(self) -> list[str]:
        """One line a phase for `distillery plan`."""
        out = []
        for phase in PHASES:
            parts = ", ".join(f"{what} {n / GIB:.1f}" for what, n in self.parts[phase] if n)
            peak = " (peak)" if phase == self.peak_phase else ""
            out.append(
                f"host memory per worker pod, {phase}: {self.phase_bytes(phase) / GIB:.1f} GiB{peak} ({parts} GiB)"
            )
        return out


def plan_host_memory(spec: DistillationJobSpec) -> HostMemoryPlan | None:
    """The host-memory plan of a job's student worker pods; None for a CPU-only pool or a student of
    unknown shape (as the GPU memory plan)."""
    pool = spec.student.pool
    gpus = pool.gpus_per_worker
    shape = resolve_shape(spec.student.model)
    if gpus == 0 or shape is None:
        return None
    p, ranks = shape.params, trainer_world_size(spec)
    settings = resolve_training(spec, spec.schedule.steps)
    shards = ranks if settings.sharding == Sharding.FSDP else 1
    runtime = ("runtime", RUNTIME_GIB_PER_GPU * GIB * gpus)

    if settings.sharded_load:
        load = [
            ("the safetensors files mapped by the reading rank", FILE_BYTES * p),
            ("a broadcast chunk a rank", gpus * math.ceil(4 * p * LOAD_CHUNK_FRACTION)),
        ]
    elif settings.lora is not None:  # frozen weights loaded in the compute dtype, put on the adapter
        compute = 4 if spec.student.precision == Precision.FLOAT32 else 2
        load = [("the whole student in its compute dtype a rank (LoRA)", gpus * compute * p)]
    else:
        load = [("the whole float32 student a rank", gpus * 4 * p)]

    resident = []
    if settings.cpu_offload:
        offloaded = gpus * 16 * p // shards
        overhead = PINNED_OVERHEAD if settings.offload_pinned else 1.0
        resident.append(("offloaded state (pinned)", math.ceil(offloaded * overhead)))
    # An engine's weights in the student's precision (a colocated teacher computes in it too).
    engine_bytes = 4 if spec.student.precision == Precision.FLOAT32 else 2
    if rollout_sleep_level(spec, rollout_engine(spec, shape)) == SleepLevel.OFFLOAD_WEIGHTS:
        # Replicas fill the pods' GPUs one tensor-parallel group at a time (Ray packs them in order).
        engines = min(rollout_replicas(spec), max(1, gpus // spec.student.rollout.tensor_parallel))
        resident.append(("rollout engines asleep (weights in host memory)", engines * engine_bytes * p))
    asleep = 0
    for teacher in spec.teachers:
        teacher_shape = resolve_shape(teacher.model)
        level = teacher_sleep_level(spec, teacher, scoring_engine(spec, teacher, local_gpus=None))
        if level == SleepLevel.OFFLOAD_WEIGHTS and teacher_shape is not None:
            asleep += engine_bytes * teacher_shape.params  # every colocated teacher on one pod: the largest
    if asleep:
        resident.append(("colocated teachers asleep (weights in host memory)", asleep))

    if settings.streamed_export:
        largest = shape.hidden * max(shape.vocab, shape.intermediate)
        checkpoint = [
            ("the largest float32 tensor a rank (master/, model/ streamed)", gpus * 4 * largest),
            ("its cast to the kept dtype (rank 0)", 2 * largest),
        ]
    else:
        checkpoint = [
            ("the whole float32 weights a rank (master/, model/)", gpus * 4 * p),
            ("model/ in its kept dtype (rank 0)", 2 * p),
        ]
    if not settings.sharded_checkpoint:
        trained = p if settings.lora is None else adapter_params(shape, settings.lora)
        checkpoint.append(("the whole optimizer state (rank 0)", OPTIMIZER_GATHER_BYTES * trained))

    parts = {
        "load": [runtime, *load],
        "training": [runtime, *resident],
        "checkpoint": [runtime, *resident, *checkpoint],
    }
    return HostMemoryPlan(gpus, parts)


def host_memory_refusal(spec: DistillationJobSpec, plan: HostMemoryPlan) -> tuple[str, str] | None:
    """(field, one line) when the student pool's memory, as the user set it, cannot hold the plan's peak;
    None when it can or the user left it to the plan."""
    resources = spec.student.pool.resources
    for kind, values in (("limits", resources.limits), ("requests", resources.requests)):
        if "memory" not in values:
            continue
        given = memory_bytes(str(values["memory"]))
        if given >= plan.peak_bytes:
            return None
        phase = plan.peak_phase
        parts = ", ".join(f"{what} {n / GIB:.1f}" for what, n in plan.parts[phase] if n)
        field = f"spec.student.pool.resources.{kind}.memory"
        return field, (
            f"{values['memory']} cannot hold a worker pod's {plan.peak_bytes / GIB:.1f} GiB of host memory in "
            f"the {phase} phase ({parts} GiB); ask for at least {plan.default_memory_gib}Gi, or leave it "
            "unset for the plan's default"
        )
    return None
