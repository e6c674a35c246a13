"""A colocated teacher (in-process vLLM `AsyncLLM`, a second tiny model) and multi-teacher
routing between it and the session's vLLM server.

Two teachers with different weights make routing observable: every sample's scores must match
its own teacher's transformers reference, and differ from the other teacher's. (vLLM serves
one model per server; a second server process would cost another ~3 GB and 30 s on 2 cores,
the in-process engine is needed anyway to test the colocated backend.)
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from distillery_runtime.teachers import (
    CompactTeacher,
    MultiTeacherScorer,
    OpenAITeacher,
    ScoreRequest,
    TeacherError,
    UnknownRouteError,
    check_tokenizer_compat,
)
from distillery_runtime.teachers.checks.consistency import TeacherInconsistentError
from transformers import AutoTokenizer

from distillery.plan.env.vllm import vllm_env
from distillery.plan.rollout.sleep import SleepLevel
from distillery.plan.teachers.engines import EngineSettings
from distillery.plan.teachers.routes import RouteTable

from .conftest import assert_matches_reference, make_samples

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def second_model_dir(tiny_model_factory):
    return tiny_model_factory(vocab_size=1024, hidden=128, layers=2, heads=4, seed=1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def colocated(second_model_dir):
    from distillery_runtime.teachers import ColocatedTeacher

    for name, value in vllm_env(os.environ).items():
        os.environ.setdefault(name, value)
    # The post-wake test hands the engine's worker a function of its own (collective_rpc), which vLLM's
    # serializer refuses unless told; set before the engine's process starts, as it reads it too.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    engine = EngineSettings(
        "colocated", 16, 512, memory_fraction=0.9, tensor_parallel=1, dtype="bfloat16", enforce_eager=True
    )
    teacher = ColocatedTeacher(str(second_model_dir), engine)
    await teacher.start()
    try:
        yield teacher
    finally:
        await teacher.close()


@pytest.fixture(scope="module")
def samples():
    return make_samples(8, 1024, seed=5, max_response=80)


@pytest.mark.asyncio(loop_scope="module")
async def test_colocated_matches_transformers(colocated, second_model_dir, samples, hf_reference) -> None:
    scores = await colocated.score(samples, 8)
    assert_matches_reference(scores, samples, hf_reference(second_model_dir, samples))
    with pytest.raises(TeacherError, match="--max-logprobs 17"):
        await colocated.score(samples[:1], 17)


@pytest.mark.asyncio(loop_scope="module")
async def test_sleep_wake_is_a_checked_no_op_on_cpu(colocated, samples) -> None:
    before = await colocated.score(samples[:3], 4)
    await colocated.sleep()
    assert colocated.sleeps is False and colocated.asleep is False  # CPU: vLLM has no sleep mode
    await colocated.wake_up()
    after = await colocated.score(samples[:3], 4)
    assert np.array_equal(before.topk_logprobs, after.topk_logprobs)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_post_wake_probe_passes_a_healthy_wake_and_stops_one_that_lost_the_weights(
    colocated, samples
) -> None:
    """The probe a colocated teacher re-scores after every wake, run for real: vLLM's CPU worker keeps its
    memory through sleep (its sleep and wake_up are no-ops), so the teacher is told it sleeps (`sleeps`, as
    `start()` sets it where vLLM has a sleep mode) at level 1 and goes through the engine's own sleep and
    wake-up. A wake whose weights came back passes; one whose weights were zeroed while asleep raises before
    it scores anything."""

    # Run in the engine's worker process (collective_rpc): local functions, so cloudpickle sends them by
    # value (the worker cannot import this test module).
    def keep_weights(worker: Any) -> None:
        worker.distillery_saved = {
            n: p.detach().clone() for n, p in worker.model_runner.model.named_parameters()
        }

    def lose_weights(worker: Any) -> None:
        # every weight zeroed, as a wake-up that did not restore them leaves the model: its logits all equal,
        # -ln V at every token (the failure the probe is there to catch)
        for parameter in worker.model_runner.model.parameters():
            parameter.data.zero_()

    def restore_weights(worker: Any) -> None:
        for name, parameter in worker.model_runner.model.named_parameters():
            parameter.data.copy_(worker.distillery_saved[name])

    before = await colocated.score(samples[:3], 4)
    sleeps, level = colocated.sleeps, colocated.sleep_level
    colocated.sleeps, colocated.sleep_level = True, SleepLevel.OFFLOAD_WEIGHTS
    await colocated.engine.collective_rpc(keep_weights)
    try:
        await colocated.sleep()
        assert colocated.asleep and await colocated.engine.is_sleeping()
        await colocated.wake_up()  # the weights are intact: the probe agrees with the one taken at start
        assert not colocated.asleep
        await colocated.sleep()
        await colocated.engine.collective_rpc(lose_weights)
        with pytest.raises(TeacherInconsistentError, match="after wake-up its probe log-probs moved"):
            await colocated.wake_up()
    finally:
        await colocated.engine.collective_rpc(restore_weights)
        if colocated.asleep or await colocated.engine.is_sleeping():
            await colocated.engine.wake_up()
        colocated.sleeps, colocated.sleep_level, colocated.asleep = sleeps, level, False
    after = await colocated.score(samples[:3], 4)
    assert np.array_equal(before.topk_logprobs, after.topk_logprobs)  # the teacher the other tests use


@pytest.mark.asyncio(loop_scope="module")
async def test_routes_samples_to_their_teacher(
    colocated, second_model_dir, vllm_server, samples, hf_reference
) -> None:
    check_tokenizer_compat(
        AutoTokenizer.from_pretrained(vllm_server.model_dir), AutoTokenizer.from_pretrained(second_model_dir)
    )
    routes = ["math", "code", "code", "math", "other", "math", "code", "other"]
    routed = [
        ScoreRequest(s.prompt_ids, s.response_ids, s.sample_id, r)
        for s, r in zip(samples, routes, strict=True)
    ]
    server_teacher = CompactTeacher([vllm_server.url], name="server")
    table = RouteTable({"math": "server", "code": "colocated"}, default="server")
    scorer = MultiTeacherScorer(table, {"server": server_teacher, "colocated": colocated})
    try:
        scores = await scorer.score(routed, 8)
        one = await scorer.score_one(routed[1], 8)
    finally:
        await server_teacher.close()
    assert scores.sample_ids == [s.sample_id for s in routed]
    ref_a = hf_reference(vllm_server.model_dir, routed)
    ref_b = hf_reference(second_model_dir, routed)
    for i, r in enumerate(routes):
        own, other = (ref_b, ref_a) if r == "code" else (ref_a, ref_b)
        sub = scores.__class__(
            scores.topk_ids[i : i + 1],
            scores.topk_logprobs[i : i + 1],
            scores.token_logprobs[i : i + 1],
            scores.mask[i : i + 1],
        )
        assert_matches_reference(sub, routed[i : i + 1], own[i : i + 1])
        t = len(routed[i].response_ids)
        if t:
            tok = np.asarray(routed[i].response_ids)
            other_lp = other[i].gather(1, __import__("torch").tensor(tok)[:, None])[:, 0].numpy()
            assert np.abs(scores.token_logprobs[i, :t] - other_lp).mean() > 0.3  # really the other model
    t1 = len(routed[1].response_ids)
    np.testing.assert_allclose(one.token_logprobs[0, :t1], scores.token_logprobs[1, :t1], atol=1e-5)

    strict = MultiTeacherScorer(
        RouteTable({"math": "openai", "code": "colocated"}),
        {"openai": OpenAITeacher([vllm_server.url], vllm_server.model), "colocated": colocated},
    )
    with pytest.raises(UnknownRouteError, match=r"'other'.*\['code', 'math'\]"):
        await strict.score(routed, 4)


def test_the_wake_up_probe_stays_inside_a_tiny_vocabulary() -> None:
    """vLLM refuses an id past its vocabulary: a 16-token model (the bundled addition task's) must still
    start a colocated teacher."""
    from distillery_runtime.teachers.in_process.colocated import probe

    assert probe(151_643).token_ids == list(range(1, 17))
    tiny = probe(16)
    assert max(tiny.token_ids) < 16 and len(tiny.token_ids) == 16 and tiny.prompt_len == 1
