"""The training and sync phases of a step: one optimizer step on the trainer ranks, their metrics combined,
then the new weights sent to the rollout engines."""

from __future__ import annotations

import asyncio

from distillery_runtime.data.samples import TrainSample
from distillery_runtime.run.loop import plan
from distillery_runtime.run.loop.components import Components, sync_weights
from distillery_runtime.run.loop.state import LoopState
from distillery_runtime.training.trainer import MAX_METRICS, SUMMED_OVER_RANKS, step_normalizer


class TrainingPhase(LoopState):
    """Training and weight sync."""

    async def train(self, c: Components, samples: list[TrainSample]) -> dict[str, float]:
        normalizer = step_normalizer(samples, self.plan.loss)
        shards = plan.shard(samples, len(c.trainers))
        results = await asyncio.gather(
            *(t.train_step.remote(s, normalizer) for t, s in zip(c.trainers, shards, strict=True))
        )
        return _combine_rank_metrics(results)

    async def sync(self, c: Components) -> None:
        if self.plan.rollout.in_trainer:  # the engine samples with the trainer's model: already in step
            self.sync_bytes = 0
            return
        self.sync_bytes = await sync_weights(c, self.version)


def _combine_rank_metrics(results: list[dict[str, float]]) -> dict[str, float]:
    """Per-rank metrics weighted by each rank's share of the loss (grad norm, lr: the same on all ranks)."""
    if len(results) == 1:
        return results[0]
    total = sum(r.get("train/share", 0.0) for r in results) or 1.0
    out: dict[str, float] = {}
    for name in results[0]:
        if name in SUMMED_OVER_RANKS:
            out[name] = sum(r.get(name, 0.0) for r in results)
        elif name in MAX_METRICS:
            out[name] = max(r[name] for r in results if name in r)
        elif name.startswith("train/"):
            out[name] = (
                results[0][name]
                if name not in {"train/samples", "train/share"}
                else sum(r[name] for r in results)
            )
        else:
            out[name] = sum(r.get(name, 0.0) * r.get("train/share", 0.0) for r in results) / total
    return out
