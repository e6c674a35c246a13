"""The status of a job, derived by pure functions from what the operator observed of its children.

Inputs: the effective spec (None when no valid spec was ever applied), the observed children, the
previous status (for transition times and sticky terminal phases) and the time. Output: the typed pieces
of the fields of `status` the operator owns; the runtime's (`RUNTIME_WRITES`) are never touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import InvalidOperation
from enum import StrEnum
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from distillery.api import (
    TERMINAL_PHASES,
    Condition,
    ConditionType,
    DistillationJob,
    Phase,
    Placement,
    StorageStatus,
    Teacher,
    TeacherOutage,
    TeacherStatus,
)
from distillery.plan.checkpoints.storage import checkpoint_storage
from distillery.runtime_config import teacher_endpoints, teacher_url
from distillery_operator import naming
from distillery_operator.jobs.spec_changes import LIVE_FIELDS_DOC
from distillery_operator.jobs.teacher_refs import shared_teacher_note
from distillery_operator.observe.summaries import Child, Observed, Unscheduled
from distillery_operator.render import KUEUE_QUEUE_LABEL

FAILED_DEPLOYMENT_STATES = {"Failed", "ValidationFailed"}
SUSPENDED_DEPLOYMENT_STATES = {"Suspended", "Suspending"}
MAX_UNSCHEDULED_LISTED = 4
"""Pods named in the PodsScheduled message; the rest are counted (a condition's message is bounded)."""


@dataclass(frozen=True)
class Trainer:
    """The RayJob, interpreted."""

    state: str
    """missing, queued, suspended, starting, running, succeeded, failed."""
    reason: str
    message: str


def trainer_state(rayjob: Child | None, *, suspend: bool, queue: str | None = None) -> Trainer:
    """`queue`: the Kueue queue the job names (its `kueue.x-k8s.io/queue-name` label), if any."""
    if rayjob is None:
        return Trainer("missing", "TrainerNotCreated", "the RayJob does not exist yet")
    s = rayjob.state
    job_status = s.get("jobStatus") or ""
    deployment = s.get("jobDeploymentStatus") or ""
    detail = ", ".join(f"{k}={s[k]}" for k in ("jobStatus", "jobDeploymentStatus") if s.get(k))
    if job_status == "SUCCEEDED":
        return Trainer("succeeded", "RayJobSucceeded", f"RayJob {rayjob.name} succeeded")
    if deployment in FAILED_DEPLOYMENT_STATES or (
        job_status in ("FAILED", "STOPPED") and deployment == "Complete"
    ):
        reason = s.get("reason") or "RayJobFailed"
        message = s.get("message") or f"RayJob {rayjob.name} failed ({detail})"
        return Trainer("failed", _reason(reason, "RayJobFailed"), message)
    if s.get("suspend") or deployment in SUSPENDED_DEPLOYMENT_STATES:
        if suspend:
            return Trainer("suspended", "Suspended", f"RayJob {rayjob.name} is suspended")
        if queue is not None:
            return Trainer(
                "queued",
                "Queued",
                f"RayJob {rayjob.name} is suspended, waiting for Kueue to admit it (queue {queue}); "
                f"without Kueue, remove the {KUEUE_QUEUE_LABEL} label from the job",
            )
        return Trainer("queued", "Queued", f"RayJob {rayjob.name} is suspended; the operator resumes it")
    if job_status == "RUNNING":
        return Trainer("running", "RayJobRunning", f"RayJob {rayjob.name} is running")
    return Trainer(
        "starting", "TrainerStarting", f"RayJob {rayjob.name} is starting ({detail or 'no status yet'})"
    )


def _reason(text: str, fallback: str) -> str:
    """A condition reason must be CamelCase-ish: KubeRay reasons are, anything else falls back."""
    cleaned = "".join(ch for ch in text if ch.isalnum())
    return cleaned if cleaned[:1].isalpha() else fallback


def runtime_outages(status: Mapping[str, Any]) -> dict[str, str]:
    """The teachers the trainer reports it is waiting for (status.teacherOutages, the runtime's), with
    their last error; malformed entries are skipped (the runtime, not the operator, writes them)."""
    out: dict[str, str] = {}
    for entry in status.get("teacherOutages") or []:
        try:
            outage = TeacherOutage.model_validate(entry)
        except ValueError:
            continue
        out[outage.name] = f"not answering since {outage.since}" + (
            f": {outage.message}" if outage.message else ""
        )
    return out


def teacher_statuses(
    job: DistillationJob,
    observed: Observed,
    trainer: Trainer,
    *,
    scaled_to_zero: bool,
    zero_message: str = "scaled to zero",
    outages: Mapping[str, str] | None = None,
) -> tuple[list[TeacherStatus], set[str]]:
    """The TeacherStatus of each teacher, and the names of those failing (not merely starting).

    `outages`: the teachers the trainer reports it cannot reach (status.teacherOutages, the runtime's),
    with its last error: whatever their Deployment says, they are failing for the job.
    Each carries the defaults the CRD gives its fields (the API server fills them in: written without
    them, the status read back would differ from the one decided, and be written again).
    """
    statuses: list[TeacherStatus] = []
    failing: set[str] = set()
    for teacher in job.spec.teachers:
        status, failed = _teacher_status(job, teacher, observed, trainer, scaled_to_zero, zero_message)
        if outages and teacher.name in outages and not scaled_to_zero:
            status = status.model_copy(
                update={"ready": False, "message": f"the trainer cannot reach it: {outages[teacher.name]}"}
            )
            failed = True
        statuses.append(status)
        if failed:
            failing.add(teacher.name)
    return statuses, failing


def _teacher_status(
    job: DistillationJob,
    teacher: Teacher,
    observed: Observed,
    trainer: Trainer,
    scaled_to_zero: bool,
    zero_message: str,
) -> tuple[TeacherStatus, bool]:
    if teacher.placement == Placement.STANDALONE:
        name = naming.teacher_name(job.metadata.name, teacher.name)
        desired = 0 if scaled_to_zero else teacher.replicas
        deployment = observed.deployments.get(name)
        ready_replicas = int(deployment.state.get("readyReplicas", 0)) if deployment else 0
        ready = desired > 0 and ready_replicas >= desired
        failing = False
        if deployment is None:
            message = "Deployment not created yet"
        elif deployment.state.get("failure"):
            message = str(deployment.state["failure"])
            failing = not ready
        elif desired == 0:
            message = zero_message
        else:
            message = f"{ready_replicas}/{desired} replicas ready"
        status = TeacherStatus(
            name=teacher.name,
            placement=teacher.placement,
            ready=ready,
            replicas=desired,
            ready_replicas=ready_replicas,
            endpoint=teacher_url(job.metadata.name, teacher.name, job.metadata.namespace),
            message=message,
        )
        return status, failing
    if teacher.placement in (Placement.EXTERNAL, Placement.SHARED):
        # Served elsewhere (a shared teacher by its DistillationTeacher): ready when its server answers.
        health = observed.external.get(teacher.name)
        ref = teacher.teacher_ref
        served_by = shared_teacher_note(ref.name, observed.shared.get(ref.name)) if ref else ""
        status = TeacherStatus(
            name=teacher.name,
            placement=teacher.placement,
            ready=bool(health and health.ok),
            endpoint=teacher_endpoints(job, teacher, job.metadata.namespace)[0],
            message=served_by + (health.message if health else "not checked yet"),
        )
        return status, health is not None and not health.ok
    status = TeacherStatus(
        name=teacher.name,
        placement=teacher.placement,
        ready=trainer.state == "running",
        message=(
            "the student's base, scored by its rollout engine with the adapter off"
            if teacher.placement == Placement.STUDENT
            else "runs inside the trainer on the student's GPUs"
        ),
    )
    return status, False


@dataclass(frozen=True)
class Cond:
    type: StrEnum
    """A ConditionType of a job, or a TeacherConditionType of a DistillationTeacher."""
    status: bool
    reason: str
    message: str


OUTPUT = "checkpoints, metrics and the final model"


def storage_status(
    job: DistillationJob, claim: Child | None, *, finished: bool = False
) -> tuple[StorageStatus, Cond]:
    """Where the job's output lives (status.storage) and the OutputKept condition. `claim`: the operator's
    checkpoint claim as observed, if it exists and is this job's to use (its own, or kept without owner);
    `finished`: the job is in a terminal phase (a claim gone then is not made again).

    Whether the output outlives the job is read from the claim itself where there is one: a claim kept
    from an earlier job of this name stays kept even when this job says deleteWithJob, since the operator
    never adds an owner to a claim it finds (deleting data is the user's decision)."""
    storage = checkpoint_storage(job.metadata.name, job.spec)
    where = f"at {storage.path} in the trainer pods"
    if storage.claim is None:
        message = (
            f"{OUTPUT} are in the trainer pods' emptyDir {where} (checkpoint.ephemeral): lost when the "
            "pods go, which KubeRay deletes when the run ends"
        )
        return StorageStatus(ephemeral=True), Cond(ConditionType.OUTPUT_KEPT, False, "Ephemeral", message)
    planned = storage.operator_claim
    if planned is None:
        message = (
            f"{OUTPUT} are on PersistentVolumeClaim {storage.claim} {where} (checkpoint.pvc), which the "
            "operator never deletes"
        )
        status = StorageStatus(claim=storage.claim, kept=True)
        return status, Cond(ConditionType.OUTPUT_KEPT, True, "UserClaim", message)
    kept = claim.owner_uid is None if claim is not None else not planned.delete_with_job
    notes: list[str] = []
    if claim is None:
        notes.append("deleted after the job finished" if finished else "not made yet")
    else:
        notes.extend(_claim_notes(claim, planned.size, planned.storage_class_name, planned.access_mode))
        if kept and planned.delete_with_job:
            notes.append(
                "made by an earlier job with this name and kept, so it is not deleted with this one "
                f"(kubectl delete pvc {claim.name} once you are done with it)"
            )
    state = claim.state if claim is not None else {}
    status = StorageStatus(
        claim=planned.name,
        kept=kept,
        size=state.get("capacity") or state.get("requested") or planned.size,
        phase=state.get("phase"),
        message="; ".join(notes) or None,
    )
    if kept:
        message = (
            f"{OUTPUT} are on PersistentVolumeClaim {planned.name} {where}, kept after the job is deleted "
            f"(kubectl delete pvc {planned.name} frees it)"
        )
        return status, Cond(ConditionType.OUTPUT_KEPT, True, "ClaimKept", message)
    message = (
        f"{OUTPUT} are on PersistentVolumeClaim {planned.name} {where}, deleted with the job "
        "(checkpoint.deleteWithJob): copy out what you keep first"
    )
    return status, Cond(ConditionType.OUTPUT_KEPT, False, "DeletedWithJob", message)


def _claim_notes(claim: Child, size: str, storage_class: str | None, access_mode: str) -> list[str]:
    """What the user should know of the operator's claim: being deleted, not bound, smaller than planned."""
    state = claim.state
    notes: list[str] = []
    if state.get("deleting"):
        notes.append("being deleted (it stays while a pod mounts it); made again once it is gone")
    phase = state.get("phase")
    if phase == "Pending":
        wanted = f"{access_mode}, {state.get('requested') or size}"
        by = f"StorageClass {storage_class}" if storage_class else "the cluster's default StorageClass"
        notes.append(
            f"not bound to a volume yet: a class that binds on first use binds it when the trainer's pods are "
            f"scheduled; else {by} may not provide {wanted} (kubectl describe pvc {claim.name})"
        )
    elif phase == "Lost":
        notes.append(f"Lost: its volume is gone (kubectl describe pvc {claim.name})")
    requested = state.get("requested")
    if requested is not None and _less(requested, size):
        # A claim's spec is immutable but for its size, which only grows, and only where its StorageClass
        # allows expansion: the operator leaves that to the user.
        notes.append(
            f"asks for {requested}, less than the {size} this job plans: made by an earlier job with this "
            f"name (grow it with kubectl patch pvc {claim.name}, if its StorageClass allows expansion)"
        )
    return notes


def _less(a: Any, b: Any) -> bool:
    try:
        return bool(parse_quantity(a) < parse_quantity(b))
    except (ValueError, TypeError, InvalidOperation):
        return False


def derive_conditions(
    *,
    problems: Sequence[str],
    refused: Sequence[str],
    valid_ever: bool,
    suspend: bool,
    trainer: Trainer,
    teachers: Sequence[TeacherStatus],
    failing_teachers: set[str],
    terminal: Phase | None,
    held_for_kueue: bool = False,
    outages: Mapping[str, str] | None = None,
    output: Cond | None = None,
    unscheduled: Sequence[Unscheduled] = (),
    storage: Cond | None = None,
) -> list[Cond]:
    """`output`: the OutputKept condition (`storage_status`), for a job with a valid spec; `storage`: the
    StorageReady condition (`storage.StorageCheck`), once the claims were checked. `unscheduled`: the job's
    pods that no node admits (listed while it starts)."""
    conds: list[Cond] = []
    if problems:
        conds.append(Cond(ConditionType.VALID, False, "InvalidSpec", "; ".join(problems)))
    else:
        conds.append(Cond(ConditionType.VALID, True, "SpecValid", "the spec is valid"))
    if problems and valid_ever:
        conds.append(
            Cond(ConditionType.SPEC_APPLIED, False, "InvalidSpec", "the children keep the last valid spec")
        )
    elif refused:
        conds.append(
            Cond(
                ConditionType.SPEC_APPLIED,
                False,
                "SpecChangeRefused",
                f"cannot change {', '.join(refused)} of an existing job (only {LIVE_FIELDS_DOC} can change); "
                "revert the change, or delete and recreate the job",
            )
        )
    elif valid_ever:
        conds.append(Cond(ConditionType.SPEC_APPLIED, True, "SpecApplied", "the children match the spec"))
    if not valid_ever:
        return conds

    ready = [t for t in teachers if t.ready]
    failing = [t for t in teachers if t.name in failing_teachers]
    summary = f"{len(ready)}/{len(teachers)} teachers ready"
    if terminal is not None:
        conds.append(Cond(ConditionType.TEACHERS_READY, False, "JobFinished", "teachers scaled to zero"))
    elif suspend:
        conds.append(Cond(ConditionType.TEACHERS_READY, False, "Suspended", "teachers scaled to zero"))
    elif held_for_kueue:
        message = "teachers held at zero replicas (no GPUs) until Kueue admits the trainer"
        conds.append(Cond(ConditionType.TEACHERS_READY, False, "Queued", message))
    elif failing:
        detail = "; ".join(f"{t.name}: {t.message}" for t in failing)
        conds.append(Cond(ConditionType.TEACHERS_READY, False, "TeacherUnavailable", f"{summary}; {detail}"))
    elif len(ready) == len(teachers):
        conds.append(Cond(ConditionType.TEACHERS_READY, True, "AllTeachersReady", summary))
    else:
        waiting = "; ".join(f"{t.name}: {t.message}" for t in teachers if not t.ready)
        conds.append(Cond(ConditionType.TEACHERS_READY, False, "TeachersStarting", f"{summary}; {waiting}"))

    conds.append(
        Cond(ConditionType.TRAINER_READY, trainer.state == "running", trainer.reason, trainer.message)
    )
    if terminal is None and not suspend:
        conds.append(pods_scheduled(unscheduled))
    if outages and terminal is None:
        waiting = "; ".join(f"{name}: {message}" for name, message in sorted(outages.items()))
        conds.append(
            Cond(
                ConditionType.TEACHER_UNAVAILABLE,
                True,
                "TeacherNotAnswering",
                f"the trainer waits for {waiting}",
            )
        )
    elif terminal is None:
        conds.append(
            Cond(ConditionType.TEACHER_UNAVAILABLE, False, "TeachersAnswering", "no teacher outage reported")
        )
    conds.append(
        Cond(
            ConditionType.SUSPENDED,
            suspend and terminal is None,
            "Suspended" if suspend else "NotSuspended",
            "the job is suspended: RayJob suspended, teachers at zero replicas"
            if suspend
            else "not suspended",
        )
    )
    if output is not None:
        conds.append(output)
    if storage is not None:
        conds.append(storage)
    if terminal == Phase.SUCCEEDED:
        conds.append(Cond(ConditionType.COMPLETE, True, trainer.reason, trainer.message))
    if terminal == Phase.FAILED:
        conds.append(Cond(ConditionType.FAILED, True, trainer.reason, trainer.message))
    return conds


def pods_scheduled(unscheduled: Sequence[Unscheduled]) -> Cond:
    """PodsScheduled: False, naming each pod no node admits and the scheduler's reason, while one waits."""
    if not unscheduled:
        return Cond(ConditionType.PODS_SCHEDULED, True, "NoPodWaiting", "no pod of the job waits for a node")
    pods = "; ".join(u.describe() for u in unscheduled[:MAX_UNSCHEDULED_LISTED])
    more = len(unscheduled) - MAX_UNSCHEDULED_LISTED
    if more > 0:
        pods += f"; and {more} more"
    return Cond(ConditionType.PODS_SCHEDULED, False, "Unschedulable", f"no node admits {pods}")


def terminal_phase(previous_phase: str | None, trainer: Trainer, *, valid_ever: bool) -> Phase | None:
    """The phase of a finished job, None while it is not finished. Terminal phases are sticky: a finished
    job stays finished, whatever its RayJob does next; a job with no valid spec never finishes."""
    if previous_phase in TERMINAL_PHASES:
        return Phase(previous_phase)
    if not valid_ever:
        return None
    if trainer.state == "succeeded":
        return Phase.SUCCEEDED
    if trainer.state == "failed":
        return Phase.FAILED
    return None


def derive_phase(
    *,
    terminal: Phase | None,
    valid_ever: bool,
    suspend: bool,
    trainer: Trainer,
    teachers: Sequence[TeacherStatus],
    previous_phase: str | None,
) -> tuple[Phase, str]:
    """The phase and its one-line message. `terminal`: `terminal_phase`, which is the phase when it is one."""
    if terminal is not None:
        # The message goes with the change: a job already finished keeps the one it finished with.
        return terminal, "" if terminal == previous_phase else trainer.message
    if not valid_ever:
        return Phase.INVALID, "the spec is invalid; no children were created"
    if suspend:
        return Phase.SUSPENDED, "suspended"
    if trainer.state == "queued":
        return Phase.PENDING, trainer.message
    # Colocated teachers and the student's base live in the trainer: only the others gate the start.
    outside = [t for t in teachers if t.placement not in (Placement.COLOCATED, Placement.STUDENT)]
    waiting = [t for t in outside if not t.ready]
    if trainer.state == "running":
        if not waiting or previous_phase == Phase.RUNNING:
            return Phase.RUNNING, "training"
        return Phase.STARTING_TEACHERS, _waiting_message(waiting)
    if waiting:
        return Phase.STARTING_TEACHERS, _waiting_message(waiting)
    return Phase.PENDING, trainer.message


def _waiting_message(waiting: Sequence[TeacherStatus]) -> str:
    return "waiting for teachers: " + "; ".join(f"{t.name} ({t.message})" for t in waiting)


def merge_conditions(
    new: Sequence[Cond], previous: Sequence[Mapping[str, Any]], *, generation: int | None, now: str
) -> list[Condition]:
    """metav1.Conditions; lastTransitionTime moves only when a condition's status changes. `previous`:
    the conditions as read from the job's status."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for cond in new:
        status = "True" if cond.status else "False"
        old = before.get(cond.type.value)
        changed = old is None or old.get("status") != status
        out.append(
            Condition(
                type=cond.type.value,
                status=status,
                reason=cond.reason,
                message=cond.message,
                last_transition_time=now if changed or not old else old.get("lastTransitionTime", now),
                observed_generation=generation,
            )
        )
    return out


def bad_condition(cond: Condition) -> bool:
    """Conditions worth a Warning event."""
    if cond.type in (ConditionType.VALID, ConditionType.SPEC_APPLIED):
        return cond.status == "False"
    if cond.type == ConditionType.FAILED:
        return cond.status == "True"
    if cond.type == ConditionType.PODS_SCHEDULED:
        return cond.status == "False"
    if cond.type == ConditionType.OUTPUT_KEPT:
        return cond.reason == "Ephemeral"  # the output is lost with the pods: say so once, loudly
    if cond.type == ConditionType.STORAGE_READY:
        return cond.status == "False"  # a claim missing, or one its pods cannot mount
    return cond.type == ConditionType.TEACHERS_READY and cond.reason == "TeacherUnavailable"
