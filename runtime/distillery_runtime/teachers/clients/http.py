"""Pooled async HTTP to the replicas of one teacher: least-outstanding-requests endpoint
choice, a per-endpoint concurrency limit, and retries with backoff inside a bounded time.

Replicas are a list of base URLs, or (with `resolve_dns=True`, plain http only) every address
behind each host name, which is how a Kubernetes headless Service exposes its pods; the addresses
are re-resolved every `dns_ttl` seconds. Every request carries the teacher's `ClientAccess` (TLS
context, API key); an untrusted certificate or a refused key ends the request at once
(`TeacherAccessError`): no retry can fix either.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from distillery_runtime.teachers.access import ClientAccess, client_access
from distillery_runtime.teachers.clients.retry import RetryPolicy, backoff_delay, is_retryable_status
from distillery_runtime.teachers.types import TeacherUnavailableError

REFUSED_CREDENTIALS = (401, 403)
"""Answers to a missing or wrong API key (OpenAI's API and vLLM's --api-key answer 401)."""


class HttpStatusError(Exception):
    """A non-retryable HTTP answer (4xx other than 408/429); the caller turns it into a clear error."""

    def __init__(self, status: int, body: bytes, url: str) -> None:
        super().__init__(f"HTTP {status} from {url}: {body[:500].decode('utf-8', 'replace')}")
        self.status, self.body, self.url = status, body, url


@dataclass(slots=True)
class Endpoint:
    """One replica: its base URL and load/health bookkeeping."""

    url: str
    host_header: str | None = None
    outstanding: int = 0
    down_until: float = 0.0
    served: int = 0


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def choose_endpoint(endpoints: Sequence[Endpoint], now: float, tiebreak: int) -> Endpoint:
    """Least outstanding requests first, among endpoints not cooling down after a failure
    (all of them if every one is cooling down); `tiebreak` rotates among equals."""
    healthy = [e for e in endpoints if e.down_until <= now] or list(endpoints)
    least = min(e.outstanding for e in healthy)
    tied = [e for e in healthy if e.outstanding == least]
    return tied[tiebreak % len(tied)]


@dataclass
class EndpointPool:
    """The replicas of one teacher."""

    urls: Sequence[str]
    concurrency: int = 8
    resolve_dns: bool = False
    dns_ttl: float = 10.0
    endpoints: list[Endpoint] = field(default_factory=list)
    _resolved_at: float = -1e18
    _turn: int = 0
    _slots: asyncio.Condition | None = None
    _slots_loop: asyncio.AbstractEventLoop | None = None

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("a teacher needs at least one endpoint URL")
        self.urls = [u.rstrip("/") for u in self.urls]
        if self.resolve_dns and any(urlsplit(u).scheme == "https" for u in self.urls):
            # An address in the URL sends no SNI, and TLS checks the certificate against the address.
            raise ValueError(f"resolve_dns is for plain http: TLS checks the host name of {list(self.urls)}")

    async def refresh(self) -> None:
        """(Re)build the endpoint list, keeping the state of endpoints that stay."""
        if self.endpoints and (not self.resolve_dns or time.monotonic() - self._resolved_at < self.dns_ttl):
            return
        wanted: list[tuple[str, str | None]] = []
        for url in self.urls:
            wanted.extend(await self._expand(url) if self.resolve_dns else [(url, None)])
        old = {e.url: e for e in self.endpoints}
        self.endpoints = [old.get(u) or Endpoint(u, host) for u, host in dict.fromkeys(wanted)]
        self._resolved_at = time.monotonic()

    @staticmethod
    async def _expand(url: str) -> list[tuple[str, str | None]]:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if _is_ip(host):
            return [(url, None)]
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        out: list[tuple[str, str | None]] = []
        for info in infos:
            addr = str(info[4][0])
            netloc = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
            out.append((urlunsplit((parts.scheme, netloc, parts.path, "", "")), parts.netloc))
        return out or [(url, None)]

    async def acquire(self) -> Endpoint:
        """Wait for a free slot on any replica, then take the least loaded one. Choosing when
        a slot frees (not when the request arrives) sends a backlog to the fast replicas."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Condition(), loop
        async with self._slots:
            while True:
                free = [e for e in self.endpoints if e.outstanding < self.concurrency]
                if free:
                    self._turn += 1
                    ep = choose_endpoint(free, time.monotonic(), self._turn)
                    ep.outstanding += 1
                    return ep
                await self._slots.wait()

    async def release(self, ep: Endpoint) -> None:
        ep.outstanding -= 1
        assert self._slots is not None
        async with self._slots:
            self._slots.notify()


