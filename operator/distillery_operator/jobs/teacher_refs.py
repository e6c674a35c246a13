"""A job's shared teachers against the DistillationTeachers they reference (pure).

A job that references a DistillationTeacher which does not exist waits (nothing of it is made) until the
teacher appears; one that asks more of it than it serves (`plan.shared_teacher.job_fits_teacher`: top-k,
context length) is refused for that job only. A teacher being deleted keeps serving the jobs that use it
(its finalizer holds it, `teachers/loop.py`), and those jobs say so in their teachers' status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from distillery.api import DistillationJob, Placement
from distillery.plan.shared_teacher import job_fits_teacher
from distillery_operator.observe.summaries import SharedTeacherFacts


@dataclass(frozen=True)
class RefCheck:
    missing: list[str] = field(default_factory=list)
    """One line for each referenced DistillationTeacher that does not exist."""
    refused: list[str] = field(default_factory=list)
    """One line for each that the job cannot use (naming the field)."""


def check_teacher_refs(job: DistillationJob, shared: Mapping[str, SharedTeacherFacts]) -> RefCheck:
    check = RefCheck()
    for index, teacher in enumerate(job.spec.teachers):
        if teacher.placement != Placement.SHARED or teacher.teacher_ref is None:
            continue
        name = teacher.teacher_ref.name
        facts = shared.get(name)
        if facts is None:
            check.missing.append(
                f"spec.teachers[{index}].teacherRef: DistillationTeacher {name} does not exist; the job "
                "waits for it"
            )
        elif facts.spec is None:
            check.refused.append(f"spec.teachers[{index}].teacherRef: DistillationTeacher {name} is invalid")
        elif (why := job_fits_teacher(job.spec, index, name, facts.spec)) is not None:
            check.refused.append(why)
    return check


def shared_teacher_note(name: str, facts: SharedTeacherFacts | None) -> str:
    """What a job's teacher status says of the DistillationTeacher behind it, before its health."""
    if facts is None:
        return f"DistillationTeacher {name} does not exist: "
    if facts.deleting:
        return f"DistillationTeacher {name} is being deleted; it serves this job until the job ends: "
    return f"DistillationTeacher {name}: "
