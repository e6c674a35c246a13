"""Where a response ends: every end token of the student's generation_config.json (one id or a list) and its
tokenizer's eos, decided once by the plan (distillery.plan.rollout.generation), and each rollout engine stopping on
any of them, on a stop string, and reporting a cut response as finish reason `length`."""

from __future__ import annotations

import gc
import json
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from distillery_runtime.data.generation_config import declared_end_tokens
from distillery_runtime.rollout import GenerationRequest, SamplingSettings, build_engine

from distillery.api.spec import DistillationJobSpec
from distillery.plan.rollout.generation import end_token_ids, resolve_generation

PROMPT = (5, 9, 13, 7)


def test_end_tokens_join_every_source() -> None:
    assert end_token_ids([151645, 151643], 151645) == (151643, 151645)
    assert end_token_ids(2, None, [2, 7], -1) == (2, 7)  # once each; -1 is a placeholder
    assert end_token_ids(None) == ()


def test_qwen_generation_config_list_gives_both_end_tokens(tiny_qwen_factory) -> None:
    """Qwen's chat models end a turn on <|im_end|> and <|endoftext|>: its tokenizer names only the first."""
    from distillery_runtime.tasks.recipes.qwen import EOS_IDS
    from transformers import AutoTokenizer

    folder = tiny_qwen_factory("qwen2.5")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token_id == EOS_IDS[0]
    ends = end_token_ids(*declared_end_tokens(folder), tokenizer.eos_token_id)
    assert ends == tuple(sorted(EOS_IDS))


def test_declared_end_tokens_reads_int_list_and_absent(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 4]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert declared_end_tokens(tmp_path) == [[3, 4], 9]
    assert declared_end_tokens(tmp_path / "missing") == []


def test_plan_resolves_the_rollout_sampling() -> None:
    spec = DistillationJobSpec.model_validate(
        {
            "student": {"model": "s", "rollout": {"stop": ["\n\n", "\n\n"], "topK": -1, "temperature": 0.7}},
            "teachers": [{"name": "t", "model": "t", "default": True}],
            "data": {"train": {"path": "/d.jsonl"}},
        }
    )
    plan = resolve_generation(spec, [7, 3, 7])
    assert plan.stop_token_ids == (3, 7) and plan.stop == ("\n\n",) and plan.top_k == 0
    assert plan.max_new_tokens == 1024 and plan.temperature == 0.7
    sampling = SamplingSettings.of(plan)
    assert sampling.stop_token_ids == (3, 7) and sampling.for_eval().greedy
    assert sampling.for_eval().stop_token_ids == (3, 7)


def _student_with_end_tokens(job_files, tmp_path: Path, engine) -> tuple[Path, int, list[int]]:
    """A copy of the test student whose generation_config.json lists its eos and a second end token: one
    its greedy response writes at the third position or later (found by decoding without stops)."""
    eos = engine_eos(job_files.student)
    greedy = SamplingSettings(greedy=True, max_new_tokens=12, stop_token_ids=(eos,))
    free = next(iter(engine.generate([GenerationRequest("free", PROMPT, seed=0)], greedy)))[0].response_ids
    candidates = [t for i, t in enumerate(free) if i >= 2 and t != eos and t not in free[:i]]
    # A fact of the fixed test student (seeded): the test needs it, so it fails rather than skips without it.
    assert candidates, f"the greedy response {free} has no fresh token past position 2"
    second = candidates[0]
    folder = tmp_path / "student"
    shutil.copytree(job_files.student, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, second]}))
    return folder, second, free


def engine_eos(folder: Path) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder).eos_token_id


def _check_stops_on_second_end_token(kind: str, job_files, tmp_path: Path) -> None:
    engine = build_engine(kind, str(job_files.student), dtype=torch.float32, max_model_len=64)
    try:
        folder, second, free = _student_with_end_tokens(job_files, tmp_path, engine)
        ends = end_token_ids(*declared_end_tokens(folder), engine_eos(folder))
        assert second in ends
        sampling = SamplingSettings(greedy=True, max_new_tokens=12, stop_token_ids=ends)
        out = next(iter(engine.generate([GenerationRequest("g", PROMPT, seed=0)], sampling)))[0]
        cut = free.index(second) + 1
        assert out.response_ids == free[:cut] and out.finish_reason == "stop"
        # Without the second end token the same response runs on to the length limit.
        long = SamplingSettings(greedy=True, max_new_tokens=cut, stop_token_ids=(engine_eos(folder),))
        out = next(iter(engine.generate([GenerationRequest("l", PROMPT, seed=0)], long)))[0]
        assert out.response_ids == free[:cut] and out.finish_reason == "length"
    finally:
        del engine
        gc.collect()


def test_transformers_engine_stops_on_second_end_token(job_files, tmp_path: Path) -> None:
    _check_stops_on_second_end_token("transformers", job_files, tmp_path)


@pytest.mark.slow
def test_vllm_engine_stops_on_second_end_token(job_files, tmp_path: Path) -> None:
    _check_stops_on_second_end_token("vllm", job_files, tmp_path)


