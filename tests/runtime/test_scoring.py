"""Teacher wiring of the loop: routing by the spec, per-teacher counts, retries surfaced for the metrics."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from distillery_runtime.run.workers import free_port
from distillery_runtime.teachers.clients.compact_http import CompactTeacher
from distillery_runtime.teachers.clients.openai_http import OpenAITeacher
from distillery_runtime.teachers.clients.outage import OutageChange, OutageTracker, TeacherOutageError
from distillery_runtime.teachers.clients.retry import RetryPolicy
from distillery_runtime.teachers.scoring import TeacherScoring, build_client
from distillery_runtime.teachers.types import ScoreRequest, TeacherUnavailableError, UnknownRouteError

from distillery.plan import resolve
from distillery.runtime_config import resolve_runtime_config
from distillery.validation import parse_job
from tests.runtime.conftest import manifest
from tests.teachers.fault_proxy import FaultProxy


def two_teacher_config(job_files):
    teachers = [
        {
            "name": "adder",
            "model": "m",
            "placement": "external",
            "endpoint": "http://127.0.0.1:1",
            "routes": ["add"],
        },
        {
            "name": "subber",
            "model": "m",
            "placement": "external",
            "endpoint": "http://127.0.0.1:2",
            "routes": ["sub"],
        },
    ]
    return resolve_runtime_config(parse_job(manifest(job_files, teachers=teachers)), None, in_cluster=False)


def test_routes_follow_the_spec_and_unknown_routes_are_named(job_files):
    config = two_teacher_config(job_files)
    plan = resolve(config.spec)
    clients = {t.name: build_client(t, plan.engines[t.name]) for t in config.teachers}
    scoring = TeacherScoring(plan, clients)
    assert scoring.teacher_name(ScoreRequest([1], [2], "a", "add")) == "adder"
    assert scoring.teacher_name(ScoreRequest([1], [2], "b", "sub")) == "subber"
    with pytest.raises(UnknownRouteError, match=r"route 'mul'.*\['add', 'sub'\]"):
        scoring.teacher_name(ScoreRequest([1], [2], "c", "mul"))


async def test_retries_reach_the_metrics(job_files):
    config = two_teacher_config(job_files)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every attempt fails and is retried
    policy = RetryPolicy(base_delay=0.01, max_delay=0.02, total_timeout=0.5, connect_timeout=0.2)
    clients = {
        "adder": CompactTeacher([dead], name="adder", max_logprobs=4, max_model_len=64, retry=policy),
        "subber": build_client(config.teachers[1], resolve(config.spec).engines["subber"]),
    }
    scoring = TeacherScoring(resolve(config.spec), clients)
    with pytest.raises(TeacherUnavailableError):
        await scoring.score_one(ScoreRequest([1, 2], [3], "a", "add"))
    retries = scoring.retries()
    assert retries["adder"] >= 2 and retries["subber"] == 0
    await scoring.close()


def one_teacher_config(job_files, endpoint: str):
    teachers = [{"name": "adder", "model": "m", "placement": "external", "endpoint": endpoint}]
    return resolve_runtime_config(parse_job(manifest(job_files, teachers=teachers)), None, in_cluster=False)


def test_an_outage_is_reported_once_per_teacher_and_backs_off_to_its_budget():
    now = [0.0]
    changes: list[OutageChange] = []
    tracker = OutageTracker(
        60, detected_after=5, base_delay=1, max_delay=8, clock=lambda: now[0], on_change=changes.append
    )
    assert [tracker.failed("a", "refused") for _ in range(5)] == [1, 2, 4, 8, 8]
    assert tracker.failed("b", "reset") == 1  # each teacher has its own outage
    assert [(c.teacher, c.down) for c in changes] == [("a", True), ("b", True)]
    now[0] = 50.0
    assert tracker.down_seconds() == {"a": 55.0, "b": 55.0}
    assert tracker.failed("a", "refused") == 5  # never sleeps past the budget
    tracker.recovered("b")
    assert changes[-1] == OutageChange("b", False, 55.0)
    now[0] = 56.0
    with pytest.raises(
        TeacherOutageError, match="teacher a unreachable for 61 s, past the outage budget of 60 s"
    ):
        tracker.failed("a", "refused")


def _openai(url: str, server, policy: RetryPolicy) -> OpenAITeacher:
    return OpenAITeacher([url], server.model, name="adder", retry=policy, max_model_len=server.max_model_len)


@pytest.mark.slow
@pytest.mark.vllm
async def test_a_teacher_down_longer_than_its_retries_is_waited_for_and_nothing_is_lost(
    job_files, vllm_server
):
    """A real vLLM teacher behind a proxy is stopped for longer than the client's retry budget, then
    restarted at the same address: the samples waiting on it are scored once it is back, identically
    to a clean run, and the outage is reported once (down, then back)."""
    proxy = await FaultProxy("127.0.0.1", int(vllm_server.url.rsplit(":", 1)[1])).start()
    policy = RetryPolicy(base_delay=0.05, max_delay=0.2, total_timeout=3.0, request_timeout=3.0)
    changes: list[OutageChange] = []
    tracker = OutageTracker(
        60, detected_after=policy.total_timeout, base_delay=0.2, max_delay=0.5, on_change=changes.append
    )
    plan = resolve(one_teacher_config(job_files, proxy.url).spec)
    scoring = TeacherScoring(plan, {"adder": _openai(proxy.url, vllm_server, policy)}, tracker)
    requests = [ScoreRequest([5, 6, 7], [8 + i, 9, 10], f"s{i}") for i in range(3)]
    try:
        want = [await scoring.score_one(r) for r in requests]
        changes.clear()  # a slow answer on this loaded machine may already have looked like an outage
        await proxy.stop()
        waiting = [asyncio.create_task(scoring.score_one(r)) for r in requests]
        deadline = time.monotonic() + 20
        while not changes and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert [(c.teacher, c.down) for c in changes] == [("adder", True)]
        assert not any(t.done() for t in waiting)
        await proxy.start()
        got = await asyncio.wait_for(asyncio.gather(*waiting), 30)
    finally:
        await scoring.close()
        await proxy.stop()
    # Down once while it was stopped, back once it answered again (alternating, however many samples wait).
    assert [c.down for c in changes] == [True, False] * (len(changes) // 2) and changes[0].teacher == "adder"
    assert changes[1].seconds >= policy.total_timeout
    for (_, a), (_, b) in zip(want, got, strict=True):
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)
        np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.vllm
async def test_a_teacher_down_past_the_budget_fails_naming_it(job_files, vllm_server):
    proxy = await FaultProxy("127.0.0.1", int(vllm_server.url.rsplit(":", 1)[1])).start()
    await proxy.stop()  # the teacher is gone for good
    policy = RetryPolicy(base_delay=0.05, max_delay=0.2, total_timeout=0.5, request_timeout=2.0)
    tracker = OutageTracker(2.0, detected_after=policy.total_timeout, base_delay=0.2, max_delay=0.5)
    plan = resolve(one_teacher_config(job_files, proxy.url).spec)
    scoring = TeacherScoring(plan, {"adder": _openai(proxy.url, vllm_server, policy)}, tracker)
    started = time.monotonic()
    try:
        with pytest.raises(TeacherOutageError) as error:
            await scoring.score_one(ScoreRequest([5, 6], [7], "s"))
    finally:
        await scoring.close()
    assert time.monotonic() - started < 2.0 + policy.total_timeout + 1.0
    assert "teacher adder unreachable for" in str(error.value) and proxy.url in str(error.value)
