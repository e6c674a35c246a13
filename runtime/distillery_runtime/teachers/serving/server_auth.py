"""The teacher server's key check, on every route: the OpenAI API, the compact scoring wire
(`/distillery/v1/*`) and vLLM's routes outside /v1 (`/tokenize`, `/load`, ...), which vLLM's own `--api-key`
check leaves open. Every request must carry `Authorization: Bearer KEY`, where KEY is

- the one key of the server (`VLLM_API_KEY`): a standalone teacher's, from its job's teacher key Secret
  (`distillery.plan.access.auth`); or
- the key of one of its clients (`DISTILLERY_TEACHER_CLIENTS`, a file of the SHA-256 digests of the keys of
  the jobs that use a shared teacher, which the operator keeps in a Secret and the kubelet keeps current).
  The request is then the job's the key belongs to: the guard replaces any `X-Distillery-Job` header with
  that job, so one job's requests are never counted, queued or served as another's.

Open without a key: `/health` (the kubelet's probes; it answers an empty 200 and tells nothing else) and
`/metrics` (Prometheus' scrape; the job's NetworkPolicy admits only the monitoring namespace to it). A
refusal is a 401 that names no key and echoes nothing of the request.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from distillery.plan.access.auth import CLIENTS_ENV, TEACHER_KEY_ENV
from distillery_runtime.teachers.wire import JOB_HEADER

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/metrics", "/metrics/"})
"""The routes that answer without a key."""
REFUSAL = b'{"error":"unauthorized: this teacher wants its job\'s key as Authorization: Bearer"}'
_JOB_HEADER = JOB_HEADER.lower().encode()

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _digest(value: bytes) -> bytes:
    # Compared as digests: equal length always, so the comparison's time tells nothing of the key.
    return hashlib.sha256(value).digest()


@dataclass
class ClientKeys:
    """A shared teacher's clients file (`plan.access.auth.clients_document`), read again whenever it changes
    (the kubelet swaps a Secret volume's files atomically): the job each known key digest belongs to. A file
    that is missing or unreadable knows no job, so every request is refused until a good one appears."""

    path: str
    _seen: tuple[int, int, int] | None = None
    _jobs: dict[bytes, str] = field(default_factory=dict)

    def job_of(self, token: bytes) -> str | None:
        """The job whose key `token` is; None: no client's."""
        self._refresh()
        want = _digest(token)
        found = None
        for digest, job in self._jobs.items():
            # Every entry compared, a match or not: the time taken tells nothing of which one matched.
            if hmac.compare_digest(digest, want):
                found = job
        return found

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            if self._seen is not None:
                log.warning("teacher clients file %s: gone; refusing every job", self.path)
            self._seen, self._jobs = None, {}
            return
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            with open(self.path, "rb") as f:
                document = orjson.loads(f.read())
            jobs = document["jobs"]
            self._jobs = {bytes.fromhex(digest): str(job) for job, digest in jobs.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("teacher clients file %s: unreadable (%s); refusing every job", self.path, error)
            self._jobs = {}
            return
        log.info("teacher clients: %d job(s): %s", len(self._jobs), ", ".join(sorted(self._jobs.values())))


def bearer_token(scope: Scope) -> bytes | None:
    """The token of the request's `Authorization: Bearer` header; None without one."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


class KeyGuard:
    """Pure ASGI middleware: refuses (401) every HTTP or WebSocket request but to OPEN_PATHS that lacks the
    server's key (`key`) or a client's (`clients`); exactly one of the two is given."""

    def __init__(self, app: App, key: str | None = None, clients: ClientKeys | None = None) -> None:
        if (key is None) == (clients is None):
            raise ValueError("KeyGuard: give the server's key or its clients' keys, not both")
        self.app = app
        self.clients = clients
        self._want: bytes | None = None
        if key is not None:
            key = key.strip()
            if not key:
                raise ValueError(f"${TEACHER_KEY_ENV}: empty; a teacher key must not be")
            self._want = _digest(key.encode())

    def authorized(self, scope: Scope) -> bool:
        """Whether the request carries a key this server takes; a client's request is named its job's."""
        token = bearer_token(scope)
        if token is None:
            return False
        if self.clients is None:
            assert self._want is not None
            return hmac.compare_digest(_digest(token), self._want)
        job = self.clients.job_of(token)
        if job is None:
            return False
        headers = [(n, v) for n, v in scope.get("headers") or () if n.lower() != _JOB_HEADER]
        scope["headers"] = [*headers, (_JOB_HEADER, job.encode())]
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        path = scope["path"].removeprefix(scope.get("root_path") or "")
        if path in OPEN_PATHS or self.authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": REFUSAL})


def key_guard_options(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The guard's options from the server's environment: its key (`VLLM_API_KEY`) or its clients file
    (`DISTILLERY_TEACHER_CLIENTS`); None where neither is set (a local run's teacher, open)."""
    env = os.environ if environ is None else environ
    key, clients = env.get(TEACHER_KEY_ENV), env.get(CLIENTS_ENV)
    if key and clients:
        raise ValueError(
            f"${TEACHER_KEY_ENV} and ${CLIENTS_ENV} are both set: a teacher has one or the other"
        )
    if clients:
        return {"clients": ClientKeys(clients)}
    return {"key": key} if key else None
