"""The teacher server's key check: with a key set (`VLLM_API_KEY`, from the job's teacher key Secret,
`distillery.plan.job_access`), every request must carry `Authorization: Bearer KEY`, on every route: the
OpenAI API, the compact scoring wire (`/distillery/v1/*`) and vLLM's routes outside /v1 (`/tokenize`,
`/load`, ...), which vLLM's own `--api-key` check leaves open.

Open without a key: `/health` (the kubelet's probes; it answers an empty 200 and tells nothing else) and
`/metrics` (Prometheus' scrape; the job's NetworkPolicy admits only the monitoring namespace to it). A
refusal is a 401 that names no key and echoes nothing of the request.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from distillery.plan.job_access import TEACHER_KEY_ENV

OPEN_PATHS = frozenset({"/health", "/metrics", "/metrics/"})
"""The routes that answer without a key."""
REFUSAL = b'{"error":"unauthorized: this teacher wants its job\'s key as Authorization: Bearer"}'

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _digest(value: bytes) -> bytes:
    # Compared as digests: equal length always, so the comparison's time tells nothing of the key.
    return hashlib.sha256(value).digest()


class KeyGuard:
    """Pure ASGI middleware: refuses (401) every HTTP or WebSocket request but to OPEN_PATHS that lacks
    `Authorization: Bearer KEY`."""

    def __init__(self, app: App, key: str) -> None:
        key = key.strip()
        if not key:
            raise ValueError(f"${TEACHER_KEY_ENV}: empty; a teacher key must not be")
        self.app = app
        self._want = _digest(key.encode())

    def authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(_digest(token.strip()), self._want)
        return False

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
