"""Whether the PersistentVolumeClaims a job's pods mount can be mounted the way those pods need (pure).

Before the operator makes the trainer (the RayJob) and the standalone teachers, it reads every claim their
pods will mount: the checkpoint claim (`distillery.plan.checkpoints.storage`) and each claim of a
`pvc://CLAIM/PATH` model, tokenizer or dataset location (`distillery.pvc`). A claim's access modes say
how many nodes or pods may mount it at once:

- ReadWriteMany: any pods on any nodes; ReadOnlyMany: the same, read-only;
- ReadWriteOnce: the pods of one node (the volume attaches to one node at a time);
- ReadWriteOncePod: one pod.

The Ray head and each worker are separate pods, and so is each replica of a teacher: the scheduler may put
them on different nodes, where a ReadWriteOnce volume attached elsewhere leaves them Pending for ever
("Multi-Attach error"). Such a claim is refused before anything is made, unless every pod that mounts it
is pinned to one node (the same `kubernetes.io/hostname` in each pool's nodeSelector). A missing claim is
waited for: the user may be making it.

The modes are read from the claim's spec: an unbound claim's status.accessModes is empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from distillery import pvc
from distillery.api import ConditionType, DistillationJob, Placement
from distillery.plan.checkpoints.storage import READ_WRITE_MANY, READ_WRITE_ONCE, checkpoint_storage
from distillery.plan.pods.model_cache import TRAINER, model_cache
from distillery_operator.jobs.status import Cond
from distillery_operator.observe.summaries import ClaimFacts
from distillery_operator.render.rayjob import trainer_locations

READ_ONLY_MANY = "ReadOnlyMany"
READ_WRITE_ONCE_POD = "ReadWriteOncePod"
HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The node label whose value in a nodeSelector pins a pod to one node."""

CLAIM_MISSING = "ClaimMissing"
ACCESS_MODE_CONFLICT = "AccessModeConflict"


@dataclass(frozen=True)
class PodGroup:
    """Pods of one kind that mount a claim."""

    what: str
    """As the messages name them: "the Ray head", "2 Ray workers", "teacher t's 2 replicas"."""
    pods: int
    node: str | None
    """The node all of them are pinned to (their pool's `kubernetes.io/hostname` nodeSelector), if any."""
    writes: bool


@dataclass(frozen=True)
class ClaimUse:
    """One claim and every pod group that mounts it."""

    claim: str
    groups: tuple[PodGroup, ...]
    operators: bool = False
    """The operator's own checkpoint claim: read from its watch, not with a GET."""

    @property
    def pods(self) -> int:
        return sum(g.pods for g in self.groups)

    @property
    def writes(self) -> bool:
        return any(g.writes for g in self.groups)

    @property
    def one_node(self) -> bool:
        """Every pod that mounts it is pinned to the same node."""
        nodes = {g.node for g in self.groups}
        return len(nodes) == 1 and None not in nodes

    def mounted_by(self) -> str:
        return " and ".join(g.what for g in self.groups)


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def claim_uses(job: DistillationJob) -> list[ClaimUse]:
    """Every claim the job's pods mount, with the pods that mount it (`render.rayjob`, `render.teacher`
    mount them so: the Ray head and workers the checkpoint claim read-write and the claims of every model
    and dataset read-only; a standalone teacher's replicas its model's claim read-only; every pod with a
    model cache on `modelCache.pvc` that claim read-write)."""
    spec = job.spec
    pool = spec.student.pool
    ray_node = pool.node_selector.get(HOSTNAME_LABEL)
    checkpoint = checkpoint_storage(job.metadata.name, spec)
    groups: dict[str, list[PodGroup]] = {}

    def ray_pods(claim: str, writes: bool) -> None:
        workers = _plural(pool.workers, "Ray worker", "Ray workers")
        groups.setdefault(claim, []).append(PodGroup("the Ray head", 1, ray_node, writes))
        groups[claim].append(PodGroup(workers, pool.workers, ray_node, writes))

    if checkpoint.claim is not None:
        ray_pods(checkpoint.claim, writes=True)
    for claim in pvc.claims(trainer_locations(job)):
        if claim not in groups:  # the checkpoint claim mounted again read-only counts once
            ray_pods(claim, writes=False)
    caches = model_cache(spec)
    cache = caches.get(TRAINER)
    if cache is not None and cache.claim is not None and cache.claim not in groups:
        ray_pods(cache.claim, writes=True)  # the model cache (HF_HOME): downloads are written there
    for teacher in spec.teachers:
        if teacher.placement != Placement.STANDALONE:
            continue
        node = teacher.pool.node_selector.get(HOSTNAME_LABEL)
        replicas = _plural(teacher.replicas, "replica", "replicas")
        mounted = [(claim, False) for claim in pvc.claims([teacher.model])]
        cache = caches.get(teacher.name)
        if cache is not None and cache.claim is not None:
            mounted.append((cache.claim, True))
        for claim, writes in mounted:
            groups.setdefault(claim, []).append(
                PodGroup(f"teacher {teacher.name}'s {replicas}", teacher.replicas, node, writes)
            )
    operators = checkpoint.operator_claim.name if checkpoint.operator_claim else None
    return [
        ClaimUse(claim, tuple(found), operators=claim == operators) for claim, found in sorted(groups.items())
    ]


