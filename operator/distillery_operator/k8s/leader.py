"""Leader election on a coordination.k8s.io Lease, as controller-runtime does it: one replica reconciles.

Every replica runs this before kopf; only the one holding the Lease runs kopf (and so the controller),
the others wait as warm standbys. The holder renews the Lease every `retry_seconds`; a holder that has
not renewed for `renew_deadline_seconds` gives up and stops (the process exits and restarts as a
standby), and a standby takes the Lease once it has seen no renewal for `lease_seconds` (on its own
clock, as client-go does: clock skew between nodes cannot expire a live holder). Since
renew_deadline < lease, an old leader stops before a new one can start. A leader that stops cleanly
releases the Lease, so its successor starts at once instead of after `lease_seconds`.

Writes are optimistic: a JSON patch whose first op tests the Lease's resourceVersion, so of two
replicas racing for an expired Lease exactly one wins (the other gets 409/422 and keeps waiting).
`decide` is the pure part: what to do given the Lease as read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import kubernetes
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

log = logging.getLogger("distillery.operator.leader")

JSON_PATCH = "application/json-patch+json"
REQUEST_TIMEOUT = (5.0, 10.0)
Action = Literal["create", "renew", "take", "wait"]


@dataclass(frozen=True)
class LeaseSettings:
    """controller-runtime's defaults: lease 15 s, renew deadline 10 s, retry period 2 s."""

    namespace: str
    identity: str
    name: str = "distillery-operator"
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError("leader election needs 0 < retry < renew deadline < lease duration")