class HttpTransport:
    """POST/GET with retries to the least loaded replica; one aiohttp session per event loop."""

    def __init__(
        self,
        pool: EndpointPool,
        policy: RetryPolicy | None = None,
        *,
        name: str = "teacher",
        access: ClientAccess | None = None,
    ) -> None:
        """`access`: the TLS context and headers of every request (default: none of either, http's)."""
        self.pool = pool
        self.policy = policy or RetryPolicy()
        self.name = name
        self.access = access or client_access(name, None, pool.urls)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rng = random.Random()
        self.retries = 0
        """Attempts retried so far (read by the runtime's teacher_retries_total metric)."""

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        # a session belongs to the loop that made it; a teacher reused from another loop
        # (tests with per-test loops, a restarted trainer loop) gets a fresh one
        if self._session is None or self._session.closed or self._loop is not loop:
            self._loop = loop
            total = max(1, self.pool.concurrency * max(1, len(self.pool.urls)) * 4)
            connector = aiohttp.TCPConnector(
                limit=total, limit_per_host=0, keepalive_timeout=30, ssl=self.access.ssl
            )
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> bytes:
        """Send until a 2xx answer (returned), a non-retryable answer (HttpStatusError), or the
        policy's total time runs out (TeacherUnavailableError naming the last failure)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.policy.total_timeout
        session = self._get_session()
        attempt, last = 0, "no attempt made"
        while True:
            remaining = deadline - loop.time()
            try:
                await self.pool.refresh()
            except OSError as exc:  # DNS failure: retry like a connection error
                last = f"resolving {self.pool.urls}: {exc!r}"
            else:
                ep = await self.pool.acquire()
                try:
                    return await self._attempt(session, ep, method, path, body, headers, remaining)
                except HttpStatusError:
                    raise
                except aiohttp.ClientConnectorCertificateError as exc:
                    raise self.access.certificate_error(ep.url, exc) from None
                except _Retryable as exc:
                    last = str(exc)
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    ep.down_until = time.monotonic() + self.policy.endpoint_cooldown
                    last = f"{ep.url}: {type(exc).__name__}: {exc}"
                finally:
                    await self.pool.release(ep)
            delay = backoff_delay(attempt, self.policy, self._rng)
            attempt += 1
            if loop.time() + delay >= deadline:
                raise TeacherUnavailableError(
                    f"teacher {self.name}: no answer from {list(self.pool.urls)} within "
                    f"{self.policy.total_timeout:.1f} s ({attempt} attempts); last error: {last}"
                )
            self.retries += 1
            await asyncio.sleep(delay)

    async def _attempt(
        self,
        session: aiohttp.ClientSession,
        ep: Endpoint,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str] | None,
        remaining: float,
    ) -> bytes:
        timeout = aiohttp.ClientTimeout(
            total=max(0.01, min(self.policy.request_timeout, remaining)), connect=self.policy.connect_timeout
        )
        hdrs = {**self.access.headers, **(headers or {})}
        if ep.host_header:
            hdrs["Host"] = ep.host_header
        async with session.request(method, ep.url + path, data=body, headers=hdrs, timeout=timeout) as resp:
            data = await resp.read()
            status = resp.status
        if 200 <= status < 300:
            ep.served += 1
            return data
        if status in REFUSED_CREDENTIALS:
            raise self.access.refused(ep.url + path, status, data)
        if is_retryable_status(status):
            raise _Retryable(f"{ep.url}{path}: HTTP {status}: {data[:200].decode('utf-8', 'replace')}")
        raise HttpStatusError(status, data, ep.url + path)


class _Retryable(Exception):
    """An answer worth retrying (429, 408, 5xx)."""
