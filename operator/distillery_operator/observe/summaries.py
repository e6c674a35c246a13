"""What the operator sees of a job's children: small immutable summaries built from watched objects.

The kopf indexes keep one summary per child (not the whole object), keyed by the owning job, so that a
reconcile reads the world from memory and the API server is only asked to change things.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from distillery.api import API_VERSION, KIND, TEACHER_KIND, DistillationTeacherSpec
from distillery.plan.teachers.client import TeacherClient
from distillery.runtime_config import CONFIG_KEY
from distillery_operator import naming
from distillery_operator.observe import drift

JobKey = tuple[str, str]
"""(namespace, name) of a DistillationJob."""
ClaimKey = tuple[str, str]
"""(namespace, name) of a PersistentVolumeClaim."""
CLAIM_KIND = "PersistentVolumeClaim"
BUDGET_KIND = "PodDisruptionBudget"
POLICY_KIND = "NetworkPolicy"
SECRET_KIND = "Secret"
"""The job's teacher key: not watched (the operator may not list or watch Secrets, it would hold them all);
made with the job's other children (`jobs.decide.plan_actions`), its 409 checked by a GET of its owner."""


@dataclass(frozen=True)
class Child:
    """One object the operator owns, as last seen by a watch."""

    kind: str
    name: str
    owner_uid: str | None
    spec_hash: str | None
    state: Mapping[str, Any] = field(default_factory=dict)
    """Kind-specific facts: replicas and readiness of a Deployment, status of a RayJob, spec of a config."""
    owned: bytes = b""
    """The live object's `observe.drift.owned_view` as compact JSON (empty: not known), compared with the rendered
    object to find edits made by someone else."""

    def owned_view(self) -> dict[str, Any] | None:
        return orjson.loads(self.owned) if self.owned else None


@dataclass(frozen=True)
class ClaimFacts:
    """A PersistentVolumeClaim the job's pods mount, as far as the storage check needs it."""

    name: str
    access_modes: tuple[str, ...]


def claim_facts(body: Mapping[str, Any]) -> ClaimFacts:
    """From a claim read from the API: spec.accessModes (status.accessModes is empty until it is bound)."""
    spec = body.get("spec") or {}
    return ClaimFacts(
        name=(body.get("metadata") or {}).get("name", ""),
        access_modes=tuple(spec.get("accessModes") or ()),
    )


@dataclass(frozen=True)
class Health:
    """The last health check of an external teacher."""

    ok: bool
    message: str


@dataclass(frozen=True)
class ProbeTarget:
    """A teacher served elsewhere as the operator health-checks it: its URL, and the client settings the
    trainer talks to it with (`distillery.plan.teachers.client`), so the check goes as scoring will."""

    endpoint: str
    client: TeacherClient


@dataclass(frozen=True)
class SharedTeacherFacts:
    """A DistillationTeacher of the job's namespace, as the operator's watch last showed it."""

    spec: DistillationTeacherSpec | None
    """None: its spec does not validate."""
    deleting: bool = False
    """Deleted, and held by its finalizer while jobs use it."""


@dataclass(frozen=True, order=True)
class Unscheduled:
    """A pod of the job that no node admits, and the scheduler's reason."""

    pod: str
    component: str
    """The pod's `app.kubernetes.io/component` label: teacher, trainer (Ray head and workers), submitter."""
    message: str

    def describe(self) -> str:
        return f"pod {self.pod} ({self.component}): {self.message}"


@dataclass
class Observed:
    """Everything the operator knows about one job's children."""

    config: Child | None = None
    services: dict[str, Child] = field(default_factory=dict)
    deployments: dict[str, Child] = field(default_factory=dict)
    budgets: dict[str, Child] = field(default_factory=dict)
    """The standalone teachers' PodDisruptionBudgets, by name."""
    policies: dict[str, Child] = field(default_factory=dict)
    """The job's NetworkPolicy (where the chart turns them on), by name."""
    rayjob: Child | None = None
    claim: Child | None = None
    """The checkpoint claim the operator makes for the job (`naming.checkpoint_claim`), found by its name:
    a kept one has no owner reference to key it by."""
    external: dict[str, Health] = field(default_factory=dict)
    """Health of each external teacher, by teacher name (absent: not checked yet)."""
    unscheduled: tuple[Unscheduled, ...] = ()
    """The job's pods that no node admits, as last listed while the job started (`k8s/scheduling.py`)."""
    shared: Mapping[str, SharedTeacherFacts] = field(default_factory=dict)
    """The DistillationTeachers of the job's namespace that it references, by name (absent: none exists)."""
    claims: Mapping[str, ClaimFacts | None] | None = None
    """The claims the pods mount that the operator does not make, read with a GET for this reconcile (None
    where the API server answered 404); None: not read (`decide` then asks for them)."""


