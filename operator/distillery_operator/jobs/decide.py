"""The reconcile decision: a job and its observed children in, the writes to make and the new status out.

Pure: no API calls, no clock (the time is an argument). The status is a typed `DistillationJobStatus`;
the controller executes the actions, serialises the status and writes it when it differs, and posts the
events. Running it twice on the same input gives the same output,
and on its own output (children created, status written) it asks for nothing more.

Before the trainer is made, the claims its pods (and the teachers') mount are checked (`storage`): a
decision made without them asks for them (`Decision.read_claims`), and the controller reads them and
decides again; a claim missing or unable to serve its pods holds every create back (`Decision.held`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from distillery.api import (
    SERVED_ELSEWHERE,
    Children,
    DistillationJob,
    DistillationJobSpec,
    DistillationJobStatus,
    ObjectMeta,
    Phase,
    Placement,
    Teacher,
    TeacherStatus,
)
from distillery.plan.checkpoints.storage import checkpoint_storage
from distillery.plan.teachers.client import teacher_client
from distillery.runtime_config import teacher_endpoints
from distillery.validation import InvalidManifest, parse_spec
from distillery_operator import naming
from distillery_operator.jobs.spec_changes import effective_spec, refused_changes
from distillery_operator.jobs.status import (
    Cond,
    Trainer,
    bad_condition,
    derive_conditions,
    derive_phase,
    merge_conditions,
    runtime_outages,
    storage_status,
    teacher_statuses,
    terminal_phase,
    trainer_state,
)
from distillery_operator.jobs.storage import (
    StorageCheck,
    check_storage,
    claim_uses,
    claims_to_read,
    mountable,
)
from distillery_operator.jobs.teacher_refs import RefCheck, check_teacher_refs
from distillery_operator.observe.drift import drifted
from distillery_operator.observe.summaries import (
    BUDGET_KIND,
    CLAIM_KIND,
    POLICY_KIND,
    SECRET_KIND,
    Child,
    ClaimFacts,
    Observed,
    ProbeTarget,
)
from distillery_operator.render import (
    KUEUE_QUEUE_LABEL,
    NO_CLUSTER_SETTINGS,
    ClusterSettings,
    RenderContext,
    queued_by_kueue,
    render_job,
)


@dataclass(frozen=True)
class Action:
    """One write: `create` sends a whole object, `patch` a JSON merge patch."""

    verb: Literal["create", "patch"]
    kind: str
    name: str
    body: dict[str, Any]
    why: str


@dataclass(frozen=True)
class EventSpec:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Decision:
    status: DistillationJobStatus
    """The operator's fields of the new status (the runtime's are left at their defaults: never written)."""
    actions: list[Action] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)
    external: dict[str, ProbeTarget] = field(default_factory=dict)
    """Teachers served elsewhere to health-check, by name."""
    starting: bool = False
    """The job's pods are being placed (valid, not suspended or held by Kueue, the trainer not running
    yet): the operator lists them to say which wait for a node and why (`k8s/scheduling.py`)."""
    finished: bool = False
    """The job is in a terminal phase (`status.terminal_phase`)."""
    read_claims: list[str] = field(default_factory=list)
    """Claims to read (GET) and decide again with (`Observed.claims`): the trainer is about to be made."""
    held: bool = False
    """The storage check failed: nothing is created (the trainer's identity neither)."""
    wait: bool = False
    """A claim is missing: decide again later (with backoff), it may be being made."""


def job_metadata(body: Mapping[str, Any]) -> ObjectMeta:
    meta = body.get("metadata", {})
    return ObjectMeta(
        name=meta.get("name", ""),
        namespace=meta.get("namespace"),
        labels=dict(meta.get("labels") or {}),
        uid=meta.get("uid"),
        generation=meta.get("generation"),
    )


def parse_current(body: Mapping[str, Any]) -> tuple[DistillationJobSpec | None, list[str]]:
    """The job's current spec, or the problems (`path: reason`) that make it invalid."""
    try:
        return parse_spec(body.get("spec") or {}), []
    except InvalidManifest as error:
        return None, [f"{p.path}: {p.reason}" if p.path else p.reason for p in error.problems]


def parse_applied(config: Child | None) -> DistillationJobSpec | None:
    if config is None or not config.state.get("spec"):
        return None
    try:
        return parse_spec(config.state["spec"])
    except InvalidManifest:
        # Written by another operator version that this one cannot read: treat the current spec as new.
        return None


def own_children(observed: Observed, uid: str | None) -> tuple[Observed, list[str]]:
    """Splits off children with our names that belong to another job (e.g. a deleted one with the same name).

    The checkpoint claim is also the job's when it has no owner: the operator made it for a job of this
    name (it carries our labels) and kept it, for this one to use again."""
    foreign: list[str] = []

    def mine(child: Child | None, *, kept_is_mine: bool = False) -> Child | None:
        if child is None or child.owner_uid == uid or (kept_is_mine and child.owner_uid is None):
            return child
        foreign.append(f"{child.kind}/{child.name}")
        return None

    own = Observed(
        config=mine(observed.config),
        rayjob=mine(observed.rayjob),
        services={n: c for n, c in observed.services.items() if mine(c)},
        deployments={n: c for n, c in observed.deployments.items() if mine(c)},
        budgets={n: c for n, c in observed.budgets.items() if mine(c)},
        policies={n: c for n, c in observed.policies.items() if mine(c)},
        claim=mine(observed.claim, kept_is_mine=True),
        external=observed.external,
        unscheduled=observed.unscheduled,
        shared=observed.shared,
        claims=observed.claims,
    )
    return own, foreign


@dataclass
class _JobPlan:
    """What `decide` works out for a job with a valid spec: its teachers' statuses, the actions on its
    children, the checks before its trainer is made, and the teachers served elsewhere to probe."""

    teachers: list[TeacherStatus] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)
    actions: list[Action] = field(default_factory=list)
    external: dict[str, ProbeTarget] = field(default_factory=dict)
    read_claims: list[str] = field(default_factory=list)
    storage_check: StorageCheck | None = None
    storage_cond: Cond | None = None
    refs: RefCheck | None = None


