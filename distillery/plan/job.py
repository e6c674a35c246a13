"""`resolve(spec) -> JobPlan`: every setting of a job derived from its spec once, typed and immutable.

The operator and the runtime each resolve the spec they hold (the plan is not serialised: the ConfigMap
carries the spec). Each field comes from one function of its own module.
"""

from __future__ import annotations

from dataclasses import dataclass

from distillery.api.spec import DistillationJobSpec
from distillery.model_shapes import ModelShape
from distillery.plan.checkpoints.export import ExportSettings, resolve_export
from distillery.plan.data.prompts import PromptPlan, resolve_prompts
from distillery.plan.grader import GraderPlan, resolve_grader
from distillery.plan.loss import LossConfig, max_logprobs
from distillery.plan.memory.budget import GpuBudget, gpu_budget
from distillery.plan.placement.gpus import GpuPlacement, plan_gpu_placement
from distillery.plan.placement.rollout import (
    rollout_in_trainer,
    teachers_in_rollout,
    teachers_in_trainer,
    trainer_computes_alone,
)
from distillery.plan.rollout.settings import (
    RolloutSettings,
    resolve_rollout,
    rollout_engine,
    trainer_world_size,
)
from distillery.plan.rollout.student_base import student_base_teachers
from distillery.plan.teachers.engines import EngineSettings, student_base_engine, teacher_engine
from distillery.plan.teachers.routes import RouteTable, route_table
from distillery.plan.teachers.scoring_overlap import teachers_scoring_after_rollout
from distillery.plan.training import TrainerSettings, resolve_training


@dataclass(frozen=True)
class JobPlan:
    """The resolved plan of one job."""

    engines: dict[str, EngineSettings]
    """Each teacher's engine settings, by teacher name (`teachers.engines.teacher_engine`)."""
    top_k: int
    """Log-probs scored per position, what every teacher's engine allows (`loss.max_logprobs`)."""
    routes: RouteTable
    """Route value -> teacher name (`teachers.routes.route_table`)."""
    gpu_budget: GpuBudget
    """Memory fractions and Ray GPU shares (`memory.budget.gpu_budget`)."""
    gpu_placement: GpuPlacement | None
    """Which GPU of which worker each actor sits on; None on CPU (`placement.gpus.plan_gpu_placement`)."""
    loss: LossConfig
    """The loss, keyed by the API's enums (`loss.resolve_loss`)."""
    trainer: TrainerSettings
    """What each trainer rank reads, over the run's steps (`training.resolve_training`)."""
    world_size: int
    """Trainer ranks (`rollout.settings.trainer_world_size`)."""
    rollout: RolloutSettings
    """What each rollout engine is started with (`rollout.settings.resolve_rollout`)."""
    teachers_in_trainer: frozenset[str]
    """The teachers scored in the trainer's process (`placement.rollout.teachers_in_trainer`)."""
    teachers_in_rollout: frozenset[str]
    """The teachers of the student's base scored by rollout replica 0's engine, the adapter off
    (`placement.rollout.teachers_in_rollout`)."""
    student_base: frozenset[str]
    """The teachers that are the student's base model (`rollout.student_base.student_base_teachers`)."""
    trainer_alone: bool
    """Whether the trainer's process is the run's one compute process (`trainer_computes_alone`): in a local
    run its OpenMP threads keep libgomp's spin (`env.threads.lone_process_env`)."""
    grader: GraderPlan
    """What grades a response against its answer: eval accuracy and the task reward (`grader.resolve_grader`)."""
    prompts: PromptPlan
    """How rows become prompts: field, chat template, system prompt, overlong policy (`data.prompts.resolve_prompts`)."""
    export: ExportSettings
    """What each checkpoint's `model/` folder holds: dtype, tokenizer (`checkpoints.export.resolve_export`)."""


def resolve(
    spec: DistillationJobSpec,
    *,
    steps: int | None = None,
    local_gpus: int | None = None,
    student: ModelShape | None = None,
) -> JobPlan:
    """The plan of a validated spec, for a run of `steps` optimizer steps (default: the schedule's; a local
    run may be told to stop earlier, and its learning-rate schedule then spans the steps it takes).
    `local_gpus`: None in a cluster; in `distillery run`, the GPUs this machine shows it (`scoring_engine`).
    `student`: the student's shape, read from its files where the caller has them (`rollout.settings.rollout_engine`)."""
    budget = gpu_budget(spec)
    trainer = resolve_training(spec, steps or spec.schedule.steps)
    engines = {
        t.name: teacher_engine(spec, t, budget.teacher_fractions[t.name], local_gpus=local_gpus)
        for t in spec.teachers
    }
    engine = rollout_engine(spec, student)
    base = student_base_teachers(spec)
    engines.update({name: student_base_engine(engines[name], engine) for name in base})
    in_trainer = rollout_in_trainer(spec, engine, trainer)
    hosted = teachers_in_trainer(in_trainer, engines, base)
    return JobPlan(
        engines=engines,
        top_k=max_logprobs(spec),
        routes=route_table(spec),
        gpu_budget=budget,
        gpu_placement=plan_gpu_placement(spec, budget),
        loss=trainer.loss,
        trainer=trainer,
        world_size=trainer_world_size(spec),
        rollout=resolve_rollout(spec, student, in_trainer=in_trainer),
        teachers_in_trainer=hosted,
        teachers_in_rollout=teachers_in_rollout(in_trainer, base),
        student_base=base,
        trainer_alone=trainer_computes_alone(
            in_trainer, hosted, teachers_scoring_after_rollout(spec, local=True)
        ),
        grader=resolve_grader(spec.data),
        prompts=resolve_prompts(spec.data, spec.teachers),
        export=resolve_export(spec),
    )
