"""Pure decisions of the loop: which prompts, which seeds, on- or off-policy, how samples become training
samples, how they split over ranks. No I/O here, so each is unit-tested with plain values."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from distillery_runtime.data.data import PromptRecord

# The split over ranks and replicas lives with the other groupings (the rollout pool uses it too); the
# loop and its tests name it here, among the loop's decisions.
from distillery_runtime.data.packing import shard as shard
from distillery_runtime.data.samples import RolloutSample, TrainSample
from distillery_runtime.rollout.base import GenerationRequest
from distillery_runtime.teachers.types import TeacherScores

T = TypeVar("T")


def is_on_policy(seed: int, step: int, fraction: float) -> bool:
    """lambda: whether step `step` trains on student samples (else on the dataset's responses)."""
    if fraction >= 1.0:
        return True
    if fraction <= 0.0:
        return False
    return random.Random(seed * 7919 + step).random() < fraction


def sample_seed(seed: int, step: int, slot: int) -> int:
    """The sampling seed of one response: fixed by the run seed, the step and the slot in the step."""
    return (seed * 1_000_003 + step * 65_537 + slot) % (2**31 - 1)


def generation_requests(
    records: Sequence[PromptRecord], step: int, samples_per_prompt: int, seed: int
) -> list[GenerationRequest]:
    out = []
    for i, record in enumerate(records):
        for j in range(samples_per_prompt):
            slot = i * samples_per_prompt + j
            out.append(
                GenerationRequest(
                    sample_id=f"s{step}-p{record.index}-{j}",
                    prompt_ids=record.prompt_ids,
                    seed=sample_seed(seed, step, slot),
                    route=record.route,
                    answer=record.answer,
                )
            )
    return out


def dataset_samples(
    records: Sequence[PromptRecord], step: int, samples_per_prompt: int, version: int
) -> list[RolloutSample]:
    """The off-policy share: the dataset's reference responses in place of student samples."""
    out = []
    for record in records:
        if record.response_ids is None:
            raise ValueError(f"row {record.index} has no reference response (data.responseField)")
        for j in range(samples_per_prompt):
            out.append(
                RolloutSample(
                    sample_id=f"s{step}-p{record.index}-{j}",
                    prompt_ids=list(record.prompt_ids),
                    response_ids=list(record.response_ids),
                    logprobs=None,
                    route=record.route,
                    answer=record.answer,
                    policy_version=version,
                )
            )
    return out


def train_sample(
    sample: RolloutSample, teacher: str, scores: TeacherScores, advantage: float = 0.0
) -> TrainSample:
    """A rollout sample with its teacher's row (scores of B = 1, T = its response length)."""
    r = len(sample.response_ids)
    return TrainSample(
        prompt_ids=sample.prompt_ids,
        response_ids=sample.response_ids,
        old_logprobs=None if sample.logprobs is None else np.asarray(sample.logprobs, np.float32),
        topk_ids=scores.topk_ids[0, :r],
        topk_logprobs=scores.topk_logprobs[0, :r],
        token_logprobs=scores.token_logprobs[0, :r],
        teacher_mask=counted_mask(sample, scores),
        task_advantage=advantage,
        teacher=teacher,
    )


def counted_mask(sample: RolloutSample, scores: TeacherScores) -> np.ndarray:
    """bool [R]: the response positions a loss or a KL may count: those the teacher scored, less an
    episode's observations (the environment wrote them; every loss mode, the packing, the trainer's
    log-prob gap and the k3 metrics read this one mask)."""
    r = len(sample.response_ids)
    mask = scores.mask[0, :r]
    if sample.student_mask is None:
        return mask
    return mask & np.asarray(sample.student_mask, bool)


def group_advantages(
    samples: Sequence[RolloutSample], reward: Callable[[RolloutSample], float]
) -> dict[str, float]:
    """GRPO-style task advantages: a sample's reward minus the mean reward of its prompt's samples."""
    groups: dict[tuple[int, ...], list[RolloutSample]] = defaultdict(list)
    for s in samples:
        groups[tuple(s.prompt_ids)].append(s)
    out = {}
    for members in groups.values():
        rewards = [reward(s) for s in members]
        mean = sum(rewards) / len(rewards)
        for s, value in zip(members, rewards, strict=True):
            out[s.sample_id] = value - mean
    return out


def _k3_sum(student: np.ndarray, teacher: np.ndarray, scored: np.ndarray) -> tuple[float, int]:
    """Sum over the scored positions of the k3 estimate of KL(student || teacher), and their number."""
    ok = scored & np.isfinite(teacher)
    if not ok.any():
        return 0.0, 0
    log_ratio = np.clip(teacher[ok] - student[ok], -20.0, 20.0)
    return float((np.exp(log_ratio) - log_ratio - 1.0).sum()), int(ok.sum())


def kl_per_teacher(samples: Sequence[TrainSample]) -> dict[str, float]:
    """k3 estimate of KL(student || teacher) per token on the student's own samples, per teacher.

    Uses the rollout policy's log-probs (the policy that drew the samples), so it is an unbiased
    on-policy estimate; steps trained on dataset responses have none.
    """
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for s in samples:
        if s.old_logprobs is None:
            continue
        total, n = _k3_sum(s.old_logprobs, s.token_logprobs, s.teacher_mask)
        if n:
            sums[s.teacher] += total
            counts[s.teacher] += n
    return {name: sums[name] / counts[name] for name in counts}


def sample_kl(sample: RolloutSample, scores: TeacherScores) -> float | None:
    """Per-token k3 KL(student || teacher) of one response (a B = 1 scoring of it) from the student's
    log-probs of its own tokens (an episode's: of the tokens the student wrote); None without them or
    without a scored position."""
    if sample.logprobs is None:
        return None
    r = len(sample.logprobs)
    total, n = _k3_sum(
        np.asarray(sample.logprobs, np.float32), scores.token_logprobs[0, :r], counted_mask(sample, scores)
    )
    return total / n if n else None


def mean_kl_per_teacher(kls: Sequence[tuple[str, float]]) -> dict[str, float]:
    """The mean of per-sample KLs, per teacher (each sample weighs the same: a reader's average)."""
    by: dict[str, list[float]] = defaultdict(list)
    for name, value in kls:
        by[name].append(value)
    return {name: sum(values) / len(values) for name, values in sorted(by.items())}


def eval_sample_lines(
    step: int,
    outputs: Sequence[RolloutSample],
    grades: Sequence[float | None],
    scored: Sequence[tuple[str, float | None]],
    prompt_text: Callable[[list[int]], str],
    response_text: Callable[[list[int]], str],
) -> list[dict[str, object]]:
    """samples.jsonl's objects of one eval: each sample's prompt as rendered, the response, the reference,
    its grade (None: no reference) and, for the first len(scored), its teacher's per-token KL."""
    lines: list[dict[str, object]] = []
    for i, (out, grade) in enumerate(zip(outputs, grades, strict=True)):
        teacher, kl = scored[i] if i < len(scored) else (None, None)
        lines.append(
            {
                "step": step,
                "id": out.sample_id,
                "prompt": prompt_text(out.prompt_ids),
                "response": response_text(out.response_ids),
                "reference": out.answer,
                "grade": grade,
                "tokens": len(out.response_ids),
                "finish_reason": out.finish_reason,
                "kl": {teacher: kl} if teacher is not None and kl is not None else {},
                **({} if out.episode is None else episode_line(out, prompt_text)),
            }
        )
    return lines


def episode_line(sample: RolloutSample, text: Callable[[list[int]], str]) -> dict[str, object]:
    """An episode's part of its samples.jsonl object: each run of its response with who wrote it (the student
    or the environment, whose tokens no loss counts), as the student read it, and its counts."""
    assert sample.episode is not None
    turns: list[dict[str, object]] = []
    start = 0
    for by_student, n in sample.episode.segments:
        ids = sample.response_ids[start : start + n]
        turns.append({"by": "student" if by_student else "environment", "text": text(ids), "tokens": n})
        start += n
    e = sample.episode
    return {
        "turns": turns,
        "tool_calls": e.tool_calls,
        "tool_errors": e.tool_errors,
        "environment_failures": e.environment_failures,
        "reward": e.reward,
    }


def wants_logprobs(step: int, every: int) -> bool:
    """Whether step `step`'s rollout returns its log-probs (plan.rollout.logprobs_every): the first step and
    every `every`-th."""
    return every <= 1 or step == 1 or step % every == 0


def is_due(step: int, every: int, total: int) -> bool:
    """Whether something that runs every `every` steps (and at the end) runs after step `step` (1-based)."""
    return step == total or (every > 0 and step % every == 0)