def decide(
    body: Mapping[str, Any], observed: Observed, now: str, *, cluster: ClusterSettings = NO_CLUSTER_SETTINGS
) -> Decision:
    meta = job_metadata(body)
    previous: Mapping[str, Any] = body.get("status") or {}
    current, problems = parse_current(body)
    observed, foreign = own_children(observed, meta.uid)
    spec, refused = _spec_to_act_on(current, parse_applied(observed.config))
    job = DistillationJob(metadata=meta, spec=spec) if spec is not None else None
    if job is None or checkpoint_storage(job.metadata.name, job.spec).operator_claim is None:
        # A claim of this name that another job owns is in the way only of a job that makes one.
        foreign = [f for f in foreign if not f.startswith(f"{CLAIM_KIND}/")]

    suspend = bool(spec and spec.suspend)
    queue = kueue_queue(job) if job is not None else None
    trainer = trainer_state(observed.rayjob, suspend=suspend, queue=queue)
    previous_phase = previous.get("phase")
    terminal = terminal_phase(previous_phase, trainer, valid_ever=job is not None)
    held_for_kueue = _held_for_kueue(queue, observed.rayjob, suspend=suspend, terminal=terminal)
    scaled_to_zero = suspend or terminal is not None or held_for_kueue
    outages = {} if scaled_to_zero else runtime_outages(previous)
    plan = (
        _plan_job(
            job,
            observed,
            trainer,
            foreign,
            terminal=terminal,
            suspend=suspend,
            held_for_kueue=held_for_kueue,
            outages=outages,
            cluster=cluster,
        )
        if job is not None
        else _JobPlan()
    )
    teachers, refs, storage_check = plan.teachers, plan.refs, plan.storage_check

    phase, message = derive_phase(
        terminal=terminal,
        valid_ever=job is not None,
        suspend=suspend,
        trainer=trainer,
        teachers=teachers,
        previous_phase=previous_phase,
    )
    if problems and job is None:
        message = "the spec is invalid: " + "; ".join(problems)
    starting = phase in (Phase.PENDING, Phase.STARTING_TEACHERS) and job is not None and not held_for_kueue
    unscheduled = observed.unscheduled if starting else ()
    phase, message = _waiting_for(phase, message, unscheduled, foreign, plan)
    held = storage_check is not None and not storage_check.ok
    conflicting = storage_check is not None and bool(storage_check.conflicts)
    finished = terminal is not None
    storage, output = (
        storage_status(job, observed.claim, finished=finished) if job is not None else (None, None)
    )
    conds = derive_conditions(
        problems=problems,
        refused=refused,
        valid_ever=job is not None,
        suspend=suspend,
        trainer=trainer,
        teachers=teachers,
        failing_teachers=plan.failing,
        terminal=terminal,
        held_for_kueue=held_for_kueue,
        outages=outages,
        output=output,
        unscheduled=unscheduled,
        storage=plan.storage_cond,
    )
    generation = meta.generation
    status = DistillationJobStatus(
        phase=phase,
        message=message or previous.get("message"),
        observed_generation=generation,
        conditions=merge_conditions(conds, previous.get("conditions") or [], generation=generation, now=now),
        teachers=teachers,
        teachers_ready=f"{sum(t.ready for t in teachers)}/{len(teachers)}" if teachers else None,
        children=_children(job) if job is not None else None,
        storage=storage,
        start_time=previous.get("startTime") or (now if phase == Phase.RUNNING else None),
        completion_time=previous.get("completionTime") or (now if terminal is not None else None),
    )
    return Decision(
        status=status,
        actions=plan.actions,
        events=transition_events(previous, status),
        external=plan.external,
        starting=starting,
        finished=terminal is not None,
        read_claims=plan.read_claims,
        held=held or (refs is not None and bool(refs.missing or refs.refused)),
        wait=held and not conflicting,
    )


