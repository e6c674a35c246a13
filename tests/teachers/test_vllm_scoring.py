"""Teacher scoring against the session's real vLLM server (CPU, tiny local model): alignment
and top-k versus a transformers forward pass, both HTTP backends, and the limits."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from distillery_runtime.teachers import (
    CompactTeacher,
    OpenAITeacher,
    ScoreRequest,
    SequenceTooLongError,
    TopKLimitError,
)

from .conftest import assert_matches_reference, make_samples

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _teacher(kind: str, server, **kw):
    if kind == "openai":
        return OpenAITeacher([server.url], server.model, **kw)
    return CompactTeacher([server.url], name=server.model, **kw)


@pytest.fixture(scope="module")
def samples():
    return make_samples(10, 1024, seed=3)


@pytest.mark.parametrize("kind", ["openai", "compact"])
async def test_matches_transformers_at_every_position(kind, vllm_server, samples, hf_reference) -> None:
    teacher = _teacher(kind, vllm_server)
    try:
        scores = await teacher.score(samples, 8)
    finally:
        await teacher.close()
    t_max = max(len(s.response_ids) for s in samples)
    assert scores.topk_ids.shape == (len(samples), t_max, 8) and scores.topk_ids.dtype == np.int32
    assert scores.topk_logprobs.dtype == np.float32 and scores.mask.dtype == bool
    assert scores.sample_ids == [s.sample_id for s in samples]
    assert_matches_reference(scores, samples, hf_reference(vllm_server.model_dir, samples))
    # padding is consistent
    pad = ~scores.mask
    assert (scores.topk_ids[pad] == 0).all() and np.isneginf(scores.topk_logprobs[pad]).all()
    assert np.isneginf(scores.token_logprobs[pad]).all()


@pytest.mark.parametrize("k", [0, 5, 64])
async def test_compact_endpoint_equals_json_path(k, vllm_server, samples) -> None:
    json_t, compact_t = _teacher("openai", vllm_server), _teacher("compact", vllm_server, batch_size=3)
    try:
        a = await json_t.score(samples, k)
        b = await compact_t.score(samples, k)
    finally:
        await json_t.close()
        await compact_t.close()
    assert np.array_equal(a.mask, b.mask)
    assert np.array_equal(a.token_logprobs, b.token_logprobs)
    assert np.array_equal(a.topk_logprobs, b.topk_logprobs)
    # ids may only differ among exactly tied log-probs
    differ = a.topk_ids != b.topk_ids
    tied = np.zeros_like(differ)
    lp = a.topk_logprobs
    if k > 1:
        tied[..., 1:] |= lp[..., 1:] == lp[..., :-1]
        tied[..., :-1] |= lp[..., :-1] == lp[..., 1:]
    assert not (differ & ~tied).any()


@pytest.mark.parametrize("kind", ["openai", "compact"])
async def test_k_above_server_limit_names_the_flag(kind, vllm_server, samples) -> None:
    teacher = _teacher(kind, vllm_server)
    try:
        with pytest.raises(TopKLimitError, match=r"--max-logprobs 65"):
            await teacher.score(samples[:2], vllm_server.max_logprobs + 1)
    finally:
        await teacher.close()


@pytest.mark.parametrize("kind", ["openai", "compact"])
async def test_too_long_sequence_names_sample_and_limits(kind, vllm_server) -> None:
    n = vllm_server.max_model_len
    long = ScoreRequest([5] * (n - 100), [6] * 100, "too-long-sample")
    ok = ScoreRequest([5] * (n - 101), [6] * 100, "fits")
    # max_model_len given too high on purpose: the client cannot pre-check, the server's answer
    # must still turn into a clear error
    for teacher in (_teacher(kind, vllm_server), _teacher(kind, vllm_server, max_model_len=10 * n)):
        try:
            with pytest.raises(SequenceTooLongError, match=r"too-long-sample") as err:
                await teacher.score([ok, long], 1)
            assert str(n) in str(err.value) or str(n - 1) in str(err.value)
            assert (await teacher.score([ok], 1)).mask.sum() == 100
        finally:
            await teacher.close()


@pytest.mark.parametrize("kind", ["openai", "compact"])
async def test_empty_batch_and_score_one(kind, vllm_server, samples) -> None:
    teacher = _teacher(kind, vllm_server)
    try:
        empty = await teacher.score([], 4)
        assert empty.topk_ids.shape == (0, 0, 4) and empty.token_logprobs.shape == (0, 0)
        whole = await teacher.score(samples[:3], 4)
        for i, s in enumerate(samples[:3]):
            one = await teacher.score_one(s, 4)
            t = len(s.response_ids)
            assert one.topk_ids.shape == (1, t, 4)
            np.testing.assert_allclose(one.token_logprobs[0], whole.token_logprobs[i, :t], atol=1e-5)
    finally:
        await teacher.close()


async def test_samples_scored_one_by_one_share_requests_and_keep_their_scores(vllm_server, samples) -> None:
    """A burst of samples, each submitted alone as a rollout streams them, goes out in a few coalesced
    requests (teachers/clients/coalesce.py) and each sample gets exactly its own scores."""
    import asyncio

    plain = _teacher("compact", vllm_server)
    coalesced = _teacher("compact", vllm_server, coalesce=(2, 16384))
    try:
        whole = await plain.score(samples, 4)
        ones = await asyncio.gather(*(coalesced.score_one(s, 4) for s in samples))
        assert coalesced.coalescer is not None and coalesced.coalescer.requests < len(samples)
        for i, (s, one) in enumerate(zip(samples, ones, strict=True)):
            t = len(s.response_ids)
            assert one.sample_ids == [s.sample_id] and one.topk_ids.shape == (1, t, 4)
            np.testing.assert_array_equal(one.topk_ids[0], whole.topk_ids[i, :t])
            np.testing.assert_allclose(one.token_logprobs[0], whole.token_logprobs[i, :t], atol=1e-5)
    finally:
        await plain.close()
        await coalesced.close()


def test_cpu_server_has_no_busy_polling_worker_process(vllm_server) -> None:
    """On CPU the model runs inside the engine-core process: vLLM's separate worker process would
    busy-poll a core for a second after every request, the core a small machine's trainer needs."""
    import psutil

    server = psutil.Process(vllm_server.handle.process.pid)
    names = [p.name() for p in server.children(recursive=True)]
    assert any("EngineCor" in n for n in names), names  # the engine core runs beside the API server
    assert not any("Worker" in n for n in names), names


