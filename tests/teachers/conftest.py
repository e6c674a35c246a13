"""Fixtures for teacher-scoring tests: student-like samples and a transformers reference."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from distillery_runtime.teachers import ScoreRequest

# bf16 tolerance for log-probs: the tiny models' logits have magnitudes of a few units, and
# bf16 keeps 8 bits of mantissa; measured differences between vLLM and transformers are
# < 0.1 nat, a one-position misalignment moves log-probs by ~1 nat on these models.
BF16_ATOL = 0.15


def make_samples(
    n: int, vocab: int, seed: int, *, max_prompt: int = 40, max_response: int = 120
) -> list[ScoreRequest]:
    """Samples of different lengths (one with an empty response), like a student's batch."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = int(rng.integers(1, max_prompt))
        r = 0 if i == 1 else int(rng.integers(1, max_response))
        out.append(
            ScoreRequest(
                rng.integers(4, vocab, p).tolist(), rng.integers(4, vocab, r).tolist(), f"s{i}", None
            )
        )
    return out


@pytest.fixture(scope="session")
def hf_reference() -> Callable[..., list[torch.Tensor]]:
    """`ref(model_dir, samples, dtype=bfloat16)` -> per sample, the transformers log-probs [T, V] (float32)
    that predict each response token: a plain forward pass on prompt + response, of that sample alone."""
    from transformers import AutoModelForCausalLM

    models: dict[tuple[Path, torch.dtype], torch.nn.Module] = {}

    def ref(
        model_dir: Path, samples: Sequence[ScoreRequest], dtype: torch.dtype = torch.bfloat16
    ) -> list[torch.Tensor]:
        key = (model_dir, dtype)
        if key not in models:
            models[key] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        out = []
        for s in samples:
            ids = torch.tensor([[*s.prompt_ids, *s.response_ids]])
            with torch.no_grad():
                logits = models[key](ids).logits[0].float()
            p = len(s.prompt_ids)
            out.append(torch.log_softmax(logits, -1)[p - 1 : p - 1 + len(s.response_ids)])
        return out

    return ref


def assert_matches_reference(scores, samples: Sequence[ScoreRequest], refs: Sequence[torch.Tensor]) -> None:
    """Every response position of every sample: the sampled token's log-prob, the log-probs at
    the teacher's top-k ids, and the top-k values themselves match transformers."""
    k = scores.top_k
    for i, (s, ref) in enumerate(zip(samples, refs, strict=True)):
        t = len(s.response_ids)
        assert scores.mask[i].sum() == t and scores.mask[i, :t].all()
        if t == 0:
            continue
        resp = torch.tensor(s.response_ids)
        want_tok = ref.gather(1, resp[:, None])[:, 0].numpy()
        np.testing.assert_allclose(scores.token_logprobs[i, :t], want_tok, atol=BF16_ATOL, rtol=0)
        if k == 0:
            continue
        ids = torch.from_numpy(scores.topk_ids[i, :t].astype(np.int64))
        np.testing.assert_allclose(
            scores.topk_logprobs[i, :t], ref.gather(1, ids).numpy(), atol=BF16_ATOL, rtol=0
        )
        np.testing.assert_allclose(
            scores.topk_logprobs[i, :t], ref.topk(k, -1).values.numpy(), atol=BF16_ATOL, rtol=0
        )
        assert (np.diff(scores.topk_logprobs[i, :t], axis=-1) <= 0).all(), "top-k not in rank order"
