"""What the operator does with one DistillationTeacher (pure): its objects, replicas, finalizer and status.

The inputs are what the watches and the scaling loop saw: the teacher's body, its Deployment, Service and
NetworkPolicy (as summaries), the jobs of its namespace that reference it (with the digests of the active
ones' keys, which its clients Secret holds), the replicas' queues (`teacher_metrics`) and how long it has
been idle. The replica count is `plan.teachers.scaling.decide_replicas`; an Event names each
change and its reason. While an active job references the teacher, the finalizer `FINALIZER` is on it, so
that deleting it waits until the jobs end (or the user removes the finalizer); the jobs say so in their
teacher status (`teacher_refs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from distillery.api import (
    DistillationTeacher,
    DistillationTeacherStatus,
    ObjectMeta,
    TeacherConditionType,
)
from distillery.plan.teachers.scaling import (
    ReplicaLoad,
    ScalingDecision,
    ScalingPolicy,
    ScalingReason,
    decide_replicas,
)
from distillery.runtime_config import shared_teacher_url
from distillery.validation import InvalidManifest, parse_teacher_spec
from distillery_operator.jobs.decide import Action, EventSpec, child_write
from distillery_operator.jobs.status import Cond, merge_conditions
from distillery_operator.observe.summaries import Child
from distillery_operator.render import (
    NO_CLUSTER_SETTINGS,
    ClusterSettings,
    render_shared_teacher,
    render_shared_teacher_clients,
    render_shared_teacher_policy,
)

FINALIZER = "distillery.io/in-use"
"""Held while active jobs reference the teacher."""


@dataclass(frozen=True)
class TeacherUse:
    """A job of the teacher's namespace whose spec references it."""

    job: str
    active: bool
    """Neither finished, refused nor suspended: it needs the teacher now or soon."""
    uid: str = ""
    """The job's uid: a job deleted and made again under its name is another job, with another key."""


@dataclass
class TeacherDecision:
    actions: list[Action] = field(default_factory=list)
    status: DistillationTeacherStatus = field(default_factory=DistillationTeacherStatus)
    scaling: ScalingDecision | None = None
    events: list[EventSpec] = field(default_factory=list)
    finalizers: list[str] | None = None
    """The teacher's new metadata.finalizers; None: unchanged."""
    clients: dict[str, Any] | None = None
    """Its clients Secret as it must be (None: the spec is invalid, nothing is made). Not watched: the loop
    writes it when it differs from what it last wrote, before the replicas that mount it are made."""


def _finalizers(meta: Mapping[str, Any], in_use: bool) -> list[str] | None:
    current = list(meta.get("finalizers") or [])
    if in_use and FINALIZER not in current:
        return [*current, FINALIZER]
    if not in_use and FINALIZER in current:
        return [f for f in current if f != FINALIZER]
    return None


