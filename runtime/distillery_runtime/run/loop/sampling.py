"""The rollout and scoring phases of a step: the step's prompts, their responses sampled by the rollout
engines and each scored by its teacher as soon as it is out, then turned into training samples."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from distillery_runtime.data.data import PromptRecord, scored_prompt, take
from distillery_runtime.data.samples import RolloutSample, TrainSample
from distillery_runtime.run.loop import plan
from distillery_runtime.run.loop.components import Components
from distillery_runtime.run.loop.state import LoopState
from distillery_runtime.teachers.types import ScoreRequest


class SamplingPhase(LoopState):
    """Rollout and scoring: what a step trains on."""

    def prompts_for(self, step: int) -> list[PromptRecord]:
        """The prompts of step `step` (1-based); pure in the data position."""
        n = self.spec.schedule.prompts_per_step
        return take(self.train_data.records, (step - 1) * n, n, self.spec.schedule.seed)

    async def rollout_and_score(self, c: Components, step: int) -> dict[str, Any]:
        """Sample the step's responses and score each as soon as it is out of the engine."""
        spec = self.spec
        records = self.prompts_for(step)
        started = time.perf_counter()
        on_policy = plan.is_on_policy(spec.schedule.seed, step, spec.loss.on_policy_fraction)
        scoring_tasks: dict[int, asyncio.Task] = {}
        held: dict[int, ScoreRequest] = {}
        samples: list[RolloutSample] = []
        if self.plan.rollout.sleeps:
            await c.scoring.wake_up()

        def submit(sample: RolloutSample) -> None:
            index = len(samples)
            samples.append(sample)
            # A teacher with a context of its own scores the same response after its own prompt.
            prompt = scored_prompt(self.teacher_views, sample.route, sample.prompt_ids)
            request = ScoreRequest(prompt, sample.response_ids, sample.sample_id, sample.route)
            if self.scored_after_rollout and c.scoring.teacher_name(request) in self.scored_after_rollout:
                held[index] = request
            else:
                scoring_tasks[index] = asyncio.create_task(c.scoring.score_one(request))

        if on_policy:
            requests = plan.generation_requests(
                records, step, spec.student.rollout.samples_per_prompt, spec.schedule.seed
            )
            wanted = [r.sample_id for r in requests]
            sampling = replace(
                self.sampling, logprobs=plan.wants_logprobs(step, self.plan.rollout.logprobs_every)
            )
            if self.episode_runner is not None:
                # Episodes are scored whole, once played: a teacher reads the observations too.
                for sample in await self.episode_runner.play(c.rollout.generate, requests, sampling):
                    submit(sample)
            else:
                async for sample in c.rollout.stream(requests, sampling):
                    submit(sample)
        else:
            dataset = plan.dataset_samples(
                records, step, spec.student.rollout.samples_per_prompt, self.version
            )
            wanted = [s.sample_id for s in dataset]
            for sample in dataset:
                submit(sample)
        rollout_done = time.perf_counter()
        scoring_tasks.update({i: asyncio.create_task(c.scoring.score_one(r)) for i, r in held.items()})
        tasks = [scoring_tasks[i] for i in range(len(samples))]
        try:
            scored = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # a teacher gave up: the samples still waiting on others stop too
                task.cancel()
            raise
        done = time.perf_counter()
        # Samples stream out in completion order; train in request order so a run is reproducible.
        position = {sample_id: i for i, sample_id in enumerate(wanted)}
        ranked = sorted(range(len(samples)), key=lambda i: position[samples[i].sample_id])
        return {
            "samples": [samples[i] for i in ranked],
            "scored": [scored[i] for i in ranked],
            "on_policy": on_policy,
            "rollout_s": rollout_done - started,
            "teacher_s": done - rollout_done,
        }

    def train_samples(self, rolled: dict[str, Any]) -> list[TrainSample]:
        samples: list[RolloutSample] = rolled["samples"]
        advantages: dict[str, float] = {}
        if self.plan.loss.task_reward_coef > 0:
            advantages = plan.group_advantages(samples, self._reward)
        return [
            plan.train_sample(s, name, scores, advantages.get(s.sample_id, 0.0))
            for s, (name, scores) in zip(samples, rolled["scored"], strict=True)
        ]

    def _reward(self, sample: RolloutSample) -> float:
        grade = self._grade(sample)
        return 0.0 if grade is None else grade
