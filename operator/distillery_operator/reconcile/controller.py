"""The reconcile loop: keys from watch events in, `decide` on the latest state, writes out, retries on errors.

This is the only module that acts. Reads come from memory (the job bodies kopf delivers, the kopf indexes
of children, the teacher probes); `decide` says what to write; the writes go through `Kube`, and the typed
status `decide` returns is serialised here, into the merge patch of the status subresource. An error
requeues the job with exponential backoff and is shown in `status.message`, never crashes the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from distillery.api import DistillationJobStatus, Phase, RayAuth
from distillery.plan.access.network import DEFAULT_NETWORK_POLICY, NetworkPolicySettings, Outside, Peer
from distillery_operator import metrics, naming
from distillery_operator.jobs.decide import Action, Decision, decide
from distillery_operator.jobs.identity import identity_actions
from distillery_operator.k8s.client import ApiError, Kube
from distillery_operator.k8s.scheduling import SchedulingWatch
from distillery_operator.k8s.workqueue import Backoff, WorkQueue
from distillery_operator.observe.probes import TeacherProber
from distillery_operator.observe.summaries import (
    CLAIM_KIND,
    SECRET_KIND,
    Child,
    JobKey,
    SharedTeacherFacts,
    assemble,
)
from distillery_operator.reconcile.inputs import ControllerInputs
from distillery_operator.render import ClusterSettings, with_new_key

log = logging.getLogger("distillery.operator")


PULL_SECRETS_ENV = "DISTILLERY_IMAGE_PULL_SECRETS"
"""The chart's `imagePullSecrets`, comma-separated names: the one place the operator learns them."""
NETWORK_POLICY_ENV = "DISTILLERY_NETWORK_POLICY"
"""The chart's `networkPolicy` values as JSON (`{"kuberay": {"namespace": NS, "podLabels": {...}}, "operator":
..., "monitoring": ...}`, each part optional), or `off`; unset or empty: the defaults (policies on)."""
RAY_AUTH_ENV = "DISTILLERY_RAY_AUTH"
"""The chart's `rayAuth`: `token` (unset too) or `disabled`, for jobs whose spec does not choose."""


def cluster_pull_secrets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The cluster's image pull secrets, from PULL_SECRETS_ENV (the chart sets it from its values)."""
    value = (os.environ if environ is None else environ).get(PULL_SECRETS_ENV, "")
    return tuple(name.strip() for name in value.split(",") if name.strip())


def cluster_settings(environ: Mapping[str, str] | None = None) -> ClusterSettings:
    """What the chart set in the operator's environment; a malformed value stops the operator at start
    with a one-line error naming the variable."""
    env = os.environ if environ is None else environ
    return ClusterSettings(
        image_pull_secrets=cluster_pull_secrets(env),
        network_policy=cluster_network_policy(env),
        ray_auth=cluster_ray_auth(env),
    )


def cluster_network_policy(environ: Mapping[str, str]) -> NetworkPolicySettings | None:
    """Where the callers from outside a job run, from NETWORK_POLICY_ENV; None where it says `off`. Each
    caller the value leaves out keeps its default (`distillery.plan.access.network.DEFAULT_NETWORK_POLICY`)."""
    value = environ.get(NETWORK_POLICY_ENV, "").strip()
    if value == "off":
        return None
    if not value:
        return DEFAULT_NETWORK_POLICY

    def refused(why: str) -> ValueError:
        return ValueError(f"{NETWORK_POLICY_ENV}={value!r}: {why}")

    try:
        given = json.loads(value)
    except ValueError:
        raise refused("neither `off` nor a JSON object") from None
    if not isinstance(given, dict) or set(given) - {w.value for w in Outside}:
        raise refused(f"a JSON object of {', '.join(w.value for w in Outside)} only")
    peers: dict[str, Peer] = {}
    for who in Outside:
        part = given.get(who.value) or {}
        if not isinstance(part, dict) or set(part) - {"namespace", "podLabels"}:
            raise refused(f"{who.value}: an object of namespace and podLabels expected")
        default = DEFAULT_NETWORK_POLICY.peer(who)
        namespace = part.get("namespace") or default.namespace
        labels = part.get("podLabels", default.pod_labels) or {}
        strings = isinstance(labels, dict) and all(
            isinstance(x, str) for pair in labels.items() for x in pair
        )
        if not isinstance(namespace, str) or not strings:
            raise refused(f"{who.value}: namespace must be a string, podLabels a map of strings")
        peers[who.value] = Peer(namespace, dict(labels))
    return NetworkPolicySettings(**peers)


