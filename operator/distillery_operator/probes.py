"""Health checks of external teachers: one small loop per teacher, a callback when the answer changes.

An external teacher is a server someone else runs, so the operator asks it directly (`GET /health`, the
vLLM server's endpoint, or `GET /v1/models` where /health does not exist). Only changes wake the job's
reconcile: a healthy teacher costs one HTTP request per interval and no Kubernetes API traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import aiohttp

from distillery_operator import metrics
from distillery_operator.observe import Health, JobKey


async def check(session: aiohttp.ClientSession, endpoint: str, timeout: float) -> Health:
    """One health check of an OpenAI-compatible server."""
    base = endpoint.rstrip("/")
    url = f"{base}/health"
    try:
        client_timeout = aiohttp.ClientTimeout(total=timeout)
        async with session.get(url, timeout=client_timeout) as response:
            if response.status == 404:
                url = f"{base}/v1/models"
                async with session.get(url, timeout=client_timeout) as fallback:
                    status = fallback.status
            else:
                status = response.status
    except (TimeoutError, aiohttp.ClientError, OSError) as error:
        text = str(error) or type(error).__name__
        return Health(False, f"GET {url}: {text}")
    if 200 <= status < 300:
        return Health(True, f"GET {url}: {status}")
    return Health(False, f"GET {url}: HTTP {status}")


class TeacherProber:
    """Keeps one probing loop per (job, external teacher) and the latest result of each."""

    def __init__(self, on_change: Callable[[JobKey], None], interval: float = 30.0, timeout: float = 5.0):
        self._on_change = on_change
        self.interval = interval
        self.timeout = timeout
        self._tasks: dict[tuple[JobKey, str], tuple[str, asyncio.Task[None]]] = {}
        self._health: dict[JobKey, dict[str, Health]] = {}
        self._session: aiohttp.ClientSession | None = None

    def health(self, key: JobKey) -> dict[str, Health]:
        return dict(self._health.get(key, {}))

    def sync(self, key: JobKey, wanted: dict[str, str]) -> None:
        """Probes exactly the teachers in `wanted` (name -> endpoint) for this job."""
        for (job, name), (endpoint, task) in list(self._tasks.items()):
            if job == key and wanted.get(name) != endpoint:
                task.cancel()
                del self._tasks[(job, name)]
                self._health.get(key, {}).pop(name, None)
        for name, endpoint in wanted.items():
            if (key, name) not in self._tasks:
                task = asyncio.create_task(self._loop(key, name, endpoint), name=f"probe {key} {name}")
                self._tasks[(key, name)] = (endpoint, task)

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

    async def _loop(self, key: JobKey, name: str, endpoint: str) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        while True:
            result = await check(self._session, endpoint, self.timeout)
            metrics.TEACHER_PROBES.labels(result="ok" if result.ok else "failed").inc()
            seen = self._health.setdefault(key, {})
            previous = seen.get(name)
            seen[name] = result
            # Only a change of health matters to the status; the exact wording of an error does not.
            if previous is None or previous.ok != result.ok:
                self._on_change(key)
            await asyncio.sleep(self.interval)
