"""A teacher's engine settings, resolved once (vLLM's `EngineArgs` is the shape; `engine` says whether vLLM
or the transformers forward computes, `scoring_engine`).

One frozen object per teacher; each consumer only translates it: `server_args()` into the flags of our
teacher server (the operator's Deployment, the local launcher, the test launcher), `engine_kwargs()` into
the keyword arguments of an in-process engine (colocated teachers), and scoring clients read its limits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from distillery.api.spec import DistillationJobSpec, Placement, RolloutEngine, Teacher, TeacherEngine
from distillery.plan.data.padding import forward_cost_tokens
from distillery.plan.loss import max_logprobs
from distillery.plan.rollout.settings import sequence_length
from distillery.plan.rollout.sleep import SleepLevel, sleep_level
from distillery.plan.teachers.scoring_engine import scoring_engine, teacher_on_cpu


@dataclass(frozen=True)
class EngineSettings:
    """The settings of one teacher's engine."""

    served_model_name: str
    max_logprobs: int
    """vLLM --max-logprobs: the loss's topK (at least 1: the sampled token's log-prob is always scored)."""
    max_model_len: int
    memory_fraction: float
    """vLLM --gpu-memory-utilization (the GPU budget's share); passed only on a GPU, as on CPU vLLM reads
    it as a fraction of the machine's memory and sizes its KV cache by VLLM_CPU_KVCACHE_SPACE instead."""
    tensor_parallel: int
    dtype: str
    extra_args: tuple[str, ...] = ()
    """Extra server flags, passed as given (a server only: an in-process engine takes no flags)."""
    max_concurrency: int = 32
    """Scoring requests a client keeps in flight per replica."""
    coalesced_in_flight: int = 2
    """Requests of samples scored one by one as they stream out of the rollout that a client keeps out:
    two per replica, so that one is scored while the next is sent; the samples that arrive meanwhile go
    together in the next (`distillery_runtime.teachers.clients.coalesce`)."""
    request_tokens: int = 16384
    """Most tokens (prompt + response, over its samples) in one coalesced scoring request: its answer is
    8 bytes a token and top-k entry, 8 MiB at K=64."""
    enforce_eager: bool = False
    """No CUDA graphs: servers launched on this machine and in-process engines, which start often."""
    on_gpu: bool = True
    """The engine's GPUs, as the spec places it (`server_args` passes GPU flags only there); an in-process
    engine is told the device it found (`engine_kwargs(on_gpu=...)`)."""
    engine: TeacherEngine = TeacherEngine.VLLM
    """vllm, or transformers: the model's forward in a Ray actor of the run (`scoring_engine`); never auto."""
    forward_cost_tokens: int | None = None
    """The transformers forward's samples are grouped by length and cut where a cut saves more padded tokens
    than this (`data.padding.forward_cost_tokens`); None: the fewest forwards. vLLM schedules its own."""
    sleep_level: SleepLevel = SleepLevel.NONE
    """How deep an in-process engine sleeps while the student trains (`sleep.sleep_level`): a colocated
    vLLM teacher on the student's GPUs at level 1 (its weights must survive); NONE for every other."""

    def server_args(self) -> list[str]:
        """The flags of our teacher server (`distillery_runtime.teachers.server`) after its address."""
        memory = ["--gpu-memory-utilization", str(self.memory_fraction)] if self.on_gpu else []
        eager = ["--enforce-eager"] if self.enforce_eager else []
        return [
            "--served-model-name", self.served_model_name,
            "--max-logprobs", str(self.max_logprobs),
            "--max-model-len", str(self.max_model_len),
            "--tensor-parallel-size", str(self.tensor_parallel),
            *memory,
            "--dtype", self.dtype,
            *eager,
            *self.extra_args,
        ]  # fmt: skip

    def engine_kwargs(self, *, on_gpu: bool) -> dict[str, Any]:
        """vLLM `EngineArgs` keyword arguments of an in-process engine beyond the model; `on_gpu`: the
        device the engine found (its memory fraction is only passed there, as in `server_args`)."""
        kwargs: dict[str, Any] = {
            "max_logprobs": self.max_logprobs,
            "max_model_len": self.max_model_len,
            "tensor_parallel_size": self.tensor_parallel,
            "dtype": self.dtype,
            "enforce_eager": self.enforce_eager,
        }
        if on_gpu:
            kwargs["gpu_memory_utilization"] = self.memory_fraction
        return kwargs


