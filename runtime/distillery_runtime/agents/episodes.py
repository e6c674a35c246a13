"""The episode runner: a step's rollouts as multi-turn episodes with an environment (`spec.environment`).

Each turn of every live episode is one batched call of the rollout engines (`RolloutPool.generate`), so
vLLM and the transformers engine, one replica or several, all play episodes. A turn is sampled from the
prompt and everything the episode wrote so far, with its own seed (derived from its request's); it ends at
an end token (the student answered), at a tool call's end string (`plan.episodes`: the environment's
observation is appended and the student goes on) or at its token limit. Every token keeps who wrote it
(`student_mask`): the loss, the eval KL and the metrics count the student's only. An environment call
that fails ends its episode, kept as far as it went and counted; the run goes on."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from distillery.plan.agents.episodes import EpisodeSettings
from distillery_runtime.agents.environments import EnvironmentFailure, Environments, EnvironmentSession
from distillery_runtime.agents.observations import ObservationEncoder
from distillery_runtime.data.samples import EpisodeStats, RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings

log = logging.getLogger("distillery.runtime")

Generate = Callable[[Sequence[GenerationRequest], SamplingSettings], Awaitable[list[RolloutSample]]]
"""The rollout pool's `generate`: the requests' samples (in any order)."""

ENDED_AT_TURNS = "max_turns"
"""The finish reason of an episode whose last allowed turn called a tool (the call goes unanswered)."""
ENDED_BY_ENVIRONMENT = "environment_failure"
"""The finish reason of an episode an environment call ended (raised, timed out or answered wrongly)."""
TRUNCATED = "length"


def turn_seed(seed: int, turn: int) -> int:
    """The seed of one turn of an episode: its request's for the first, then one of its own per turn."""
    return seed if turn == 0 else (seed * 1_000_003 + turn * 7_919) % (2**31 - 1)


def turn_id(sample_id: str, turn: int) -> str:
    return f"{sample_id}/turn{turn}"


@dataclass
class _Episode:
    request: GenerationRequest
    session: EnvironmentSession
    response_ids: list[int] = field(default_factory=list)
    student_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    stats: EpisodeStats = field(default_factory=EpisodeStats)
    finish_reason: str | None = None
    policy_version: int = 0
    over: bool = False

    def turn_request(self, turn: int) -> GenerationRequest:
        return replace(
            self.request,
            sample_id=turn_id(self.request.sample_id, turn),
            prompt_ids=(*self.request.prompt_ids, *self.response_ids),
            seed=turn_seed(self.request.seed, turn),
        )

    def append(self, ids: Sequence[int], by_student: bool, logprobs: Sequence[float] | None) -> None:
        self.response_ids.extend(ids)
        self.student_mask.extend([by_student] * len(ids))
        self.stats.segments.append((by_student, len(ids)))
        if self.logprobs is not None:
            # An observation's positions have no rollout log-prob; 0 is never read (they are not counted).
            self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def end(self, reason: str | None) -> None:
        self.over, self.finish_reason = True, reason

    def fail(self, source: str, failure: EnvironmentFailure) -> None:
        self.stats.environment_failures += 1
        log.warning("%s: episode %s: %s (the episode ends here)", source, self.request.sample_id, failure)
        self.end(ENDED_BY_ENVIRONMENT)

    def sample(self) -> RolloutSample:
        return RolloutSample(
            sample_id=self.request.sample_id,
            prompt_ids=list(self.request.prompt_ids),
            response_ids=self.response_ids,
            logprobs=self.logprobs,
            route=self.request.route,
            answer=self.request.answer,
            policy_version=self.policy_version,
            finish_reason=self.finish_reason,
            student_mask=self.student_mask,
            episode=self.stats,
        )