def cluster_ray_auth(environ: Mapping[str, str]) -> RayAuth:
    """The platform's Ray authentication, from RAY_AUTH_ENV (token where unset or empty)."""
    value = environ.get(RAY_AUTH_ENV, "").strip() or RayAuth.TOKEN.value
    try:
        return RayAuth(value)
    except ValueError:
        choices = ", ".join(mode.value for mode in RayAuth)
        raise ValueError(f"{RAY_AUTH_ENV}={value!r}: not one of {choices}") from None


@dataclass
class ControllerSettings:
    workers: int = 4
    """Jobs reconciled concurrently."""
    resync_seconds: float = 600.0
    """Safety-net reconcile of every job; it reads memory only and writes nothing when nothing drifted."""
    probe_interval: float = 30.0
    probe_timeout: float = 5.0
    scheduling_interval: float = 10.0
    """Seconds between two lists of a starting job's pods (why they wait for a node)."""
    backoff_base: float = 0.5
    backoff_cap: float = 60.0
    create_grace_seconds: float = 30.0
    """A child created this recently and not yet seen by the watch is not created again."""
    cluster: ClusterSettings = field(default_factory=cluster_settings)
    """The chart's pull secrets (every pod gets them, before the job's own) and network policy settings."""
    conflict_grace_seconds: float = 2.0
    """A create answered 409 (the name is taken) is tried again this much later; a 409 again, with the watch
    still not showing the object as the job's, is an error shown in the status (someone else's object)."""


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


OPERATOR_FIELDS = DistillationJobStatus.operator_fields()
OPERATOR_KEYS = tuple(DistillationJobStatus.model_fields[name].alias or name for name in OPERATOR_FIELDS)
"""The operator's fields of a status as they are named in the job (camelCase)."""


def status_body(status: DistillationJobStatus) -> dict[str, Any]:
    """The operator's fields of a decided status as the API server stores them: camelCase, unset (None)
    fields left out, each teacher and condition with the defaults the CRD gives their fields."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json", include=set(OPERATOR_FIELDS))


def owned_status(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The operator's fields of a status read from a job, without empty ones."""
    status = status or {}
    return {k: status[k] for k in OPERATOR_KEYS if status.get(k) is not None}


def replacing(current: Any, desired: Any) -> Any:
    """`desired` as a JSON merge patch value over `current`: a key of a `current` map that `desired` lacks
    is null (a merge patch keeps what it does not name: status.storage.message, once written, would stay,
    and every reconcile would write it away again); lists are replaced whole anyway."""
    if isinstance(current, Mapping) and isinstance(desired, Mapping):
        out: dict[str, Any] = {k: None for k in current if k not in desired}
        out.update({k: replacing(current.get(k), v) for k, v in desired.items()})
        return out
    return desired


@dataclass
class _Written:
    """The status we last wrote and the job's resourceVersion we wrote it over."""

    status: dict[str, Any]
    over_version: str | None


