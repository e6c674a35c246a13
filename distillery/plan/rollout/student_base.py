"""Teachers that are the LoRA student's own base model (`placement: student`): which they are, the log-probs
the rollout engine returns for them and what `distillery plan` says of them (pure; their engine settings are
`teachers.engines.student_base_engine`).

A LoRA student trains an adapter on a frozen base, and its rollout engine already holds that base: vLLM
serves it beside the adapter (a request without the adapter is scored by the base alone), and the
transformers engine's peft model computes it with the adapter disabled. Such a teacher is scored there, with
the adapter off: no engine, GPU share or second copy of the weights of its own. The engine that hosts it is
the rollout engine's process: the trainer's where the rollout samples with the trainer's model
(`placement.rollout.rollout_in_trainer`), else rollout replica 0. With a `systemPrompt` the same teacher is a
context distiller: it sees a system turn the student does not.
"""

from __future__ import annotations

from distillery.api.spec import DistillationJobSpec, Placement, Precision
from distillery.model_shapes import ModelShape
from distillery.plan.loss import max_logprobs


def student_base_teachers(spec: DistillationJobSpec) -> frozenset[str]:
    """The teachers scored by the student's rollout engine with the adapter off."""
    return frozenset(t.name for t in spec.teachers if t.placement == Placement.STUDENT)


def rollout_scoring_logprobs(spec: DistillationJobSpec) -> int:
    """The log-probs a position the rollout engine must return: the loss's topK where it scores a teacher of
    the student's base (vLLM refuses more prompt log-probs than its max_logprobs), else 1, the sampled
    token's own."""
    return max_logprobs(spec) if student_base_teachers(spec) else 1


def student_base_lines(spec: DistillationJobSpec, student: ModelShape | None = None) -> list[str]:
    """What `distillery plan` says of each such teacher (`student`: the student's shape, where known: the
    weights it does not load again), and of each teacher's context."""
    lines = []
    for teacher in spec.teachers:
        if teacher.placement == Placement.STUDENT:
            # The engine holds the base in the student's compute precision (auto: bfloat16 on a GPU).
            on_gpu = spec.student.pool.gpus_per_worker > 0
            bf16 = spec.student.precision == Precision.BFLOAT16 or (
                spec.student.precision == Precision.AUTO and on_gpu
            )
            width = 2 if bf16 else 4
            saved = f": {student.params * width / 1e9:.2f} GB of weights not loaded again" if student else ""
            lines.append(
                f"teacher {teacher.name}: the student's base model, scored by the rollout engine with the "
                f"adapter off (placement student: no engine, GPU share or copy of the weights of its own{saved})"
            )
        if teacher.system_prompt is not None:
            lines.append(
                f"teacher {teacher.name}: sees a system turn of {len(teacher.system_prompt)} characters that "
                "the student does not (context distillation)"
            )
    return lines
