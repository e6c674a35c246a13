"""Turn a vLLM OpenAI `/v1/completions` answer with `prompt_logprobs` into response-position
arrays, aligned with the student's tokens.

The rules (FIELD.md, "vLLM facts that bite"): `prompt_logprobs[0]` is null; each entry is a
dict keyed by token id *as a string*; it holds the top K plus the actual token when that one
is outside the top K (K or K+1 entries); dict order is not rank order (the actual token is
inserted first). msgspec decodes the keys straight to ints and skips `decoded_token`
without building a string per entry; the rest is vectorised with numpy.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from operator import attrgetter

import msgspec
import numpy as np

from distillery_runtime.teachers.types import TeacherError


# gc=False: tens of thousands of entries per answer; they hold no references, so the
# garbage collector need not track (and repeatedly scan) them
class _Entry(msgspec.Struct, gc=False):
    logprob: float
    rank: int = 0


class _Choice(msgspec.Struct, gc=False):
    prompt_logprobs: list[dict[int, _Entry] | None] | None = None


class _Completion(msgspec.Struct, gc=False):
    choices: list[_Choice]


_decoder = msgspec.json.Decoder(_Completion)
_LOGPROB, _RANK = attrgetter("logprob"), attrgetter("rank")


def parse_completion(
    body: bytes, prompt_len: int, response_ids: Sequence[int], top_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (topk_ids int32 [T, K], topk_logprobs float32 [T, K], token_logprobs float32 [T])
    for the T = len(response_ids) response positions of one scored sequence."""
    plp = _decoder.decode(body).choices[0].prompt_logprobs
    n_resp = len(response_ids)
    if plp is None or len(plp) != prompt_len + n_resp:
        got = None if plp is None else len(plp)
        raise TeacherError(f"teacher returned {got} prompt_logprobs entries, expected {prompt_len + n_resp}")
    rows = plp[prompt_len:]
    if any(row is None for row in rows):  # vLLM leaves only the first prompt position without entries
        raise TeacherError("teacher returned no prompt_logprobs for a response position")
    return rows_from_entries(rows, response_ids, top_k)  # type: ignore[arg-type]  # None excluded above


def rows_from_entries(
    rows: Sequence[dict[int, _Entry]], response_ids: Sequence[int], top_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised alignment of per-position entry dicts (see the module docstring)."""
    n_pos = len(rows)
    if n_pos == 0:
        return np.zeros((0, top_k), np.int32), np.zeros((0, top_k), np.float32), np.zeros(0, np.float32)
    counts = np.fromiter(map(len, rows), np.int64, n_pos)
    total = int(counts.sum())
    ids = np.fromiter(itertools.chain.from_iterable(rows), np.int64, total)
    entries = list(itertools.chain.from_iterable(d.values() for d in rows))
    # map + attrgetter: the per-entry step runs in C, no Python frame per entry
    lps = np.fromiter(map(_LOGPROB, entries), np.float64, total)
    ranks = np.fromiter(map(_RANK, entries), np.int64, total)

    row = np.repeat(np.arange(n_pos), counts)
    actual = np.asarray(response_ids, np.int64)[row] == ids
    token_lp = np.full(n_pos, np.nan)
    token_lp[row[actual]] = lps[actual]
    if np.isnan(token_lp).any():
        bad = int(np.flatnonzero(np.isnan(token_lp))[0])
        raise TeacherError(f"teacher answer lacks the actual token at response position {bad}")

    # K+1 entries: the actual token is outside the top K and is the extra one.
    keep = ~(actual & (counts[row] == top_k + 1))
    if int(keep.sum()) != n_pos * top_k:
        raise TeacherError(
            f"teacher answer has {int(keep.sum())} top-k entries for {n_pos} positions, expected K={top_k} "
            "each (is the teacher's vocabulary smaller than K?)"
        )
    kid = ids[keep].reshape(n_pos, top_k)
    klp = lps[keep].reshape(n_pos, top_k)
    krank = ranks[keep].reshape(n_pos, top_k)
    order = np.lexsort((-klp, krank), axis=-1)
    return (
        np.take_along_axis(kid, order, -1).astype(np.int32),
        np.take_along_axis(klp, order, -1).astype(np.float32),
        token_lp.astype(np.float32),
    )