def test_transformers_engine_stops_on_stop_string_and_top_k(job_files) -> None:
    from transformers import AutoTokenizer

    engine = build_engine("transformers", str(job_files.student), dtype=torch.float32, max_model_len=64)
    tokenizer = AutoTokenizer.from_pretrained(job_files.student)
    free = SamplingSettings(greedy=True, max_new_tokens=10, stop_token_ids=(tokenizer.eos_token_id,))
    first = next(iter(engine.generate([GenerationRequest("f", PROMPT, seed=0)], free)))[0]
    ids = first.response_ids
    assert len(ids) >= 5, f"the greedy response {ids} ends before 5 tokens"
    # A stop string that the 4th and 5th tokens write together: the response ends at the 5th.
    stop = tokenizer.decode(ids[3:5])
    text_before = tokenizer.decode(ids[:4])
    assert stop not in text_before, f"{stop!r} is already written by {ids[:4]}"
    with_stop = replace(free, stop=(stop,))
    out = next(iter(engine.generate([GenerationRequest("s", PROMPT, seed=0)], with_stop)))[0]
    assert out.response_ids == ids[:5] and out.finish_reason == "stop"
    # top_k = 1 samples the greedy response whatever the seed and temperature.
    sampled = replace(free, greedy=False, temperature=5.0, top_k=1)
    for seed in (1, 2):
        out = next(iter(engine.generate([GenerationRequest("k", PROMPT, seed=seed)], sampled)))[0]
        assert out.response_ids == ids and out.finish_reason == first.finish_reason


@pytest.mark.slow
def test_vllm_engine_samples_a_step_whose_prompts_pass_the_token_budget(job_files) -> None:
    """More seeded prompt tokens in one step than vLLM CPU's budget (4096): split prompts would discard
    their samples by rewinding a seeded CPU generator, which raises ("CPU Generator does not use offset");
    the engine takes whole prompts instead, and every request gets its response."""
    engine = build_engine("vllm", str(job_files.student), dtype=torch.float32, max_model_len=160)
    try:
        sampling = SamplingSettings(greedy=False, temperature=1.0, max_new_tokens=4, stop_token_ids=())
        prompt = [4 + i % 50 for i in range(120)]
        requests = [GenerationRequest(f"r{i}", prompt, seed=i) for i in range(48)]  # 5760 prompt tokens
        done = [s for batch in engine.generate(requests, sampling) for s in batch]
        assert sorted(s.sample_id for s in done) == sorted(r.sample_id for r in requests)
        assert all(1 <= len(s.response_ids) <= 4 for s in done)
    finally:
        del engine
        gc.collect()


def test_transformers_engine_samples_as_a_draw_a_token_from_the_request_seed(job_files) -> None:
    """The engine draws each row's uniforms for its whole response at once: a sample is the one that a draw
    a token from the request's seeded generator gives, replayed here on the model's forward without a cache
    (the engine's own inverse CDF, top-k and top-p)."""
    engine = build_engine("transformers", str(job_files.student), dtype=torch.float32, max_model_len=64)
    sampling = SamplingSettings(temperature=1.5, top_k=20, top_p=0.95, max_new_tokens=12)
    for seed, prompt in ((3, PROMPT), (11, PROMPT[1:])):
        (sample,) = [
            s
            for batch in engine.generate([GenerationRequest("r", prompt, seed=seed)], sampling)
            for s in batch
        ]
        generator = torch.Generator().manual_seed(seed)
        ids = list(prompt)
        with torch.no_grad():
            for token in sample.response_ids:
                logits = engine.model(input_ids=torch.tensor([ids])).logits[:, -1].float()
                uniform = torch.rand((), generator=generator)[None]
                drawn = int(engine._draw(logits, sampling, uniform)[0])
                assert drawn == token, (seed, len(ids) - len(prompt))
                ids.append(drawn)


def test_transformers_engine_decodes_with_the_plans_attention_and_gives_the_model_its_own_back(
    job_files,
) -> None:
    """`decode_attention` (the plan's eager on CPU) runs the decode steps only: the prompts' forward keeps the
    model's own kernel, and so does the model after the engine (the trainer's own, where they share it). The
    two compute the same attention: the same samples, log-probs within rounding."""
    own = build_engine("transformers", str(job_files.student), dtype=torch.float32, max_model_len=64)
    eager = build_engine(
        "transformers",
        str(job_files.student),
        dtype=torch.float32,
        max_model_len=64,
        decode_attention="eager",
    )
    kernel = eager.model.config._attn_implementation
    assert kernel != "eager"
    seen: list[tuple[int, str]] = []
    forward = eager.model.forward

    def recording(*args, **kwargs):
        seen.append((kwargs["input_ids"].shape[1], eager.model.config._attn_implementation))
        return forward(*args, **kwargs)

    eager.model.forward = recording
    requests = [GenerationRequest(f"r{i}", p, seed=i) for i, p in enumerate((PROMPT, PROMPT[:2], (9,)))]
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=8)
    for _ in range(2):  # a second call starts from the model's own kernel too
        seen.clear()
        samples = {s.sample_id: s for batch in eager.generate(requests, sampling) for s in batch}
        assert seen[0] == (len(PROMPT), kernel) and {k for _, k in seen[1:]} == {"eager"}, seen
        assert {w for w, _ in seen[1:]} == {1}
        assert eager.model.config._attn_implementation == kernel
    for batch in own.generate(requests, sampling):
        for sample in batch:
            assert samples[sample.sample_id].response_ids == sample.response_ids
            assert samples[sample.sample_id].logprobs == pytest.approx(sample.logprobs, abs=1e-5)