def referenced_teachers(job: Mapping[str, Any]) -> list[str]:
    """The DistillationTeachers a job's spec references (read from the raw body: a job whose spec does not
    validate still names them, and is woken when they change)."""
    teachers = (job.get("spec") or {}).get("teachers") or []
    names = []
    for teacher in teachers if isinstance(teachers, list) else []:
        ref = teacher.get("teacherRef") if isinstance(teacher, Mapping) else None
        if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
            names.append(ref["name"])
    return names


def teacher_facts(body: Mapping[str, Any]) -> SharedTeacherFacts:
    """What a job needs of a DistillationTeacher's body."""
    # Imported here: validation pulls in the whole API, which the summaries above do not need.
    from distillery.validation import InvalidManifest, parse_teacher_spec

    try:
        spec: DistillationTeacherSpec | None = parse_teacher_spec(body.get("spec") or {})
    except InvalidManifest:
        spec = None
    return SharedTeacherFacts(spec, bool((body.get("metadata") or {}).get("deletionTimestamp")))


def owner_key(body: Mapping[str, Any]) -> tuple[JobKey, str] | None:
    """The (job key, job uid) a child belongs to, from its controller owner reference."""
    meta = body.get("metadata", {})
    for ref in meta.get("ownerReferences", []) or []:
        if ref.get("kind") == KIND and ref.get("apiVersion") == API_VERSION and ref.get("controller"):
            return (meta.get("namespace", ""), ref.get("name", "")), ref.get("uid", "")
    return None


def teacher_owner_key(body: Mapping[str, Any]) -> JobKey | None:
    """The (namespace, name) of the DistillationTeacher that owns a child, from its controller reference."""
    meta = body.get("metadata", {})
    for ref in meta.get("ownerReferences", []) or []:
        if ref.get("kind") == TEACHER_KIND and ref.get("apiVersion") == API_VERSION and ref.get("controller"):
            return meta.get("namespace", ""), ref.get("name", "")
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):  # kopf's read-only views of the body
        return dict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _owned(body: Mapping[str, Any]) -> bytes:
    return orjson.dumps(drift.owned_view(body), default=_plain)


def _base(body: Mapping[str, Any]) -> tuple[str, str | None, str | None]:
    meta = body.get("metadata", {})
    owner = owner_key(body)
    annotations = meta.get("annotations") or {}
    return meta.get("name", ""), owner[1] if owner else None, annotations.get(naming.SPEC_HASH_ANNOTATION)


def summarize_deployment(body: Mapping[str, Any]) -> Child:
    name, uid, spec_hash = _base(body)
    status = body.get("status") or {}
    failure = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            failure = cond.get("message") or "progress deadline exceeded"
        elif cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            failure = cond.get("message") or cond.get("reason") or "replica failure"
    return Child(
        kind="Deployment",
        name=name,
        owner_uid=uid,
        spec_hash=spec_hash,
        state={
            "replicas": (body.get("spec") or {}).get("replicas", 1),
            "readyReplicas": status.get("readyReplicas", 0) or 0,
            "failure": failure,
        },
        owned=_owned(body),
    )


def summarize_service(body: Mapping[str, Any]) -> Child:
    name, uid, spec_hash = _base(body)
    return Child(kind="Service", name=name, owner_uid=uid, spec_hash=spec_hash, owned=_owned(body))


def summarize_budget(body: Mapping[str, Any]) -> Child:
    name, uid, spec_hash = _base(body)
    return Child(kind=BUDGET_KIND, name=name, owner_uid=uid, spec_hash=spec_hash, owned=_owned(body))