def default_identity() -> str:
    """The pod's name (from the downward API) plus a random suffix: a restarted pod is a new candidate."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def micro_time(moment: datetime) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record(lease: dict[str, Any] | None) -> tuple[Any, ...]:
    """What changes when the holder renews: watched to tell a live holder from a dead one."""
    spec = (lease or {}).get("spec") or {}
    return (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"))


def decide(lease: dict[str, Any] | None, identity: str, unchanged_for: float, lease_seconds: float) -> Action:
    """create: no Lease yet; renew: we hold it; take: free, or its record has not changed for the lease
    duration (measured on our own clock since we saw it change, as client-go does, so a skewed clock
    cannot make a live holder look expired); wait: someone else holds it and renews it."""
    if lease is None:
        return "create"
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if holder == identity:
        return "renew"
    duration = float(spec.get("leaseDurationSeconds") or lease_seconds)
    if not holder or unchanged_for >= duration:
        return "take"
    return "wait"


def lease_spec(
    identity: str, now: datetime, settings: LeaseSettings, previous: dict[str, Any] | None
) -> dict[str, Any]:
    """The Lease spec after `identity` creates, takes or renews it."""
    old = (previous or {}).get("spec") or {}
    ours = old.get("holderIdentity") == identity
    transitions = int(old.get("leaseTransitions") or 0)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": int(settings.lease_seconds) or 1,
        "acquireTime": old.get("acquireTime") if ours and old.get("acquireTime") else micro_time(now),
        "renewTime": micro_time(now),
        "leaseTransitions": transitions if ours or previous is None else transitions + 1,
    }


class LeaderElector:
    """Acquires, holds and releases the Lease (I/O at the edge; `decide` and `lease_spec` decide)."""

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        settings: LeaseSettings,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._client = kubernetes.client.ApiClient(configuration)
        self._api = kubernetes.client.CoordinationV1Api(self._client)
        self.leading = False
        # try_once runs in worker threads: a renewal still in flight when the operator stops must not
        # land after the release (it would hand the Lease back to us), so the two take turns.
        self._lock = threading.Lock()
        self._released = False
        self._seen: tuple[Any, ...] | None = None
        self._seen_at = 0.0  # time.monotonic() when the Lease's record last changed, to our eyes
        self._waiting_for: str | None = None  # the holder we last said we stand by for

    def close(self) -> None:
        self._client.close()

    # ---------------------------------------------------------------------------------------------- one try

    def _read(self) -> dict[str, Any] | None:
        s = self.settings
        try:
            lease = self._api.read_namespaced_lease(s.name, s.namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._client.sanitize_for_serialization(lease)

    def try_once(self) -> bool:
        """One attempt to create, take or renew the Lease; True when we hold it afterwards."""
        with self._lock:
            return False if self._released else self._try_once()

    def _try_once(self) -> bool:
        s = self.settings
        try:
            lease = self._read()
            if record(lease) != self._seen:
                self._seen, self._seen_at = record(lease), time.monotonic()
            action = decide(lease, s.identity, time.monotonic() - self._seen_at, s.lease_seconds)
            if action == "wait":
                holder = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
                if holder != self._waiting_for:
                    self._waiting_for = holder
                    if holder:  # empty: released, ours once it expires
                        log.info("standing by: the lease %s/%s is held by %s", s.namespace, s.name, holder)
                return False
            spec = lease_spec(s.identity, self._clock(), s, lease)
            if lease is None:
                body: Any = {"metadata": {"name": s.name, "namespace": s.namespace}, "spec": spec}
                self._api.create_namespaced_lease(s.namespace, body, _request_timeout=REQUEST_TIMEOUT)
            else:
                version = (lease.get("metadata") or {}).get("resourceVersion")
                ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
                ops.append({"op": "replace" if "spec" in lease else "add", "path": "/spec", "value": spec})
                self._api.patch_namespaced_lease(
                    s.name, s.namespace, ops, _content_type=JSON_PATCH, _request_timeout=REQUEST_TIMEOUT
                )
            if action == "take":
                log.info("took the lease %s/%s as %s", s.namespace, s.name, s.identity)
            return True
        except ApiException as exc:
            if exc.status not in (409, 422):  # 409/422: another replica wrote first
                log.warning("lease %s/%s: %s %s", s.namespace, s.name, exc.status, exc.reason)
            return False
        except HTTPError as exc:
            log.warning("lease %s/%s: API server unreachable: %s", s.namespace, s.name, exc)
            return False

    def release(self) -> None:
        """Let the next replica in at once: empty the holder, if we still hold the Lease."""
        with self._lock:
            self._released = True
            self._release()

    def _release(self) -> None:
        s = self.settings
        try:
            lease = self._read()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != s.identity:
                return
            version = (lease.get("metadata") or {}).get("resourceVersion")
            ops: list[dict[str, Any]] = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                {"op": "replace", "path": "/spec/holderIdentity", "value": ""},
                {"op": "replace", "path": "/spec/leaseDurationSeconds", "value": 1},
            ]
            self._api.patch_namespaced_lease(
                s.name, s.namespace, ops, _content_type=JSON_PATCH, _request_timeout=REQUEST_TIMEOUT
            )
            log.info("released the lease %s/%s", s.namespace, s.name)
        except (ApiException, HTTPError) as exc:
            log.warning("could not release the lease %s/%s: %s", s.namespace, s.name, exc)

    # ---------------------------------------------------------------------------------------------- loops

    async def acquire(self, stopping: Callable[[], bool]) -> bool:
        """Waits until we hold the Lease (True) or `stopping()` (False)."""
        while not stopping():
            if await asyncio.to_thread(self.try_once):
                self.leading = True
                return True
            await asyncio.sleep(self.settings.retry_seconds)
        return False

    async def hold(self) -> None:
        """Renews the Lease until it cannot for `renew_deadline_seconds`; then returns (leadership lost)."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.retry_seconds)
            if await asyncio.to_thread(self.try_once):
                last = time.monotonic()
            elif time.monotonic() - last >= self.settings.renew_deadline_seconds:
                self.leading = False
                log.error("lost the lease %s/%s: stopping", self.settings.namespace, self.settings.name)
                return