class EpisodeRunner:
    """Plays a step's (or an eval's) episodes on the rollout engines with the job's environment."""

    def __init__(
        self,
        settings: EpisodeSettings,
        environments: Environments,
        encoder: ObservationEncoder,
        decode: Callable[[list[int]], str],
    ) -> None:
        """`decode`: token ids -> the text the environment reads (special tokens left out)."""
        self.settings = settings
        self.environments = environments
        self.encoder = encoder
        self.decode = decode

    async def play(
        self, generate: Generate, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> list[RolloutSample]:
        """The requests' episodes, in request order."""
        s = self.settings
        episodes = [_Episode(r, self.environments.session(r.sample_id)) for r in requests]
        await asyncio.gather(*(self._reset(e) for e in episodes))
        turn_sampling = replace(sampling, stop=tuple(dict.fromkeys((*sampling.stop, *s.call_ends))))
        for turn in range(s.max_turns):
            live = [e for e in episodes if not e.over]
            if not live:
                break
            # One call per turn limit: an episode near the end of its budget may write only what is left of it,
            # so the engines' context (plan.rollout.sequence_length) is never passed.
            by_limit: dict[int, list[_Episode]] = defaultdict(list)
            for e in live:
                by_limit[min(s.turn_tokens, s.max_tokens - len(e.response_ids))].append(e)
            outputs = await asyncio.gather(
                *(
                    generate(
                        [e.turn_request(turn) for e in group], replace(turn_sampling, max_new_tokens=limit)
                    )
                    for limit, group in by_limit.items()
                )
            )
            called: list[tuple[_Episode, str]] = []
            # The engines return a call's samples as they finish, not in request order.
            written = {sample.sample_id: sample for samples in outputs for sample in samples}
            for group in by_limit.values():
                for e in group:
                    text = self._written(e, written[turn_id(e.request.sample_id, turn)])
                    if e.over:
                        continue
                    if turn == s.max_turns - 1:
                        e.end(ENDED_AT_TURNS)
                    else:
                        called.append((e, text))
            await asyncio.gather(*(self._answer(e, text) for e, text in called))
        for e in episodes:
            if (
                not e.over
            ):  # the loop ran out of turns with every episode still going: cannot happen, but kept
                e.end(ENDED_AT_TURNS)
        await asyncio.gather(*(self._grade(e) for e in episodes))
        return [e.sample() for e in episodes]

    def _written(self, e: _Episode, out: RolloutSample) -> str:
        """Appends the student's turn; ends the episode unless the turn ended in a tool call. Returns its text."""
        e.policy_version = out.policy_version
        if out.logprobs is None:
            e.logprobs = None
        e.append(out.response_ids, True, out.logprobs)
        e.stats.turns += 1
        text = self.decode(out.response_ids)
        if self._called(text):
            e.stats.tool_calls += 1
        elif len(e.response_ids) >= self.settings.max_tokens:
            e.end(TRUNCATED)
        else:
            e.end(out.finish_reason)  # an end token (the student answered) or the turn's own length limit
        return text

    def _called(self, text: str) -> bool:
        return any(end in text for end in self.settings.call_ends)

    async def _reset(self, e: _Episode) -> None:
        prompt = self.decode(list(e.request.prompt_ids))
        try:
            await e.session.reset(prompt, e.request.answer)
        except EnvironmentFailure as failure:
            e.fail(self.settings.source, failure)

    async def _answer(self, e: _Episode, text: str) -> None:
        try:
            step = await e.session.step(text)
        except EnvironmentFailure as failure:
            e.fail(self.settings.source, failure)
            return
        if step.error:
            e.stats.tool_errors += 1
        if step.done:
            e.end("stop")
            return
        ids = self.encoder.encode(step.observation)
        if len(e.response_ids) + len(ids) >= self.settings.max_tokens:
            e.end(TRUNCATED)  # no room for the observation and a turn after it
            return
        e.append(ids, False, None)

    async def _grade(self, e: _Episode) -> None:
        if e.stats.environment_failures:
            return  # a failed environment grades nothing: the job's grader reads the response
        try:
            e.stats.reward = await e.session.reward()
        except EnvironmentFailure as failure:
            e.fail(self.settings.source, failure)
