"""Score sequences with an in-process vLLM engine (`AsyncLLM`) and get top-k as arrays.

vLLM's engine core already ships prompt log-probs as tensors (`LogprobsTensors`: ids and
log-probs [positions, K+1], the actual token in column 0, then the top K in rank order). Its
front end then turns every entry into Python objects (`tolist`, one `Logprob` per entry,
optionally a decoded string each) which is what makes large K slow. Requests flagged with
`extra_args={"distillery_compact": True}` skip that: `install_tensor_logprobs()` swaps in a
subclass of `LogprobsProcessor` that keeps the tensors as numpy arrays and leaves every other
request untouched. It patches one module attribute of vLLM 0.32
(`vllm.v1.engine.output_processor.LogprobsProcessor`) and checks that it exists, so a vLLM
upgrade that moves it fails at start-up, not with wrong numbers.

Used by the teacher server (compact endpoint) and by colocated teachers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import output_processor as _output_processor
from vllm.v1.engine.logprobs import LogprobsProcessor

from distillery_runtime.teachers.types import TeacherError
from distillery_runtime.teachers.wire import WireSequence

COMPACT_FLAG = "distillery_compact"


class TensorPromptLogprobs:
    """Stands in for vLLM's per-entry prompt log-prob list: numpy chunks, one per prefill chunk."""

    __slots__ = ("ids", "logprobs")

    def __init__(self) -> None:
        self.ids: list[np.ndarray] = []
        self.logprobs: list[np.ndarray] = []

    def __bool__(self) -> bool:
        return bool(self.ids)

    def __len__(self) -> int:
        # vLLM's list starts with a None for position 0
        return 1 + sum(len(c) for c in self.ids)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids int [L-1, K+1], logprobs float32 [L-1, K+1]) for positions 1..L-1."""
        if len(self.ids) == 1:
            return self.ids[0], self.logprobs[0]
        return np.concatenate(self.ids), np.concatenate(self.logprobs)


class TensorLogprobsProcessor(LogprobsProcessor):
    """`LogprobsProcessor` that keeps prompt log-probs of flagged requests as arrays."""

    @classmethod
    def from_new_request(cls, tokenizer, request):  # type: ignore[no-untyped-def]
        proc = super().from_new_request(tokenizer, request)
        params = request.sampling_params
        flagged = params is not None and params.extra_args and params.extra_args.get(COMPACT_FLAG)
        if flagged and proc.prompt_logprobs is not None:
            proc.prompt_logprobs = TensorPromptLogprobs()  # type: ignore[assignment]
        return proc

    def _update_prompt_logprobs(self, prompt_logprobs_tensors) -> None:  # type: ignore[no-untyped-def]
        holder = self.prompt_logprobs
        if not isinstance(holder, TensorPromptLogprobs):
            super()._update_prompt_logprobs(prompt_logprobs_tensors)
            return
        token_ids, logprobs = prompt_logprobs_tensors[0], prompt_logprobs_tensors[1]
        # copy: the tensors may be views of a receive buffer that vLLM reuses
        holder.ids.append(token_ids.numpy().astype(np.int32))
        holder.logprobs.append(logprobs.numpy().astype(np.float32, copy=True))


def install_tensor_logprobs() -> None:
    """Route prompt log-probs of flagged requests around vLLM's per-entry Python objects."""
    current = getattr(_output_processor, "LogprobsProcessor", None)
    if current is None or not issubclass(current, LogprobsProcessor):
        raise RuntimeError(
            "vllm.v1.engine.output_processor.LogprobsProcessor not found: this vLLM version is not "
            "supported by the compact scoring path (written for vLLM 0.32)"
        )
    if current is not TensorLogprobsProcessor:
        _output_processor.LogprobsProcessor = TensorLogprobsProcessor  # type: ignore[misc]


def scoring_params(top_k: int) -> SamplingParams:
    # max_tokens=1: vLLM must generate something; greedy so no sampling work. Prompt
    # log-probs are the raw model log-probs (logprobs_mode default), independent of temperature.
    return SamplingParams(
        max_tokens=1,
        temperature=0.0,
        prompt_logprobs=top_k,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
        extra_args={COMPACT_FLAG: True},
    )


async def score_one_sequence(
    engine, seq: WireSequence, top_k: int, params: SamplingParams | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(topk_ids int32 [T, K], topk_logprobs float32 [T, K], token_logprobs float32 [T]) for the
    response positions (index >= prompt_len) of one sequence."""
    params = params or scoring_params(top_k)
    final = None
    async for out in engine.generate(
        TokensPrompt(prompt_token_ids=list(seq.token_ids)), params, request_id=f"dscore-{uuid.uuid4().hex}"
    ):
        final = out
    return response_rows(final, seq)


def response_rows(output: Any, seq: WireSequence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A finished request's (top-k ids [T, K], top-k log-probs [T, K], token log-probs [T]) at the response
    positions of `seq`, from its tensor prompt log-probs."""
    holder = None if output is None else output.prompt_logprobs
    if not isinstance(holder, TensorPromptLogprobs):
        raise TeacherError(
            "engine returned no tensor prompt log-probs (is install_tensor_logprobs() in effect?)"
        )
    ids, lps = holder.arrays()
    n = len(seq.token_ids)
    if len(ids) != n - 1:
        raise TeacherError(f"engine returned {len(ids)} prompt log-prob rows for {n} tokens")
    # row i scores token i+1; response tokens are prompt_len..n-1
    lo = seq.prompt_len - 1
    return ids[lo:, 1:], lps[lo:, 1:], lps[lo:, 0]


async def score_sequences(
    engine, seqs: Sequence[WireSequence], top_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Score all sequences concurrently (the engine batches them); returns concatenated
    (lengths [n], topk_ids [sum T, K], topk_logprobs [sum T, K], token_logprobs [sum T])."""
    params = scoring_params(top_k)
    rows = await asyncio.gather(*(score_one_sequence(engine, s, top_k, params) for s in seqs))
    lengths = np.array([len(r[2]) for r in rows], np.int32)
    if not rows:
        return (
            lengths,
            np.zeros((0, top_k), np.int32),
            np.zeros((0, top_k), np.float32),
            np.zeros(0, np.float32),
        )
    return (
        lengths,
        np.concatenate([r[0] for r in rows]),
        np.concatenate([r[1] for r in rows]),
        np.concatenate([r[2] for r in rows]),
    )