def _held_for_kueue(
    queue: str | None, rayjob: Child | None, *, suspend: bool, terminal: Phase | None
) -> bool:
    """While Kueue holds the trainer (its RayJob suspended, or about to be created so), the standalone
    teachers hold no GPUs either: they start when Kueue admits the RayJob by unsuspending it."""
    return (
        queue is not None
        and not suspend
        and terminal is None
        and (rayjob is None or bool(rayjob.state.get("suspend")))
    )


def _spec_to_act_on(
    current: DistillationJobSpec | None, applied: DistillationJobSpec | None
) -> tuple[DistillationJobSpec | None, list[str]]:
    """The spec the operator acts on (the applied one with the current one's allowed changes; either, where
    only one is there), and the changes it refuses."""
    if current is not None and applied is not None:
        return effective_spec(applied, current), refused_changes(applied, current)
    return (current if current is not None else applied), []


def _plan_job(
    job: DistillationJob,
    observed: Observed,
    trainer: Trainer,
    foreign: list[str],
    *,
    terminal: Phase | None,
    suspend: bool,
    held_for_kueue: bool,
    outages: Mapping[str, str],
    cluster: ClusterSettings,
) -> _JobPlan:
    """The teachers' statuses, the actions on the job's children, and the claims and teacher references
    checked before its trainer is made (a job is made whole or not at all)."""
    scaled_to_zero = suspend or terminal is not None or held_for_kueue
    plan = _JobPlan()
    plan.teachers, plan.failing = teacher_statuses(
        job,
        observed,
        trainer,
        scaled_to_zero=scaled_to_zero,
        zero_message=HELD_FOR_KUEUE if held_for_kueue else "scaled to zero",
        outages=outages,
    )
    meta = job.metadata
    ctx = RenderContext(
        namespace=meta.namespace or "",
        owner_uid=meta.uid,
        teachers_scaled_to_zero=scaled_to_zero,
        cluster=cluster,
    )
    blocked = set(foreign)
    plan.actions = plan_actions(job, render_job(job, ctx), observed, blocked, terminal is not None)
    if terminal is None and observed.rayjob is None:
        # The trainer is about to be made: its claims (and the teachers') are checked first.
        plan.read_claims = claims_to_read(job) if observed.claims is None else []
        if not plan.read_claims:
            plan.storage_check = check_storage(job, observed.claims or {}, _operators_claim(observed.claim))
            plan.storage_cond = plan.storage_check.condition()
            if not plan.storage_check.ok:
                # Nothing new is made: a job is made whole or not at all.
                plan.actions = [a for a in plan.actions if a.verb != "create"]
    else:
        plan.storage_cond = mountable(tuple(use.claim for use in claim_uses(job)))
    if terminal is None and observed.rayjob is None:
        # Before the trainer is made, its DistillationTeachers must exist and serve what it asks.
        plan.refs = check_teacher_refs(job, observed.shared)
        if plan.refs.missing or plan.refs.refused:
            plan.actions = [a for a in plan.actions if a.verb != "create"]
    # Teachers served elsewhere are asked directly whether they answer: an external server, and a
    # shared teacher's Service (the job does not own its Deployment, so it has none to watch).
    plan.external = {
        t.name: probe_target(job, index, t)
        for index, t in enumerate(job.spec.teachers)
        if t.placement in SERVED_ELSEWHERE and terminal is None and not suspend
    }
    return plan


