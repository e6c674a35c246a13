"""The teacher-scoring contract: what goes in (`ScoreRequest`), what comes out (`TeacherScores`),
the `Teacher` protocol every backend implements, and the errors retrying cannot fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class ScoreRequest:
    """One student sample to score: the teacher sees `prompt_ids + response_ids` and returns
    log-probs for the response positions only. `route` picks the teacher (multi-teacher)."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    sample_id: str = ""
    route: str | None = None


@dataclass(slots=True)
class TeacherScores:
    """Dense, padded teacher outputs for a batch, in the order of the input samples.

    Shapes: `topk_ids` int32 [B, T, K], `topk_logprobs` float32 [B, T, K] (rank order, best
    first), `token_logprobs` float32 [B, T] (log-prob of the sampled response token), `mask`
    bool [B, T]. T is the longest response; padding is id 0, log-prob -inf, mask False.
    """

    topk_ids: np.ndarray
    topk_logprobs: np.ndarray
    token_logprobs: np.ndarray
    mask: np.ndarray
    sample_ids: list[str] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.topk_ids.shape[2])

    def lengths(self) -> np.ndarray:
        """Number of scored response positions per sample."""
        return self.mask.sum(axis=1)


@runtime_checkable
class Teacher(Protocol):
    """Anything that scores a batch of samples with one teacher model."""

    async def score(self, samples: Sequence[ScoreRequest], top_k: int) -> TeacherScores: ...

    async def score_one(self, sample: ScoreRequest, top_k: int) -> TeacherScores:
        """One sample the moment its rollout ends (a client may send it together with others)."""
        ...

    async def close(self) -> None: ...


class TeacherError(RuntimeError):
    """Base class for teacher-scoring failures."""


class TopKLimitError(TeacherError):
    """K is above what the teacher allows (`--max-logprobs`); retrying cannot help."""


class SequenceTooLongError(TeacherError):
    """A sample does not fit in the teacher's context window."""


class InvalidSampleError(TeacherError):
    """A sample the teacher cannot score (for example an empty prompt)."""


class UnknownRouteError(TeacherError, KeyError):
    """A sample's route value matches no teacher and there is no default teacher."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TeacherUnavailableError(TeacherError):
    """The teacher could not be reached (or kept failing) within the bounded retry time."""


class TokenizerMismatchError(TeacherError):
    """Student and teacher tokenizers map tokens differently."""


class TeacherAccessError(TeacherError):
    """The teacher's certificate is not trusted, or it refused our API key (or its lack): retrying cannot
    help, so the first such answer ends the wait with one line naming the teacher and the reason."""
