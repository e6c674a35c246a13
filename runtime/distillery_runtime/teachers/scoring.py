"""Teacher wiring for the loop: build the scoring clients from the resolved config, score one sample at
a time as rollouts finish, and keep per-teacher counts and latencies for the metrics.

standalone teachers are reached through the compact endpoint of our teacher server, external ones
through the OpenAI JSON API, the ones computed in the run's processes (colocated ones, and those the plan
scores with the transformers forward) through a Ray actor holding their engine
(`workers.InProcessTeacherWorker`), put to sleep while the student trains where it can sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from distillery.plan import JobPlan
from distillery.plan.teachers.engines import EngineSettings
from distillery.runtime_config import ResolvedTeacher, TeacherProtocol
from distillery_runtime.teachers.clients.coalesce import Coalescer
from distillery_runtime.teachers.clients.outage import OutageTracker
from distillery_runtime.teachers.clients.retry import RetryPolicy
from distillery_runtime.teachers.router import MultiTeacherScorer
from distillery_runtime.teachers.types import ScoreRequest, Teacher, TeacherScores, TeacherUnavailableError


@dataclass
class TeacherStats:
    """What scoring did in one step, per teacher name."""

    samples: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


class RayTeacher:
    """A `Teacher` whose engine lives in a Ray actor of the run (`workers.InProcessTeacherWorker`). Samples
    scored one by one as the rollout streams them share calls (`teachers.coalesce`), as a served teacher's
    share requests: one Ray call and one forward for a step's samples held until its rollout ends."""

    def __init__(
        self, name: str, actor: Any, *, in_flight: int = 1, max_tokens: int = 16384, hosted: bool = False
    ) -> None:
        """`hosted`: the actor is the trainer's, which scores this teacher among its other calls
        (`workers.TrainerWithRollout`, its `teacher_*` calls by name); else the teacher's own actor."""
        self.name = name
        self.actor = actor
        self.hosted = hosted
        self.coalescer = Coalescer(self._score_each, in_flight=in_flight, max_tokens=max_tokens)

    async def _score_each(self, samples: Sequence[ScoreRequest], top_k: int) -> list[TeacherScores]:
        if self.hosted:
            return await self.actor.teacher_score_each.remote(self.name, list(samples), top_k)
        return await self.actor.score_each.remote(list(samples), top_k)

    async def score(self, samples: Sequence[ScoreRequest], top_k: int) -> TeacherScores:
        if self.hosted:
            return await self.actor.teacher_score.remote(self.name, list(samples), top_k)
        return await self.actor.score.remote(list(samples), top_k)

    async def score_one(self, sample: ScoreRequest, top_k: int) -> TeacherScores:
        return await self.coalescer.score_one(sample, top_k)

    async def sleep(self) -> None:
        if not self.hosted:  # a forward on the trainer's device holds no engine to put to sleep
            await self.actor.sleep.remote()

    async def wake_up(self) -> None:
        if not self.hosted:
            await self.actor.wake_up.remote()

    async def close(self) -> None:
        await self.coalescer.close()


def client_retry(outage_budget_seconds: float) -> RetryPolicy:
    """How long one scoring call retries before its teacher counts as down: RetryPolicy's default, or a
    quarter of a smaller outage budget, so that the outage wait (live-reported) is most of the budget."""
    default = RetryPolicy()
    if 0 < outage_budget_seconds / 4 < default.total_timeout:
        seconds = outage_budget_seconds / 4
        return RetryPolicy(total_timeout=seconds, request_timeout=min(default.request_timeout, seconds))
    return default


