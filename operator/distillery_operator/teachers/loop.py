"""The DistillationTeachers' loop (I/O): reads their replicas' queues, applies `decide_teacher`, writes.

Every `interval` seconds, and at once when a teacher, its objects or a job that references it changes, each
known teacher is decided again: its replicas' /metrics are read (the ready pods of its Deployment, at their
pod IPs: each replica's own queue, not one behind the Service), the jobs that use it are taken from the job
controller's watch with the digests of the active ones' keys (each read once from the job's teacher key
Secret), and the decision's writes go out: its clients Secret, Deployment and Service, its finalizer, its
status and an Event for each change of its replica count. Teachers are few and a decision is cheap: one pass over
all of them, one at a time, keeps the loop simple.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from distillery.api import TERMINAL_PHASES, DistillationTeacherStatus, Phase
from distillery.plan.access.auth import TEACHER_KEY, job_identity, key_digest, teacher_key_secret_name
from distillery.plan.teachers.scaling import ReplicaLoad
from distillery.runtime_config import TEACHER_PORT
from distillery_operator.k8s.client import ApiError, Kube
from distillery_operator.observe.summaries import Child, JobKey
from distillery_operator.reconcile.controller import Controller, now_iso, replacing
from distillery_operator.render import shared_teacher_selector
from distillery_operator.teachers.decide import TeacherUse, decide_teacher
from distillery_operator.teachers.metrics import parse_replica_sample, replica_load

log = logging.getLogger(__name__)

TeacherKey = JobKey
"""(namespace, name) of a DistillationTeacher."""
STATUS_KEYS = tuple(f.alias or n for n, f in DistillationTeacherStatus.model_fields.items())
"""A DistillationTeacher's status fields as they are named in the object (camelCase); all the operator's."""


INTERVAL_ENV = "DISTILLERY_TEACHER_SCALING_INTERVAL"
"""Seconds between two scaling decisions (the chart's sharedTeachers.scalingIntervalSeconds)."""


def scaling_interval(environ: Mapping[str, str] | None = None) -> float:
    value = (os.environ if environ is None else environ).get(INTERVAL_ENV, "").strip()
    if not value:
        return 15.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{INTERVAL_ENV}={value!r}: must be a positive number of seconds")
    return seconds


SCALING_ENV = "DISTILLERY_TEACHER_SCALING"
"""`operator` (default) or `hpa` (the chart's sharedTeachers.scaling)."""


def scaled_by_hpa(environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get(SCALING_ENV, "").strip() or "operator"
    if value not in ("operator", "hpa"):
        raise ValueError(f"{SCALING_ENV}={value!r}: must be operator or hpa")
    return value == "hpa"


@dataclass
class SharedTeacherSettings:
    interval: float = field(default_factory=scaling_interval)
    """Seconds between two decisions of every teacher (its queues are read this often)."""
    hpa: bool = field(default_factory=scaled_by_hpa)
    """The replicas are an HPA's: made at minReplicas, never changed by the operator."""
    metrics_timeout: float = 3.0


def job_uses(jobs: Mapping[JobKey, Mapping[str, Any]], using: Iterable[JobKey]) -> list[TeacherUse]:
    """The jobs `using` a teacher, each active or not (from its last status and spec)."""
    uses = []
    for key in using:
        body = jobs.get(key) or {}
        phase = (body.get("status") or {}).get("phase")
        suspended = bool((body.get("spec") or {}).get("suspend"))
        done = phase in {p.value for p in TERMINAL_PHASES} or phase == Phase.INVALID.value
        uid = (body.get("metadata") or {}).get("uid", "")
        uses.append(TeacherUse(job=key[1], active=not done and not suspended, uid=uid))
    return uses


def ready_pods(pods: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(name, IP) of the pods whose Ready condition is True."""
    out = []
    for pod in pods:
        status = pod.get("status") or {}
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if ready and status.get("podIP"):
            out.append(((pod.get("metadata") or {}).get("name", ""), status["podIP"]))
    return out


@dataclass
class SharedTeachers:
    kube: Kube
    jobs: Controller
    """The job controller: its watch of jobs and of DistillationTeachers, its Event poster."""
    settings: SharedTeacherSettings = field(default_factory=SharedTeacherSettings)
    children_of: Callable[[TeacherKey], Iterable[Child]] = lambda key: ()
    """Set at startup to read the kopf indexes of the teachers' Deployments and Services."""

    def __post_init__(self) -> None:
        self._wake = asyncio.Event()
        self._last_busy: dict[TeacherKey, float] = {}
        """When each teacher was last seen busy (or first seen): its idle time runs from there."""
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._previous: dict[TeacherKey, dict[str, tuple[float, float]]] = {}
        """Each teacher's replicas' last read, by pod: total seconds waited in its queue, and when."""
        self._digests: dict[tuple[str, str, str], str] = {}
        """The key digest of each job (namespace, name, uid) found so far: a job's key never changes (its
        Secret is made once with it, never written again), so it is read once."""
        self._clients_written: dict[TeacherKey, dict[str, Any]] = {}
        """Each teacher's clients Secret as this process last wrote it (the Secret is not watched)."""

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="shared teachers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            for key in list(self.jobs.teachers):
                try:
                    await self.reconcile(key)
                except ApiError as error:
                    log.warning("DistillationTeacher %s/%s: %s; retrying", *key, error)
                except Exception:
                    log.exception("DistillationTeacher %s/%s: reconcile crashed; retrying", *key)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.interval)

    async def _loads(self, key: TeacherKey) -> list[ReplicaLoad]:
        namespace, name = key
        selector = shared_teacher_selector(name)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        pods = await self.kube.list_pods(namespace, ",".join(f"{k}={v}" for k, v in selector.items()))
        loads = []
        previous = self._previous.get(key, {})
        seen: dict[str, tuple[float, float]] = {}
        timeout = aiohttp.ClientTimeout(total=self.settings.metrics_timeout)
        for pod, ip in ready_pods(pods):
            url = f"http://{ip}:{TEACHER_PORT}/metrics"
            try:
                async with self._session.get(url, timeout=timeout) as response:
                    sample = parse_replica_sample(await response.text())
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as error:
                # A replica that does not answer is left out: with none answering nothing scales up.
                log.info("GET %s: %s", url, error)
                continue
            now = time.monotonic()
            loads.append(replica_load(sample, previous.get(pod), now))
            if sample.waited_seconds is not None:
                seen[pod] = (sample.waited_seconds, now)
        # Only the replicas read now: a pod that is gone is forgotten.
        self._previous[key] = seen
        return loads

    async def _clients(self, namespace: str, uses: Iterable[TeacherUse]) -> dict[str, str]:
        """The key digest of each active job of `uses` whose key Secret exists, by job identity."""
        clients = {}
        for use in uses:
            if not use.active:
                continue
            job = (namespace, use.job, use.uid)
            if job not in self._digests:
                secret = teacher_key_secret_name(use.job)
                key = await self.kube.read_key(namespace, "Secret", secret, TEACHER_KEY)
                if key is None:
                    continue  # not made yet: the job's first reconcile makes it, a pass soon after finds it
                self._digests[job] = key_digest(key)
            clients[job_identity(use.job, namespace)] = self._digests[job]
        return clients

    def _forget_gone_jobs(self) -> None:
        live = {(*k, (b.get("metadata") or {}).get("uid", "")) for k, b in self.jobs.jobs.items()}
        self._digests = {job: digest for job, digest in self._digests.items() if job in live}

    async def _write_clients(self, key: TeacherKey, secret: dict[str, Any]) -> None:
        """Make or update the teacher's clients Secret where it differs from what was last written."""
        if self._clients_written.get(key) == secret:
            return
        namespace = key[0]
        try:
            await self.kube.create(namespace, secret)
            verb = "create"
        except ApiError as error:
            if error.code != 409:
                raise
            # Made before (by this process before a restart, or an earlier pass): the data put in place.
            await self.kube.patch(namespace, "Secret", secret["metadata"]["name"], {"data": secret["data"]})
            verb = "patch"
        self._clients_written[key] = secret
        log.info(
            "DistillationTeacher %s/%s: %s Secret/%s (its clients)", *key, verb, secret["metadata"]["name"]
        )

    async def reconcile(self, key: TeacherKey) -> None:
        body = self.jobs.teachers.get(key)
        if body is None:
            self._last_busy.pop(key, None)
            self._previous.pop(key, None)
            self._clients_written.pop(key, None)
            return
        namespace, name = key
        children = list(self.children_of(key))
        deployment = next((c for c in children if c.kind == "Deployment"), None)
        service = next((c for c in children if c.kind == "Service"), None)
        network_policy = next((c for c in children if c.kind == "NetworkPolicy"), None)
        uses = job_uses(self.jobs.jobs, self.jobs.jobs_using(key))
        self._forget_gone_jobs()
        clients = await self._clients(namespace, uses)
        loads: list[ReplicaLoad] = []
        if (
            not self.settings.hpa
            and deployment is not None
            and int(deployment.state.get("readyReplicas", 0)) > 0
        ):
            loads = await self._loads(key)
        clock = time.monotonic()
        last_busy = self._last_busy.setdefault(key, clock)
        if any(load.busy for load in loads):
            last_busy = self._last_busy[key] = clock
        decision = decide_teacher(
            body,
            deployment=deployment,
            service=service,
            network_policy=network_policy,
            uses=uses,
            clients=clients,
            loads=loads,
            idle_for_seconds=clock - last_busy,
            now=now_iso(),
            cluster=self.jobs.settings.cluster,
            replicas_by_hpa=self.settings.hpa,
        )
        if decision.clients is not None:
            # Before the replicas, which mount it.
            await self._write_clients(key, decision.clients)
        for action in decision.actions:
            if action.verb == "create":
                await self.kube.create(namespace, action.body)
            else:
                await self.kube.patch(namespace, action.kind, action.name, action.body)
            log.info(
                "DistillationTeacher %s/%s: %s %s/%s (%s)",
                *key,
                action.verb,
                action.kind,
                action.name,
                action.why,
            )
        # The Events say what the writes above changed (the replicas), so they are posted now: a finalizer or
        # status write below that fails (a 409 under concurrent updates) would otherwise lose them for good,
        # since the next pass finds the replicas already changed (a node scenario's 1 -> 2 had no Event).
        for event in decision.events:
            self.jobs.post_event(body, event.type, event.reason, event.message)
        if decision.finalizers is not None:
            version = (body.get("metadata") or {}).get("resourceVersion")
            # With the version read: a finalizer list changed meanwhile is a 409, tried again next pass.
            patch = {"metadata": {"finalizers": decision.finalizers, "resourceVersion": version}}
            await self.kube.patch_teacher(namespace, name, patch)
        desired = decision.status.model_dump(by_alias=True, exclude_none=True, mode="json")
        current = {k: v for k, v in (body.get("status") or {}).items() if k in STATUS_KEYS}
        if desired != current:
            patch = {
                k: replacing(current.get(k), desired.get(k))
                for k in STATUS_KEYS
                if k in current or k in desired
            }
            await self.kube.patch_teacher(namespace, name, {"status": patch}, status=True)
