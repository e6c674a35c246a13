"""Real vLLM (CPU build) with Qwen's vocabulary: the tiny Qwen2.5-like student is served and generates from
its chat template, then a Qwen3-like teacher's server reports a vocabulary that extends the student's and
scores the student's tokens as transformers does. One server at a time (each ~3 GB on these machines)."""

from __future__ import annotations

import os

import aiohttp
import pytest
from distillery_runtime.teachers import CompactTeacher, ScoreRequest, check_vocabulary, tokenizer_vocabulary
from distillery_runtime.teachers.checks.tokenizer_compat import served_vocabulary
from distillery_runtime.testing.teacher_server import cpu_engine, start_teacher_server
from transformers import AutoTokenizer

from ..conftest import CACHE, ROOT, cpu_env
from .conftest import assert_matches_reference

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PROMPT = [{"role": "user", "content": "Name three prime numbers."}]


def _server(model_dir, name, tmp_path):
    env = cpu_env(CACHE)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "runtime"), env.get("PYTHONPATH", "")])
    return start_teacher_server(model_dir, cpu_engine(name), log_path=tmp_path / f"{name}.log", env=env)


async def _generate(url: str, model: str, prompt_ids: list[int], tokens: int) -> list[int]:
    body = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": tokens,
        "temperature": 1.0,
        "seed": 0,
        "ignore_eos": True,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    return [int(t.removeprefix("token_id:")) for t in answer["choices"][0]["logprobs"]["tokens"]]


async def test_a_qwen3_teacher_scores_a_qwen25_students_tokens(tiny_qwen_factory, hf_reference, tmp_path):
    student_dir, teacher_dir = tiny_qwen_factory("qwen2.5"), tiny_qwen_factory("qwen3", seed=1)
    student_tok = AutoTokenizer.from_pretrained(student_dir)
    prompt_ids = student_tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False)
    assert prompt_ids[:3] == [151644, 8948, 198]  # <|im_start|>system\n

    student_server = _server(student_dir, "qwen25", tmp_path)
    try:
        reported = await served_vocabulary(student_server.url, "qwen25", student_tok)
        assert reported == (tokenizer_vocabulary(student_tok), True)
        responses = [await _generate(student_server.url, "qwen25", prompt_ids, n) for n in (12, 20)]
    finally:
        student_server.stop()
    assert [len(r) for r in responses] == [12, 20]
    assert all(0 <= i < 151936 for r in responses for i in r)  # the random student may pick any row

    teacher_server = _server(teacher_dir, "qwen3", tmp_path)
    teacher = CompactTeacher([teacher_server.url], name="qwen3")
    try:
        reported = await served_vocabulary(teacher_server.url, "qwen3", student_tok)
        assert reported is not None and reported[1] and len(reported[0]) == 151669
        assert reported[0][151667] == "<think>"
        check_vocabulary(tokenizer_vocabulary(student_tok), reported[0], teacher_name="qwen3")
        samples = [ScoreRequest(prompt_ids, r, f"s{i}") for i, r in enumerate(responses)]
        scores = await teacher.score(samples, 8)
    finally:
        await teacher.close()
        teacher_server.stop()
    assert_matches_reference(scores, samples, hf_reference(teacher_dir, samples))
