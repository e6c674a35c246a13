"""The teacher server's scoring route serves jobs by their `X-Distillery-Job` header: a `CompactTeacher` with
a job identity and one without (an external client) both get their scores, each is accounted under its job
on the metrics, and concurrent jobs share the engine fairly. vLLM's engine is a fake that answers the
engine-core's tensor log-probs (`TensorPromptLogprobs`), so the route runs without a model."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import uvicorn
from distillery_runtime.teachers import CompactTeacher, ScoreRequest, server
from distillery_runtime.teachers.engine_scoring import TensorPromptLogprobs
from distillery_runtime.teachers.server_metrics import TeacherServerMetrics
from distillery_runtime.workers import free_port
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest


class FakeEngine:
    """Answers a scoring request after `delay`: the actual token's log-prob is -token id / 100, its top K
    ids 0..K-1; records the order in which each job's sequences reached the engine."""

    def __init__(self, max_num_seqs: int, delay: float = 0.0) -> None:
        self.model_config = SimpleNamespace(max_model_len=64, max_logprobs=8)
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))
        self.delay = delay
        self.arrivals: list[int] = []

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        tokens = np.asarray(prompt["prompt_token_ids"])
        self.arrivals.append(int(tokens[0]))
        await asyncio.sleep(self.delay)
        k = params.prompt_logprobs
        ids = np.tile(np.arange(k + 1, dtype=np.int32), (len(tokens) - 1, 1))
        ids[:, 0] = tokens[1:]
        lps = -np.tile(np.arange(k + 1, dtype=np.float32), (len(tokens) - 1, 1))
        lps[:, 0] = -tokens[1:] / 100
        holder = TensorPromptLogprobs()
        holder.ids.append(ids)
        holder.logprobs.append(lps)
        yield SimpleNamespace(prompt_logprobs=holder)


@contextlib.asynccontextmanager
async def serving(engine: FakeEngine, metrics: TeacherServerMetrics) -> AsyncIterator[str]:
    app = FastAPI()
    app.include_router(server.router)
    app.state.engine_client = engine
    app.state.args = SimpleNamespace(distillery_max_in_flight=None, served_model_name=["t"], model="t")
    app.state.distillery_metrics = metrics
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(uv.serve())
    while not uv.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        await task


def _value(text: str, name: str, job: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{client_job="{job}"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {job}")


async def test_requests_are_scored_and_accounted_under_their_job() -> None:
    registry = CollectorRegistry()
    engine = FakeEngine(max_num_seqs=4)
    async with serving(engine, TeacherServerMetrics(registry)) as url:
        ours = CompactTeacher([url], name="t", job="team-a/gsm8k")
        external = CompactTeacher([url], name="t")
        try:
            sample = ScoreRequest([5, 6], [7, 8, 9], "s0")
            a = await ours.score([sample, sample], 3)
            b = await external.score([sample], 3)
        finally:
            await ours.close()
            await external.close()
    assert np.allclose(a.token_logprobs, [[-0.07, -0.08, -0.09]] * 2)
    assert np.array_equal(b.topk_ids[0, 0], [1, 2, 3])
    text = generate_latest(registry).decode()
    assert _value(text, "distillery_teacher_scored_tokens_total", "team-a/gsm8k") == 10
    assert _value(text, "distillery_teacher_scored_tokens_total", "unknown") == 5
    assert _value(text, "distillery_teacher_request_duration_seconds_count", "team-a/gsm8k") == 1
    assert _value(text, "distillery_teacher_busy_seconds_total", "unknown") > 0


async def test_a_second_job_is_not_queued_behind_a_large_one() -> None:
    engine = FakeEngine(max_num_seqs=2, delay=0.02)
    async with serving(engine, TeacherServerMetrics(CollectorRegistry())) as url:
        big = CompactTeacher([url], name="t", job="ns/big", concurrency=64, batch_size=1)
        small = CompactTeacher([url], name="t", job="ns/small", concurrency=64, batch_size=1)
        try:
            # prompt token 1: big's sequences, 2: small's; big's 40 requests arrive first
            big_task = asyncio.create_task(big.score([ScoreRequest([1], [3], f"b{i}") for i in range(40)], 0))
            while len(engine.arrivals) < 2:
                await asyncio.sleep(0.005)
            await small.score([ScoreRequest([2], [3], f"s{i}") for i in range(4)], 0)
            await big_task
        finally:
            await big.close()
            await small.close()
    last_small = max(i for i, first in enumerate(engine.arrivals) if first == 2)
    # half of the two slots: small's 4 sequences are in after at most ~4 of big's, not after all 40
    assert last_small < 12, engine.arrivals
