"""The teacher server's scoring route serves jobs by their `X-Distillery-Job` header: a `CompactTeacher` with
a job identity and one without (an external client) both get their scores, each is accounted under its job
on the metrics, and concurrent jobs share the engine fairly; a request whose client stopped waiting is not
scored. vLLM's engine is a fake that answers the engine-core's tensor log-probs (`TensorPromptLogprobs`), so
the route runs without a model; the server is real uvicorn, whose shutdown waits for every request's
handler, so what the metrics say after it is all the server did."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import uvicorn
from distillery_runtime.run.workers import free_port
from distillery_runtime.teachers import CompactTeacher, ScoreRequest, TeacherUnavailableError, server
from distillery_runtime.teachers.clients.retry import RetryPolicy
from distillery_runtime.teachers.in_process.engine_scoring import TensorPromptLogprobs
from distillery_runtime.teachers.serving.server_metrics import TeacherServerMetrics
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest


class FakeEngine:
    """Answers a scoring request after `delay` (`first_delay` for the first sequence, when given): the actual
    token's log-prob is -token id / 100, its top K ids 0..K-1; records the order in which each job's
    sequences reached the engine, and counts the sequences aborted in it (vLLM aborts a request whose
    `generate` is cancelled)."""

    def __init__(self, max_num_seqs: int, delay: float = 0.0, first_delay: float | None = None) -> None:
        self.model_config = SimpleNamespace(max_model_len=64, max_logprobs=8)
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))
        self.delay = delay
        self.first_delay = delay if first_delay is None else first_delay
        self.arrivals: list[int] = []
        self.aborted = 0

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        tokens = np.asarray(prompt["prompt_token_ids"])
        self.arrivals.append(int(tokens[0]))
        try:
            await asyncio.sleep(self.first_delay if len(self.arrivals) == 1 else self.delay)
        except asyncio.CancelledError:
            self.aborted += 1
            raise
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


async def test_an_attempt_the_client_gave_up_on_is_aborted_and_its_retry_scored_once() -> None:
    """The first attempt outlasts the client's per-attempt timeout (a loaded teacher); the client retries.
    The server aborts the abandoned attempt in the engine when its connection closes, so the job's
    sequences are scored and counted once, not once per attempt (a shared teacher's accounting, and its
    load under overload, where every retry would add to the queue that made it time out)."""
    registry = CollectorRegistry()
    engine = FakeEngine(max_num_seqs=4, first_delay=3.0)
    patient = RetryPolicy(request_timeout=0.5, total_timeout=20.0)
    async with serving(engine, TeacherServerMetrics(registry)) as url:
        client = CompactTeacher([url], name="t", job="ns/job", retry=patient)
        try:
            scores = await client.score([ScoreRequest([5, 6], [7, 8], "s0")], 2)
        finally:
            await client.close()
        retries = client.transport.retries
    assert retries == 1
    assert np.allclose(scores.token_logprobs, [[-0.07, -0.08]])
    assert engine.arrivals == [5, 5] and engine.aborted == 1
    text = generate_latest(registry).decode()
    assert _value(text, "distillery_teacher_scored_sequences_total", "ns/job") == 1
    assert _value(text, "distillery_teacher_request_duration_seconds_count", "ns/job") == 1


async def test_a_request_whose_client_left_the_queue_never_reaches_the_engine() -> None:
    """One sequence at a time: job `ns/long`'s request holds the engine; `ns/gone`'s waits in the fair queue
    and its client gives up. It leaves the queue: the engine never sees it and nothing is counted for it."""
    registry = CollectorRegistry()
    engine = FakeEngine(max_num_seqs=1, delay=1.5)
    metrics = TeacherServerMetrics(registry)
    async with serving(engine, metrics) as url:
        long = CompactTeacher([url], name="t", job="ns/long")
        gone = CompactTeacher([url], name="t", job="ns/gone", retry=RetryPolicy(request_timeout=0.3,
                                                                                total_timeout=0.4))  # fmt: skip
        try:
            held = asyncio.create_task(long.score([ScoreRequest([1], [3], "l0")], 0))
            while not engine.arrivals:
                await asyncio.sleep(0.005)
            with pytest.raises(TeacherUnavailableError):
                await gone.score([ScoreRequest([2], [3], "g0")], 0)
            await held
        finally:
            await long.close()
            await gone.close()
    assert engine.arrivals == [1] and engine.aborted == 0
    text = generate_latest(registry).decode()
    assert _value(text, "distillery_teacher_scored_sequences_total", "ns/long") == 1
    assert 'client_job="ns/gone"' not in text  # neither scored, nor timed, nor waited for
    assert "distillery_teacher_waiting_sequences 0.0" in text.splitlines()
