"""The GPU-memory budget of the engines that share a GPU: each teacher's vLLM memory fraction.

A standalone teacher owns its GPUs and takes vLLM's default share of them. Colocated teachers share the
student's GPU with the rollout engine, which is awake at the same time: a teacher that sets no fraction
gets an equal part of what the rollout engine and the teachers that set one leave below the ceiling.
The pydantic rule and its CEL twin (`distillery.api.spec`) check that a spec fits; this module derives the
numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distillery.api.spec import (
    COLOCATED_MEMORY_CEILING,
    COLOCATED_MEMORY_LIMIT,
    MIN_DEFAULT_FRACTION,
    STANDALONE_MEMORY_FRACTION,
    DistillationJobSpec,
    Placement,
    Teacher,
)


class GpuBudgetExceeded(ValueError):
    """The engines placed on one GPU would take more of its memory than it has to give."""

    def __init__(self, taken: float) -> None:
        super().__init__(f"the engines on one GPU would take {taken:.2f} of its memory")
        self.taken = taken


@dataclass(frozen=True)
class GpuBudget:
    """Who takes how much of which GPU: vLLM memory fractions, and Ray's logical GPU shares of the actors."""

    teacher_fractions: dict[str, float]
    """Each teacher's vLLM gpu_memory_utilization, by name: of its own GPUs (standalone) or of the
    student's (colocated)."""
    student_gpu_taken: float
    """What the rollout engine and the colocated teachers, awake together, take of the student's GPU."""
    trainer_gpus: float
    """Ray's logical GPU share of a trainer rank (on GPU workers)."""
    engine_gpus: float
    """Ray's logical GPU share of each rollout engine (of each tensor-parallel rank) and of each colocated
    teacher, on the GPU the placement names (`gpu_placement`): with the trainer rank's, at most 1 on a GPU
    that holds every colocated teacher. They sleep while the trainer trains."""


def share_left(taken: float, own_fractions: Sequence[float | None]) -> float:
    """The fraction each engine that sets none gets of a GPU where `taken` is spoken for, beside engines
    that set `own_fractions` (None: sets none); 0.0 when every engine sets its own.

    Raises GpuBudgetExceeded when the GPU is over-committed, or leaves an engine that sets none less than
    MIN_DEFAULT_FRACTION."""
    taken += sum(f for f in own_fractions if f is not None)
    unset = sum(f is None for f in own_fractions)
    ceiling = COLOCATED_MEMORY_CEILING if unset else COLOCATED_MEMORY_LIMIT
    share = (ceiling - taken) / unset if unset else 0.0
    if taken > ceiling or (unset and share < MIN_DEFAULT_FRACTION):
        raise GpuBudgetExceeded(taken)
    return share


def teacher_fraction(own: float | None, share: float) -> float:
    """A teacher's fraction on a shared GPU: its own, or its part of what is left."""
    return own if own is not None else round(share, 3)


def gpu_budget(spec: DistillationJobSpec) -> GpuBudget:
    """The budget of a validated spec (its colocated engines fit: the spec's memory rule checks it)."""
    rollout = spec.student.rollout.memory_fraction
    colocated = [t for t in spec.teachers if t.placement == Placement.COLOCATED]
    share = share_left(rollout, [t.inference.memory_fraction for t in colocated]) if colocated else 0.0
    fractions = {t.name: _fraction(t, share) for t in spec.teachers}
    return GpuBudget(
        teacher_fractions=fractions,
        student_gpu_taken=rollout + sum(fractions[t.name] for t in colocated),
        trainer_gpus=0.5 if colocated else 0.6,
        engine_gpus=round(0.4 / (1 + len(colocated)), 3),
    )


def _fraction(teacher: Teacher, colocated_share: float) -> float:
    if teacher.placement == Placement.STUDENT:  # scored by the rollout engine, in its memory
        return 0.0
    if teacher.placement == Placement.COLOCATED:
        return teacher_fraction(teacher.inference.memory_fraction, colocated_share)
    if teacher.inference.memory_fraction is not None:
        return teacher.inference.memory_fraction
    return STANDALONE_MEMORY_FRACTION
