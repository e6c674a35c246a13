"""The on-policy distillation loop, on Ray actors.

One step, top to bottom (`Loop.step`):
  rollout   the rollout actors (student.rollout.replicas) sample the step's responses, each a share, and
            stream each one out as it finishes (`rollout/pool.py`)
  teacher   each sample goes to its routed teacher the moment it arrives (scoring overlaps rollout); a
            teacher on the rollout's own CPU cores gets them once the rollout is done (plan.scoring_overlap)
  train     the trainer ranks take one optimizer step on their shards (gradients all-reduced)
  sync      the new weights stream from the trainers' shards to the rollout engine in buckets, over a
            torch.distributed group of their own (`sync/weight_sync.py`), not through Ray's object store; none
            where the engine samples with the trainer's own model in its process (plan.rollout_in_trainer:
            one float32 CPU replica and the transformers engine); that process then also scores the
            teachers computed by their transformers forward (plan.teachers_in_trainer)
then metrics, status, checkpoint and evaluation when due. With `schedule.oneStepOff` the rollout of step
i+1 is started before step i trains, so sampling overlaps training and each sample is one policy version
stale (recorded as `staleness`). Everything stateful (engines, models, files) lives in the leaves.

The phases live in their own modules, each a part of `Loop`: `sampling.py` (rollout and scoring),
`training.py` (train and sync), `evaluation.py`, `checkpointing.py` (resume and save); the state they
share is `state.LoopState`, the actors `components.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from distillery_runtime.data.samples import TrainSample
from distillery_runtime.observe.rollout_stats import episode_stats, response_stats
from distillery_runtime.run.loop import plan
from distillery_runtime.run.loop.checkpointing import CheckpointPhase
from distillery_runtime.run.loop.components import Components
from distillery_runtime.run.loop.evaluation import EvaluationPhase
from distillery_runtime.run.loop.sampling import SamplingPhase
from distillery_runtime.run.loop.state import RunResult
from distillery_runtime.run.loop.training import TrainingPhase
from distillery_runtime.teachers.clients.outage import TeacherOutageError


class Loop(SamplingPhase, TrainingPhase, EvaluationPhase, CheckpointPhase):
    """A run of one DistillationJob: its steps, each rollout, scoring, training, sync, then metrics,
    checkpoint and evaluation when due."""

    async def run(self, c: Components) -> RunResult:
        try:
            return await self._run(c)
        except TeacherOutageError:
            # The finished steps are not thrown away with the run: save them, then fail.
            if self.step_done > self.saved_step:
                await self.save(c, self.step_done)
            raise
        finally:
            if self.episode_runner is not None:
                await self.episode_runner.environments.close()  # an HTTP environment's connections

    async def _run(self, c: Components) -> RunResult:
        if self.step_done == 0 and self.eval_data is not None:
            await self.evaluate(c, 0)
        one_step_off = self.spec.schedule.one_step_off
        pending: asyncio.Task | None = None
        stopped = False
        step = self.step_done
        while step < self.total:
            step += 1
            started = time.perf_counter()
            rolled = await (pending or asyncio.create_task(self.rollout_and_score(c, step)))
            pending = None
            if one_step_off and step < self.total and not self.options.stop.is_set():
                pending = asyncio.create_task(self.rollout_and_score(c, step + 1))
            elif self.plan.rollout.sleeps:
                # Nothing samples or scores while the student trains: the engines on its GPUs free them.
                await asyncio.gather(c.scoring.sleep(), c.rollout.sleep())
            samples = self.train_samples(rolled)
            t_train = time.perf_counter()
            train_metrics = await self.train(c, samples)
            self.version += 1
            t_sync = time.perf_counter()
            if self.plan.rollout.sleeps:
                await c.rollout.wake_up()
            await self.sync(c)
            finished = time.perf_counter()
            self.step_done, self.position = step, step * self.spec.schedule.prompts_per_step
            record = self._record(step, rolled, samples, train_metrics, started, t_train, t_sync, finished)
            self._publish(c, record)
            stop = self.options.stop.is_set()
            if stop and pending is not None:
                await pending  # let the overlapped rollout finish; its samples are redone on resume
                pending = None
            if plan.is_due(step, self.spec.schedule.checkpoint_every, self.total) or stop:
                await self.save(c, step)
            if self.eval_data is not None and plan.is_due(step, self.spec.schedule.eval_every, self.total):
                # The rollout actor runs one call at a time: this evaluation queues behind the weight
                # sync above, so it sees the weights of `step` even while a rollout is overlapped.
                await self.evaluate(c, step)
            if stop:
                stopped = True
                self._event(f"stopped after step {step} (checkpoint saved)")
                break
        if pending is not None:
            await pending
        return self.result(stopped)

    def result(self, stopped: bool) -> RunResult:
        """What the run did so far (its end, or where a failure left it)."""
        return RunResult(
            self.step_done, self.total, stopped, self.records, self.evals, self.last_checkpoint, self.model
        )

    def _record(
        self,
        step: int,
        rolled: dict[str, Any],
        samples: list[TrainSample],
        train_metrics: dict[str, float],
        started: float,
        t_train: float,
        t_sync: float,
        finished: float,
    ) -> dict[str, Any]:
        tokens = sum(len(s.response_ids) for s in samples)
        step_s = finished - started
        staleness = max((self.version - 1 - s.policy_version for s in rolled["samples"]), default=0)
        return {
            "step": step,
            "loss": train_metrics.get("distill/loss"),
            "kl": train_metrics.get("distill/kl_k3"),
            "kl_per_teacher": plan.kl_per_teacher(samples),
            "grad_norm": train_metrics.get("train/grad_norm"),
            "lr": train_metrics.get("train/lr"),
            "on_policy": rolled["on_policy"],
            "staleness": staleness,
            "samples": len(samples),
            "generated_tokens": tokens if rolled["on_policy"] else 0,
            "response_tokens": tokens,
            "tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
            "time/step_s": step_s,
            "time/rollout_s": rolled["rollout_s"],
            "time/teacher_s": rolled["teacher_s"],
            "time/train_s": t_sync - t_train,
            "time/sync_s": finished - t_sync,
            # What the sync sent: the whole student, or a LoRA student's adapter (megabytes, not the model).
            "sync/bytes": self.sync_bytes,
            "samples_per_teacher": dict(Counter(s.teacher for s in samples)),
            **response_stats(rolled["samples"]),
            **episode_stats(rolled["samples"]),
            "entropy": train_metrics.get("distill/entropy"),
            # Rollout engine vs trainer log-probs of the same tokens: ~0 unless the two copies differ.
            "logprob_gap_mean": train_metrics.get("distill/logprob_gap_mean"),
            "logprob_gap_max": train_metrics.get("distill/logprob_gap_max"),
            "metrics": train_metrics,
            "time": time.time(),
        }

    def _publish(self, c: Components, record: dict[str, Any]) -> None:
        stats = c.scoring.take_stats()
        self.metrics.record_retries(c.scoring.retries())
        self.records.append(record)
        self.metrics_file.write(record)
        self.metrics.record_step(record, dict(stats.seconds))
        if self.options.on_step:
            self.options.on_step(record)
        if self.options.status is not None:
            self.options.status.progress(record, self.total)
