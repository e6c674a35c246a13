"""The rollout engine contract, shared by the vLLM and transformers engines."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from distillery.plan.rollout.generation import GenerationSettings
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.sync.weight_sync import TensorMeta


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
    """One generate call's sampling, as the plan decided it (`distillery.plan.rollout.generation`); each engine
    translates it (vLLM's SamplingParams, the transformers loop's own checks)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 = off."""
    max_new_tokens: int = 1024
    greedy: bool = False
    """Evaluation decodes greedily."""
    logprobs: bool = True
    """Return the sampled tokens' log-probs (not greedy): only on the steps that need them (a cost per
    decode iteration; plan.rollout.logprobs_every)."""
    stop_token_ids: tuple[int, ...] = ()
    """A response ends after the first of these it samples (empty: the engine's tokenizer's eos)."""
    stop: tuple[str, ...] = ()
    """A response ends once its text contains one of these."""

    @classmethod
    def of(cls, generation: GenerationSettings) -> SamplingSettings:
        """The rollout's sampling of a job's plan."""
        return cls(
            temperature=generation.temperature,
            top_p=generation.top_p,
            top_k=generation.top_k,
            max_new_tokens=generation.max_new_tokens,
            stop_token_ids=generation.stop_token_ids,
            stop=generation.stop,
        )

    def for_eval(self) -> SamplingSettings:
        """Greedy decoding with the same ends and length."""
        return replace(self, greedy=True)


class RolloutEngine(Protocol):
    """What the loop needs from a rollout engine."""

    policy_version: int
    sync_ranks: int
    """Ranks the engine takes in the weight-sync group (its workers: vLLM's tensor-parallel ranks; one where
    the engine's own process receives a LoRA adapter)."""

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> Iterator[list[RolloutSample]]:
        """Yield the samples as soon as they are finished (any order), those that finish together (in one
        engine step) in one list: each yield is a Ray object to the loop, so a burst is one, not many."""
        ...

    def update_weights(self, weights: Sequence[tuple[str, torch.Tensor]], version: int) -> None:
        """Load the trainer's weights (Hugging Face names); later samples use them."""
        ...

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, names: Sequence[str], timeout_s: float
    ) -> None:
        """Join the weight-sync group (`sync/weight_sync.py`) as ranks `first_rank` .. `first_rank + sync_ranks - 1`."""
        ...

    def receive_weights(self, metas: Sequence[TensorMeta], bucket_bytes: int, version: int) -> None:
        """One streamed sync: load the trainer's weights as their buckets arrive; later samples use them."""
        ...

    def sequence_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """Log-prob of each response token under the engine's current weights."""
        ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...