def max_model_len(spec: DistillationJobSpec, teacher: Teacher) -> int:
    """The context a teacher needs: the longest prompt, the longest response and one scoring token."""
    return max(teacher.inference.max_model_len or 0, sequence_length(spec))


def served_model_name(teacher: Teacher) -> str:
    """The model name a teacher's server answers to: an external server's own, a shared teacher's its
    DistillationTeacher's name (one server, many jobs, each naming the teacher as it likes), else the
    teacher's name."""
    if teacher.placement == Placement.EXTERNAL:
        return teacher.model
    if teacher.placement == Placement.SHARED and teacher.teacher_ref is not None:
        return teacher.teacher_ref.name
    return teacher.name


def teacher_engine(
    spec: DistillationJobSpec, teacher: Teacher, memory_fraction: float, *, local_gpus: int | None = None
) -> EngineSettings:
    """A teacher's engine settings (`local_gpus`: see `scoring_engine`). A colocated teacher computes in the
    student's precision (each engine resolves `auto` on its own device), eagerly, without tensor parallelism,
    on the student's GPU when the student has one. A transformers forward takes one request at a time: the
    samples that arrive meanwhile join the next (a second one out would only queue behind it)."""
    # A teacher of the student's base computes where the student's rollout does (`student_base`).
    colocated = teacher.placement in (Placement.COLOCATED, Placement.STUDENT)
    engine = scoring_engine(spec, teacher, local_gpus=local_gpus)
    in_flight = 2 * (max(1, teacher.replicas) if teacher.placement == Placement.STANDALONE else 1)
    return EngineSettings(
        served_model_name=served_model_name(teacher),
        max_logprobs=max_logprobs(spec),
        max_model_len=max_model_len(spec, teacher),
        memory_fraction=memory_fraction,
        tensor_parallel=1 if colocated else teacher.pool.tensor_parallel,
        dtype=spec.student.precision.value if colocated else teacher.inference.dtype,
        extra_args=tuple(teacher.inference.extra_args),
        max_concurrency=teacher.max_concurrency,
        coalesced_in_flight=1 if engine == TeacherEngine.TRANSFORMERS else in_flight,
        enforce_eager=colocated,
        on_gpu=(spec.student.pool.gpus_per_worker if colocated else teacher.pool.gpus_per_replica) > 0,
        engine=engine,
        forward_cost_tokens=(
            forward_cost_tokens(on_gpu=not teacher_on_cpu(spec, teacher, local_gpus=local_gpus))
            if engine == TeacherEngine.TRANSFORMERS
            else None
        ),
        sleep_level=teacher_sleep_level(spec, teacher, engine),
    )


def student_base_engine(settings: EngineSettings, rollout: RolloutEngine) -> EngineSettings:
    """The engine settings of a teacher of the student's base (`student_base`): the rollout engine's kind
    (vLLM batches what is in flight; the transformers forward takes one request at a time, the rest joining
    the next), no memory of its own and no sleep of its own (the rollout engine's is its)."""
    engine = TeacherEngine.VLLM if rollout == RolloutEngine.VLLM else TeacherEngine.TRANSFORMERS
    return dataclasses.replace(
        settings,
        engine=engine,
        memory_fraction=0.0,
        coalesced_in_flight=1 if engine == TeacherEngine.TRANSFORMERS else settings.coalesced_in_flight,
        forward_cost_tokens=settings.forward_cost_tokens if engine == TeacherEngine.TRANSFORMERS else None,
    )


def teacher_sleep_level(spec: DistillationJobSpec, teacher: Teacher, engine: TeacherEngine) -> SleepLevel:
    """How deep a teacher's engine sleeps while the student trains (`sleep.sleep_level`): a colocated vLLM
    engine on the student's GPUs keeps its weights in host memory (level 1), as nothing reloads them; every
    other teacher (a server, a transformers forward, anything on CPU) never sleeps."""
    on_student_gpus = teacher.placement == Placement.COLOCATED and spec.student.pool.gpus_per_worker > 0
    return sleep_level(
        sleeps=on_student_gpus and engine == TeacherEngine.VLLM, weights_synced_after_wake=False
    )
