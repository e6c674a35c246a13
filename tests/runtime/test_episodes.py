"""Multi-turn episodes (`distillery_runtime.agents`) on the real transformers engine with a tiny model: every
token marked by who wrote it, each student turn exactly what the engine writes from everything before it,
observations out of the loss and the eval KL, the environment's failures ending one episode each, the turn
and token limits, an HTTP environment on a real aiohttp service, and the chat template's tool message."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch
from aiohttp import web
from distillery_runtime.agents.environments import EnvironmentLoadError, Environments
from distillery_runtime.agents.episodes import EpisodeRunner
from distillery_runtime.agents.observations import ObservationEncoder, template_frame
from distillery_runtime.rollout import GenerationRequest, SamplingSettings, build_engine
from distillery_runtime.run.loop import plan as loop_plan
from distillery_runtime.teachers.types import TeacherScores
from transformers import AutoTokenizer

from distillery.api.environment import ToolCallFormat
from distillery.plan.agents.episodes import EpisodeSettings

PROMPTS = ["12+34=", "5+6=", "70+8=", "9+91="]


@pytest.fixture(scope="module")
def engine(job_files) -> Iterator:
    engine = build_engine("transformers", str(job_files.student), dtype=torch.float32, max_model_len=128)
    yield engine


@pytest.fixture(scope="module")
def tokenizer(job_files):
    return AutoTokenizer.from_pretrained(job_files.student)


def settings(stop: str, **overrides) -> EpisodeSettings:
    base = EpisodeSettings(
        module="distillery_runtime.testing.environments:Counter",
        url=None,
        tool_call_format=ToolCallFormat.STOP_SEQUENCE,
        call_ends=(stop,),
        max_turns=4,
        max_tokens=48,
        turn_tokens=10,
        step_timeout_s=2.0,
    )
    return replace(base, **overrides)


def runner(tokenizer, s: EpisodeSettings) -> EpisodeRunner:
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    return EpisodeRunner(s, Environments(s), ObservationEncoder(tokenizer, s.tool_call_format), decode)


def requests(tokenizer) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            f"e{i}", tuple(tokenizer(p, add_special_tokens=False)["input_ids"]), seed=i, answer="1"
        )
        for i, p in enumerate(PROMPTS)
    ]


def generate_with(engine):
    async def generate(reqs, sampling):
        return [sample for finished in engine.generate(reqs, sampling) for sample in finished]

    return generate


def greedy(tokenizer) -> SamplingSettings:
    return SamplingSettings(greedy=True, max_new_tokens=10, stop_token_ids=(tokenizer.eos_token_id,))


@pytest.fixture(scope="module")
def stop(engine, tokenizer) -> str:
    """A string the student writes in its first greedy turn of the first prompt (a token's text that does
    not occur before it), so that turn ends in a "call" and the episode goes on."""
    first = requests(tokenizer)[0]
    out = next(iter(engine.generate([first], greedy(tokenizer))))[0]
    ids = out.response_ids
    for i in range(1, len(ids)):
        piece = tokenizer.decode(ids[i : i + 1])
        if piece.strip() and piece not in tokenizer.decode(ids[:i]):
            return piece
    pytest.fail(f"the greedy response {ids} repeats its first token throughout")


def play(engine, tokenizer, s: EpisodeSettings, sampling: SamplingSettings | None = None):
    r = runner(tokenizer, s)
    return asyncio.run(r.play(generate_with(engine), requests(tokenizer), sampling or greedy(tokenizer))), r


def test_every_token_is_marked_and_each_turn_is_what_the_engine_writes_from_before_it(
    engine, tokenizer, stop
) -> None:
    s = settings(stop)
    samples, r = play(engine, tokenizer, s)
    assert [x.sample_id for x in samples] == [f"e{i}" for i in range(len(PROMPTS))]
    multi = 0
    for sample in samples:
        e = sample.episode
        assert e is not None and sample.student_mask is not None
        assert len(sample.student_mask) == len(sample.response_ids) == sum(n for _by, n in e.segments)
        assert len(sample.logprobs or []) in (0, len(sample.response_ids))
        calls, start = 0, 0
        for by_student, n in e.segments:
            ids = sample.response_ids[start : start + n]
            assert sample.student_mask[start : start + n] == [by_student] * n
            if by_student:
                # The turn, sampled again from the prompt and everything before it, with the turn's stop.
                again = GenerationRequest("again", (*sample.prompt_ids, *sample.response_ids[:start]), seed=0)
                turn = replace(greedy(tokenizer), stop=(stop,), max_new_tokens=s.turn_tokens)
                redo = next(iter(engine.generate([again], turn)))[0]
                assert redo.response_ids == ids
            else:
                calls += 1  # Counter answers its Nth call with "=N"
                assert ids == r.encoder.encode(f"={calls}")
            start += n
        assert e.tool_calls >= calls and e.turns == sum(by for by, _n in e.segments)
        assert e.tool_errors == calls // 2  # Counter reports every even call as a misuse
        multi += calls > 0
    assert multi >= 1, "no episode called the environment"


def test_observations_are_out_of_the_loss_and_the_kl(engine, tokenizer, stop) -> None:
    samples, _ = play(
        engine, tokenizer, settings(stop), replace(greedy(tokenizer), greedy=False, logprobs=True)
    )
    sample = next(x for x in samples if x.student_mask is not None and not all(x.student_mask))
    r = len(sample.response_ids)
    scores = TeacherScores(
        topk_ids=np.zeros((1, r, 1), np.int32),
        topk_logprobs=np.zeros((1, r, 1), np.float32),
        token_logprobs=np.full((1, r), -1.0, np.float32),
        mask=np.ones((1, r), bool),
    )
    train = loop_plan.train_sample(sample, "t", scores)
    assert train.teacher_mask.tolist() == sample.student_mask
    # Observation positions carry log-prob 0 (never read); the KL counts the student's positions only.
    assert sample.logprobs is not None
    observed = ~np.asarray(sample.student_mask)
    assert np.all(np.asarray(sample.logprobs)[observed] == 0.0)
    kl = loop_plan.sample_kl(sample, scores)
    student = np.asarray(sample.logprobs)[~observed]
    ratio = -1.0 - student
    assert kl == pytest.approx(float(np.mean(np.exp(ratio) - ratio - 1.0)), rel=1e-5)
    assert loop_plan.kl_per_teacher([train])["t"] == pytest.approx(kl, rel=1e-5)


@pytest.mark.parametrize(
    ("cls", "call", "says"),
    [
        ("Raising", "step", "RuntimeError: the tool broke"),
        ("Hanging", "step", "took longer than 0.5 s"),
        ("Wrong", "step", "answered 42"),
        ("ResetFails", "reset", "ValueError: no such task"),
    ],
)
def test_a_failing_environment_ends_its_episode_counted_and_the_others_go_on(
    engine, tokenizer, stop, caplog, cls, call, says
) -> None:
    s = settings(stop, module=f"distillery_runtime.testing.environments:{cls}", step_timeout_s=0.5)
    with caplog.at_level(logging.WARNING, logger="distillery.runtime"):
        samples, _ = play(engine, tokenizer, s)
    failed = [x for x in samples if x.episode is not None and x.episode.environment_failures]
    assert failed, "no episode met the failure"
    for sample in failed:
        assert sample.finish_reason == "environment_failure"
        assert sample.student_mask is not None and all(sample.student_mask)  # nothing was appended
        if call == "reset":
            assert sample.response_ids == []
    lines = [rec.getMessage() for rec in caplog.records]
    assert any(f"{call}: {says}" in line and s.source in line for line in lines), lines


def test_turn_and_token_limits(engine, tokenizer, stop) -> None:
    one = settings(stop, max_turns=1)
    samples, _ = play(engine, tokenizer, one)
    assert all(x.episode is not None and x.episode.turns == 1 for x in samples)
    assert all(x.student_mask is not None and all(x.student_mask) for x in samples)
    assert any(x.finish_reason == "max_turns" for x in samples)  # the first prompt's turn called
    short = settings(stop, max_tokens=12, max_turns=8)
    samples, _ = play(engine, tokenizer, short)
    assert all(len(x.response_ids) <= 12 for x in samples)


def test_an_environment_that_is_not_one_stops_the_job_naming_the_field() -> None:
    for path, says in (
        ("distillery_runtime.testing.environments:Nope", "cannot import"),
        ("distillery_runtime.testing.environments:NotAnEnvironment", "is not a class with reset"),
    ):
        with pytest.raises(EnvironmentLoadError, match=f"^spec.environment.module: .*{says}"):
            Environments(settings("x", module=path))


def test_an_http_environment_names_each_episode(engine, tokenizer, stop) -> None:
    seen: dict[str, list[str]] = {}

    async def reset(request: web.Request) -> web.Response:
        body = await request.json()
        seen[body["episode"]] = [body["prompt"]]
        return web.json_response({})

    async def step(request: web.Request) -> web.Response:
        body = await request.json()
        seen[body["episode"]].append(body["output"])
        return web.json_response({"observation": "=7", "done": len(seen[body["episode"]]) > 2})

    async def reward(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"reward": 1.0 if len(seen[body["episode"]]) > 1 else 0.0})

    async def main():
        app = web.Application()
        app.add_routes(
            [web.post("/env/reset", reset), web.post("/env/step", step), web.post("/env/reward", reward)]
        )
        app_runner = web.AppRunner(app)
        await app_runner.setup()
        site = web.TCPSite(app_runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        s = settings(stop, module=None, url=f"http://127.0.0.1:{port}/env")
        r = runner(tokenizer, s)
        try:
            return await r.play(generate_with(engine), requests(tokenizer), greedy(tokenizer)), r
        finally:
            await r.environments.close()
            await app_runner.cleanup()

    samples, r = asyncio.run(main())
    assert sorted(seen) == [f"e{i}" for i in range(len(PROMPTS))]
    assert seen["e0"][0] == PROMPTS[0]
    for sample in samples:
        e = sample.episode
        assert e is not None and e.reward == (1.0 if e.tool_calls else 0.0)
        observations = [n for by, n in e.segments if not by]
        assert all(n == len(r.encoder.encode("=7")) for n in observations)
        assert len(seen[sample.sample_id]) == 1 + e.tool_calls  # reset, then one step per call


@pytest.mark.parametrize("flavour", ["qwen2.5", "qwen3"])
def test_the_chat_templates_tool_message_is_what_the_template_renders(qwen_tokenizer, flavour) -> None:
    """prompt + the student's turn + the appended observation = the template's own rendering of the
    conversation with that tool message, token for token."""
    tok = qwen_tokenizer(flavour)
    user = [{"role": "user", "content": "What is 1234*5678?"}]
    call = '<tool_call>\n{"name": "calc", "arguments": {"expr": "1234*5678"}}\n</tool_call>'
    prompt = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template(
        [*user, {"role": "assistant", "content": call}, {"role": "tool", "content": "7006652"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    encoder = ObservationEncoder(tok, ToolCallFormat.CHAT_TEMPLATE)
    assert prompt + call + encoder.text("7006652") == whole
    before, after = template_frame(tok)
    assert "<tool_response>" in before and after.endswith("<|im_start|>assistant\n")
    ids = [
        *tok(prompt, add_special_tokens=False)["input_ids"],
        *tok(call, add_special_tokens=False)["input_ids"],
        *encoder.encode("7006652"),
    ]
    assert ids == tok(whole, add_special_tokens=False)["input_ids"]