def build_client(
    teacher: ResolvedTeacher,
    engine: EngineSettings,
    in_process_actor: Any | None = None,
    retry: RetryPolicy | None = None,
    job: str | None = None,
    hosted: bool = False,
) -> Teacher:
    """The scoring client of one resolved teacher, at its endpoints and within its engine's limits. `job`:
    the job's identity (`wire.job_identity`), sent with each request to our teacher server (a shared
    teacher shares its engine fairly among the jobs it serves and accounts for each by it). `hosted`: the
    in-process actor is the trainer's (`RayTeacher`)."""
    retry = retry or RetryPolicy()
    if teacher.protocol in (TeacherProtocol.COMPACT, TeacherProtocol.OPENAI):
        from distillery_runtime.teachers.access import client_access

        # TLS, CA bundle, key and DNS re-resolution as the plan decided them (`plan.teacher_client`).
        access = client_access(teacher.name, teacher.client, teacher.endpoints)
    if teacher.protocol == TeacherProtocol.COMPACT:
        from distillery_runtime.teachers.clients.compact_http import CompactTeacher

        return CompactTeacher(
            teacher.endpoints,
            name=teacher.name,
            max_logprobs=engine.max_logprobs,
            max_model_len=engine.max_model_len,
            concurrency=engine.max_concurrency,
            batch_size=1,
            resolve_dns=access.settings.resolve_dns,
            access=access,
            retry=retry,
            coalesce=(engine.coalesced_in_flight, engine.request_tokens),
            job=job,
        )
    if teacher.protocol == TeacherProtocol.OPENAI:
        from distillery_runtime.teachers.clients.openai_http import OpenAITeacher

        return OpenAITeacher(
            teacher.endpoints,
            engine.served_model_name,
            name=teacher.name,
            concurrency=engine.max_concurrency,
            resolve_dns=access.settings.resolve_dns,
            access=access,
            retry=retry,
        )
    if in_process_actor is None:
        raise ValueError(f"teacher {teacher.name}: a teacher computed in the run needs its engine actor")
    return RayTeacher(
        teacher.name,
        in_process_actor,
        in_flight=engine.coalesced_in_flight,
        max_tokens=engine.request_tokens,
        hosted=hosted,
    )


class TeacherScoring:
    """All teachers of a job behind one router, with per-teacher bookkeeping."""

    def __init__(
        self, plan: JobPlan, clients: Mapping[str, Teacher], outages: OutageTracker | None = None
    ) -> None:
        """`clients`: by teacher name."""
        self.clients = dict(clients)
        self.outages = outages or OutageTracker(0.0)
        """Without a tracker (budget 0) the first TeacherUnavailableError ends the run, as before."""
        self.top_k = plan.top_k
        self.router = MultiTeacherScorer(plan.routes, self.clients)
        self.stats = TeacherStats()

    def teacher_name(self, request: ScoreRequest) -> str:
        return self.router.teacher_name(request)

    async def score_one(self, request: ScoreRequest) -> tuple[str, TeacherScores]:
        """Score one sample with its routed teacher; returns the teacher's name and the scores."""
        name = self.teacher_name(request)
        started = time.perf_counter()
        while True:
            try:
                scores = await self.router.score_one(request, self.top_k)
                break
            except TeacherUnavailableError as error:
                # The client's own retries are spent: wait for the teacher (or give up past the budget).
                await asyncio.sleep(self.outages.failed(name, str(error)))
        self.outages.recovered(name)
        self.stats.seconds[name].append(time.perf_counter() - started)
        self.stats.samples[name] += 1
        return name, scores

    def take_stats(self) -> TeacherStats:
        stats, self.stats = self.stats, TeacherStats()
        return stats

    def retries(self) -> dict[str, int]:
        """Retries so far per teacher, where the client's transport counts them."""
        from distillery_runtime.teachers.clients.compact_http import CompactTeacher
        from distillery_runtime.teachers.clients.openai_http import OpenAITeacher

        return {
            name: client.transport.retries
            for name, client in self.clients.items()
            if isinstance(client, CompactTeacher | OpenAITeacher)
        }

    async def sleep(self) -> None:
        for client in self.clients.values():
            if isinstance(client, RayTeacher):
                await client.sleep()

    async def wake_up(self) -> None:
        for client in self.clients.values():
            if isinstance(client, RayTeacher):
                await client.wake_up()

    async def close(self) -> None:
        await self.router.close()
