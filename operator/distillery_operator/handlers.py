"""kopf registrations: when X changes, tell the controller. No decisions here.

DistillationJob events update the controller's copy of the job and queue it. Children (Deployments,
Services, PodDisruptionBudgets, NetworkPolicies, ConfigMaps, RayJobs labelled as ours) are kept in kopf indexes as small summaries, keyed by the
owning job, and each of their events queues that job. Checkpoint claims are indexed by their own name
instead: a kept one has no owner, and its job (if one of that name exists) is found by the name the
operator gives its claim. kopf runs no other handler until every index has seen its initial list, so after
a restart the first reconcile already knows every child it made before.
"""

from __future__ import annotations

from typing import Any

import kopf

from distillery.api import GROUP, PLURAL, TEACHER_PLURAL, VERSION
from distillery_operator import naming
from distillery_operator.observe import summaries
from distillery_operator.reconcile.controller import Controller
from distillery_operator.teachers.loop import SharedTeachers

OURS = {naming.MANAGED_BY_LABEL: naming.MANAGED_BY}
CHILD_RESOURCES: dict[str, tuple[str, ...]] = {
    # kopf's resource spec: (group, version, plural), or (version, plural) for the core group.
    "Deployment": ("apps", "v1", "deployments"),
    "Service": ("v1", "services"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    # Each job's and each DistillationTeacher's (unless the chart's `networkPolicy.enabled` is false);
    # watched either way, as RBAC grants it.
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
    "ConfigMap": ("v1", "configmaps"),
    "RayJob": ("ray.io", "v1", "rayjobs"),
    # The trainer's identity (render.render_trainer_identity), repaired like any child.
    "ServiceAccount": ("v1", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
}
INDEX_NAMES = {kind: f"{kind.lower()}_index" for kind in CHILD_RESOURCES}
TEACHER_CHILDREN = ("Deployment", "Service", "NetworkPolicy")
"""What a DistillationTeacher owns (`render/shared_teacher.py`; its NetworkPolicy unless the chart turns them
off)."""
TEACHER_INDEX_NAMES = {kind: f"teacher_{kind.lower()}_index" for kind in TEACHER_CHILDREN}
CLAIMS = ("v1", "persistentvolumeclaims")
CLAIM_INDEX = "persistentvolumeclaim_index"


def _controller(memo: Any) -> Controller:
    return memo.controller


def _shared(memo: Any) -> SharedTeachers:
    return memo.shared_teachers


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # kopf's own readers, not the kubernetes client's: they read $KUBECONFIG when called, not at import.
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def start(memo: Any, **kwargs: Any) -> None:
    controller = _controller(memo)
    indexes = {kind: kwargs[name] for kind, name in INDEX_NAMES.items()}
    claims = kwargs[CLAIM_INDEX]

    def children_of(key: summaries.JobKey) -> list[summaries.Child]:
        found: list[summaries.Child] = []
        for index in indexes.values():
            found.extend(index.get(key, ()))
        found.extend(claims.get((key[0], naming.checkpoint_claim(key[1])), ()))
        return found

    controller.children_of = children_of
    controller.start()
    teacher_indexes = [kwargs[name] for name in TEACHER_INDEX_NAMES.values()]

    def teacher_children(key: summaries.JobKey) -> list[summaries.Child]:
        return [child for index in teacher_indexes for child in index.get(key, ())]

    shared = _shared(memo)
    shared.children_of = teacher_children
    shared.start()


@kopf.on.cleanup()
async def stop(memo: Any, **_: Any) -> None:
    await _shared(memo).stop()
    await _controller(memo).stop()
    # kopf may be stopping on a signal it caught itself: raise the stop flag it was given too, or its
    # task waiting on that flag hangs and kopf waits 5 s for it before cancelling it.
    stopped = getattr(memo, "stopped", None)
    if stopped is not None:
        stopped.set()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(event: Any, body: Any, memo: Any, **_: Any) -> None:
    _controller(memo).job_event(event.get("type"), body)


@kopf.on.event(GROUP, VERSION, TEACHER_PLURAL)
async def teacher_event(event: Any, body: Any, memo: Any, **_: Any) -> None:
    _controller(memo).teacher_event(event.get("type"), body)
    _shared(memo).wake()


def _teacher_index(kind: str):  # type: ignore[no-untyped-def]
    summarize = summaries.SUMMARIZERS[kind]

    def index(body: Any, **_: Any) -> dict[summaries.JobKey, summaries.Child] | None:
        owner = summaries.teacher_owner_key(body)
        return None if owner is None else {owner: summarize(body)}

    index.__name__ = TEACHER_INDEX_NAMES[kind]
    return index


def _index(kind: str):  # type: ignore[no-untyped-def]
    summarize = summaries.SUMMARIZERS[kind]

    def index(body: Any, **_: Any) -> dict[summaries.JobKey, summaries.Child] | None:
        owner = summaries.owner_key(body)
        return None if owner is None else {owner[0]: summarize(body)}

    index.__name__ = INDEX_NAMES[kind]
    return index


def _event(kind: str):  # type: ignore[no-untyped-def]
    async def child_event(body: Any, memo: Any, **_: Any) -> None:
        if summaries.teacher_owner_key(body) is not None:
            _shared(memo).wake()
        owner = summaries.owner_key(body)
        if owner is not None:
            controller = _controller(memo)
            controller.child_seen(owner[0], kind, body.get("metadata", {}).get("name", ""))
            controller.enqueue(owner[0], kind)

    child_event.__name__ = f"{kind.lower()}_event"
    return child_event


for _kind, _resource in CHILD_RESOURCES.items():
    kopf.index(*_resource, labels=OURS, id=INDEX_NAMES[_kind])(_index(_kind))
    kopf.on.event(*_resource, labels=OURS, id=f"{_kind.lower()}_event")(_event(_kind))


for _kind in TEACHER_CHILDREN:
    kopf.index(*CHILD_RESOURCES[_kind], labels=OURS, id=TEACHER_INDEX_NAMES[_kind])(_teacher_index(_kind))


@kopf.index(*CLAIMS, labels=OURS, id=CLAIM_INDEX)
def persistentvolumeclaim_index(body: Any, **_: Any) -> dict[summaries.ClaimKey, summaries.Child]:
    meta = body.get("metadata", {})
    return {(meta.get("namespace", ""), meta.get("name", "")): summaries.summarize_claim(body)}


@kopf.on.event(*CLAIMS, labels=OURS, id="persistentvolumeclaim_event")
async def persistentvolumeclaim_event(body: Any, memo: Any, **_: Any) -> None:
    meta = body.get("metadata", {})
    controller = _controller(memo)
    key = controller.job_of_claim(meta.get("namespace", ""), meta.get("name", ""))
    if key is not None:  # else a claim kept after its job was deleted: nothing to reconcile
        controller.child_seen(key, summaries.CLAIM_KIND, meta.get("name", ""))
        controller.enqueue(key, summaries.CLAIM_KIND)
