"""The rollout engine contract, shared by the vLLM and transformers engines."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from distillery_runtime.samples import RolloutSample


@dataclass(frozen=True)
class GenerationRequest:
    """One response to sample: the seed makes the sample reproducible (deterministic CPU mode)."""

    sample_id: str
    prompt_ids: tuple[int, ...]
    seed: int
    route: str | None = None
    answer: str | None = None


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    greedy: bool = False
    """Evaluation decodes greedily."""


class RolloutEngine(Protocol):
    """What the loop needs from a rollout engine."""

    policy_version: int

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> Iterator[RolloutSample]:
        """Yield each sample as soon as it is finished (any order)."""
        ...

    def update_weights(self, weights: Sequence[tuple[str, torch.Tensor]], version: int) -> None:
        """Load the trainer's weights (Hugging Face names); later samples use them."""
        ...

    def sequence_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """Log-prob of each response token under the engine's current weights."""
        ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...
