"""Samples scored one by one share requests (teachers/clients/coalesce.py): a burst is spread over the free slots, a
sample that finds a free slot goes at once, the ones that arrive while every slot is out go together,
within the token budget, each answered with its own scores or its request's error."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest
from distillery_runtime.teachers.clients.coalesce import Coalescer
from distillery_runtime.teachers.types import ScoreRequest, TeacherError, TeacherScores


class FakeTeacher:
    """Answers each sample with its own prompt length as every score; records each request's samples."""

    def __init__(self, *, delay: float = 0.01, fail: int | None = None) -> None:
        self.requests: list[list[str]] = []
        self.delay = delay
        self.fail = fail

    async def send(self, samples: Sequence[ScoreRequest], top_k: int) -> list[TeacherScores]:
        self.requests.append([s.sample_id for s in samples])
        await asyncio.sleep(self.delay)
        if self.fail is not None and len(self.requests) == self.fail:
            raise TeacherError("teacher t: down")
        out = []
        for s in samples:
            t = len(s.response_ids)
            value = np.full((1, t), len(s.prompt_ids), np.float32)
            out.append(
                TeacherScores(
                    np.zeros((1, t, top_k), np.int32),
                    np.zeros((1, t, top_k), np.float32),
                    value,
                    np.ones((1, t), bool),
                    [s.sample_id],
                )
            )
        return out


def sample(i: int, tokens: int = 10) -> ScoreRequest:
    return ScoreRequest(list(range(1, i + 2)), [5] * (tokens - i - 1), f"s{i}")


async def test_a_burst_is_spread_over_the_free_slots_each_sample_with_its_own_scores() -> None:
    teacher = FakeTeacher()
    coalescer = Coalescer(teacher.send, in_flight=2, max_tokens=10_000)
    scores = await asyncio.gather(*(coalescer.score_one(sample(i, 80), 4) for i in range(64)))
    assert [s.sample_ids for s in scores] == [[f"s{i}"] for i in range(64)]
    assert [float(s.token_logprobs[0, 0]) for s in scores] == [i + 1.0 for i in range(64)]
    assert teacher.requests == [[f"s{i}" for i in range(32)], [f"s{i}" for i in range(32, 64)]]


async def test_samples_that_arrive_while_every_slot_is_out_go_together() -> None:
    teacher = FakeTeacher()
    coalescer = Coalescer(teacher.send, in_flight=1, max_tokens=10_000)
    first = asyncio.create_task(coalescer.score_one(sample(0), 4))
    await asyncio.sleep(0.001)  # s0 is out
    await asyncio.gather(first, *(coalescer.score_one(sample(i), 4) for i in range(1, 6)))
    assert teacher.requests == [["s0"], ["s1", "s2", "s3", "s4", "s5"]]


async def test_samples_that_trickle_in_go_at_once_one_by_one() -> None:
    teacher = FakeTeacher(delay=0.001)
    coalescer = Coalescer(teacher.send, in_flight=2, max_tokens=10_000)
    for i in range(5):
        await coalescer.score_one(sample(i), 4)
    assert teacher.requests == [[f"s{i}"] for i in range(5)]


async def test_a_request_holds_at_most_the_token_budget_and_at_least_one_sample() -> None:
    teacher = FakeTeacher()
    coalescer = Coalescer(teacher.send, in_flight=1, max_tokens=30)
    samples = [*(sample(i, 10) for i in range(7)), sample(9, 50)]
    await asyncio.gather(*(coalescer.score_one(s, 4) for s in samples))
    assert teacher.requests == [
        ["s0", "s1", "s2"],
        ["s3", "s4", "s5"],
        ["s6"],
        ["s9"],
    ]  # 10 tokens each, 30 a
    # request; s9 is longer than the budget: a request of its own


async def test_a_failed_request_fails_its_samples_only() -> None:
    teacher = FakeTeacher(fail=2)
    coalescer = Coalescer(teacher.send, in_flight=1, max_tokens=10_000)
    first = asyncio.create_task(coalescer.score_one(sample(0), 4))
    await asyncio.sleep(0.001)
    results = await asyncio.gather(
        first, *(coalescer.score_one(sample(i), 4) for i in range(1, 6)), return_exceptions=True
    )
    assert teacher.requests[:2] == [["s0"], ["s1", "s2", "s3", "s4", "s5"]]
    assert isinstance(results[0], TeacherScores)
    assert all(isinstance(r, TeacherError) for r in results[1:])
    again = await coalescer.score_one(sample(1), 4)  # the caller retries; the coalescer still works
    assert again.sample_ids == ["s1"]


async def test_a_sample_whose_caller_gave_up_is_not_sent() -> None:
    teacher = FakeTeacher()
    coalescer = Coalescer(teacher.send, in_flight=1, max_tokens=10_000)
    first = asyncio.create_task(coalescer.score_one(sample(0), 4))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(coalescer.score_one(sample(1), 4))
    await asyncio.sleep(0)
    waiting.cancel()
    await first
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0.05)
    assert teacher.requests == [["s0"]]
    await coalescer.close()