def test_transformers_engine_decodes_on_the_plans_threads_and_gives_the_process_its_own_back(
    job_files, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`decode_threads` (the plan's one for a small CPU student) holds for the decode steps only: the prompts'
    forward of every batch runs on the process's threads, and so does whatever runs after the engine (the
    teachers scored in the trainer's process, the trainer). The same samples as on the process's threads."""
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op in its process once it binds its threads:
    # here, after a vLLM engine of an earlier test in this worker. A run's transformers engine never shares a
    # process with vLLM (its own actor, or the trainer's), so the test gives torch its own back.
    monkeypatch.setattr(torch, "set_num_threads", torch._C.set_num_threads)
    own = build_engine("transformers", str(job_files.student), dtype=torch.float32, max_model_len=64)
    engine = build_engine(
        "transformers", str(job_files.student), dtype=torch.float32, max_model_len=64, decode_threads=1
    )
    engine.batch_rows = 2  # two batches: the second's prompts' forward is on the process's threads again
    seen: list[tuple[int, int]] = []
    forward = engine.model.forward

    def recording(*args, **kwargs):
        seen.append((kwargs["input_ids"].shape[1], torch.get_num_threads()))
        return forward(*args, **kwargs)

    engine.model.forward = recording
    requests = [
        GenerationRequest(f"r{i}", p, seed=i) for i, p in enumerate((PROMPT, PROMPT[:2], (9, 4, 2, 8)))
    ]
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=6)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a test worker may run on one: two tell the decode's one apart
    try:
        samples = {s.sample_id: s for batch in engine.generate(requests, sampling) for s in batch}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    # each batch's prompts' forward (4 tokens wide) on the process's 2, then its decode steps on 1
    assert seen[0][0] == 4 and [n for width, n in seen if width > 1] == [2, 2], seen
    assert {n for width, n in seen if width == 1} == {1}, seen
    for batch in own.generate(requests, sampling):
        for sample in batch:
            assert samples[sample.sample_id].response_ids == sample.response_ids
            assert samples[sample.sample_id].logprobs == pytest.approx(sample.logprobs, abs=1e-5)


def test_transformers_engine_decodes_a_step_together_as_each_request_alone(job_files) -> None:
    """The step's requests decode in one left-padded batch, each row from its own seed: every sample is the one
    its request gets alone, rows are out as they end (shortest first), and the log-probs are the model's."""
    engine = build_engine("transformers", str(job_files.student), dtype=torch.float32, max_model_len=64)
    prompts = [PROMPT, PROMPT[:2], (*PROMPT, 11, 6, 8), PROMPT[1:], (9,), PROMPT, (*PROMPT, 5), (13, 7)]
    requests = [GenerationRequest(f"r{i}", prompt, seed=i) for i, prompt in enumerate(prompts)]
    # a top-k and top-p to filter through; as end tokens, the ones the free responses use most, so that the
    # responses end at different lengths
    free = SamplingSettings(temperature=1.5, top_k=20, top_p=0.95, max_new_tokens=16)
    used = Counter(
        token for batch in engine.generate(requests, free) for s in batch for token in s.response_ids
    )
    sampling = replace(free, stop_token_ids=tuple(token for token, _ in used.most_common(3)))
    batches = list(engine.generate(requests, sampling))
    together = {sample.sample_id: sample for batch in batches for sample in batch}
    assert sorted(together) == sorted(r.sample_id for r in requests)
    lengths = [len(sample.response_ids) for batch in batches for sample in batch]
    assert lengths == sorted(lengths) and len(set(lengths)) > 2, lengths
    assert len(batches) > 2  # out as they end, not all at the end
    for request in requests:
        (alone,) = [sample for batch in engine.generate([request], sampling) for sample in batch]
        sample = together[request.sample_id]
        assert sample.response_ids == alone.response_ids and sample.finish_reason == alone.finish_reason
        assert sample.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
        model = engine.sequence_logprobs(request.prompt_ids, sample.response_ids)
        assert sample.logprobs == pytest.approx(model, abs=1e-4)
    # the same seed and prompt in one batch sample the same; other seeds, other samples
    again = [GenerationRequest(f"again{i}", PROMPT, seed=seed) for i, seed in enumerate((0, 0, 1, 2, 3))]
    samples = [tuple(s.response_ids) for batch in engine.generate(again, free) for s in batch]
    assert len(samples) == 5 and len(set(samples)) == 4, samples
