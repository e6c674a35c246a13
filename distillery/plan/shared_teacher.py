"""A DistillationTeacher's vLLM engine settings, resolved once from its spec.

The operator's Deployment and `distillery serve-teacher` both translate this object into the flags of our
teacher server (`EngineSettings.server_args()`), so a teacher served on a laptop answers as the cluster's
would: to the DistillationTeacher's name, with its maxLogprobs and context length.
"""

from __future__ import annotations

from distillery.api.shared_teacher import DistillationTeacherSpec
from distillery.api.spec import STANDALONE_MEMORY_FRACTION
from distillery.plan.engines import EngineSettings

SHARED_MAX_MODEL_LEN = 4096
"""The context of a DistillationTeacher that sets no inference.maxModelLen. Unlike a job's teacher it
cannot size itself from one job's prompts and responses, and the model's own (often 32k or more) would
spend a GPU's KV cache on lengths no distillation job scores; a job whose sequences are longer is refused at
its start (the server's /distillery/v1/info against the job's plan)."""


def shared_teacher_engine(name: str, spec: DistillationTeacherSpec) -> EngineSettings:
    """The engine of DistillationTeacher `name`: served as its name (the jobs' teacherRef), with as many
    log-probs as its maxLogprobs allows every job's loss.topK, on its pool's GPUs and tensor parallelism,
    compiled (CUDA graphs: a shared teacher starts rarely and serves long)."""
    return EngineSettings(
        served_model_name=name,
        max_logprobs=spec.max_logprobs,
        max_model_len=spec.inference.max_model_len or SHARED_MAX_MODEL_LEN,
        memory_fraction=spec.inference.memory_fraction or STANDALONE_MEMORY_FRACTION,
        tensor_parallel=spec.pool.tensor_parallel,
        dtype=spec.inference.dtype,
        extra_args=tuple(spec.inference.extra_args),
        enforce_eager=False,
        on_gpu=spec.pool.gpus_per_replica > 0,
    )