async def test_scoring_is_accounted_per_job_on_the_servers_metrics(vllm_server, samples) -> None:
    """The job header reaches the real server, which admits the request through its fair queue (sized
    from the engine's max-num-seqs) and shows the job's `distillery_teacher_*` series beside vLLM's own on
    its one /metrics page."""
    import urllib.request

    job = "team-a/accounted"
    teacher = CompactTeacher([vllm_server.url], name=vllm_server.model, job=job)
    try:
        await teacher.score(samples[:3], 4)
    finally:
        await teacher.close()
    with urllib.request.urlopen(f"{vllm_server.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert "vllm:num_requests_running" in text
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples[:3])
    assert f'distillery_teacher_scored_tokens_total{{client_job="{job}"}} {float(tokens)}' in text
    assert f'distillery_teacher_request_duration_seconds_count{{client_job="{job}"}} 1.0' in text
    assert f'distillery_teacher_busy_seconds_total{{client_job="{job}"}}' in text
    assert "distillery_teacher_gpus 0.0" in text  # a CPU server


async def test_a_request_abandoned_by_its_client_is_not_scored(vllm_server) -> None:
    """A client that gives up on its request (its attempt's timeout, well before the scoring could end):
    the real server (vLLM's app, its middleware included) sees the connection close and drops the request,
    so nothing is scored or counted for its job; a request of another job sent after it is answered."""
    import urllib.request

    from distillery_runtime.teachers import TeacherUnavailableError
    from distillery_runtime.teachers.clients.retry import RetryPolicy
    from prometheus_client.parser import text_string_to_metric_families

    heavy = make_samples(64, 1024, seed=5, max_prompt=200, max_response=300)
    impatient = RetryPolicy(request_timeout=0.05, total_timeout=0.06)
    gone = CompactTeacher([vllm_server.url], name=vllm_server.model, job="team-a/gone", retry=impatient)
    after = CompactTeacher([vllm_server.url], name=vllm_server.model, job="team-a/after")
    try:
        with pytest.raises(TeacherUnavailableError):
            await gone.score(heavy, 64)
        await after.score(heavy[:2], 4)
    finally:
        await gone.close()
        await after.close()

    def idle_metrics() -> str | None:
        """The metrics page once nothing waits for admission or runs in the engine (else None): had the
        server kept the abandoned request, it would have been scored by then."""
        with urllib.request.urlopen(f"{vllm_server.url}/metrics", timeout=10) as response:
            page = response.read().decode()
        busy = [
            s.value
            for f in text_string_to_metric_families(page)
            for s in f.samples
            if s.name in ("distillery_teacher_waiting_sequences", "vllm:num_requests_running",
                          "vllm:num_requests_waiting")
        ]  # fmt: skip
        return page if busy and not any(busy) else None

    deadline = time.monotonic() + 120
    while (text := idle_metrics()) is None:
        assert time.monotonic() < deadline, "the server stayed busy for 2 minutes"
        await asyncio.sleep(0.2)
    assert 'distillery_teacher_scored_sequences_total{client_job="team-a/after"} 2.0' in text
    assert 'distillery_teacher_scored_sequences_total{client_job="team-a/gone"}' not in text
