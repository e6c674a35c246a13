"""Data-parallel rollout (rollout_pool.py): a step's requests split over replicas, samples merged as they
finish, every replica driven by the same calls. Real Ray actors; the engine is a stand-in that answers
each request from its seed, as a real engine's sampling is fixed by the request's seed."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.rollout.pool import RolloutPool


class SeedEngine:
    """Answers a request with tokens derived from its seed (the first replica slower than the others)."""

    def __init__(self, index: int) -> None:
        self.index, self.calls, self.version = index, [], 0

    def stream(self, requests: Sequence[GenerationRequest], sampling: Any) -> Iterator[list[RolloutSample]]:
        self.calls.append([r.sample_id for r in requests])
        for r in requests:
            time.sleep(0.05 if self.index == 0 else 0.01)
            yield [
                RolloutSample(
                    r.sample_id,
                    list(r.prompt_ids),
                    [r.seed % 97, r.seed % 89],
                    None,
                    policy_version=self.version,
                )
            ]

    def generate(self, requests: Sequence[GenerationRequest], sampling: Any) -> list[RolloutSample]:
        return [s for finished in self.stream(requests, sampling) for s in finished]

    def dtype(self) -> str:
        return "float32"

    def set_version(self, version: int) -> int:
        self.version = version
        return version

    def seen(self) -> list[list[str]]:
        return self.calls


def _requests(n: int) -> list[GenerationRequest]:
    return [GenerationRequest(sample_id=f"s{i}", prompt_ids=[1, 2, i], seed=1000 + 7 * i) for i in range(n)]


@pytest.mark.slow
def test_replicas_share_the_requests_and_return_what_one_engine_would(ray_local) -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import a test module
    actor = ray_local.remote(num_cpus=0)(SeedEngine)
    one = RolloutPool([actor.remote(0)])
    three = RolloutPool([actor.remote(i) for i in range(3)])
    requests = _requests(8)
    sampling = SamplingSettings(max_new_tokens=2)

    async def collect(pool: RolloutPool) -> list[RolloutSample]:
        await pool.set_version(5)
        return [s async for s in pool.stream(requests, sampling)]

    alone, shared = asyncio.run(collect(one)), asyncio.run(collect(three))
    by_id = {s.sample_id: s for s in alone}
    assert sorted(s.sample_id for s in shared) == sorted(by_id)
    for s in shared:
        assert s.response_ids == by_id[s.sample_id].response_ids and s.policy_version == 5
    # Each replica got a contiguous share.
    seen = [ray_local.get(a.seen.remote())[0] for a in three.actors]
    assert seen == [["s0", "s1"], ["s2", "s3", "s4"], ["s5", "s6", "s7"]]
    generated = asyncio.run(three.generate(requests, sampling))
    assert [s.sample_id for s in generated] == [r.sample_id for r in requests]  # request order
    assert asyncio.run(three.dtype()) == "float32"
