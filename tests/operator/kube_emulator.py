"""A kmock Kubernetes emulator with the gaps of kmock 0.8 closed that the operator tests rely on.

kmock serves the real HTTP API (create, get, list, merge-patch, delete, watch) from memory. What it lacks
and what this subclass adds, each as the API server does it:
- `metadata.uid`, `resourceVersion`, `creationTimestamp`, `generation` stamped on create; the
  resourceVersion bumped on every write and `generation` only when `spec` changes;
- `metadata.generateName` honoured (kopf names its Events that way);
- `metadata.namespace` filled from the URL on create (else namespaced watches miss the object);
- the `status` subresource: a PATCH to `/status` changes only `status`, a PATCH to the object never does;
- JSON patches (kopf adds finalizers with one whose first op tests the resourceVersion) are applied
  with `jsonpatch`; a failed `test` op answers 422 (kmock would merge the list and answer 500);
- list answers carry `kind`/`apiVersion` and core discovery says `v1`, which kubectl needs;
- optional garbage collection: deleting an owner deletes the objects whose ownerReferences name its uid
  (kube-controller-manager's job; no other controller runs, so tests play KubeRay and Deployments).
There is no schema validation: rendered objects are validated offline in test_render.py.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import uuid
from typing import Any

import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import dicts, enums, rendering

from distillery.api import GROUP, KIND, PLURAL, TEACHER_KIND, TEACHER_PLURAL, VERSION

DJ = f"{GROUP}/{VERSION}/{PLURAL}"
TEACHERS = f"{GROUP}/{VERSION}/{TEACHER_PLURAL}"
RAYJOBS = "ray.io/v1/rayjobs"
DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
CONFIGMAPS = "v1/configmaps"
EVENTS = "v1/events"


def _merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns `old` into `new` (null removes a key, lists are replaced)."""
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            inner = _merge_diff(old[key], value)
            if inner:
                out[key] = inner
        elif old.get(key, object()) != value:
            out[key] = value
    return out


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    garbage_collection: bool = True
    write_latency: float = 0.0
    """Seconds each create/patch/delete takes (a slow API server: makes kill-mid-reconcile tests certain)."""
    faults: dict[tuple[str, str], list[int]] = attrs.field(factory=dict)
    request_log: list[rendering.Request] = attrs.field(factory=list, init=False)
    """Every request received, in order (see `_handle` for why kmock's own log is kept short)."""
    _inflight: dict[int, rendering.Request] = attrs.field(factory=dict, init=False)
    """Injected failures: (action, resource path like 'apps/v1/deployments[/status]') -> HTTP codes to answer
    with, one per matching request, before serving normally again."""
    _versions: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()
        verbs = {"list", "watch", "get", "create", "patch", "update", "delete"}
        self.resources[DJ] = kmock.ResourceInfo(
            kind=KIND, singular="distillationjob", namespaced=True, verbs=verbs,
            subresources={"status"}, shortnames={"dj"},
        )  # fmt: skip
        self.resources[TEACHERS] = kmock.ResourceInfo(
            kind=TEACHER_KIND, singular=TEACHER_KIND.lower(), namespaced=True, verbs=verbs,
            subresources={"status"}, shortnames={"dt"},
        )  # fmt: skip
        self.resources[RAYJOBS] = kmock.ResourceInfo(
            kind="RayJob", singular="rayjob", namespaced=True, verbs=verbs, subresources={"status"}
        )

    # ------------------------------------------------------------------------------------------ writes

    def _info(self, resource: Any) -> kmock.ResourceInfo | None:
        # ResourcesArray creates entries on lookup (like a defaultdict): read its dict instead.
        return self.resources._resources.get(resource)

    def _has_status_subresource(self, resource: Any) -> bool:
        info = self._info(resource)
        return bool(info and "status" in (info.subresources or ()))

    def _stamp_create(self, request: rendering.Request) -> None:
        data = request.data
        meta = data.setdefault("metadata", {})
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._versions))
        meta["creationTimestamp"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta["generation"] = 1

    def _json_patch_as_merge_patch(self, request: rendering.Request) -> None:
        """Applies a JSON patch to the stored object and hands kmock the equivalent merge patch."""
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        old = copy.deepcopy(self._objects[key].last.raw)
        try:
            new = jsonpatch.apply_patch(old, request.data)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(error)) from None
        object.__setattr__(request, "data", _merge_diff(old, new))  # the Request is frozen

    def _stamp_update(self, request: rendering.Request) -> None:
        data = request.data
        key = (request.resource, request.namespace, request.name)
        current = self._objects[key] if key in self._objects and not self._objects[key].deleted else None
        if current is None:
            return  # kmock answers 404
        if request.subresource == "status":
            kept = {"status": data.get("status")}
        else:
            kept = {
                k: v
                for k, v in data.items()
                if k != "status" or not self._has_status_subresource(request.resource)
            }
        data.clear()
        data.update(kept)
        meta = data.setdefault("metadata", {})
        old = copy.deepcopy(current.last.raw)
        generation = old.get("metadata", {}).get("generation", 1)
        if "spec" in data and request.subresource != "status":
            new_spec = dicts.patch_dict(copy.deepcopy(old.get("spec") or {}), data["spec"] or {})
            if new_spec != (old.get("spec") or {}):
                generation += 1
        meta["generation"] = generation
        meta["resourceVersion"] = str(next(self._versions))

    def _fault(self, request: rendering.Request) -> int | None:
        res = request.resource
        path = f"{res.group}/{res.version}/{res.plural}" if res.group else f"{res.version}/{res.plural}"
        if request.subresource:
            path += f"/{request.subresource}"
        action = str(getattr(request.action, "value", request.action)).lower()
        codes = self.faults.get((action, path))
        return codes.pop(0) if codes else None

    async def _handle(self, request: rendering.Request) -> Any:
        # kmock dispatches a request by scanning its whole request log through every reaction filter,
        # O(requests) per request; its log keeps only the requests in flight, the full log is ours.
        self.request_log.append(request)
        self._inflight[id(request)] = request
        self._requests[:] = [r for r in self._requests if id(r) in self._inflight]
        try:
            return await self._handle_tracked(request)
        finally:
            self._inflight.pop(id(request), None)

    async def _handle_tracked(self, request: rendering.Request) -> Any:
        if request.resource is not None:
            if self.write_latency and request.action in (
                enums.action.CREATE,
                enums.action.UPDATE,
                enums.action.DELETE,
            ):
                await asyncio.sleep(self.write_latency)
            code = self._fault(request)
            if code is not None:
                raise kmock.KubernetesError(status=code, reason="InjectedFault", message=f"injected {code}")
            if request.action == enums.action.CREATE and isinstance(request.data, dict):
                self._stamp_create(request)
            elif request.action == enums.action.UPDATE:
                if isinstance(request.data, list):
                    self._json_patch_as_merge_patch(request)
                self._stamp_update(request)
        response = await super()._handle(request)
        if (
            self.garbage_collection
            and request.resource is not None
            and request.action == enums.action.DELETE
            and request.name is not None
        ):
            await self._collect_garbage()
        return response

    async def _collect_garbage(self) -> None:
        """Deletes every object whose owners are all gone (background cascading deletion)."""
        while True:
            alive = {obj.get("metadata", {}).get("uid") for obj in self._objects.values() if not obj.deleted}
            orphans = []
            for key, obj in self._objects.items():
                if obj.deleted:
                    continue
                refs = obj.get("metadata", {}).get("ownerReferences") or []
                if refs and not any(ref.get("uid") in alive for ref in refs):
                    orphans.append(key)
            if not orphans:
                return
            async with self._lock:
                for key in orphans:
                    raw = self._objects[key].raw
                    self._objects[key].delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})

    # ------------------------------------------------------------------------------------------ reads
    # kmock finds the object of a create/patch/get by scanning every stored object; with thousands of
    # objects (the scale bench) that scan dominates, so these look the key up directly.

    def _live(self, request: rendering.Request, namespace: str | None, name: str | None) -> Any:
        key = (request.resource, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return self._objects[key]

    async def _serve_create(self, request: rendering.Request) -> Any:
        meta = request.data.get("metadata", {})
        return self._live(request, request.namespace or meta.get("namespace"), meta.get("name")).last.raw

    async def _serve_update(self, request: rendering.Request) -> Any:
        key = (request.resource, request.namespace, request.name)
        return self._objects[key].last.raw

    async def _serve_fetch(self, request: rendering.Request) -> Any:
        return self._live(request, request.namespace, request.name).raw

    async def _serve_list(self, request: rendering.Request) -> Any:
        payload = await super()._serve_list(request)
        info = self._info(request.resource)
        kind = (info.kind if info and info.kind else "Object") + "List"
        group = request.resource.group if request.resource else ""
        version = request.resource.version if request.resource else "v1"
        payload["kind"] = kind
        payload["apiVersion"] = f"{group}/{version}" if group else version
        payload["metadata"] = {"resourceVersion": str(next(self._versions))}
        return payload

    async def _serve_version(self, request: rendering.Request) -> Any:
        payload = await super()._serve_version(request)
        if isinstance(payload, dict) and payload.get("groupVersion") == "/v1":
            payload["groupVersion"] = "v1"
        return payload

    # ------------------------------------------------------------------------------------------ helpers

    def obj(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object (a copy), or None when absent or deleted."""
        key = (kmock.resource(resource), namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].last.raw)

    def peek(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object itself (no copy: do not modify it), or None; cheap enough to poll thousands."""
        key = (kmock.resource(resource), namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return self._objects[key].last.raw

    def object_names(self, resource: str, namespace: str) -> list[str]:
        wanted = kmock.resource(resource)
        return sorted(
            name
            for (res, ns, name), obj in self._objects.items()
            if res == wanted and ns == namespace and not obj.deleted
        )

    async def play(
        self, resource: str, namespace: str, name: str, patch: dict[str, Any], subresource: str = "status"
    ) -> None:
        """Plays a missing controller: patches an object through the HTTP API, as that controller would."""
        group_version, plural = resource.rsplit("/", 1)
        prefix = "/api" if "/" not in group_version else "/apis"
        url = f"{prefix}/{group_version}/namespaces/{namespace}/{plural}/{name}"
        if subresource:
            url += f"/{subresource}"
        async with self.patch(
            url, json=patch, headers={"Content-Type": "application/merge-patch+json"}
        ) as resp:
            assert resp.status < 300, await resp.text()

    def api_requests(self) -> list[rendering.Request]:
        """Every request the server received, in order."""
        return list(self.request_log)
