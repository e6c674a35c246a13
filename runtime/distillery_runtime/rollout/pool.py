"""The student's rollout engines as one (`student.rollout.replicas`): data-parallel copies of the student.

Each replica is a `RolloutWorker` actor. A step's requests are split into contiguous, near-equal shares,
one per replica, and the samples of all replicas stream out as they finish (merged, not in order: the
loop sorts them back into request order). Every sample's seed comes from its request, not from the
replica that draws it, so a run samples the same responses with any number of replicas. Sleep, wake-up,
versions and weight syncs go to every replica; the weight sync is one group with the trainer as rank 0
and the t ranks of replica i as ranks 1 + i t .. (i + 1) t (`sync/weight_sync.py`), so one broadcast feeds
them all: t is the plan's `RolloutSettings.replica_sync_ranks`, a vLLM engine's tensor-parallel workers
(each loads its shard), or one where the engine receives a LoRA adapter in its own process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from distillery_runtime.data.packing import shard
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings

_DONE = object()


class RolloutPool:
    """Ray actor handles of the replicas (`RolloutWorker`), driven together."""

    def __init__(self, actors: Sequence[Any], replica_ranks: int = 1) -> None:
        """`replica_ranks`: each replica's ranks in the weight-sync group (`RolloutSettings.replica_sync_ranks`)."""
        if not actors:
            raise ValueError("a rollout pool needs at least one engine")
        self.actors = list(actors)
        self.replica_ranks = replica_ranks

    @property
    def names(self) -> list[str]:
        """How the weight-sync group names each engine worker in its errors, in rank order."""
        if self.replica_ranks == 1:
            return [f"rollout engine {i}" for i in range(len(self.actors))]
        return [
            f"rollout engine {i} tensor-parallel rank {t}"
            for i in range(len(self.actors))
            for t in range(self.replica_ranks)
        ]

    def _shares(self, requests: Sequence[GenerationRequest]) -> list[tuple[Any, list[GenerationRequest]]]:
        shares = shard(requests, len(self.actors))
        return [(actor, share) for actor, share in zip(self.actors, shares, strict=True) if share]

    async def stream(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> AsyncIterator[RolloutSample]:
        """Samples of every replica as each finishes (a Ray streaming generator per replica)."""
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(actor: Any, share: list[GenerationRequest]) -> None:
            try:
                async for ref in actor.stream.options(num_returns="streaming").remote(share, sampling):
                    for sample in await ref:  # the samples one engine step finished
                        await queue.put(sample)
                await queue.put(_DONE)
            except BaseException as error:  # handed to the consumer, which stops the others
                await queue.put(error)

        tasks = [asyncio.create_task(pump(actor, share)) for actor, share in self._shares(requests)]
        running = len(tasks)
        try:
            while running:
                item = await queue.get()
                if item is _DONE:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()

    async def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> list[RolloutSample]:
        """All samples, each replica's in the order they finished (each carries its request's sample_id)."""
        parts = await asyncio.gather(
            *(a.generate.remote(share, sampling) for a, share in self._shares(requests))
        )
        return [sample for part in parts for sample in part]

    async def dtype(self) -> str:
        dtypes = set(await asyncio.gather(*(a.dtype.remote() for a in self.actors)))
        if len(dtypes) != 1:
            raise RuntimeError(f"rollout replicas disagree on their dtype: {sorted(dtypes)}")
        return dtypes.pop()

    async def sleep(self) -> None:
        await asyncio.gather(*(a.sleep.remote() for a in self.actors))

    async def wake_up(self) -> None:
        await asyncio.gather(*(a.wake_up.remote() for a in self.actors))

    async def set_version(self, version: int) -> None:
        await asyncio.gather(*(a.set_version.remote(version) for a in self.actors))

    async def join_weight_sync(self, host: str, port: int, names: list[str]) -> None:
        """Replica i's ranks are 1 + i t onwards (rank 0 is the trainer)."""
        t = self.replica_ranks
        await asyncio.gather(
            *(a.join_weight_sync.remote(host, port, 1 + i * t, names) for i, a in enumerate(self.actors))
        )

    async def receive_weights(self, metas: list[Any], bucket_bytes: int, version: int) -> None:
        await asyncio.gather(*(a.receive_weights.remote(metas, bucket_bytes, version) for a in self.actors))

    async def update_weights(self, weights: Any, version: int) -> None:
        """Through the object store (one ObjectRef, read by every replica)."""
        await asyncio.gather(*(a.update_weights.remote(weights, version) for a in self.actors))
