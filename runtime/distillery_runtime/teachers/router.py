"""Multi-teacher routing (MOPD): each sample goes to the teacher named by its `route` value.

The job's route table (`distillery.plan.teachers.routes`) decides which teacher takes a value: unknown values go to
the default teacher when there is one, otherwise they are an error naming the value and the known ones.
Teachers score concurrently; the results are merged back into input order and padded to one common T.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import numpy as np

from distillery.plan.teachers.routes import RouteTable
from distillery_runtime.teachers.dense import empty_scores
from distillery_runtime.teachers.types import ScoreRequest, Teacher, TeacherScores, UnknownRouteError


def assign_routes(samples: Sequence[ScoreRequest], routes: RouteTable) -> dict[str, list[int]]:
    """Group sample indices by the name of the teacher their route picks (the job's route table); pure."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        teacher = routes.teacher_for(s.route)
        if teacher is None:
            name = s.sample_id or f"#{i}"
            raise UnknownRouteError(
                f"sample {name} has route {s.route!r}, which matches no teacher; known routes: "
                f"{routes.known_routes()} and no default teacher is configured"
            )
        groups.setdefault(teacher, []).append(i)
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
    """Routes samples to teachers by `ScoreRequest.route` through the job's route table; itself a `Teacher`."""

    def __init__(self, routes: RouteTable, teachers: Mapping[str, Teacher]) -> None:
        """`teachers`: by name, every teacher the route table names."""
        if not teachers:
            raise ValueError("MultiTeacherScorer needs at least one teacher")
        self.routes = routes
        self.teachers = dict(teachers)

    def teacher_name(self, sample: ScoreRequest) -> str:
        """The name of the teacher that scores this sample; UnknownRouteError when none does."""
        return next(iter(assign_routes([sample], self.routes)))

    def teacher_for(self, sample: ScoreRequest) -> Teacher:
        return self.teachers[self.teacher_name(sample)]

    async def score(self, samples: Sequence[ScoreRequest], top_k: int) -> TeacherScores:
        if not samples:
            return empty_scores(top_k)
        groups = assign_routes(samples, self.routes)
        names = list(groups)
        results = await asyncio.gather(
            *(self.teachers[n].score([samples[i] for i in groups[n]], top_k) for n in names)
        )
        return merge_scores(
            [(groups[n], r) for n, r in zip(names, results, strict=True)], len(samples), top_k
        )

    async def score_one(self, sample: ScoreRequest, top_k: int) -> TeacherScores:
        """Streaming entry: score one sample with its teacher as soon as its rollout is done."""
        return await self.teacher_for(sample).score_one(sample, top_k)

    async def close(self) -> None:
        seen: set[int] = set()
        for t in self.teachers.values():
            if id(t) not in seen:
                seen.add(id(t))
                await t.close()
