"""Pure array helpers: check samples against a teacher's limits, and pack per-sample results
into the padded `TeacherScores` layout (ids 0, log-probs -inf, mask False)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distillery_runtime.teachers.types import (
    InvalidSampleError,
    ScoreRequest,
    SequenceTooLongError,
    TeacherScores,
    TopKLimitError,
)


def empty_scores(top_k: int, batch: int = 0) -> TeacherScores:
    """Scores for `batch` samples with no response positions (T = 0)."""
    return TeacherScores(
        topk_ids=np.zeros((batch, 0, top_k), np.int32),
        topk_logprobs=np.zeros((batch, 0, top_k), np.float32),
        token_logprobs=np.zeros((batch, 0), np.float32),
        mask=np.zeros((batch, 0), bool),
    )


def check_top_k(top_k: int, max_logprobs: int | None, teacher: str) -> None:
    """Refuse K outside [0, the teacher's --max-logprobs] with the flag to raise."""
    if top_k < 0:
        raise TopKLimitError(f"teacher {teacher}: top_k must be >= 0, got {top_k}")
    if max_logprobs is not None and max_logprobs >= 0 and top_k > max_logprobs:
        raise TopKLimitError(
            f"teacher {teacher}: top_k={top_k} is above the server's limit of {max_logprobs}; "
            f"start the teacher with `--max-logprobs {top_k}` (or more), or lower top_k"
        )


def check_sample(sample: ScoreRequest, index: int, max_model_len: int | None, teacher: str) -> None:
    """Refuse samples the teacher cannot score, naming the sample and the limits.

    vLLM scores a prompt only if it leaves room for one generated token, so the scored
    sequence (prompt + response) must be at most max_model_len - 1 tokens.
    """
    name = sample.sample_id or f"#{index}"
    if len(sample.prompt_ids) == 0:
        raise InvalidSampleError(
            f"teacher {teacher}: sample {name} has an empty prompt; the first response token "
            "needs at least one token of context to be scored"
        )
    total = len(sample.prompt_ids) + len(sample.response_ids)
    if max_model_len is not None and total > max_model_len - 1:
        raise SequenceTooLongError(
            f"teacher {teacher}: sample {name} has {total} tokens (prompt {len(sample.prompt_ids)} + "
            f"response {len(sample.response_ids)}), above the teacher's limit of {max_model_len - 1} "
            f"(max_model_len {max_model_len} minus one token to generate); raise the teacher's "
            "--max-model-len or shorten the sample"
        )


def pack_flat(
    lengths: np.ndarray,
    topk_ids: np.ndarray,
    topk_logprobs: np.ndarray,
    token_logprobs: np.ndarray,
    top_k: int,
    sample_ids: Sequence[str] = (),
) -> TeacherScores:
    """Scatter concatenated per-sample rows ([sum(lengths), K] and [sum(lengths)]) into the
    padded [B, T, K] layout. Boolean-mask assignment fills rows in C order, which is exactly
    the concatenation order, so there is no per-sample Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    batch = len(lengths)
    width = int(lengths.max()) if batch else 0
    mask = np.arange(width)[None, :] < lengths[:, None]
    ids = np.zeros((batch, width, top_k), np.int32)
    lps = np.full((batch, width, top_k), -np.inf, np.float32)
    tok = np.full((batch, width), -np.inf, np.float32)
    total = int(lengths.sum())
    ids[mask] = topk_ids.reshape(total, top_k)
    lps[mask] = topk_logprobs.reshape(total, top_k)
    tok[mask] = token_logprobs.reshape(-1)
    return TeacherScores(ids, lps, tok, mask, list(sample_ids))


def pack_rows(
    rows: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], top_k: int, sample_ids: Sequence[str] = ()
) -> TeacherScores:
    """Pad a list of per-sample (topk_ids [T_i, K], topk_logprobs [T_i, K], token_logprobs [T_i])."""
    if not rows:
        return empty_scores(top_k)
    lengths = np.array([len(r[2]) for r in rows], np.int64)
    return pack_flat(
        lengths,
        np.concatenate([r[0].reshape(len(r[2]), top_k) for r in rows]),
        np.concatenate([r[1].reshape(len(r[2]), top_k) for r in rows]),
        np.concatenate([r[2].reshape(-1) for r in rows]),
        top_k,
        sample_ids,
    )
