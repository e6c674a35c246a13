"""A rollout's requests and responses in vLLM's terms: the plan's sampling as `SamplingParams`, a finished
request as a `RolloutSample`, and a sequence's scoring request and its response tokens' log-probs.

Translation only: the engine (`vllm_engine.VllmRolloutEngine`) decides when to send and what to sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings


def sampling_params(sampling: SamplingSettings, seed: int) -> Any:
    """The `SamplingParams` of one request of a generate call (`seed`: the request's)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    # Stop strings are matched on the text, which only detokenizing gives; the token ids that wrote one
    # stay in the response (only the text is cut), as the transformers engine keeps them.
    greedy = sampling.greedy
    return SamplingParams(
        max_tokens=sampling.max_new_tokens,
        stop_token_ids=list(sampling.stop_token_ids),
        stop=list(sampling.stop),
        detokenize=bool(sampling.stop),
        temperature=0.0 if greedy else sampling.temperature,
        top_p=1.0 if greedy else sampling.top_p,
        top_k=0 if greedy else sampling.top_k,
        seed=None if greedy else seed,
        # The sampled token's own log-prob (raw model log-probs: vLLM's default mode), where asked for
        # (plan.rollout.logprobs_every); greedy eval's too, for the KL of its responses under the teachers.
        logprobs=0 if sampling.logprobs else None,
        # Only a finished request's output (as `LLM.generate` asks): the default (cumulative) builds
        # every running request's output, its token list copied, at every decode iteration. The rollout
        # of the e2e bench's small bf16 student (32 x 128 tokens), alternating in one process: 1.34 ->
        # 1.30 s (bench/README.md).
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def rollout_sample(request: GenerationRequest, output: Any, policy_version: int) -> RolloutSample:
    """A finished `RequestOutput` of `request` as the sample the loop trains on, sampled with the weights of
    `policy_version`."""
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [
            # Sampled positions always carry entries (only prompt position 0 has None).
            entry[token].logprob
            for entry, token in zip(completion.logprobs, ids, strict=True)
        ]
    return RolloutSample(
        sample_id=request.sample_id,
        prompt_ids=list(request.prompt_ids),
        response_ids=ids,
        logprobs=logprobs,
        route=request.route,
        answer=request.answer,
        policy_version=policy_version,
        finish_reason=completion.finish_reason,
    )


def sequence_scoring_params() -> Any:
    """One sequence scored, not extended: its prompt log-probs, the sampled token's own, raw."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)


def response_logprobs(output: Any, prompt_len: int, response_ids: Sequence[int]) -> list[float]:
    """Each response token's log-prob from the prompt log-probs of the request that scored the whole
    sequence (its prompt `prompt_len` tokens long)."""
    entries = output.prompt_logprobs or []
    result = []
    for i, token in enumerate(response_ids):
        row = entries[prompt_len + i]
        if row is None:  # only the first prompt position has no entries
            raise RuntimeError("vLLM returned no prompt log-probs for a response position")
        result.append(row[token].logprob)
    return result
