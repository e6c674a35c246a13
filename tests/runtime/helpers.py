"""Synthetic training samples for the trainer and rollout tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from distillery_runtime.data.samples import TrainSample

from distillery.plan.loss import LossConfig


def make_samples(n: int, vocab: int, k: int, seed: int = 0) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, r = 3 + i % 3, 2 + (i * 2) % 5
        logits = torch.randn(r, vocab, generator=g) * 2
        logp = torch.log_softmax(logits, -1)
        top = logp.topk(k, -1)
        response = torch.randint(4, vocab, (r,), generator=g)
        mask = np.ones(r, bool)
        mask[-1] = i % 2 == 0  # some positions the teacher did not score
        out.append(
            TrainSample(
                prompt_ids=torch.randint(4, vocab, (p,), generator=g).tolist(),
                response_ids=response.tolist(),
                old_logprobs=None,
                topk_ids=top.indices.numpy().astype(np.int32),
                topk_logprobs=top.values.numpy().astype(np.float32),
                token_logprobs=logp.gather(-1, response[:, None])[:, 0].numpy(),
                teacher_mask=mask,
            )
        )
    return out


def train_steps(
    worker: Any, loss: LossConfig, vocab: int, steps: range, rank: int = 0, world: int = 1
) -> list[float]:
    """A trainer worker's losses over `steps` steps of `make_samples` (seeded by the step), this rank's
    share of each (`plan.shard`), normalised over all ranks' samples."""
    from distillery_runtime.run.loop import plan
    from distillery_runtime.training.trainer import step_normalizer

    losses = []
    for step in steps:
        samples = make_samples(7, vocab, 4, seed=step)
        normalizer = step_normalizer(samples, loss)
        losses.append(worker.train_step(plan.shard(samples, world)[rank], normalizer)["distill/loss"])
    return losses