def claims_to_read(job: DistillationJob) -> list[str]:
    """The claims the operator reads with a GET before it makes the pods' owners: all but its own."""
    return [use.claim for use in claim_uses(job) if not use.operators]


def conflict(use: ClaimUse, facts: ClaimFacts) -> str | None:
    """Why the claim's access modes cannot serve its pods, or None when they can (or say nothing)."""
    modes = set(facts.access_modes)
    if not modes or READ_WRITE_MANY in modes:
        return None
    if READ_ONLY_MANY in modes and not use.writes:
        return None
    shown = ", ".join(facts.access_modes)
    pods = use.pods
    if READ_WRITE_ONCE in modes and (pods <= 1 or use.one_node):
        return None
    if READ_WRITE_ONCE_POD in modes and pods <= 1:
        return None
    if modes <= {READ_ONLY_MANY}:
        why = "read-only, but the trainer writes its checkpoints there"
    elif modes <= {READ_WRITE_ONCE_POD, READ_ONLY_MANY}:
        why = f"mountable by one pod, but {pods} pods mount it ({use.mounted_by()})"
    else:
        why = (
            f"mountable on one node at a time, but {pods} pods mount it ({use.mounted_by()}), which may be "
            f"scheduled on different nodes"
        )
    return (
        f"PersistentVolumeClaim {use.claim} is {shown}: {why}; use a ReadWriteMany claim"
        + ("" if use.writes else " (or ReadOnlyMany)")
        + f", or pin every pod that mounts it to one node (the same {HOSTNAME_LABEL} in the pools' "
        "nodeSelector)"
    )


@dataclass(frozen=True)
class StorageCheck:
    """The result of checking a job's claims."""

    claims: tuple[str, ...]
    """Every claim the pods mount."""
    missing: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    """One message per claim that cannot serve its pods."""

    @property
    def ok(self) -> bool:
        return not self.missing and not self.conflicts

    def condition(self) -> Cond:
        if self.conflicts:
            return Cond(ConditionType.STORAGE_READY, False, ACCESS_MODE_CONFLICT, "; ".join(self.conflicts))
        if self.missing:
            names = ", ".join(self.missing)
            message = (
                f"waiting for PersistentVolumeClaim {names} (not found in the job's namespace): nothing is "
                "made until it exists"
            )
            return Cond(ConditionType.STORAGE_READY, False, CLAIM_MISSING, message)
        return mountable(self.claims)


def mountable(claims: tuple[str, ...]) -> Cond:
    """StorageReady True: the message names the claims only (it must not change once the pods exist and the
    claims are no longer read)."""
    if not claims:
        return Cond(ConditionType.STORAGE_READY, True, "NoClaims", "the pods mount no PersistentVolumeClaim")
    message = f"PersistentVolumeClaim {', '.join(claims)}: found, with access modes that serve the pods"
    return Cond(ConditionType.STORAGE_READY, True, "ClaimsMountable", message)


def check_storage(
    job: DistillationJob, read: Mapping[str, ClaimFacts | None], operators: ClaimFacts | None
) -> StorageCheck:
    """Checks every claim the job's pods mount. `read`: the claims read with a GET (`claims_to_read`), None
    where the API server answered 404; `operators`: the operator's checkpoint claim as its watch has it
    (None: not made yet; then it is judged as the plan makes it, ReadWriteMany for several pods)."""
    uses = claim_uses(job)
    missing: list[str] = []
    conflicts: list[str] = []
    planned = checkpoint_storage(job.metadata.name, job.spec).operator_claim
    for use in uses:
        if use.operators:
            facts = operators or ClaimFacts(use.claim, (planned.access_mode,) if planned else ())
        else:
            found = read.get(use.claim)
            if found is None:
                missing.append(use.claim)
                continue
            facts = found
        why = conflict(use, facts)
        if why is not None:
            conflicts.append(why)
    return StorageCheck(tuple(u.claim for u in uses), tuple(missing), tuple(conflicts))