def decide_teacher(
    body: Mapping[str, Any],
    *,
    deployment: Child | None,
    service: Child | None,
    network_policy: Child | None = None,
    uses: Sequence[TeacherUse],
    clients: Mapping[str, str] | None = None,
    loads: Sequence[ReplicaLoad],
    idle_for_seconds: float,
    now: str,
    cluster: ClusterSettings | None = None,
    replicas_by_hpa: bool = False,
) -> TeacherDecision:
    """`clients`: the key digest of each active job that references the teacher, by job identity (a job
    whose key the operator has not found yet is left out until it is). `replicas_by_hpa`: the chart hands
    the replica count to an HPA; the Deployment is made at minReplicas and its count is left as it is
    found."""
    meta = body.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    generation = meta.get("generation")
    previous = (body.get("status") or {}).get("conditions") or []
    active = sorted(u.job for u in uses if u.active)
    finalizers = _finalizers(meta, in_use=bool(active))
    try:
        spec = parse_teacher_spec(body.get("spec") or {})
    except InvalidManifest as error:
        message = "; ".join(f"{p.path}: {p.reason}" for p in error.problems)
        conds = [Cond(TeacherConditionType.VALID, False, "InvalidSpec", message)]
        status = DistillationTeacherStatus(
            jobs=active,
            conditions=merge_conditions(conds, previous, generation=generation, now=now),
            observed_generation=generation,
        )
        return TeacherDecision(status=status, finalizers=finalizers)

    current = int(deployment.state.get("replicas", 0)) if deployment is not None else 0
    scaling = spec.scaling
    policy = ScalingPolicy(
        scaling.min_replicas, scaling.max_replicas, scaling.target_waiting_per_replica, scaling.idle_seconds
    )
    ready = int(deployment.state.get("readyReplicas", 0)) if deployment is not None else 0
    if replicas_by_hpa:
        kept = current if deployment is not None else scaling.min_replicas
        decision = ScalingDecision(kept, ScalingReason.BY_HPA, "the replicas are an HPA's", changed=False)
    else:
        decision = decide_replicas(
            current=current,
            policy=policy,
            loads=loads,
            active_jobs=len(active),
            idle_for_seconds=idle_for_seconds,
            ready=ready,
        )
    teacher = DistillationTeacher(metadata=ObjectMeta(name=name, namespace=namespace), spec=spec)
    deployment_obj, service_obj = render_shared_teacher(
        teacher, namespace=namespace, replicas=decision.replicas, owner_uid=meta.get("uid"), cluster=cluster
    )
    clients_obj = render_shared_teacher_clients(
        teacher, namespace=namespace, clients=clients or {}, owner_uid=meta.get("uid")
    )
    policy_obj = render_shared_teacher_policy(
        teacher, namespace=namespace, owner_uid=meta.get("uid"), cluster=cluster or NO_CLUSTER_SETTINGS
    )
    # The policy first: made before any replica it selects (None where the chart turns policies off).
    writes = [(policy_obj, network_policy)] if policy_obj is not None else []
    writes += [(service_obj, service), (deployment_obj, deployment)]
    actions = [action for obj, seen in writes if (action := child_write(obj, seen)) is not None]
    events = []
    if decision.changed:
        events.append(
            EventSpec(
                "Normal",
                decision.reason.value,
                f"replicas {current} -> {decision.replicas}: {decision.message}",
            )
        )

    deleting = bool(meta.get("deletionTimestamp"))
    conds = _conditions(decision, ready, active, deleting=deleting)
    status = DistillationTeacherStatus(
        replicas=decision.replicas,
        ready_replicas=ready,
        endpoint=shared_teacher_url(name, namespace),
        jobs=active,
        conditions=merge_conditions(conds, previous, generation=generation, now=now),
        observed_generation=generation,
    )
    if deleting:
        # Its replicas still serve the jobs that hold it (and still scale); nothing is made again.
        actions = [a for a in actions if a.verb == "patch"]
    return TeacherDecision(
        actions=actions,
        status=status,
        scaling=decision,
        events=events,
        finalizers=finalizers,
        clients=clients_obj,
    )


def _conditions(decision: ScalingDecision, ready: int, active: list[str], *, deleting: bool) -> list[Cond]:
    """A valid teacher's conditions: Valid, Ready (its replicas) and InUse (the jobs that hold it)."""
    if ready > 0:
        ready_cond = Cond(
            TeacherConditionType.READY, True, "ReplicasReady", f"{ready}/{decision.replicas} ready"
        )
    elif decision.replicas == 0:
        ready_cond = Cond(TeacherConditionType.READY, False, "ScaledToZero", decision.message)
    else:
        ready_cond = Cond(TeacherConditionType.READY, False, "Starting", f"0/{decision.replicas} ready")
    if active:
        held = "; deleting it waits until they end" if deleting else ""
        in_use = Cond(TeacherConditionType.IN_USE, True, "JobsActive", f"used by {', '.join(active)}{held}")
    else:
        in_use = Cond(TeacherConditionType.IN_USE, False, "NoActiveJob", "no active job references it")
    return [Cond(TeacherConditionType.VALID, True, "Valid", "the spec is valid"), ready_cond, in_use]
