"""Where the student's rollout engine runs: a process of its own, or the trainer's (sampling with the
trainer's module, and scoring the teachers computed on the same cores); and the rollout line of
`distillery plan`.

Apart from `rollout/settings.py` because the choice reads the trainer's settings, which are resolved from the memory
plan, which reads the rollout's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from distillery.api.spec import DistillationJobSpec, Precision, RolloutEngine, Sharding, TeacherEngine
from distillery.model_shapes import ModelShape
from distillery.plan.attention import decode_attention
from distillery.plan.rollout.settings import (
    CPU_ONE_THREAD_DECODE_MAX_TOKEN_PARAMS,
    CPU_SMALL_DECODE_THREADS,
    decode_threads,
    lora_needs_transformers,
    rollout_engine,
    rollout_replicas,
    trainer_world_size,
)
from distillery.plan.teachers.engines import EngineSettings
from distillery.plan.training import TrainerSettings, resolve_training


def rollout_in_trainer(spec: DistillationJobSpec, engine: RolloutEngine, trainer: TrainerSettings) -> bool:
    """Whether the one rollout engine samples with the trainer's own model, in the trainer's process.

    Where the student trains on CPU as one float32 replica and the transformers engine samples it, a
    separate engine process only costs: a second copy of the weights, a weight sync every step, and a
    process switch at each phase on the same few cores. The trainer's module samples as it is (in eval
    mode, without gradients), so the engine is always at the trainer's version. Not with a one-step-off
    rollout, which samples with the weights of the step before while the trainer changes them; not where
    the engine's weights would differ from the trainer's (bfloat16 rollout weights against float32
    masters, FSDP2 shards, offloaded parameters); and not with several engines or trainer ranks."""
    return (
        engine == RolloutEngine.TRANSFORMERS
        and spec.student.pool.gpus_per_worker == 0
        and trainer_world_size(spec) == 1
        and rollout_replicas(spec) == 1
        and spec.student.rollout.tensor_parallel == 1
        and not spec.schedule.one_step_off
        and spec.student.precision != Precision.BFLOAT16
        and trainer.sharding == Sharding.REPLICATE
        and not trainer.cpu_offload
    )


def teachers_in_trainer(
    in_trainer: bool, engines: Mapping[str, EngineSettings], student_base: frozenset[str] = frozenset()
) -> frozenset[str]:
    """The teachers scored in the trainer's process too: where the rollout runs there (`in_trainer`), every
    teacher the plan scores with its transformers forward (`scoring_engine`: on the student's CPU cores),
    those of the student's base (`student_base`: the trainer's model with the adapter off) among them.
    Their scoring already waits for the rollout's end on those cores (`scoring_overlap`), so the phases run
    one after the other in any case; in one process they do so without a process switch, a Ray worker of
    their own or the data crossing between processes."""
    if not in_trainer:
        return frozenset()
    return frozenset(
        name for name, engine in engines.items() if engine.engine == TeacherEngine.TRANSFORMERS
    ) | frozenset(student_base)


def teachers_in_rollout(in_trainer: bool, student_base: frozenset[str]) -> frozenset[str]:
    """The teachers scored by rollout replica 0's engine, the adapter off: those of the student's base
    (`student_base`) where the engine has a process of its own."""
    return frozenset() if in_trainer else frozenset(student_base)


def trainer_computes_alone(in_trainer: bool, hosted: frozenset[str], on_this_host: Iterable[str]) -> bool:
    """Whether the trainer's process is the only one of a local run that computes on its host: the rollout
    samples there (`in_trainer`), and every teacher that computes on the host (`on_this_host`:
    `teachers.scoring_overlap.teachers_scoring_after_rollout`; external and shared teachers compute elsewhere) is
    scored there (`hosted`: `teachers_in_trainer`). Its OpenMP threads then keep libgomp's spin
    (`env.threads.lone_process_env`)."""
    return in_trainer and set(on_this_host) <= hosted


def rollout_line(spec: DistillationJobSpec, student: ModelShape | None) -> str:
    """The rollout engines and why, for `distillery plan` (`student`: the student's shape where known)."""
    rollout, pool = spec.student.rollout, spec.student.pool
    engine = rollout_engine(spec, student)
    replicas = rollout_replicas(spec)
    shares = rollout_in_trainer(spec, RolloutEngine.TRANSFORMERS, resolve_training(spec, spec.schedule.steps))
    in_trainer = "in the trainer's process with its own model (auto: one float32 CPU replica; no weight sync)"
    if rollout.engine != RolloutEngine.AUTO:
        engine_why = "student.rollout.engine"
    elif lora_needs_transformers(spec):
        engine_why = "auto: lora.modulesToSave, which vLLM's LoRA cannot load"
    elif engine == RolloutEngine.TRANSFORMERS and student is not None:
        engine_why = f"auto: a student of {student.token_params / 1e6:.1f}M parameters a token on CPU"
    elif pool.gpus_per_worker == 0 and rollout.tensor_parallel == 1 and student is None:
        # The plan is made without the student's files (a URI, a hub id): the run decides once it has them.
        return (
            f"rollout: {replicas} engine(s) x tensorParallel {rollout.tensor_parallel} (auto: one on CPU), "
            "transformers if the student computes at most 1.5M parameters a token, else vllm (auto: read from "
            "its config.json when the run starts)"
            + (f"; transformers {in_trainer}" if shares else "")
            + f"; transformers decodes with {decode_attention(spec, RolloutEngine.TRANSFORMERS)} attention (auto: "
            f"on CPU), on {CPU_SMALL_DECODE_THREADS} thread for a student of at most "
            f"{CPU_ONE_THREAD_DECODE_MAX_TOKEN_PARAMS / 1e6:.1f}M"
        )
    else:
        engine_why = "auto"
    if rollout.replicas is not None:
        why = "student.rollout.replicas"
    elif pool.gpus_per_worker == 0:
        why = "auto: one on CPU"
    else:
        why = f"auto: one per {rollout.tensor_parallel} of the student's {pool.workers * pool.gpus_per_worker} GPUs"
    where = f", {in_trainer}" if shares and engine == RolloutEngine.TRANSFORMERS else ""
    decode = decode_attention(spec, engine)
    threads = decode_threads(spec, engine, student)
    on_threads = f" on {threads} thread" if threads else ""
    small = f", a student of at most {CPU_ONE_THREAD_DECODE_MAX_TOKEN_PARAMS / 1e6:.1f}M" if threads else ""
    kernel = f"; decode steps with {decode} attention{on_threads} (auto: on CPU{small})" if decode else ""
    return (
        f"rollout: {replicas} {engine} engine(s) ({engine_why}) x tensorParallel {rollout.tensor_parallel} "
        f"({why}){where}{kernel}"
    )
