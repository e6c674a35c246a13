"""Calls to the Kubernetes API through the official `kubernetes` client, off the event loop.

Writes go through here; reads come from kopf's watches, but for the claims a job's pods mount that the
operator does not make (`read_claims`: read once before the trainer is made, not worth a watch of every
claim) and a starting job's pods, whose `PodScheduled` conditions say why they wait (`k8s/scheduling.py`,
listed by the job's label), and the one key of a Secret or ConfigMap that an external teacher's health
check needs (its API key, its CA bundle: `observe/probes.py`, a `get` by name, never a list or a watch). Every call runs in a small thread pool, skips the client's deserialisation
into its models (a write's result comes back through the watch; reads are parsed as plain JSON), and
turns `ApiException` into `ApiError` with the HTTP code, which the metrics count and the status shows.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kubernetes
import orjson
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from distillery.api import GROUP, PLURAL, TEACHER_KIND, TEACHER_PLURAL, VERSION
from distillery_operator import metrics, naming
from distillery_operator.observe.summaries import ClaimFacts, claim_facts

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = (5.0, 30.0)


class ApiError(Exception):
    """A failed API call: `code` is the HTTP status (0 when the server could not be reached)."""

    def __init__(self, code: int, reason: str, message: str):
        self.code = code
        self.reason = reason
        self.message = message
        super().__init__(f"{code} {reason}: {message}" if code else f"{reason}: {message}")


def load_configuration(kubeconfig: str | None = None) -> kubernetes.client.Configuration:
    """In-cluster service account if there is one, else the kubeconfig ($KUBECONFIG read now, not at import)."""
    config = kubernetes.client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and kubeconfig is None:
        kubernetes.config.load_incluster_config(client_configuration=config)
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        kubernetes.config.load_kube_config(config_file=path, client_configuration=config)
    return config


def _error(exc: ApiException) -> ApiError:
    message = exc.reason or ""
    if exc.body:
        try:
            body = orjson.loads(exc.body)
            message = body.get("message") or message
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            message = str(exc.body)[:300]
    return ApiError(int(exc.status or 0), str(exc.reason or "Error"), message)


class Kube:
    """The operator's writes: create and merge-patch children, patch the job's status."""

    def __init__(self, configuration: kubernetes.client.Configuration, threads: int = 8):
        configuration.connection_pool_maxsize = max(threads, configuration.connection_pool_maxsize or 1)
        self._client = kubernetes.client.ApiClient(configuration)
        self._core = kubernetes.client.CoreV1Api(self._client)
        self._apps = kubernetes.client.AppsV1Api(self._client)
        self._custom = kubernetes.client.CustomObjectsApi(self._client)
        self._rbac = kubernetes.client.RbacAuthorizationV1Api(self._client)
        self._policy = kubernetes.client.PolicyV1Api(self._client)
        self._networking = kubernetes.client.NetworkingV1Api(self._client)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    async def _call(
        self, verb: str, kind: str, fn: Callable[..., Any], *args: Any, read: bool = False, **kwargs: Any
    ) -> bytes:
        """Calls `fn`; returns the response's body when `read`, else b"" (a write's result comes back
        through the watch)."""

        def run() -> bytes:
            response = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
            data: bytes = response.data if read else b""
            # Read the body to its end before the connection goes back to the pool: released unread, its
            # rest (a large object's managedFields) is taken by the next request on it as its response.
            response.drain_conn()
            response.release_conn()
            return data

        loop = asyncio.get_running_loop()
        try:
            data = await loop.run_in_executor(self._pool, run)
        except ApiException as exc:
            error = _error(exc)
            metrics.API_ERRORS.labels(code=str(error.code)).inc()
            metrics.API_REQUESTS.labels(verb=verb, kind=kind, code=str(error.code)).inc()
            raise error from None
        except HTTPError as exc:
            metrics.API_ERRORS.labels(code="0").inc()
            metrics.API_REQUESTS.labels(verb=verb, kind=kind, code="0").inc()
            raise ApiError(0, "Unreachable", str(exc)) from None
        metrics.API_REQUESTS.labels(verb=verb, kind=kind, code="2xx").inc()
        return data

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods of `namespace` with the label `selector`, as JSON (metadata, spec, status)."""
        data = await self._call(
            "list", "Pod", self._core.list_namespaced_pod, namespace, read=True, label_selector=selector
        )
        return list(orjson.loads(data).get("items") or [])

    async def create(self, namespace: str, obj: dict[str, Any]) -> None:
        kind = obj["kind"]
        if kind == "ConfigMap":
            await self._call("create", kind, self._core.create_namespaced_config_map, namespace, obj)
        elif kind == "Service":
            await self._call("create", kind, self._core.create_namespaced_service, namespace, obj)
        elif kind == "Deployment":
            await self._call("create", kind, self._apps.create_namespaced_deployment, namespace, obj)
        elif kind == "PersistentVolumeClaim":
            await self._call(
                "create", kind, self._core.create_namespaced_persistent_volume_claim, namespace, obj
            )
        elif kind == "PodDisruptionBudget":
            await self._call(
                "create", kind, self._policy.create_namespaced_pod_disruption_budget, namespace, obj
            )
        elif kind == "NetworkPolicy":
            await self._call(
                "create", kind, self._networking.create_namespaced_network_policy, namespace, obj
            )
        elif kind == "Secret":
            # A job's teacher key (`render/teacher_key.py`: made once, never patched) or a shared teacher's
            # clients Secret (`render/shared_teacher.py`).
            await self._call("create", kind, self._core.create_namespaced_secret, namespace, obj)
        elif kind == "ServiceAccount":
            await self._call("create", kind, self._core.create_namespaced_service_account, namespace, obj)
        elif kind == "Role":
            await self._call("create", kind, self._rbac.create_namespaced_role, namespace, obj)
        elif kind == "RoleBinding":
            await self._call("create", kind, self._rbac.create_namespaced_role_binding, namespace, obj)
        elif kind == "RayJob":
            await self._call(
                "create",
                kind,
                self._custom.create_namespaced_custom_object,
                "ray.io",
                "v1",
                namespace,
                "rayjobs",
                obj,
            )
        else:
            raise ValueError(f"the operator does not create {kind}")

    async def patch(self, namespace: str, kind: str, name: str, body: dict[str, Any]) -> None:
        ct: dict[str, Any] = {"_content_type": MERGE_PATCH}
        if kind == "ConfigMap":
            await self._call(
                "patch", kind, self._core.patch_namespaced_config_map, name, namespace, body, **ct
            )
        elif kind == "Service":
            await self._call("patch", kind, self._core.patch_namespaced_service, name, namespace, body, **ct)
        elif kind == "Deployment":
            await self._call(
                "patch", kind, self._apps.patch_namespaced_deployment, name, namespace, body, **ct
            )
        elif kind == "Secret":
            # A shared teacher's clients Secret (digests of its jobs' keys); a job's key is never patched.
            await self._call("patch", kind, self._core.patch_namespaced_secret, name, namespace, body, **ct)
        elif kind == "PodDisruptionBudget":
            await self._call(
                "patch",
                kind,
                self._policy.patch_namespaced_pod_disruption_budget,
                name,
                namespace,
                body,
                **ct,
            )
        elif kind == "NetworkPolicy":
            await self._call(
                "patch", kind, self._networking.patch_namespaced_network_policy, name, namespace, body, **ct
            )
        elif kind == "ServiceAccount":
            await self._call(
                "patch", kind, self._core.patch_namespaced_service_account, name, namespace, body, **ct
            )
        elif kind == "Role":
            await self._call("patch", kind, self._rbac.patch_namespaced_role, name, namespace, body, **ct)
        elif kind == "RoleBinding":
            await self._call(
                "patch", kind, self._rbac.patch_namespaced_role_binding, name, namespace, body, **ct
            )
        elif kind == "RayJob":
            await self._call(
                "patch",
                kind,
                self._custom.patch_namespaced_custom_object,
                "ray.io",
                "v1",
                namespace,
                "rayjobs",
                name,
                body,
                **ct,
            )
        else:
            # Nor PersistentVolumeClaims: their spec is immutable but for growing, left to the user.
            raise ValueError(f"the operator does not patch {kind}")

    async def read_claims(self, namespace: str, names: list[str]) -> dict[str, ClaimFacts | None]:
        """The claims of `namespace` named, by name; None for one the API server does not have (404)."""
        out: dict[str, ClaimFacts | None] = {}
        for name in names:
            try:
                data = await self._call(
                    "get",
                    "PersistentVolumeClaim",
                    self._core.read_namespaced_persistent_volume_claim,
                    name,
                    namespace,
                    read=True,
                )
            except ApiError as error:
                if error.code != 404:
                    raise
                out[name] = None
            else:
                out[name] = claim_facts(orjson.loads(data))
        return out

    async def secret_owner(self, namespace: str, name: str) -> str | None:
        """The uid of the controller owner of Secret `name`, if it is labelled as ours (None: not ours, or
        no such Secret). Only its metadata is looked at; the rest of the answer is dropped at once."""
        try:
            data = await self._call(
                "get", "Secret", self._core.read_namespaced_secret, name, namespace, read=True
            )
        except ApiError as error:
            if error.code == 404:
                return None
            raise
        meta = orjson.loads(data).get("metadata") or {}
        if (meta.get("labels") or {}).get(naming.MANAGED_BY_LABEL) != naming.MANAGED_BY:
            return None
        owners = [ref for ref in meta.get("ownerReferences") or () if ref.get("controller")]
        return owners[0].get("uid") if owners else None

    async def read_key(self, namespace: str, kind: str, name: str, key: str) -> str | None:
        """The value of `key` in Secret or ConfigMap `name` (kind "Secret" or "ConfigMap"); None when the
        object or the key does not exist. The caller uses it at once and keeps it nowhere."""
        read = (
            self._core.read_namespaced_secret if kind == "Secret" else self._core.read_namespaced_config_map
        )
        try:
            data = await self._call("get", kind, read, name, namespace, read=True)
        except ApiError as error:
            if error.code == 404:
                return None
            raise
        obj = orjson.loads(data)
        if kind == "Secret":
            value = (obj.get("data") or {}).get(key)
            return None if value is None else base64.b64decode(value).decode("utf-8", "replace")
        value = (obj.get("data") or {}).get(key)
        if value is None and key in (obj.get("binaryData") or {}):
            value = base64.b64decode(obj["binaryData"][key]).decode("utf-8", "replace")
        return value

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._call(
            "patch",
            "DistillationJob/status",
            self._custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
        )

    async def patch_teacher(
        self, namespace: str, name: str, body: dict[str, Any], *, status: bool = False
    ) -> None:
        """A merge patch of a DistillationTeacher (its metadata) or, with `status`, of its status."""
        call = (
            self._custom.patch_namespaced_custom_object_status
            if status
            else self._custom.patch_namespaced_custom_object
        )
        await self._call(
            "patch",
            f"{TEACHER_KIND}/status" if status else TEACHER_KIND,
            call,
            GROUP,
            VERSION,
            namespace,
            TEACHER_PLURAL,
            name,
            body,
            _content_type=MERGE_PATCH,
        )
