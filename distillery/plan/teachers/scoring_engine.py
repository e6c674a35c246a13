"""Which engine computes a teacher's log-probs: vLLM, or the model's own transformers forward in a process of
the job's (`inference.engine`, auto by default).

vLLM is the engine wherever the teacher has devices or a server of its own: its batching, paged KV cache and
kernels are what a GPU teacher wants, and a served teacher (standalone in a cluster, external, shared) is a
vLLM server. Where the teacher computes on the student's CPU cores instead (a colocated teacher of a CPU
student, a standalone teacher of a CPU `distillery run`, which would be a server process on this host),
vLLM's scoring of a step's samples costs more than one forward of them: its scheduler chunks the prefill,
ships the top-k back through its front end (a server adds HTTP), and it holds a KV cache that scoring never
reads again. Measured on the 2-core host (`bench/cpu_teacher_engines.py`: the e2e bench's teachers, one
step's 32 samples of 136 tokens, top-16, float32): the vLLM server 0.256 s against the forward's 0.181 s for
the 1.6M teacher, 2.653 s against 2.585 s for the 37M one; and no server process to start. There the
transformers forward is the default.

It computes in float32 where the dtype is `auto` on CPU: CPUs without bfloat16 matrix units run bfloat16
matmuls hundreds of times slower (1 GFLOPS on the AVX2 host), and float32 scores the model exactly.
"""

from __future__ import annotations

from distillery.api.spec import DistillationJobSpec, Placement, Teacher, TeacherEngine

TRANSFORMERS_DTYPES = {
    "auto": "auto",
    "float32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
}
"""vLLM's --dtype names the transformers forward understands, and what each means there (`auto`: float32 on
CPU, bfloat16 on a GPU that has it, decided on the device the forward finds)."""


def _in_job_processes(teacher: Teacher, *, local_gpus: int | None) -> bool:
    """Whether the teacher computes in the job's own processes (a Ray actor of the run), not a server."""
    if teacher.placement in (Placement.COLOCATED, Placement.STUDENT):
        return True
    return local_gpus is not None and teacher.placement == Placement.STANDALONE


def teacher_on_cpu(spec: DistillationJobSpec, teacher: Teacher, *, local_gpus: int | None) -> bool:
    """Whether the teacher computes on CPUs (`local_gpus`: see `scoring_engine`)."""
    if teacher.placement in (Placement.COLOCATED, Placement.STUDENT):
        return spec.student.pool.gpus_per_worker == 0
    # A local run's standalone teacher takes GPUs where the machine has them (`local_gpus`), else the CPU.
    return teacher.pool.gpus_per_replica == 0 or local_gpus == 0


def scoring_engine(spec: DistillationJobSpec, teacher: Teacher, *, local_gpus: int | None) -> TeacherEngine:
    """The engine of one teacher, never auto. `local_gpus`: None in a cluster (a standalone teacher is a
    Deployment of vLLM); in `distillery run`, the CUDA GPUs this machine shows it, which its standalone
    teachers take (`local_gpus.plan_local_gpus`), or run on its CPU without. The user's vllm or transformers
    wins (the API allows transformers for colocated teachers only)."""
    chosen = teacher.inference.engine
    if chosen != TeacherEngine.AUTO:
        return chosen
    forward = (
        _in_job_processes(teacher, local_gpus=local_gpus)
        and teacher_on_cpu(spec, teacher, local_gpus=local_gpus)
        and teacher.inference.dtype in TRANSFORMERS_DTYPES
        and not teacher.inference.extra_args  # vLLM flags a forward could not honour
    )
    return TeacherEngine.TRANSFORMERS if forward else TeacherEngine.VLLM


def scoring_engine_lines(spec: DistillationJobSpec) -> list[str]:
    """Each teacher's engine and why, for `distillery plan`: in a cluster, and in `distillery run` on a
    machine without GPUs where the two differ."""
    lines = []
    for teacher in spec.teachers:
        if teacher.placement == Placement.STUDENT:
            lines.append(f"teacher {teacher.name}: the student's rollout engine (placement student)")
            continue
        cluster = scoring_engine(spec, teacher, local_gpus=None)
        local = scoring_engine(spec, teacher, local_gpus=0)
        if teacher.inference.engine != TeacherEngine.AUTO:
            why = f"spec: inference.engine {teacher.inference.engine}"
        elif cluster == TeacherEngine.TRANSFORMERS:
            why = "auto: colocated with a CPU student, a forward in its processes"
        elif teacher.placement in (Placement.EXTERNAL, Placement.SHARED):
            why = f"auto: {teacher.placement}, served elsewhere"
        else:
            why = "auto: on GPUs or a server of its own"
        line = f"teacher {teacher.name}: {cluster} ({why})"
        if local != cluster:
            line += f"; distillery run without GPUs: {local} in the run's processes"
        lines.append(line)
    return lines
