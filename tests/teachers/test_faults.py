"""Faults between client and teacher: a loopback proxy drops, delays, resets, stalls and
answers 5xx/429 on a fraction of requests. Every sample must still be scored, identically to
a fault-free run; with the server gone the error must be clear and arrive in bounded time.
Several proxies in front of the one server also stand in for several replicas."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from distillery_runtime.teachers import (
    CompactTeacher,
    OpenAITeacher,
    RetryPolicy,
    TeacherUnavailableError,
)

from .conftest import make_samples
from .fault_proxy import FaultProxy

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# per-attempt timeout below the proxy's stall, so stalls exercise the timeout path
POLICY = RetryPolicy(
    base_delay=0.02, max_delay=0.3, total_timeout=60.0, request_timeout=2.0, endpoint_cooldown=0.2
)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _teacher(kind: str, urls: list[str], server, policy: RetryPolicy = POLICY):
    if kind == "openai":
        return OpenAITeacher(urls, server.model, retry=policy, max_model_len=server.max_model_len)
    return CompactTeacher(
        urls, name="t", retry=policy, batch_size=2, max_model_len=server.max_model_len, max_logprobs=64
    )


@pytest.mark.parametrize("kind", ["openai", "compact"])
async def test_twenty_percent_faults_same_results(kind, vllm_server) -> None:
    samples = make_samples(24, 1024, seed=11, max_response=60)
    clean = _teacher(kind, [vllm_server.url], vllm_server)
    try:
        want = await clean.score(samples, 8)
    finally:
        await clean.close()

    proxies = [
        await FaultProxy(
            "127.0.0.1", _port(vllm_server.url), fault_rate=0.2, seed=s, stall=POLICY.request_timeout + 1
        ).start()
        for s in (1, 2)
    ]
    teacher = _teacher(kind, [p.url for p in proxies], vllm_server)
    try:
        got = await teacher.score(samples, 8)
        got2 = await teacher.score(samples, 8)
    finally:
        await teacher.close()
        for p in proxies:
            await p.stop()
    faults = sum((p.counts for p in proxies), start=type(proxies[0].counts)())
    total = sum(faults.values())
    injected = total - faults["ok"]
    assert injected >= 0.1 * total and len([f for f in faults if f != "ok"]) >= 3, faults
    for g in (got, got2):
        assert np.array_equal(g.mask, want.mask)
        assert np.array_equal(g.topk_ids, want.topk_ids)
        assert np.array_equal(g.topk_logprobs, want.topk_logprobs)
        assert np.array_equal(g.token_logprobs, want.token_logprobs)
    # load went to both replicas
    assert all(e.served > 0 for e in teacher.transport.pool.endpoints)


@pytest.mark.parametrize("kind", ["openai", "compact"])
async def test_server_gone_clear_error_in_bounded_time(kind, vllm_server) -> None:
    proxy = await FaultProxy("127.0.0.1", _port(vllm_server.url)).start()
    url = proxy.url
    policy = RetryPolicy(base_delay=0.05, max_delay=0.5, total_timeout=3.0, request_timeout=2.0)
    teacher = _teacher(kind, [url], vllm_server, policy)
    try:
        await teacher.score(make_samples(2, 1024, seed=1), 4)  # works through the proxy
        await proxy.stop()  # the teacher goes away: connections refused from now on
        start = time.monotonic()
        with pytest.raises(TeacherUnavailableError) as err:
            await teacher.score(make_samples(3, 1024, seed=2), 4)
        elapsed = time.monotonic() - start
    finally:
        await teacher.close()
    assert elapsed < policy.total_timeout + 1.0
    msg = str(err.value)
    assert url in msg and "3.0 s" in msg and "attempts" in msg and "last error" in msg


async def test_least_outstanding_spreads_concurrent_load(vllm_server) -> None:
    # one replica is slow (every request delayed): the other one must take most of the load
    slow = await FaultProxy(
        "127.0.0.1", _port(vllm_server.url), fault_rate=1.0, faults=("delay",), delay=2.0
    ).start()
    fast = await FaultProxy("127.0.0.1", _port(vllm_server.url)).start()
    teacher = OpenAITeacher([slow.url, fast.url], vllm_server.model, max_model_len=512, concurrency=4)
    try:
        await asyncio.gather(
            *(teacher.score(make_samples(8, 1024, seed=s, max_response=20), 2) for s in range(3))
        )
        served = {e.url: e.served for e in teacher.transport.pool.endpoints}
    finally:
        await teacher.close()
        await slow.stop()
        await fast.stop()
    # the slow replica still gets its first requests (all slots free at the start), not the backlog
    assert served[fast.url] >= 1.5 * served[slow.url] > 0, served
