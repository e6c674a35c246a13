"""What a DistillationTeacher's replicas run and how a job that references one is checked against it (pure).

A DistillationTeacher is served exactly as a job's standalone teacher: the same server, the same pod shape
(`operator/.../render/teacher.py`), from a `TeacherServer`, which this module builds from the teacher's own
spec and `teacher_server` builds for a job's standalone teacher. What differs is only where its settings
come from: a standalone teacher's context length and top-k follow its job's data and loss; a shared one
serves jobs it does not know in advance, so it has its own (`inference.maxModelLen`, default
`SHARED_MAX_MODEL_LEN`, and `maxLogprobs`), and each job that references it is checked against them
(`job_fits_teacher`) before anything of the job is made. `distillery serve-teacher` runs the same engine
(`shared_teacher_engine`) on this machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distillery.api.shared_teacher import DistillationTeacherSpec
from distillery.api.spec import (
    STANDALONE_MEMORY_FRACTION,
    DistillationJobSpec,
    Inference,
    Placement,
    Teacher,
    TeacherPool,
)
from distillery.plan import resolve
from distillery.plan.pods.model_cache import CacheVolume, model_cache, server_cache
from distillery.plan.pods.resources import ContainerResources, pod_resources, teacher_resources
from distillery.plan.pods.scheduling import PodScheduling, pod_scheduling, teacher_scheduling
from distillery.plan.rollout.settings import sequence_length
from distillery.plan.teachers.engines import EngineSettings

SHARED_MAX_MODEL_LEN = 4096
"""The context of a DistillationTeacher that sets no inference.maxModelLen. Unlike a job's teacher it
cannot size itself from one job's prompts and responses, and the model's own (often 32k or more) would
spend a GPU's KV cache on lengths no distillation job scores; a job whose sequences are longer is refused
(the operator before it makes anything, `job_fits_teacher`; a local run at its start, against the server's
/distillery/v1/info)."""


@dataclass(frozen=True)
class TeacherServer:
    """One teacher's vLLM replicas, resolved: everything the Deployment's pod template is made from."""

    model: str
    engine: EngineSettings
    pool: TeacherPool
    inference: Inference
    image: str
    ready_timeout_seconds: int
    """How long a replica may take to load its model before Kubernetes restarts it."""
    resources: ContainerResources
    scheduling: PodScheduling
    cache: CacheVolume | None


def teacher_server(
    spec: DistillationJobSpec, teacher: Teacher, cluster_pull_secrets: Sequence[str] = ()
) -> TeacherServer:
    """A job's standalone teacher."""
    return TeacherServer(
        model=teacher.model,
        engine=resolve(spec).engines[teacher.name],
        pool=teacher.pool,
        inference=teacher.inference,
        image=spec.image,
        ready_timeout_seconds=spec.teacher_ready_timeout_seconds,
        resources=pod_resources(spec).teachers[teacher.name],
        scheduling=pod_scheduling(spec, cluster_pull_secrets).teachers[teacher.name],
        cache=model_cache(spec).get(teacher.name),
    )


def shared_teacher_engine(name: str, spec: DistillationTeacherSpec) -> EngineSettings:
    """A DistillationTeacher's engine: served under its own name (every job reaches it by it), with its own
    context length and top-k bound, compiled (a shared teacher starts rarely and serves long)."""
    pool = spec.pool
    return EngineSettings(
        served_model_name=name,
        max_logprobs=spec.max_logprobs,
        max_model_len=spec.inference.max_model_len or SHARED_MAX_MODEL_LEN,
        memory_fraction=spec.inference.memory_fraction or STANDALONE_MEMORY_FRACTION,
        tensor_parallel=pool.tensor_parallel,
        dtype=spec.inference.dtype,
        extra_args=tuple(spec.inference.extra_args),
        on_gpu=pool.gpus_per_replica > 0,
    )


def shared_teacher_server(
    name: str, spec: DistillationTeacherSpec, cluster_pull_secrets: Sequence[str] = ()
) -> TeacherServer:
    """A DistillationTeacher: its pull secrets are the cluster's, then its own."""
    cache = server_cache(spec.model)
    return TeacherServer(
        model=spec.model,
        engine=shared_teacher_engine(name, spec),
        pool=spec.pool,
        inference=spec.inference,
        image=spec.image,
        ready_timeout_seconds=spec.startup_timeout_seconds,
        resources=teacher_resources(spec.pool, spec.model, cache),
        scheduling=teacher_scheduling(
            spec.pool, tuple(dict.fromkeys([*cluster_pull_secrets, *spec.image_pull_secrets]))
        ),
        cache=cache,
    )


def job_fits_teacher(
    job: DistillationJobSpec, index: int, name: str, teacher: DistillationTeacherSpec
) -> str | None:
    """Why the job's teachers[index] cannot use the DistillationTeacher `name` (one line naming the field),
    or None. Its tokenizer is checked by the trainer against the server's vocabulary, as any teacher's."""
    engine = shared_teacher_engine(name, teacher)
    if job.teachers[index].placement != Placement.SHARED:
        return None
    if job.loss.top_k > engine.max_logprobs:
        return (
            f"spec.loss.topK: {job.loss.top_k} is more than DistillationTeacher {name} serves "
            f"(maxLogprobs {engine.max_logprobs})"
        )
    needed = sequence_length(job)
    if needed > engine.max_model_len:
        return (
            f"spec.teachers[{index}].teacherRef: the job's sequences need {needed} tokens, DistillationTeacher "
            f"{name} serves {engine.max_model_len} (its inference.maxModelLen)"
        )
    return None