def summarize_policy(body: Mapping[str, Any]) -> Child:
    name, uid, spec_hash = _base(body)
    return Child(kind=POLICY_KIND, name=name, owner_uid=uid, spec_hash=spec_hash, owned=_owned(body))


def summarize_config_map(body: Mapping[str, Any]) -> Child:
    """The config map carries the applied spec: the record of what the children were made from."""
    name, uid, spec_hash = _base(body)
    spec: Any = None
    raw = (body.get("data") or {}).get(CONFIG_KEY)
    if raw:
        try:
            spec = orjson.loads(raw).get("spec")
        except (orjson.JSONDecodeError, AttributeError):
            spec = None
    return Child(
        kind="ConfigMap",
        name=name,
        owner_uid=uid,
        spec_hash=spec_hash,
        state={"spec": spec},
        owned=_owned(body),
    )


RAYJOB_STATUS_FIELDS = ("jobStatus", "jobDeploymentStatus", "reason", "message", "startTime", "endTime")


def summarize_rayjob(body: Mapping[str, Any]) -> Child:
    name, uid, spec_hash = _base(body)
    status = body.get("status") or {}
    state = {k: status.get(k) for k in RAYJOB_STATUS_FIELDS}
    state["suspend"] = bool((body.get("spec") or {}).get("suspend", False))
    return Child(
        kind="RayJob", name=name, owner_uid=uid, spec_hash=spec_hash, state=state, owned=_owned(body)
    )


def summarize_claim(body: Mapping[str, Any]) -> Child:
    """The checkpoint claim: whose it is (a kept one has no owner), its phase, size and whether it is being
    deleted. Its spec is never compared or patched (a claim's spec is immutable but for a larger size)."""
    name, uid, spec_hash = _base(body)
    meta = body.get("metadata", {})
    requests = ((body.get("spec") or {}).get("resources") or {}).get("requests") or {}
    status = body.get("status") or {}
    state = {
        "phase": status.get("phase"),
        "requested": requests.get("storage"),
        "capacity": (status.get("capacity") or {}).get("storage"),
        "deleting": bool(meta.get("deletionTimestamp")),
        "accessModes": list((body.get("spec") or {}).get("accessModes") or []),
    }
    return Child(kind=CLAIM_KIND, name=name, owner_uid=uid, spec_hash=spec_hash, state=state)


def _summarize_plain(kind: str):  # type: ignore[no-untyped-def]
    """The trainer's identity objects: only whether they exist, whose they are and their content hash."""

    def summarize(body: Mapping[str, Any]) -> Child:
        name, uid, spec_hash = _base(body)
        # What grants: an edited rule or subject is put back even when the edit kept our hash annotation.
        state = {k: body[k] for k in ("rules", "subjects") if k in body}
        return Child(kind=kind, name=name, owner_uid=uid, spec_hash=spec_hash, state=state)

    return summarize


IDENTITY_KINDS = ("ServiceAccount", "Role", "RoleBinding")
"""Children that `jobs.identity.identity_actions` looks after (`decide` and `assemble` leave them alone)."""

SUMMARIZERS = {
    "Deployment": summarize_deployment,
    "Service": summarize_service,
    BUDGET_KIND: summarize_budget,
    POLICY_KIND: summarize_policy,
    "ConfigMap": summarize_config_map,
    "RayJob": summarize_rayjob,
    CLAIM_KIND: summarize_claim,
    **{kind: _summarize_plain(kind) for kind in IDENTITY_KINDS},
}


def assemble(
    children: Iterable[Child],
    external: Mapping[str, Health] | None = None,
    unscheduled: Iterable[Unscheduled] = (),
) -> Observed:
    """Groups a job's children by kind."""
    observed = Observed(external=dict(external or {}), unscheduled=tuple(unscheduled))
    for child in children:
        if child.kind == "ConfigMap":
            observed.config = child
        elif child.kind == "RayJob":
            observed.rayjob = child
        elif child.kind == "Deployment":
            observed.deployments[child.name] = child
        elif child.kind == "Service":
            observed.services[child.name] = child
        elif child.kind == BUDGET_KIND:
            observed.budgets[child.name] = child
        elif child.kind == POLICY_KIND:
            observed.policies[child.name] = child
        elif child.kind == CLAIM_KIND:
            observed.claim = child
    return observed
