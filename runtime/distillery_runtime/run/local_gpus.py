"""Which of this machine's GPUs each part of a local run gets (pure; `local.py` applies the plan).

In a cluster the student's workers and each standalone teacher get GPUs of their own from Kubernetes. A
local run has one machine: the student's trainer ranks take the first `workers x gpusPerWorker` visible
GPUs (the rollout engine and colocated teachers share them, as in the cluster), then each standalone
teacher takes the next `pool.gpusPerReplica` GPUs for its single local server. A teacher that finds none
left shares the student's first GPUs; it is then awake beside the rollout engine and colocated teachers,
so its vLLM memory fraction must fit in what they leave (0.95 of the GPU in all, the trainer keeps its
weights there too). A run that asks for more than the machine has is refused before anything starts,
naming the field to change: Ray would keep the trainer pending forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distillery.api.spec import COLOCATED_MEMORY_LIMIT, DistillationJobSpec, Placement, Teacher
from distillery.plan import resolve
from distillery.plan.memory.budget import GpuBudget, GpuBudgetExceeded, share_left, teacher_fraction


class NotEnoughGpus(ValueError):
    """The job asks this machine for more GPUs than it has; `field` is the spec field to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class TeacherGpus:
    """The GPUs of one local standalone teacher server, and vLLM's memory fraction on them."""

    devices: list[str]
    """CUDA_VISIBLE_DEVICES of the server (ids as this machine names them)."""
    memory_fraction: float
    tensor_parallel: int
    shared: bool
    """On the student's GPUs (none were left for it alone)."""


@dataclass(frozen=True)
class LocalGpuPlan:
    student: list[str] = field(default_factory=list)
    """The GPUs the embedded Ray cluster may hand to the trainer ranks (empty: CPU)."""
    teachers: dict[str, TeacherGpus] = field(default_factory=dict)
    """Standalone teachers that run on GPUs, by name; the others run their server as configured."""

    def describe(self) -> str:
        """One line for the run's log, e.g. `GPUs: student 0,1; teacher math 2 (0.9 of memory)`."""
        parts = [f"student {','.join(self.student) or 'none (CPU)'}"]
        for name, t in self.teachers.items():
            where = ",".join(t.devices) + (" shared with the student" if t.shared else "")
            parts.append(f"teacher {name} {where} ({t.memory_fraction} of memory)")
        return "GPUs: " + "; ".join(parts)


def plan_local_gpus(spec: DistillationJobSpec, visible: list[str]) -> LocalGpuPlan:
    """Place the student and the standalone teachers on `visible` (this machine's GPU ids, in order)."""
    pool = spec.student.pool
    needed = pool.workers * pool.gpus_per_worker
    if needed > len(visible):
        has = f"this machine has {len(visible)}" if visible else "this machine has no CUDA GPU"
        raise NotEnoughGpus(
            "student.pool.gpusPerWorker",
            f"the student asks for {pool.workers} worker(s) x {pool.gpus_per_worker} GPU(s) = {needed}, and "
            f"{has}; a local run places everything on this machine: lower student.pool.workers or "
            "gpusPerWorker, or set gpusPerWorker: 0 to run on CPU",
        )
    student = visible[:needed]
    if not visible:
        return LocalGpuPlan()
    free = visible[needed:]
    budget = resolve(spec).gpu_budget
    teachers: dict[str, TeacherGpus] = {}
    sharing: list[tuple[int, Teacher]] = []
    for index, teacher in enumerate(spec.teachers):
        wants = teacher.pool.gpus_per_replica
        if teacher.placement != Placement.STANDALONE or wants == 0:
            continue
        if wants <= len(free):
            devices, free = free[:wants], free[wants:]
            teachers[teacher.name] = TeacherGpus(
                devices, budget.teacher_fractions[teacher.name], teacher.pool.tensor_parallel, shared=False
            )
        elif wants <= len(student):
            sharing.append((index, teacher))
        else:
            raise NotEnoughGpus(
                f"teachers[{index}].pool.gpusPerReplica",
                f"teacher {teacher.name} asks for {wants} GPU(s); this machine has {len(visible)}, "
                f"{len(student)} of them the student's and {len(free)} left",
            )
    teachers.update(_share_student_gpus(budget, student, sharing))
    return LocalGpuPlan(student, teachers)


def _share_student_gpus(
    budget: GpuBudget, student: list[str], sharing: list[tuple[int, Teacher]]
) -> dict[str, TeacherGpus]:
    """Fractions for the standalone teachers placed on the student's GPUs, beside the awake engines."""
    if not sharing:
        return {}
    try:
        share = share_left(budget.student_gpu_taken, [t.inference.memory_fraction for _, t in sharing])
    except GpuBudgetExceeded as exceeded:
        index, teacher = sharing[0]
        raise NotEnoughGpus(
            f"teachers[{index}].inference.memoryFraction",
            f"no GPU is left for teacher {teacher.name} alone, so it would share the student's, where the "
            f"rollout engine and the teachers on it would take {exceeded.taken:.2f} of the memory; on this "
            f"machine the fractions must add up to <= {COLOCATED_MEMORY_LIMIT}: lower them, or make the "
            "teacher colocated (it then sleeps while the student trains)",
        ) from exceeded
    plan = {}
    for _, teacher in sharing:
        wants = teacher.pool.gpus_per_replica
        fraction = teacher_fraction(teacher.inference.memory_fraction, share)
        plan[teacher.name] = TeacherGpus(student[:wants], fraction, teacher.pool.tensor_parallel, shared=True)
    return plan
