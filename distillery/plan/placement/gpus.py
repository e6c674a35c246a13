"""Which GPU of which student worker each Ray actor of a job sits on (pure): the placement groups the runtime
reserves, the bundle each actor takes, and `distillery plan`'s lines of it.

Ray packs fractional GPU requests onto one GPU unless told where: with two declared GPUs, two trainer ranks
asking for 0.5 each both got GPU 0 (NCCL refuses two ranks of a group on one device), and the rollout engine
and a colocated teacher both got GPU 1. So nothing of a GPU job is left to Ray's packing:

- one placement group per student worker, STRICT_PACK (its bundles on one node: a worker pod's GPUs), with
  one bundle per GPU, `{"GPU": 1}`: Ray gives each bundle a GPU of its own, and an actor scheduled on a
  bundle sees that GPU alone (`CUDA_VISIBLE_DEVICES`);
- trainer rank i takes bundle `i % gpusPerWorker` of worker `i // gpusPerWorker`, a share of it;
- rollout replica r's tensor-parallel ranks take the `tensorParallel` bundles from GPU `r x tensorParallel`
  on (one worker's GPUs: the spec's rule), each rank a share of its own bundle: vLLM's Ray executor places
  its workers on the bundles the engine names (`VLLM_RAY_BUNDLE_INDICES`), and its one-GPU engine sits on
  its bundle itself. Replica 0 sits beside trainer rank 0, whose weight sync maps its buckets to it through
  CUDA IPC;
- each colocated teacher takes a share of bundle 0 of worker 0, beside rollout replica 0 and trainer rank 0:
  where the memory budget puts them (`memory.budget.student_gpu_taken`: the rollout's fraction plus every
  colocated teacher's, on one GPU).

Ray's logical shares only keep the actors of one bundle within it (their sum at most 1, or the last one
never starts); the memory each engine takes is vLLM's fraction (`gpu_budget`), printed beside them. No
bundle asks for CPUs: the actors reserve none (a worker's cores serve its GPUs' processes alike), so a pod
with fewer CPUs than GPUs still places its bundles.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from distillery.api.spec import DistillationJobSpec, Placement
from distillery.plan.memory.budget import GpuBudget, gpu_budget
from distillery.plan.rollout.settings import rollout_replicas

GPU_BUNDLE: dict[str, float] = {"GPU": 1.0}
"""Each bundle of a worker's placement group: one whole GPU."""
STRATEGY = "STRICT_PACK"
"""A worker's bundles on one node: its ranks talk over NVLink/PCIe, its TP engines' ranks too."""


class Role(StrEnum):
    TRAINER = "trainer"
    ROLLOUT = "rollout"
    TEACHER = "teacher"


@dataclass(frozen=True)
class GpuSlot:
    """One GPU of the student's: bundle `gpu` of worker `worker`'s placement group."""

    worker: int
    gpu: int


@dataclass(frozen=True)
class PlacedActor:
    """One Ray actor (or one tensor-parallel rank of a rollout engine) on one GPU."""

    role: Role
    index: int
    """Trainer rank, rollout replica, or the teacher's index in `spec.teachers`."""
    name: str
    """As `distillery plan` and the runtime's errors name it, e.g. `rollout engine 1 (tp rank 0)`."""
    slot: GpuSlot
    gpu_share: float
    """Ray's logical share of the bundle's GPU."""
    memory_fraction: float | None
    """vLLM's gpu_memory_utilization of an engine (None: the trainer, which takes what they leave)."""


@dataclass(frozen=True)
class GpuPlacement:
    """Every GPU actor of a job and the placement groups that hold them."""

    workers: int
    gpus_per_worker: int
    actors: tuple[PlacedActor, ...]

    @property
    def bundles(self) -> list[dict[str, float]]:
        """The bundles of each worker's placement group."""
        return [dict(GPU_BUNDLE) for _ in range(self.gpus_per_worker)]

    def trainer(self, rank: int) -> PlacedActor:
        return self._one(Role.TRAINER, rank)

    def rollout(self, replica: int) -> list[PlacedActor]:
        """A rollout replica's tensor-parallel ranks, in rank order."""
        return [a for a in self.actors if a.role == Role.ROLLOUT and a.index == replica]

    def teacher(self, index: int) -> PlacedActor:
        return self._one(Role.TEACHER, index)

    def on(self, slot: GpuSlot) -> list[PlacedActor]:
        return [a for a in self.actors if a.slot == slot]

    def slots(self) -> list[GpuSlot]:
        return [GpuSlot(w, g) for w in range(self.workers) for g in range(self.gpus_per_worker)]

    def lines(self) -> list[str]:
        """`distillery plan`'s lines: each GPU, the actors that share it, their Ray shares and vLLM memory."""
        head = (
            f"GPU placement: a placement group per worker ({STRATEGY}), a bundle per GPU; each actor pinned to "
            "its bundle's GPU"
        )
        out = [head]
        for slot in self.slots():
            parts = []
            for actor in self.on(slot):
                memory = (
                    f", vLLM memory {actor.memory_fraction:.2f}" if actor.memory_fraction is not None else ""
                )
                parts.append(f"{actor.name} (Ray share {actor.gpu_share:g}{memory})")
            taken = sum(a.gpu_share for a in self.on(slot))
            out.append(f"  worker {slot.worker} GPU {slot.gpu}: {'; '.join(parts)} = {taken:g} of the GPU")
        return out

    def _one(self, role: Role, index: int) -> PlacedActor:
        (actor,) = (a for a in self.actors if a.role == role and a.index == index)
        return actor


def plan_gpu_placement(spec: DistillationJobSpec, budget: GpuBudget | None = None) -> GpuPlacement | None:
    """The placement of a validated spec's GPU actors; None on CPU (`gpusPerWorker: 0`), where the actors
    take no GPU and no placement group is made. The spec's rules already refuse a rollout layout that no
    worker's GPUs can hold (`rollout.tensorParallel` a divisor of `pool.gpusPerWorker`, `rollout.replicas x
    tensorParallel` at most the student's GPUs), a local run one that asks for more GPUs than the machine
    has (`local_gpus`); and the Ray shares of one GPU add up to at most 1 by the budget's construction."""
    pool = spec.student.pool
    if pool.gpus_per_worker == 0:
        return None
    budget = budget or gpu_budget(spec)
    per_worker, tp = pool.gpus_per_worker, spec.student.rollout.tensor_parallel
    ranks = pool.workers * per_worker

    def slot(gpu: int) -> GpuSlot:
        return GpuSlot(gpu // per_worker, gpu % per_worker)

    actors = [
        PlacedActor(Role.TRAINER, rank, f"trainer rank {rank}", slot(rank), budget.trainer_gpus, None)
        for rank in range(ranks)
    ]
    memory = spec.student.rollout.memory_fraction
    for replica in range(rollout_replicas(spec)):
        for tp_rank in range(tp):
            name = f"rollout engine {replica}" + (f" (tp rank {tp_rank})" if tp > 1 else "")
            gpu = replica * tp + tp_rank
            actors.append(PlacedActor(Role.ROLLOUT, replica, name, slot(gpu), budget.engine_gpus, memory))
    for index, teacher in enumerate(spec.teachers):
        if teacher.placement == Placement.COLOCATED:
            fraction = budget.teacher_fractions[teacher.name]
            name = f"teacher {teacher.name}"
            actors.append(PlacedActor(Role.TEACHER, index, name, slot(0), budget.engine_gpus, fraction))
    return GpuPlacement(pool.workers, per_worker, tuple(actors))
