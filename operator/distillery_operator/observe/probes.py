"""Health checks of external teachers: one small loop per teacher, a callback when the answer changes.

An external teacher is a server someone else runs, so the operator asks it directly (`GET /health`, the
vLLM server's endpoint, or `GET /v1/models` where /health does not exist). Only changes wake the job's
reconcile: a healthy teacher costs one HTTP request per interval and no Kubernetes API traffic.

It asks as the trainer will score: the same client settings (`distillery.plan.teachers.client`), turned into
a TLS context and the Authorization header by the same translation (`distillery.teacher_tls`), from the
CA bundle and API key the operator reads out of the job's Secret or ConfigMap before each check (a rotated
key is used at the next one). Neither is kept, logged, or put in the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Mapping

import aiohttp

from distillery.plan.teachers.client import TeacherClient
from distillery.teacher_tls import AccessMaterialError, authorization, tls_context
from distillery_operator import metrics
from distillery_operator.observe.summaries import Health, JobKey, ProbeTarget

KeyReader = Callable[[str, str, str, str], Awaitable[str | None]]
"""(namespace, "Secret" or "ConfigMap", name, key) -> the value, None if missing (`Kube.read_key`)."""


async def client_access(
    read_key: KeyReader | None, namespace: str, client: TeacherClient
) -> tuple[ssl.SSLContext | bool, dict[str, str]]:
    """The TLS context and headers of `client` from the job's Secret or ConfigMap: what the trainer pods get
    as a file and a variable. AccessMaterialError (one line, naming the field) where one cannot be read."""

    async def value(kind: str, name: str, key: str, field: str) -> str:
        if read_key is None:
            raise AccessMaterialError(f"{field}: the operator reads no Secrets or ConfigMaps here")
        try:
            found = await read_key(namespace, kind, name, key)
        except Exception as error:  # an API error (403 without the grant, 5xx): the check fails, named
            raise AccessMaterialError(f"{field}: get {kind} {name}: {error}") from None
        if found is None:
            raise AccessMaterialError(f"{field}: {kind} {name} has no key {key} (or does not exist)")
        return found

    headers: dict[str, str] = {}
    if client.api_key_secret is not None:
        ref, field = client.api_key_secret, f"{client.field}.external.apiKeySecret"
        headers = authorization(
            await value("Secret", ref.name, ref.key, field), f"{field} (Secret {ref.name})"
        )
    context: ssl.SSLContext | bool = True
    if client.tls:
        pem = None
        if client.ca_bundle is not None:
            bundle, field = client.ca_bundle, f"{client.field}.external.caBundle"
            kind, name = (
                ("Secret", bundle.secret_name)
                if bundle.secret_name
                else ("ConfigMap", bundle.config_map_name)
            )
            pem = await value(kind, name or "", bundle.key, field)
        context = tls_context(pem, client.ca_origin())
    return context, headers


async def check(
    session: aiohttp.ClientSession,
    endpoint: str,
    timeout: float,
    *,
    ssl_context: ssl.SSLContext | bool = True,
    headers: Mapping[str, str] | None = None,
    client: TeacherClient | None = None,
) -> Health:
    """One health check of an OpenAI-compatible server. With an API key it asks `/v1/models` first: vLLM
    serves /health to anyone (its --api-key guards /v1 only), so only /v1 shows whether the key is taken.
    `client`: the settings `ssl_context` and `headers` came from, named in the messages."""
    base = endpoint.rstrip("/")
    paths = ["/v1/models"] if headers else ["/health", "/v1/models"]
    url, status = f"{base}{paths[0]}", 0
    try:
        client_timeout = aiohttp.ClientTimeout(total=timeout)
        for path in paths:
            url = f"{base}{path}"
            async with session.get(url, timeout=client_timeout, ssl=ssl_context, headers=headers) as response:
                status = response.status
            if status != 404:
                break
    except aiohttp.ClientConnectorCertificateError as error:
        reason = getattr(error.certificate_error, "verify_message", None) or str(error.certificate_error)
        against = client.ca_origin() if client is not None else "the system's CAs"
        return Health(False, f"GET {url}: TLS certificate not trusted ({reason}), checked against {against}")
    except (TimeoutError, aiohttp.ClientError, OSError) as error:
        text = str(error) or type(error).__name__
        return Health(False, f"GET {url}: {text}")
    if 200 <= status < 300:
        return Health(True, f"GET {url}: {status}")
    if status in (401, 403) and client is not None:
        return Health(False, f"GET {url}: HTTP {status}, refusing {client.key_origin()}")
    return Health(False, f"GET {url}: HTTP {status}")


class TeacherProber:
    """Keeps one probing loop per (job, external teacher) and the latest result of each."""

    def __init__(
        self,
        on_change: Callable[[JobKey], None],
        interval: float = 30.0,
        timeout: float = 5.0,
        read_key: KeyReader | None = None,
    ):
        """`read_key`: how the CA bundles and API keys are read (`Kube.read_key`)."""
        self._on_change = on_change
        self.interval = interval
        self.timeout = timeout
        self._read_key = read_key
        self._tasks: dict[tuple[JobKey, str], tuple[ProbeTarget, asyncio.Task[None]]] = {}
        self._health: dict[JobKey, dict[str, Health]] = {}
        self._session: aiohttp.ClientSession | None = None

    def health(self, key: JobKey) -> dict[str, Health]:
        return dict(self._health.get(key, {}))

    def sync(self, key: JobKey, wanted: Mapping[str, ProbeTarget]) -> None:
        """Probes exactly the teachers in `wanted` (by name) for this job; a changed URL or setting restarts
        a teacher's loop."""
        for (job, name), (target, task) in list(self._tasks.items()):
            if job == key and wanted.get(name) != target:
                task.cancel()
                del self._tasks[(job, name)]
                self._health.get(key, {}).pop(name, None)
        for name, target in wanted.items():
            if (key, name) not in self._tasks:
                task = asyncio.create_task(self._loop(key, name, target), name=f"probe {key} {name}")
                self._tasks[(key, name)] = (target, task)

    def forget(self, key: JobKey) -> None:
        self.sync(key, {})
        self._health.pop(key, None)

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()

    async def _loop(self, key: JobKey, name: str, target: ProbeTarget) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        while True:
            try:
                context, headers = await client_access(self._read_key, key[0], target.client)
            except AccessMaterialError as error:
                result = Health(False, str(error))
            else:
                result = await check(
                    self._session,
                    target.endpoint,
                    self.timeout,
                    ssl_context=context,
                    headers=headers,
                    client=target.client,
                )
            metrics.TEACHER_PROBES.labels(result="ok" if result.ok else "failed").inc()
            seen = self._health.setdefault(key, {})
            previous = seen.get(name)
            seen[name] = result
            # Only a change of health matters to the status; the exact wording of an error does not.
            if previous is None or previous.ok != result.ok:
                self._on_change(key)
            await asyncio.sleep(self.interval)