def _waiting_for(
    phase: Phase, message: str, unscheduled: Sequence[Any], foreign: list[str], plan: _JobPlan
) -> tuple[Phase, str]:
    """The phase and message once what the job waits for is said: a node, another job's children, its
    DistillationTeachers, or claims that cannot serve its pods."""
    if unscheduled:
        others = f" (and {len(unscheduled) - 1} more)" if len(unscheduled) > 1 else ""
        message = f"waiting for a node: {unscheduled[0].describe()}{others}"
    if foreign:
        message = f"waiting for {', '.join(foreign)} of another job with this name to be deleted"
    refs = plan.refs
    if refs is not None and (refs.missing or refs.refused):
        # Refused as an invalid spec is, until the job or the teacher changes (its events wake the job).
        phase = Phase.INVALID if refs.refused else Phase.PENDING
        message = "; ".join(refs.refused or refs.missing)
    check, cond = plan.storage_check, plan.storage_cond
    if check is not None and not check.ok and cond is not None:
        # A claim that cannot serve the pods is the spec's problem in this cluster: refused, as an invalid
        # spec is, until the spec or the claim changes. A missing one is waited for.
        phase = Phase.INVALID if check.conflicts else Phase.PENDING
        message = cond.message
    return phase, message


def probe_target(job: DistillationJob, index: int, teacher: Teacher) -> ProbeTarget:
    """How the operator checks a teacher served elsewhere: at its URL, with the trainer's client settings."""
    endpoints = teacher_endpoints(job, teacher, job.metadata.namespace)
    client = teacher_client(teacher, index, endpoints, in_cluster=True)
    assert client is not None  # a teacher served elsewhere has an endpoint
    return ProbeTarget(endpoints[0], client)


def _operators_claim(claim: Child | None) -> ClaimFacts | None:
    """The operator's checkpoint claim as its watch has it (None: not made yet)."""
    if claim is None:
        return None
    return ClaimFacts(claim.name, tuple(claim.state.get("accessModes") or ()))


HELD_FOR_KUEUE = "held at zero replicas until Kueue admits the trainer"


