"""Pure decisions of the loop: on/off-policy choice, seeds, sharding, advantages, KL, the LR schedule."""

from __future__ import annotations

import functools
import itertools
import math
import operator

import numpy as np
import pytest
from distillery_runtime.data.data import PromptRecord
from distillery_runtime.data.samples import RolloutSample, TrainSample
from distillery_runtime.run.loop import plan
from distillery_runtime.teachers.types import TeacherScores
from distillery_runtime.training.schedule import lr_factor


def test_on_policy_fraction_is_a_reproducible_coin():
    picks = [plan.is_on_policy(5, step, 0.3) for step in range(2000)]
    assert abs(sum(picks) / len(picks) - 0.3) < 0.04
    assert picks == [plan.is_on_policy(5, step, 0.3) for step in range(2000)]
    assert all(plan.is_on_policy(5, s, 1.0) for s in range(50))
    assert not any(plan.is_on_policy(5, s, 0.0) for s in range(50))


def test_generation_requests_have_distinct_reproducible_seeds():
    records = [PromptRecord(index=i, prompt_ids=(1, i + 2), route="r") for i in range(3)]
    requests = plan.generation_requests(records, step=7, samples_per_prompt=2, seed=1)
    assert len(requests) == 6 and len({r.seed for r in requests}) == 6
    assert requests == plan.generation_requests(records, step=7, samples_per_prompt=2, seed=1)
    assert requests[1].prompt_ids == (1, 2) and requests[2].prompt_ids == (1, 3)
    other_step = plan.generation_requests(records, step=8, samples_per_prompt=2, seed=1)
    assert {r.seed for r in requests}.isdisjoint({r.seed for r in other_step})


def test_dataset_samples_need_a_reference_response():
    records = [
        PromptRecord(index=0, prompt_ids=(1,), response_ids=(4, 2)),
        PromptRecord(index=1, prompt_ids=(1,)),
    ]
    assert plan.dataset_samples(records[:1], 1, 2, version=3)[1].response_ids == [4, 2]
    with pytest.raises(ValueError, match="row 1 has no reference response"):
        plan.dataset_samples(records, 1, 1, version=0)


def test_shard_is_contiguous_and_balanced():
    items = list(range(7))
    shards = plan.shard(items, 3)
    assert [len(s) for s in shards] == [2, 2, 3]
    assert functools.reduce(operator.iadd, shards, []) == items


def test_group_advantages_center_rewards_per_prompt():
    samples = [
        RolloutSample(f"s{i}", [1, p], [5], None, answer=str(i % 2)) for i, p in enumerate([7, 7, 8, 8])
    ]
    adv = plan.group_advantages(samples, lambda s: float(s.sample_id in {"s0", "s2", "s3"}))
    assert adv == {"s0": 0.5, "s1": -0.5, "s2": 0.0, "s3": 0.0}


def _train_sample(student, teacher, mask, name="t"):
    n = len(student)
    return TrainSample(
        [1], [2] * n, np.asarray(student, np.float32), np.zeros((n, 0), np.int32), np.zeros((n, 0), np.float32),
        np.asarray(teacher, np.float32), np.asarray(mask), teacher=name,
    )  # fmt: skip


def test_kl_per_teacher_is_the_k3_estimate_over_scored_tokens():
    a = _train_sample([-1.0, -2.0], [-1.5, -np.inf], [True, True], "a")
    b = _train_sample([-0.5], [-0.5], [True], "b")
    kl = plan.kl_per_teacher([a, b])
    r = -0.5
    assert kl["a"] == pytest.approx(math.exp(r) - r - 1)
    assert kl["b"] == pytest.approx(0.0)


def test_train_sample_takes_the_teachers_row():
    scores = TeacherScores(
        topk_ids=np.arange(8, dtype=np.int32).reshape(1, 4, 2),
        topk_logprobs=np.full((1, 4, 2), -1.0, np.float32),
        token_logprobs=np.array([[-1, -2, -3, -np.inf]], np.float32),
        mask=np.array([[True, True, True, False]]),
    )
    sample = RolloutSample("s", [1], [4, 5, 6], [-0.1, -0.2, -0.3])
    out = plan.train_sample(sample, "t", scores)
    assert out.topk_ids.shape == (3, 2) and out.token_logprobs.tolist() == [-1, -2, -3]
    assert out.old_logprobs.dtype == np.float32 and out.teacher == "t"


def test_lr_schedule_warmup_then_cosine():
    f = [lr_factor(s, warmup_steps=2, total_steps=10, min_lr_ratio=0.1) for s in range(10)]
    assert f[0] == 0.5 and f[1] == 1.0 and f[2] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(f[2:]))
    assert lr_factor(10, warmup_steps=2, total_steps=10, min_lr_ratio=0.1) == pytest.approx(0.1)


def test_is_due():
    assert [s for s in range(1, 8) if plan.is_due(s, 3, 7)] == [3, 6, 7]
    assert [s for s in range(1, 8) if plan.is_due(s, 0, 7)] == [7]
