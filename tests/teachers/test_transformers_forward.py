"""The transformers teacher (`teachers/in_process/transformers_forward.py`): a real tiny model's forward in this process.

Its scores must be the model's own log-probs, position for position: each sample is checked against a
forward of that sample alone (float32 both, so to float rounding), whatever the samples it shares a batch
with, however the batch is split into groups. vLLM's scores are checked against the same reference in
test_vllm_teacher.py / test_colocated_and_routing.py, so the two engines agree through it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from distillery_runtime.teachers import ScoreRequest, TeacherError
from distillery_runtime.teachers.in_process import transformers_forward as forward
from distillery_runtime.teachers.in_process.transformers_forward import TransformersTeacher, forward_groups

from distillery.api.spec import TeacherEngine
from distillery.plan.teachers.engines import EngineSettings

from .conftest import make_samples

ATOL = 2e-4  # float32 on both sides; batched and single-sample kernels round differently


def engine(max_logprobs: int = 64, max_model_len: int = 512) -> EngineSettings:
    return EngineSettings(
        "teacher", max_logprobs, max_model_len, memory_fraction=0.9, tensor_parallel=1, dtype="float32",
        on_gpu=False, engine=TeacherEngine.TRANSFORMERS,
    )  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory) -> Path:
    return tiny_model_factory(vocab_size=1024, hidden=128, layers=2, heads=4, seed=3, dtype=torch.float32)


@pytest.fixture(scope="module")
def teacher(model_dir) -> TransformersTeacher:
    return TransformersTeacher(str(model_dir), engine(), dtype=torch.float32, device=torch.device("cpu"))


@pytest.fixture
def reference(hf_reference) -> Callable[[Path, list[ScoreRequest]], list[torch.Tensor]]:
    """Each sample's log-probs [T, V] from a float32 forward of that sample alone."""
    return lambda model_dir, samples: hf_reference(model_dir, samples, torch.float32)


def assert_exact(scores, samples: list[ScoreRequest], refs: list[torch.Tensor]) -> None:
    k = scores.top_k
    for i, (s, ref) in enumerate(zip(samples, refs, strict=True)):
        t = len(s.response_ids)
        assert scores.mask[i].sum() == t and scores.mask[i, :t].all(), s.sample_id
        assert scores.sample_ids[i] == s.sample_id
        if t == 0:
            continue
        wanted = ref.gather(1, torch.tensor(s.response_ids)[:, None])[:, 0].numpy()
        np.testing.assert_allclose(scores.token_logprobs[i, :t], wanted, atol=ATOL, rtol=0)
        if k:
            top = ref.topk(k, -1)
            np.testing.assert_allclose(scores.topk_logprobs[i, :t], top.values.numpy(), atol=ATOL, rtol=0)
            # the ids are the reference's own top-k: their reference log-probs are the values given
            ids = torch.from_numpy(scores.topk_ids[i, :t].astype(np.int64))
            np.testing.assert_allclose(
                ref.gather(1, ids).numpy(), scores.topk_logprobs[i, :t], atol=ATOL, rtol=0
            )


@pytest.mark.parametrize("top_k", [0, 1, 8, 16, 64])  # 16 and 64: numpy's exact top-k; below, torch's
def test_scores_are_each_samples_own_forward(teacher, model_dir, reference, top_k) -> None:
    samples = make_samples(12, 1024, seed=7, max_prompt=30, max_response=60)  # one with no response
    scores = asyncio.run(teacher.score(samples, top_k))
    assert scores.top_k == top_k and scores.batch_size == len(samples)
    assert_exact(scores, samples, reference(model_dir, samples))