def kueue_queue(job: DistillationJob) -> str | None:
    """The Kueue queue the job asks for (its `kueue.x-k8s.io/queue-name` label), if any."""
    if not queued_by_kueue(job):
        return None
    return job.spec.labels.get(KUEUE_QUEUE_LABEL) or job.metadata.labels.get(KUEUE_QUEUE_LABEL)


def _children(job: DistillationJob) -> Children:
    name = job.metadata.name
    standalone = [t for t in job.spec.teachers if t.placement == Placement.STANDALONE]
    teacher_names = [naming.teacher_name(name, t.name) for t in standalone]
    return Children(
        ray_job=naming.rayjob_name(name),
        config_map=naming.config_map_name(name),
        teacher_deployments=teacher_names,
        teacher_services=teacher_names,
    )


def plan_actions(
    job: DistillationJob,
    desired: list[dict[str, Any]],
    observed: Observed,
    blocked: set[str],
    terminal: bool,
) -> list[Action]:
    """The writes that bring the children to the desired objects (each child at most one write)."""
    actions: list[Action] = []
    key: tuple[int, Action] | None = None
    rolls_onto_key = False
    for obj in desired:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if f"{kind}/{name}" in blocked:
            continue
        if kind == SECRET_KIND:
            # The teacher key is not watched: it is made (or found made, a 409 the controller checks is the
            # job's) whenever pods that take it are made, in the same step and before them; never patched
            # (it is made once with its value, `render/teacher_key.py`: a patch could only lose it).
            if not terminal:
                key = (len(actions), Action("create", kind, name, obj, "with the pods that take it"))
            continue
        seen = _observed_child(observed, kind, name)
        if seen is None:
            # A finished job gets no new objects: a deleted RayJob must not run again.
            if not terminal:
                actions.append(Action("create", kind, name, obj, "missing"))
            continue
        if kind == CLAIM_KIND:
            # Never patched: a claim's spec is immutable (but for a larger size, which only its StorageClass
            # may allow), and a kept one may be an earlier job's; `storage_status` reports what differs.
            continue
        edited = _drift(obj, seen)
        if kind == "RayJob":
            if terminal:
                continue  # KubeRay is done with it; nothing of it matters any more
            patch = _rayjob_patch(job, seen)
            if edited:
                body = _restore(obj)
                body["spec"].pop("suspend", None)  # the trainer's suspend is decided below, not restored
                actions.append(Action("patch", kind, name, _merge(body, patch or {}), edited))
            elif patch is not None:
                actions.append(Action("patch", kind, name, patch, "suspend"))
            continue
        action = child_write(obj, seen)
        if action is not None:
            actions.append(action)
            if kind in POD_MAKERS and key is not None and not _takes_secret(seen, key[1].name):
                # A Deployment made before teacher keys (an operator upgraded under a running job) rolls its
                # pods onto the key: they must not wait on a Secret that nothing makes.
                rolls_onto_key = True
    if key is not None and (
        rolls_onto_key or any(a.verb == "create" and a.kind in POD_MAKERS for a in actions)
    ):
        actions.insert(*key)  # where it is rendered: before the pods' makers
    return actions


def _takes_secret(seen: Child, secret: str) -> bool:
    """Whether the live object's pods take a value from Secret `secret` (by secretKeyRef)."""

    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            ref = node.get("secretKeyRef")
            if isinstance(ref, dict) and ref.get("name") == secret:
                return True
            return any(walk(v) for v in node.values())
        return isinstance(node, list) and any(walk(v) for v in node)

    return walk(seen.owned_view())


POD_MAKERS = ("Deployment", "RayJob")
"""The children whose pods take the teacher key (a standalone teacher's replicas, the trainer's head)."""


