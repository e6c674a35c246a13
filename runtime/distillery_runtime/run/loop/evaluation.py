"""The evaluation phase: greedy decoding of the held-out prompts, graded and scored by the teachers, written
to eval.jsonl and samples.jsonl."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from distillery.plan.rollout.generation import EVAL_SAMPLES_LOGGED
from distillery_runtime.data.data import scored_prompt
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.observe.rollout_stats import episode_stats, response_stats
from distillery_runtime.rollout.base import GenerationRequest
from distillery_runtime.run.loop import plan
from distillery_runtime.run.loop.components import Components
from distillery_runtime.run.loop.state import LoopState
from distillery_runtime.teachers.types import ScoreRequest


class EvaluationPhase(LoopState):
    """Evaluation when due (and before the first step)."""

    async def evaluate(self, c: Components, step: int) -> float:
        """Greedy decoding of the held-out prompts. Those with a reference answer are graded by the job's
        grader (the accuracy is the mean score; NaN when none has one); the first `EVAL_SAMPLES_LOGGED`
        responses are scored by their teachers, whose per-token KL is the quality signal of data with no
        reference. Every sample goes to samples.jsonl, so that a user can read what the student writes."""
        assert self.eval_data is not None
        records = list(self.eval_data.records)
        if not records:
            return float("nan")
        requests = [
            GenerationRequest(
                sample_id=f"eval-{r.index}", prompt_ids=r.prompt_ids, seed=0, route=r.route, answer=r.answer
            )
            for r in records
        ]
        started = time.perf_counter()
        if self.episode_runner is not None:
            outputs = await self.episode_runner.play(c.rollout.generate, requests, self.sampling.for_eval())
        else:
            outputs = await c.rollout.generate(requests, self.sampling.for_eval())
        grades = [self._grade(o) for o in outputs]
        scored = await self._score_eval_samples(c, outputs[:EVAL_SAMPLES_LOGGED])
        graded = [g for g in grades if g is not None]
        accuracy = sum(graded) / len(graded) if graded else None
        stats = response_stats(outputs)
        kl_per_teacher = plan.mean_kl_per_teacher([(name, kl) for name, kl in scored if kl is not None])
        entry: dict[str, Any] = {
            "step": step,
            "grader": self.grader.name,
            "eval_accuracy": accuracy,
            "n": len(outputs),
            "graded": len(graded),
            "response_length_mean": stats["rollout/response_length_mean"],
            "response_length_max": stats["rollout/response_length_max"],
            "truncated_fraction": stats["rollout/truncated_fraction"],
            **{key.replace("/", "_"): value for key, value in episode_stats(outputs).items()},
            "kl_per_teacher": kl_per_teacher,
            "kl_samples": len(scored),
            "seconds": time.perf_counter() - started,
        }
        self.samples_file.write_many(
            plan.eval_sample_lines(step, outputs, grades, scored, self._prompt_text, self._text)
        )
        self.evals.append(entry)
        self.eval_file.write(entry)
        self.metrics.record_eval(entry)
        kl = ", ".join(f"{name} {value:.3f}" for name, value in kl_per_teacher.items())
        if accuracy is None:
            length = stats["rollout/response_length_mean"]
            self._event(
                f"eval step {step}: no reference answers; KL {kl or '-'}, {length:.0f} tokens a response"
            )
            return float("nan")
        self.metrics.eval_accuracy.set(accuracy)
        self._event(
            f"eval step {step}: {self.grader.name} accuracy {accuracy:.3f} ({sum(graded):g}/{len(graded)})"
            + (f"; KL {kl}" if kl else "")
        )
        if self.options.status is not None:
            self.options.status.eval_accuracy(accuracy)
        return accuracy

    async def _score_eval_samples(
        self, c: Components, outputs: list[RolloutSample]
    ) -> list[tuple[str, float | None]]:
        """(teacher, per-token k3 KL of the student's own response under it) of each sample: a bounded
        number of scoring requests per eval (EVAL_SAMPLES_LOGGED), not the whole eval set."""
        if not outputs:
            return []
        await c.scoring.wake_up()  # colocated teachers sleep while the student trains
        requests = [
            ScoreRequest(
                scored_prompt(self.teacher_views, o.route, o.prompt_ids), o.response_ids, o.sample_id, o.route
            )
            for o in outputs
        ]
        results = await asyncio.gather(*(c.scoring.score_one(r) for r in requests))
        return [(name, plan.sample_kl(o, scores)) for o, (name, scores) in zip(outputs, results, strict=True)]
