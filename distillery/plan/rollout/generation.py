"""How the student's responses are sampled and where they end, decided once for both rollout engines.

A chat model ends a turn on more than one token: Qwen's generation_config.json lists `<|im_end|>` and
`<|endoftext|>` as `eos_token_id`, while its tokenizer names only one of them. Stopping on the tokenizer's
alone lets a response run past the end of its turn to `maxNewTokens`, and trains the student on that tail.
The end tokens are therefore the union of every source; the plan cannot read the model's files, so the
runtime passes what it read (`end_token_ids`) and the engines translate `GenerationSettings` (vLLM's
SamplingParams, the transformers loop's own checks).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from distillery.api.spec import DistillationJobSpec

EndTokens = int | Sequence[int] | None
"""An `eos_token_id` as a config file spells it: one id, a list of ids, or absent."""

EVAL_SAMPLES_LOGGED = 16
"""Eval samples written to samples.jsonl at each eval, each scored by its teacher (its KL): a few to read,
and the scoring stays a small fraction of an eval's cost whatever the size of the eval set."""


@dataclass(frozen=True)
class GenerationSettings:
    """What every rollout request of the job is sampled with."""

    temperature: float
    top_p: float
    top_k: int
    """0 = off (the API's -1 is spelled 0 here, as vLLM does)."""
    max_new_tokens: int
    stop_token_ids: tuple[int, ...]
    """Every end token of the student, sorted: a response ends after the first it samples."""
    stop: tuple[str, ...]
    """`student.rollout.stop`: a response ends once its text contains one of them."""


def _ids(value: EndTokens) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def end_token_ids(*sources: EndTokens) -> tuple[int, ...]:
    """The union of the end tokens of every source (generation_config.json's and config.json's
    `eos_token_id`, the tokenizer's `eos_token_id`), sorted, each once; negative ids (a placeholder some
    configs carry) are dropped."""
    found: set[int] = set()
    for source in sources:
        found.update(i for i in _ids(source) if i >= 0)
    return tuple(sorted(found))


def resolve_generation(spec: DistillationJobSpec, end_ids: Iterable[int]) -> GenerationSettings:
    """The sampling settings of a job, given the student's end tokens (`end_token_ids`)."""
    rollout = spec.student.rollout
    return GenerationSettings(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=max(rollout.top_k, 0),
        max_new_tokens=rollout.max_new_tokens,
        stop_token_ids=tuple(sorted(set(end_ids))),
        stop=tuple(dict.fromkeys(rollout.stop)),
    )