def test_a_batch_split_into_groups_scores_the_same(teacher, model_dir, reference, monkeypatch) -> None:
    samples = make_samples(10, 1024, seed=8, max_prompt=20, max_response=50)
    whole = asyncio.run(teacher.score(samples, 8))
    # Logits of ~40 positions at most per forward: several groups, each of similar lengths.
    monkeypatch.setattr(forward, "LOGITS_BYTES", 40 * 1024 * 4)
    groups = forward_groups(samples, 1024)
    assert len(groups) > 2 and sorted(i for g in groups for i in g) == list(range(len(samples)))
    split = asyncio.run(teacher.score(samples, 8))
    np.testing.assert_array_equal(split.mask, whole.mask)
    np.testing.assert_allclose(split.topk_logprobs[split.mask], whole.topk_logprobs[whole.mask], atol=ATOL)
    assert_exact(split, samples, reference(model_dir, samples))


def test_the_plans_forward_cost_cuts_the_padding_and_scores_the_same(
    model_dir, reference, monkeypatch
) -> None:
    samples = make_samples(10, 1024, seed=11, max_prompt=20, max_response=80)

    def padded(groups: list[list[int]]) -> int:
        return sum(
            len(g) * max(len(samples[i].prompt_ids) + len(samples[i].response_ids) for i in g) for g in groups
        )

    fewest, cut = forward_groups(samples, 1024), forward_groups(samples, 1024, 16)
    assert len(fewest) == 1 and len(cut) > 1
    assert padded(cut) + 16 * len(cut) < padded(fewest) + 16
    settings = dataclasses.replace(engine(), forward_cost_tokens=16)
    cutting = TransformersTeacher(str(model_dir), settings, dtype=torch.float32, device=torch.device("cpu"))
    seen: list[list[list[int]]] = []
    real = forward.forward_groups
    monkeypatch.setattr(forward, "forward_groups", lambda *args: seen.append(real(*args)) or seen[-1])
    scores = asyncio.run(cutting.score(samples, 8))
    assert seen == [cut]  # the engine's settings reach its forwards
    assert_exact(scores, samples, reference(model_dir, samples))


def test_score_each_answers_each_sample_in_order(teacher, model_dir, reference) -> None:
    samples = make_samples(5, 1024, seed=9, max_response=40)
    each = asyncio.run(teacher.score_each(samples, 4))
    refs = reference(model_dir, samples)
    assert [s.sample_ids for s in each] == [[s.sample_id] for s in samples]
    for one, sample, ref in zip(each, samples, refs, strict=True):
        assert_exact(one, [sample], [ref])


def test_limits_are_refused_before_any_forward(teacher) -> None:
    long = ScoreRequest(list(range(4, 400)), list(range(4, 200)), "long")
    with pytest.raises(TeacherError, match="long has 592 tokens"):
        asyncio.run(teacher.score([long], 4))
    with pytest.raises(TeacherError, match="--max-logprobs 65"):
        asyncio.run(teacher.score(make_samples(1, 1024, seed=1), 65))


def test_a_real_vocabulary_is_scored_within_the_logits_budget(tiny_qwen_factory, reference) -> None:
    """Qwen's 151,936-row head: 32 samples of ~130 positions would be 2.5 GB of float32 logits in one
    forward; the groups keep each within LOGITS_BYTES and still score every sample as alone."""
    model_dir = tiny_qwen_factory()
    qwen = TransformersTeacher(str(model_dir), engine(), dtype=torch.float32, device=torch.device("cpu"))
    assert qwen.vocabulary_size == 151936
    samples = make_samples(6, 151000, seed=4, max_prompt=20, max_response=300)
    groups = forward_groups(samples, qwen.vocabulary_size)
    assert len(groups) > 1
    for group in groups:
        width = max(len(samples[i].prompt_ids) + len(samples[i].response_ids) for i in group)
        first = min(len(samples[i].prompt_ids) for i in group) - 1
        assert len(group) == 1 or len(group) * (width - 1 - first) * 151936 * 4 <= forward.LOGITS_BYTES
    scores = asyncio.run(qwen.score(samples, 16))
    assert_exact(scores, samples, reference(model_dir, samples))
    assert len(qwen.vocabulary()) >= 151643  # the tokenizer's, for the run's check against the student's
