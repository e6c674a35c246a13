"""The DistillationJob's schedule (`spec.schedule`): steps, batch sizes, evaluation and checkpoint cadence."""

from __future__ import annotations

from pydantic import Field

from distillery.api.base import ApiModel
from distillery.api.bounds import (
    MAX_INT,
)


class Schedule(ApiModel):
    """How long and how big each step is."""

    steps: int = Field(default=100, ge=1, le=10_000_000)
    """Optimizer steps of the whole job."""
    prompts_per_step: int = Field(default=32, ge=1, le=1_000_000)
    """Prompts rolled out per step (each gives samplesPerPrompt samples)."""
    micro_batch_size: int = Field(default=8, ge=1, le=100_000)
    """Samples per forward/backward on one rank; gradients accumulate over micro-batches."""
    micro_batch_tokens: int | None = Field(default=None, ge=16, le=1_048_576)
    """Token budget of a micro-batch: samples are packed end to end (no padding, each attends only to
    itself) until the next would exceed it; a longer sample gets a micro-batch of its own. Unset:
    microBatchSize samples, right-padded to the longest."""
    checkpoint_every: int = Field(default=50, ge=0, le=MAX_INT)
    """Steps between checkpoints (0 = only at the end)."""
    eval_every: int = Field(default=0, ge=0, le=MAX_INT)
    """Steps between held-out evaluations (0 = never; needs data.eval)."""
    seed: int = Field(default=0, ge=0, le=MAX_INT)
    """Seed of data order, sampling and initialisation (CPU runs are deterministic)."""
    one_step_off: bool = False
    """Overlap the rollout of step i+1 with training of step i (samples are one policy version stale)."""
