"""Shared batch logic for teacher backends: validate, score each sample, pack in input order.

A backend implements `_limits()` (max_model_len, max_logprobs) and `_score_rows()`; `score`
and the per-sample streaming entry `score_one` are built on them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distillery_runtime.teachers.dense import check_sample, check_top_k, empty_scores, pack_rows
from distillery_runtime.teachers.types import ScoreRequest, TeacherScores

Rows = tuple[np.ndarray, np.ndarray, np.ndarray]


class BatchTeacher:
    """Base class: `score(samples, K)` -> dense `TeacherScores`; `score_one(sample, K)` -> B = 1."""

    name: str = "teacher"

    async def _limits(self) -> tuple[int | None, int | None]:
        return None, None

    async def _score_rows(self, samples: Sequence[ScoreRequest], top_k: int) -> list[Rows]:
        raise NotImplementedError

    async def validate(self, samples: Sequence[ScoreRequest], top_k: int) -> None:
        """Raise the clear error (K limit, too long, empty prompt) before any scoring work."""
        max_model_len, max_logprobs = await self._limits()
        check_top_k(top_k, max_logprobs, self.name)
        for i, s in enumerate(samples):
            check_sample(s, i, max_model_len, self.name)

    async def score(self, samples: Sequence[ScoreRequest], top_k: int) -> TeacherScores:
        if not samples:
            check_top_k(top_k, None, self.name)
            return empty_scores(top_k)
        await self.validate(samples, top_k)
        rows = await self._score_rows(samples, top_k)
        return pack_rows(rows, top_k, [s.sample_id for s in samples])

    async def score_one(self, sample: ScoreRequest, top_k: int) -> TeacherScores:
        """Score one sample as soon as its rollout finishes (streaming use); B = 1."""
        return await self.score([sample], top_k)

    async def score_each(self, samples: Sequence[ScoreRequest], top_k: int) -> list[TeacherScores]:
        """Score the samples together; each one's scores (B = 1), in order (a coalesced request's answer)."""
        await self.validate(samples, top_k)
        rows = await self._score_rows(samples, top_k) if samples else []
        return [pack_rows([r], top_k, [s.sample_id]) for r, s in zip(rows, samples, strict=True)]

    async def close(self) -> None:
        return None
