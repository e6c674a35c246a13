"""Multi-teacher routing (MOPD): each sample goes to the teacher named by its `route` value.

Unknown values go to the default teacher when there is one, otherwise they are an error
naming the value and the known ones. Teachers score concurrently; the results are merged
back into input order and padded to one common T.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import numpy as np

from distillery_runtime.teachers.dense import empty_scores
from distillery_runtime.teachers.types import ScoreRequest, Teacher, TeacherScores, UnknownRouteError


def assign_routes(
    samples: Sequence[ScoreRequest], known: Sequence[str], has_default: bool
) -> dict[str | None, list[int]]:
    """Group sample indices by teacher key (None = the default teacher); pure."""
    groups: dict[str | None, list[int]] = {}
    known_set = set(known)
    for i, s in enumerate(samples):
        if s.route in known_set:
            key: str | None = s.route
        elif has_default:
            key = None
        else:
            name = s.sample_id or f"#{i}"
            raise UnknownRouteError(
                f"sample {name} has route {s.route!r}, which matches no teacher; known routes: "
                f"{sorted(known_set)} and no default teacher is configured"
            )
        groups.setdefault(key, []).append(i)
    return groups


def merge_scores(
    parts: Sequence[tuple[Sequence[int], TeacherScores]], batch: int, top_k: int
) -> TeacherScores:
    """Scatter per-teacher results (with their input indices) into one padded batch."""
    width = max((p.mask.shape[1] for _, p in parts), default=0)
    out = empty_scores(top_k, batch)
    out.topk_ids = np.zeros((batch, width, top_k), np.int32)
    out.topk_logprobs = np.full((batch, width, top_k), -np.inf, np.float32)
    out.token_logprobs = np.full((batch, width), -np.inf, np.float32)
    out.mask = np.zeros((batch, width), bool)
    out.sample_ids = [""] * batch
    for index, p in parts:
        idx = np.asarray(index, np.int64)
        t = p.mask.shape[1]
        out.topk_ids[idx, :t] = p.topk_ids
        out.topk_logprobs[idx, :t] = p.topk_logprobs
        out.token_logprobs[idx, :t] = p.token_logprobs
        out.mask[idx, :t] = p.mask
        for j, i in enumerate(index):
            out.sample_ids[i] = p.sample_ids[j] if p.sample_ids else ""
    return out


class MultiTeacherScorer:
    """Routes samples to teachers by `ScoreRequest.route`; itself a `Teacher`."""

    def __init__(self, teachers: Mapping[str, Teacher], default: Teacher | None = None) -> None:
        if not teachers and default is None:
            raise ValueError("MultiTeacherScorer needs at least one teacher")
        self.teachers = dict(teachers)
        self.default = default

    def teacher_for(self, sample: ScoreRequest, index: int = 0) -> Teacher:
        key = next(iter(assign_routes([sample], list(self.teachers), self.default is not None)))
        return self._teacher(key)

    def _teacher(self, key: str | None) -> Teacher:
        if key is not None:
            return self.teachers[key]
        # assign_routes gives the key None only when it was told there is a default.
        assert self.default is not None
        return self.default

    async def score(self, samples: Sequence[ScoreRequest], top_k: int) -> TeacherScores:
        if not samples:
            return empty_scores(top_k)
        groups = assign_routes(samples, list(self.teachers), self.default is not None)
        keys = list(groups)
        results = await asyncio.gather(
            *(self._teacher(k).score([samples[i] for i in groups[k]], top_k) for k in keys)
        )
        return merge_scores([(groups[k], r) for k, r in zip(keys, results, strict=True)], len(samples), top_k)

    async def score_one(self, sample: ScoreRequest, top_k: int) -> TeacherScores:
        """Streaming entry: score one sample with its teacher as soon as its rollout is done."""
        return await self.teacher_for(sample).score([sample], top_k)

    async def close(self) -> None:
        seen: set[int] = set()
        for t in [*self.teachers.values(), *([self.default] if self.default else [])]:
            if id(t) not in seen:
                seen.add(id(t))
                await t.close()