def child_write(obj: dict[str, Any], seen: Child | None) -> Action | None:
    """The write that brings a plain child (a Deployment, Service, ...) to its rendered object: made where
    missing, put back where edited, a Deployment scaled where only its replicas differ; None: nothing."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if seen is None:
        return Action("create", kind, name, obj, "missing")
    edited = _drift(obj, seen)
    if edited:
        # Someone edited the object, or a live change of the config: make it ours again.
        return Action("patch", kind, name, _restore(obj), edited)
    if kind == "Deployment" and seen.state.get("replicas") != obj["spec"]["replicas"]:
        return Action("patch", kind, name, {"spec": {"replicas": obj["spec"]["replicas"]}}, "scale")
    return None


def _drift(rendered: dict[str, Any], seen: Child) -> str:
    """Why a child must be patched back ('' if it need not): its spec-hash annotation is not the rendered
    one (a live change of the config, or an edited annotation), or a field the operator renders holds
    another value (someone edited the object; fields the API server or other controllers fill in do not
    count: `drift.drifted`)."""
    if seen.spec_hash != rendered["metadata"]["annotations"][naming.SPEC_HASH_ANNOTATION]:
        return "drift: spec-hash"
    live = seen.owned_view()
    paths = drifted(rendered, live) if live is not None else []
    if paths:
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        return f"drift: {shown}"
    return ""


def _restore(rendered: dict[str, Any]) -> dict[str, Any]:
    """A merge patch putting back what the operator renders (and its labels and spec-hash annotation)."""
    body = {k: v for k, v in rendered.items() if k in ("spec", "data")}
    body["metadata"] = {k: rendered["metadata"][k] for k in ("labels", "annotations")}
    return body


def _merge(body: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            _merge(body[key], value)
        else:
            body[key] = value
    return body


def _rayjob_patch(job: DistillationJob, seen: Child) -> dict[str, Any] | None:
    """Suspend follows the job; resuming a Kueue-queued RayJob is Kueue's decision, not ours."""
    suspended = bool(seen.state.get("suspend"))
    if job.spec.suspend and not suspended:
        return {"spec": {"suspend": True}}
    if not job.spec.suspend and suspended and not queued_by_kueue(job):
        return {"spec": {"suspend": False}}
    return None


def _observed_child(observed: Observed, kind: str, name: str) -> Child | None:
    if kind == "ConfigMap":
        return observed.config if observed.config and observed.config.name == name else None
    if kind == "RayJob":
        return observed.rayjob if observed.rayjob and observed.rayjob.name == name else None
    if kind == "Deployment":
        return observed.deployments.get(name)
    if kind == BUDGET_KIND:
        return observed.budgets.get(name)
    if kind == POLICY_KIND:
        return observed.policies.get(name)
    if kind == CLAIM_KIND:
        return observed.claim if observed.claim and observed.claim.name == name else None
    return observed.services.get(name)


def transition_events(previous: Mapping[str, Any], status: DistillationJobStatus) -> list[EventSpec]:
    """An Event per phase change and per condition transition (and for bad conditions when they appear).
    `previous`: the status as read from the job."""
    events: list[EventSpec] = []
    old_phase, new_phase = previous.get("phase"), status.phase
    if old_phase != new_phase:
        kind: Literal["Normal", "Warning"] = (
            "Warning" if new_phase in (Phase.FAILED, Phase.INVALID) else "Normal"
        )
        text = f"phase {old_phase or '(none)'} -> {new_phase.value}"
        if status.message:
            text += f": {status.message}"
        events.append(EventSpec(kind, new_phase.value, text))
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    for cond in status.conditions:
        old = before.get(cond.type)
        changed = (
            old is None
            or old.get("status") != cond.status
            or (bad_condition(cond) and old.get("message") != cond.message)
        )
        if not changed or (old is None and not bad_condition(cond)):
            continue
        kind = "Warning" if bad_condition(cond) else "Normal"
        events.append(EventSpec(kind, cond.reason, f"{cond.type}={cond.status}: {cond.message}"))
    return events