@dataclass
class Controller(ControllerInputs):
    kube: Kube
    settings: ControllerSettings = field(default_factory=ControllerSettings)
    children_of: Callable[[JobKey], Iterable[Child]] = lambda key: ()
    """Set at startup to read the kopf indexes of children."""

    def __post_init__(self) -> None:
        self.jobs: dict[JobKey, dict[str, Any]] = {}
        self.teachers: dict[JobKey, dict[str, Any]] = {}
        """The DistillationTeachers, by (namespace, name), as their watch last showed them."""
        self._teacher_facts: dict[JobKey, SharedTeacherFacts] = {}
        self.queue: WorkQueue[JobKey] = WorkQueue(
            Backoff(self.settings.backoff_base, self.settings.backoff_cap)
        )
        self.prober = TeacherProber(
            lambda key: self.enqueue(key, "ExternalTeacher"),
            interval=self.settings.probe_interval,
            timeout=self.settings.probe_timeout,
            read_key=self.kube.read_key,
        )
        self.scheduling = SchedulingWatch(
            self.kube.list_pods,
            lambda key: self.enqueue(key, "PodScheduling"),
            interval=self.settings.scheduling_interval,
        )
        self.phases: dict[JobKey, str] = {}
        self._triggers: dict[JobKey, str] = {}
        self._written: dict[JobKey, _Written] = {}
        self._created: dict[tuple[JobKey, str, str], float] = {}
        self._conflicts: dict[tuple[JobKey, str, str], float] = {}
        """Children whose create got 409 (the name is taken) and that the watch has not shown: since when."""
        self._workers: list[asyncio.Task[None]] = []
        for phase in Phase:  # every phase is a series from the start, at 0
            metrics.JOBS.labels(phase=phase.value)
        self.ready = asyncio.Event()
        self._event_context: contextvars.Context | None = None

    # ------------------------------------------------------------------------------------------ workers

    def start(self) -> None:
        for index in range(self.settings.workers):
            self._workers.append(asyncio.create_task(self._work(), name=f"reconcile worker {index}"))
        self.ready.set()

    async def stop(self) -> None:
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()
        self.queue.close()
        await self.prober.close()
        await self.scheduling.close()

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            metrics.QUEUE_DEPTH.set(len(self.queue))
            trigger = self._triggers.pop(key, "Resync")
            started = time.perf_counter()
            try:
                result = await self.reconcile(key)
            except ApiError as error:
                delay = self.queue.add_rate_limited(key)
                metrics.RETRIES.inc()
                log.warning("reconcile of %s/%s failed (%s); retrying in %.1fs", *key, error, delay)
                result = "error"
            except Exception:
                # A bug must not stop the other jobs: log it, back off, try again.
                delay = self.queue.add_rate_limited(key)
                log.exception("reconcile of %s/%s crashed; retrying in %.1fs", *key, delay)
                result = "error"
            else:
                if result != "waiting":  # its backoff goes on growing while it waits
                    self.queue.forget(key)
                if key in self.jobs:
                    self.queue.add_after(key, self.settings.resync_seconds)
            finally:
                self.queue.done(key)
            metrics.RECONCILES.labels(kind=trigger, result=result).inc()
            metrics.RECONCILE_DURATION.observe(time.perf_counter() - started)

    # ------------------------------------------------------------------------------------------ reconcile

    def _forget(self, key: JobKey) -> None:
        self.prober.forget(key)
        self.scheduling.forget(key)
        self.queue.drop(key)
        self._set_phase(key, None)
        self._written.pop(key, None)
        for created in [c for c in self._created if c[0] == key]:
            del self._created[created]
        for conflict in [c for c in self._conflicts if c[0] == key]:
            del self._conflicts[conflict]

    def _set_phase(self, key: JobKey, phase: str | None) -> None:
        """Keeps the jobs-by-phase gauge by counting transitions (no scan of every job per reconcile)."""
        old = self.phases.pop(key, None) if phase is None else self.phases.get(key)
        if old == phase:
            return
        if old is not None:
            metrics.JOBS.labels(phase=old).dec()
        if phase is not None:
            self.phases[key] = phase
            metrics.JOBS.labels(phase=phase).inc()

    def _as_seen(self, key: JobKey, body: dict[str, Any]) -> dict[str, Any]:
        """The job with the status we wrote, while the watch has not delivered our write yet."""
        written = self._written.get(key)
        version = body.get("metadata", {}).get("resourceVersion")
        if written is None or written.over_version != version:
            return body
        status = {k: v for k, v in (body.get("status") or {}).items() if k not in OPERATOR_KEYS}
        return {**body, "status": {**status, **written.status}}

    async def reconcile(self, key: JobKey) -> str:
        body = self.jobs.get(key)
        if body is None:
            self._forget(key)
            return "deleted"
        if body.get("metadata", {}).get("deletionTimestamp"):
            return "unchanged"
        body = self._as_seen(key, body)
        # Every child in the indexes came with a watch event, which already confirmed it (`child_seen`).
        children = list(self.children_of(key))
        observed = assemble(children, self.prober.health(key), self.scheduling.unscheduled(key))
        observed.shared = self.shared_facts(key)
        now = now_iso()
        decision = decide(body, observed, now, cluster=self.settings.cluster)
        read_error: tuple[str, ApiError] | None = None
        if decision.read_claims:
            # The trainer is about to be made: the claims its pods (and the teachers') mount are read
            # first, and the job decided again with them (`storage`).
            try:
                observed.claims = await self.kube.read_claims(key[0], decision.read_claims)
            except ApiError as exc:
                # Unchecked, nothing is made: the error goes to status.message and the job is retried.
                read_error = (f"get PersistentVolumeClaim {', '.join(decision.read_claims)}", exc)
                decision.actions, decision.held = [], True
            else:
                decision = decide(body, observed, now, cluster=self.settings.cluster)
        if not decision.held:
            # The trainer's identity first: KubeRay's pods need their ServiceAccount when they are made.
            decision.actions[:0] = identity_actions(body, children, terminal=decision.finished)
        self.prober.sync(key, decision.external)
        self.scheduling.sync(key, decision.starting)
        error = await self._act(key, decision) or read_error
        wrote_status = await self._write_status(key, body, decision, error)
        self._set_phase(key, decision.status.phase.value)
        if error is not None:
            raise error[1]
        if decision.wait:
            # A claim is missing: no watch tells when it appears (the operator watches only its own
            # claims), so look again, backing off up to backoff_cap.
            delay = self.queue.add_rate_limited(key)
            log.info("%s/%s: waiting for a claim; looking again in %.1fs", *key, delay)
            return "waiting"
        if decision.status.phase == Phase.INVALID:
            return "invalid"
        return "changed" if decision.actions or wrote_status else "unchanged"

    async def _act(self, key: JobKey, decision: Decision) -> tuple[str, ApiError] | None:
        namespace = key[0]
        first_error: tuple[str, ApiError] | None = None
        now = time.monotonic()
        for action in decision.actions:
            what = f"{action.verb} {action.kind}/{action.name}"
            if action.kind == SECRET_KIND:
                key_error = await self._make_key(key, action, now)
                if key_error is not None:
                    # The pods that take the key are not made without it: nothing is made half.
                    log.warning("%s/%s: %s failed: %s", *key, what, key_error)
                    return what, key_error
                continue
            try:
                if action.verb == "create":
                    created = self._created.get((key, action.kind, action.name))
                    if created is not None and now - created < self.settings.create_grace_seconds:
                        continue
                    await self.kube.create(namespace, action.body)
                    self._created[(key, action.kind, action.name)] = now
                    self._conflicts.pop((key, action.kind, action.name), None)
                    log.info("%s/%s: created %s/%s", *key, action.kind, action.name)
                else:
                    await self.kube.patch(namespace, action.kind, action.name, action.body)
                    log.info("%s/%s: patched %s/%s (%s)", *key, action.kind, action.name, action.why)
            except ApiError as error:
                if action.verb == "create" and error.code == 409:
                    # The name is taken: by our own create that the watch has not shown yet (a race with a
                    # previous incarnation), which it will show in a moment; or by an object that is not
                    # the job's (no owner reference to it, or not labelled as ours), which it never will.
                    child = (key, action.kind, action.name)
                    since = self._conflicts.setdefault(child, now)
                    if now - since < self.settings.conflict_grace_seconds:
                        self.queue.add_after(key, self.settings.conflict_grace_seconds)
                        continue
                    advice = "delete or rename it"
                    if action.kind == CLAIM_KIND:
                        advice += ", or name it in spec.checkpoint.pvc to write the checkpoints there"
                    error = ApiError(
                        409,
                        "AlreadyExists",
                        f"{action.kind} {action.name} exists and is not this job's (no owner reference to "
                        f"it or no label {naming.MANAGED_BY_LABEL}={naming.MANAGED_BY}): {advice}",
                    )
                if action.verb == "patch" and error.code == 404:
                    continue  # deleted meanwhile: the watch will tell, and the next reconcile recreates it
                log.warning("%s/%s: %s failed: %s", *key, what, error)
                first_error = first_error or (what, error)
        return first_error

    async def _make_key(self, key: JobKey, action: Action, now: float) -> ApiError | None:
        """Makes the job's teacher key Secret with a fresh key (`render.with_new_key`: in the create's body
        alone), or finds it made: a 409 is fine where the Secret is the job's (its controller owner, read
        with a GET: the operator does not watch Secrets). None when it exists as the job's."""
        if (
            now - self._created.get((key, action.kind, action.name), -math.inf)
            < self.settings.create_grace_seconds
        ):
            return None
        try:
            await self.kube.create(key[0], with_new_key(action.body))
        except ApiError as error:
            if error.code != 409:
                return error
            owners = action.body["metadata"].get("ownerReferences") or [{}]
            try:
                owner = await self.kube.secret_owner(key[0], action.name)
            except ApiError as read_error:
                return read_error
            if owner is None or owner != owners[0].get("uid"):
                return ApiError(
                    409,
                    "AlreadyExists",
                    f"Secret {action.name} exists and is not this job's (no owner reference to it or no "
                    f"label {naming.MANAGED_BY_LABEL}={naming.MANAGED_BY}): delete or rename it",
                )
            return None
        self._created[(key, action.kind, action.name)] = now
        log.info("%s/%s: created %s/%s", *key, action.kind, action.name)
        return None

    async def _write_status(
        self, key: JobKey, body: Mapping[str, Any], decision: Decision, error: tuple[str, ApiError] | None
    ) -> bool:
        status = decision.status
        events = list(decision.events)
        if error is not None:
            what, exc = error
            status = status.model_copy(
                update={"message": f"API error on {what}: {exc} (retrying with backoff)"}
            )
        desired = status_body(status)
        current = owned_status(body.get("status"))
        if desired == current:
            return False
        # A field the operator wrote before and leaves unset now is removed (null, in a merge patch).
        patch: dict[str, Any] = {
            k: replacing(current.get(k), desired.get(k))
            for k in OPERATOR_KEYS
            if k in current or k in desired
        }
        await self.kube.patch_job_status(key[0], key[1], patch)
        version = body.get("metadata", {}).get("resourceVersion")
        self._written[key] = _Written(desired, version)
        for event in events:
            self.post_event(body, event.type, event.reason, event.message)
        if error is not None and error[0] not in (current.get("message") or ""):
            self.post_event(body, "Warning", "ApiError", desired["message"])
        return True

    def post_event(self, body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        try:
            if self._event_context is None:
                raise LookupError("no kopf context yet")
            self._event_context.run(
                kopf.event,
                kopf.Body(cast(kopf.RawBody, dict(body))),
                type=kind,
                reason=reason,
                message=message[:1024],
            )
        except LookupError:
            # Outside kopf's context (unit tests of the controller): there is no event poster.
            log.info("event %s %s: %s", kind, reason, message)
